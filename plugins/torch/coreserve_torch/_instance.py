"""One torch module on one device, run on the instance's thread (torch releases the GIL)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from coreserve import DataType, InferenceRequest, InternalError, InvalidArgumentError
from coreserve.backend import InstanceThread, ModelSignature, Responder, run_batched
from coreserve_torch._binding import InputBinding, OutputBinding
from coreserve_torch._cuda_graphs import CapturedGraphs, empty_cache
from coreserve_torch._tensors import to_tensor

_HOST = torch.device("cpu")


class TorchInstance:
    """One module on one device; calls run on the instance's thread (torch releases the GIL)."""

    def __init__(
        self,
        module: Any,
        device: torch.device,
        inputs: InputBinding,
        outputs: OutputBinding,
        signature: ModelSignature,
        thread: InstanceThread,
        *,
        inference_mode: bool,
        optimized: bool,
        graphs: CapturedGraphs | None = None,
    ) -> None:
        self._module = module
        self._device = device
        self._inputs = inputs
        self._outputs = outputs
        self._types = {name: spec.datatype.numpy_dtype for name, spec in signature.model_outputs.items()}
        self._thread = thread
        self._inference_mode = inference_mode
        self._optimized = optimized
        self._scripted = isinstance(module, torch.jit.ScriptModule)
        self._graphs = graphs

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self.infer, thread=self._thread)

    @contextlib.contextmanager
    def _modes(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode() if self._inference_mode else torch.no_grad())
            if self._scripted and not self._optimized:
                stack.enter_context(torch.jit.optimized_execution(False))  # type: ignore[attr-defined]
            yield

    def infer(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """Runs forward() on one batch (blocking); `execute` calls it on the instance's thread."""
        if self._graphs is None:
            tensors = {name: to_tensor(array, self._device) for name, array in inputs.items()}
            with self._modes():
                result = self._module(*self._inputs.arguments(tensors))
            outputs = self._outputs.outputs(result, output_names)
        else:
            # The graph copies host tensors into its own; its result is read out (to host memory)
            # before the turn ends, so no other replay can overwrite it first.
            tensors = {name: to_tensor(array, _HOST) for name, array in inputs.items()}
            with self._graphs.turn(), self._modes():
                result = self._graphs.replay(self._inputs.arguments(tensors))
                outputs = self._outputs.outputs(result, output_names)
        for name, array in outputs.items():
            if array.dtype != self._types[name]:  # Triton's words (an invalid argument there)
                expected = DataType.from_numpy(self._types[name]).config_name
                try:
                    provided = DataType.from_numpy(array.dtype).config_name
                except ValueError:
                    provided = str(array.dtype)
                raise InvalidArgumentError(
                    f"configuration expects datatype {expected} for output '{name}', "
                    f"model provides {provided}"
                )
        return outputs

    def capture_graphs(self, largest: dict[str, np.ndarray], sizes: Sequence[int] | None) -> None:
        """Captures the instance's CUDA graphs (blocking, at load): see CapturedGraphs.capture."""
        if self._graphs is None:
            raise InternalError("capture_graphs: this instance runs without CUDA graphs")
        tensors = {name: to_tensor(array, _HOST) for name, array in largest.items()}
        with self._modes():
            self._graphs.capture(self._module, self._inputs.arguments(tensors), sizes)

    async def close(self) -> None:
        self.release()

    def release(self) -> None:
        """Frees the module, its graphs and (on a GPU) the memory torch keeps cached for them."""
        self._thread.close()
        if self._graphs is not None:
            self._graphs.clear()
        del self._module
        if self._device.type == "cuda":  # torch's cache keeps what the module held from NVML's view
            empty_cache()
