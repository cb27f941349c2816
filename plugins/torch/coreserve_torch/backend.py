"""The `pytorch` backend: TorchScript and torch.export models, one module per instance."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coreserve import (
    DataType,
    InferenceRequest,
    InternalError,
    ModelConfig,
    ModelConfigError,
    UnavailableError,
)
from coreserve.backend import (
    InstanceKind,
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelInstance,
    ModelSignature,
    ModelTensor,
    Responder,
    ServerContext,
    bool_parameter,
    complete_config,
    default_max_batch_size,
    inline_below_us,
    int_parameter,
    run_batched,
)
from coreserve_torch.binding import InputBinding, OutputBinding
from coreserve_torch.tensors import TORCH_TYPES, to_tensor

EXPORT_SUFFIX = ".pt2"


def _is_export(path: Path) -> bool:
    return path.suffix == EXPORT_SUFFIX


def _dims(value: Any) -> tuple[int, ...]:
    return tuple(int(dim) if isinstance(dim, int) else -1 for dim in value.shape)


def _export_tensors(program: Any) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """A torch.export program's user inputs and outputs (outputs named OUTPUT__<index>)."""
    names = list(program.graph_signature.user_inputs)
    placeholders = {
        node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"
    }
    inputs = [
        ModelTensor(
            name,
            TORCH_TYPES.get(placeholders[name].dtype),
            _dims(placeholders[name]),
            str(placeholders[name].dtype),
        )
        for name in names
    ]
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    values = output_node.meta.get("val")
    values = list(values) if isinstance(values, list | tuple) else [values]
    outputs = [
        ModelTensor(f"OUTPUT__{index}", TORCH_TYPES.get(value.dtype), _dims(value), str(value.dtype))
        for index, value in enumerate(values)
    ]
    return inputs, outputs


def _device(placement: InstancePlacement, model_name: str) -> torch.device:
    if placement.kind is not InstanceKind.GPU:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnavailableError(
            f"model '{model_name}': instance '{placement.name}' is KIND_GPU, but this torch has no CUDA "
            "device (a CUDA build of torch and an NVIDIA GPU are needed)"
        )
    if placement.device_id >= torch.cuda.device_count():
        raise UnavailableError(
            f"model '{model_name}': GPU {placement.device_id} does not exist "
            f"({torch.cuda.device_count()} found)"
        )
    return torch.device(f"cuda:{placement.device_id}")


def _load(path: Path, device: torch.device, model_name: str) -> tuple[Any, list[str]]:
    """The callable module and its forward() argument names."""
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': model file {path} not found")
    try:
        if _is_export(path):
            program = torch.export.load(str(path))
            return program.module().to(device), list(program.graph_signature.user_inputs)
        module = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise ModelConfigError(f"model '{model_name}': torch cannot load {path}: {exc}") from None
    module.eval()
    arguments = [argument.name for argument in module.forward.schema.arguments][1:]  # without self
    return module, arguments


class TorchBackend:
    """Serves TorchScript (`model.pt`) and torch.export (`model.pt2`) models."""

    name: str = "pytorch"
    platforms: tuple[str, ...] = ("pytorch_libtorch",)
    default_model_filename: str = "model.pt"

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Completes configurations of torch.export programs; TorchScript files carry no shapes."""
        if (
            (config.input and config.output)
            or not _is_export(model.model_file)
            or not model.model_file.is_file()
        ):
            return config
        try:
            program = torch.export.load(str(model.model_file))
        except Exception as exc:
            raise ModelConfigError(
                f"model '{model.name}': torch cannot load {model.model_file}: {exc}"
            ) from None
        inputs, outputs = _export_tensors(program)
        return complete_config(
            config,
            inputs,
            outputs,
            model_name=model.name,
            max_batch_size=default_max_batch_size(server, model.name),
        )

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        device = _device(placement, model.name)
        intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", minimum=1)
        if intra is not None:
            torch.set_num_threads(intra)
        inter = int_parameter(config, "INTER_OP_THREAD_COUNT", minimum=1)
        if inter is not None:
            with contextlib.suppress(RuntimeError):  # torch allows it once, before parallel work starts
                torch.set_num_interop_threads(inter)
        module, arguments = await asyncio.to_thread(_load, model.model_file, device, model.name)
        signature = ModelSignature(config)
        unsupported = [s.name for s in signature.model_inputs.values() if s.datatype is DataType.BYTES]
        if unsupported:
            raise ModelConfigError(
                f"model '{model.name}': plugin-torch cannot pass BYTES tensors ({unsupported})"
            )
        return TorchInstance(
            module,
            device,
            InputBinding(model.name, list(signature.model_inputs), arguments),
            OutputBinding(model.name, list(signature.model_outputs)),
            signature,
            InstanceThread(placement.name, inline_below_us(config)),
            inference_mode=bool_parameter(config, "INFERENCE_MODE") is not False,
            optimized=not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION"),
        )


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

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self._run, thread=self._thread)

    @contextlib.contextmanager
    def _modes(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode() if self._inference_mode else torch.no_grad())
            if self._scripted and not self._optimized:
                stack.enter_context(torch.jit.optimized_execution(False))  # type: ignore[attr-defined]
            yield

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        tensors = {name: to_tensor(array, self._device) for name, array in inputs.items()}
        with self._modes():
            result = self._module(*self._inputs.arguments(tensors))
        outputs = self._outputs.outputs(result, output_names)
        for name, array in outputs.items():
            if array.dtype != self._types[name]:
                raise InternalError(
                    f"the model returned output '{name}' as {array.dtype}, but the configuration says "
                    f"{DataType.from_numpy(self._types[name])}"
                )
        return outputs

    async def close(self) -> None:
        self._thread.close()
        del self._module
