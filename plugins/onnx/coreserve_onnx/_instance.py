"""One ONNX Runtime session serving one instance, on a thread of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from coreserve import DataType, InferenceRequest, InvalidArgumentError
from coreserve.backend import InstanceThread, ModelSignature, Responder, run_batched


class OnnxInstance:
    """Executes batches with `InferenceSession.run`: on the instance's thread (onnxruntime
    releases the GIL), or inline while runs are shorter than the thread hop would cost."""

    def __init__(
        self,
        session: ort.InferenceSession,
        signature: ModelSignature,
        thread: InstanceThread,
        scalar_inputs: frozenset[str] = frozenset(),
        scalar_outputs: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        """`scalar_inputs` go to the model with no dimensions; `scalar_outputs` that come with
        none get the configuration's dims (see _tensors.scalars)."""
        self._session = session
        self._thread = thread
        self._scalar_inputs = scalar_inputs
        self._scalar_outputs = scalar_outputs or {}
        self._string_inputs = {n for n, s in signature.model_inputs.items() if s.datatype is DataType.BYTES}
        self._string_outputs = {n for n, s in signature.model_outputs.items() if s.datatype is DataType.BYTES}

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(
            requests,
            responder,
            self._run,
            thread=self._thread,
            convert_input=self._strings_to_str if self._string_inputs else None,
        )

    def _strings_to_str(self, name: str, array: np.ndarray) -> np.ndarray:
        # onnxruntime's Python API wants str objects for string tensors; clients send bytes.
        if name not in self._string_inputs:
            return array
        try:
            text = [item.decode("utf-8") for item in array.ravel()]
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"input '{name}' holds bytes that are not UTF-8 text ({exc.reason} at byte {exc.start}); "
                "the ONNX model takes strings"
            ) from None
        converted = np.empty(array.shape, dtype=np.object_)
        converted.reshape(-1)[:] = text
        return converted

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        if self._scalar_inputs:  # (the request's shape was checked: dims of 1 only)
            inputs = {n: a.reshape(()) if n in self._scalar_inputs else a for n, a in inputs.items()}
        try:
            results = self._session.run(list(output_names), inputs)
        except InvalidArgument as exc:
            raise InvalidArgumentError(f"onnxruntime rejected the inputs: {exc}") from None
        outputs = dict(zip(output_names, results, strict=True))
        for name in self._scalar_outputs.keys() & outputs.keys():
            if outputs[name].ndim == 0:
                outputs[name] = outputs[name].reshape(self._scalar_outputs[name])
        for name in self._string_outputs.intersection(outputs):
            array = outputs[name]
            encoded = np.empty(array.shape, dtype=np.object_)
            encoded.reshape(-1)[:] = [str(item).encode("utf-8") for item in array.ravel()]
            outputs[name] = encoded
        return outputs

    async def close(self) -> None:
        self._thread.close()
        del self._session
