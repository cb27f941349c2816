"""One TensorRT execution context on one GPU, with device buffers reused across batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from coreserve import InferenceRequest, InvalidArgumentError
from coreserve.backend import InstanceThread, ModelSignature, Responder, run_batched
from coreserve_tensorrt._runtime import check


class TensorRTInstance:
    """Runs batches with execute_async_v3 on a CUDA stream of its own, on the instance's thread."""

    def __init__(
        self,
        trt: Any,
        cudart: Any,
        engine: Any,
        device_id: int,
        signature: ModelSignature,
        thread: InstanceThread,
    ) -> None:
        self._trt = trt
        self._cudart = cudart
        self._engine = engine
        self._device_id = device_id
        self._signature = signature
        self._thread = thread
        self._context: Any = None
        self._stream: Any = None
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, capacity in bytes)
        self._profile = -1
        self._inputs = [
            engine.get_tensor_name(i)
            for i in range(engine.num_io_tensors)
            if engine.get_tensor_mode(engine.get_tensor_name(i)) == trt.TensorIOMode.INPUT
        ]

    def prepare(self) -> None:
        """Creates the context and stream on the instance's GPU (on the instance's thread)."""
        check(self._cudart, self._cudart.cudaSetDevice(self._device_id), "cudaSetDevice")
        self._context = self._engine.create_execution_context()
        self._stream = check(self._cudart, self._cudart.cudaStreamCreate(), "cudaStreamCreate")

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        await run_batched(requests, responder, self._run, thread=self._thread)

    def _profile_for(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """The first optimization profile whose min/max shapes hold every input."""
        for profile in range(self._engine.num_optimization_profiles):
            fits = True
            for name, shape in shapes.items():
                low, _, high = self._engine.get_tensor_profile_shape(name, profile)
                if len(low) != len(shape) or any(
                    not lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)
                ):
                    fits = False
                    break
            if fits:
                return profile
        raise InvalidArgumentError(
            f"no optimization profile of model '{self._signature.model_name}' fits the input shapes "
            f"{ {name: list(shape) for name, shape in shapes.items()} }"
        )

    def _buffer(self, name: str, size: int) -> int:
        pointer, capacity = self._buffers.get(name, (0, 0))
        if capacity < size:
            if pointer:
                check(self._cudart, self._cudart.cudaFree(pointer), "cudaFree")
            pointer = check(self._cudart, self._cudart.cudaMalloc(max(size, 1)), "cudaMalloc")
            self._buffers[name] = (pointer, size)
            self._context.set_tensor_address(name, pointer)
        return pointer

    def _run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        cudart, trt = self._cudart, self._trt
        check(cudart, cudart.cudaSetDevice(self._device_id), "cudaSetDevice")
        arrays = {name: np.ascontiguousarray(inputs[name]) for name in self._inputs}
        profile = self._profile_for({name: array.shape for name, array in arrays.items()})
        if profile != self._profile:
            self._context.set_optimization_profile_async(profile, self._stream)
            self._profile = profile
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name, array in arrays.items():
            self._context.set_input_shape(name, array.shape)
            pointer = self._buffer(name, array.nbytes)
            check(
                cudart,
                cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, to_device, self._stream),
                "copy to the GPU",
            )
        outputs = {}
        for name in output_names:
            shape = tuple(self._context.get_tensor_shape(name))
            outputs[name] = np.empty(shape, dtype=trt.nptype(self._engine.get_tensor_dtype(name)))
            self._buffer(name, outputs[name].nbytes)
        for index in range(self._engine.num_io_tensors):  # outputs nobody asked for still need memory
            name = self._engine.get_tensor_name(index)
            if name not in arrays and name not in outputs:
                shape = tuple(self._context.get_tensor_shape(name))
                self._buffer(
                    name,
                    int(np.prod(shape)) * np.dtype(trt.nptype(self._engine.get_tensor_dtype(name))).itemsize,
                )
        if not self._context.execute_async_v3(self._stream):
            raise InvalidArgumentError(
                f"TensorRT could not run model '{self._signature.model_name}' on these inputs"
            )
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, array in outputs.items():
            check(
                cudart,
                cudart.cudaMemcpyAsync(
                    array.ctypes.data, self._buffers[name][0], array.nbytes, to_host, self._stream
                ),
                "copy from the GPU",
            )
        check(cudart, cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        return outputs

    def _release(self) -> None:
        for pointer, _ in self._buffers.values():
            self._cudart.cudaFree(pointer)
        self._buffers.clear()
        if self._stream is not None:
            self._cudart.cudaStreamDestroy(self._stream)
        self._context = None

    async def close(self) -> None:
        await self._thread.run(self._release)
        self._thread.close()
