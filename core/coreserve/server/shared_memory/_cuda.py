"""CUDA shared-memory regions: GPU buffers that clients share with the server by IPC handle.

A client allocates device memory, takes its `cudaIpcMemHandle_t` and registers the raw handle
(64 bytes, base64 over HTTP) with the device id and the size. The server opens the handle once
(`cudaIpcOpenMemHandle`) and copies each tensor between the device and host memory, where
coreserve's backends read and write. The CUDA runtime is cuda-python's
(`cuda.bindings.runtime`); `load_cuda_runtime` returns it only where a CUDA device is usable,
and without one the server keeps answering that it offers no CUDA shared memory.

Copies hold the registry's lock, so a region cannot be unregistered (its handle closed) while
a request copies from or into it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreserve.errors import InternalError, InvalidArgumentError, NotFoundError
from coreserve.server.shared_memory._region_table import RegionTable

CUDA_IPC_HANDLE_SIZE = 64
# Present wherever an NVIDIA driver is: without it, cuda-python is not even imported.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"


def load_cuda_runtime() -> Any | None:
    """cuda-python's runtime module where a CUDA device is usable, else None."""
    if not os.path.exists(NVIDIA_CONTROL_DEVICE):
        return None
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    try:
        error, count = runtime.cudaGetDeviceCount()
    except Exception:  # a broken driver install: no GPU path, as without one
        return None
    if error != runtime.cudaError_t.cudaSuccess or count < 1:
        return None
    return runtime


@dataclass(slots=True)
class _CudaRegion:
    name: str
    device_id: int
    byte_size: int
    pointer: int  # the device address the opened IPC handle maps to

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class CudaSharedMemory(RegionTable[_CudaRegion]):
    """Registers, lists and unregisters CUDA regions; copies tensors out of and into them."""

    kind = "cuda"

    def __init__(self, runtime: Any) -> None:
        super().__init__()
        self._runtime = runtime

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Opens the IPC handle of `byte_size` bytes on `device_id` under `name` (the caller
        checked that the name is free)."""
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise InvalidArgumentError(
                f"failed to register CUDA shared memory region '{name}': raw_handle has "
                f"{len(raw_handle)} bytes, a cudaIpcMemHandle_t has {CUDA_IPC_HANDLE_SIZE}"
            )
        if type(device_id) is not int or device_id < 0:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': device_id must be a non-negative integer"
            )
        if type(byte_size) is not int or byte_size <= 0:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': byte_size must be a positive integer"
            )
        runtime = self._runtime
        handle = runtime.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, CUDA_IPC_HANDLE_SIZE)
        with self._lock:
            self._check(name, runtime.cudaSetDevice(device_id), "cudaSetDevice")
            result = runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess)
            self._check(name, result, "cudaIpcOpenMemHandle")
            self._regions[name] = _CudaRegion(name, device_id, byte_size, int(result[1]))

    def _check(self, name: str, result: Any, call: str) -> None:
        error = result[0] if isinstance(result, tuple) else result
        if error != self._runtime.cudaError_t.cudaSuccess:
            raise InvalidArgumentError(
                f"failed to register CUDA shared memory region '{name}': {call} failed: {error.name}"
            )

    def unregister(self, name: str = "") -> None:
        """Closes one region's handle, or every region's when `name` is empty; unknown names
        are ignored, as Triton ignores them."""
        # (a copy in progress holds the lock: the handle closes after it)
        for region in self._remove(name):
            self._runtime.cudaSetDevice(region.device_id)
            self._runtime.cudaIpcCloseMemHandle(region.pointer)

    def read(self, region: str, offset: int, byte_size: int) -> memoryview:
        """A host copy of `byte_size` bytes at `offset` in `region`."""
        host = np.empty(byte_size, dtype=np.uint8)
        with self._lock:
            found = self._find(region, offset, byte_size)
            self._copy(host.ctypes.data, found.pointer + offset, byte_size, region)
        return host.data.toreadonly()

    def staging(self, region: str, offset: int, byte_size: int) -> tuple[memoryview, Callable[[], None]]:
        """Host memory for an output bound for `region`, and the call that copies it there."""
        with self._lock:
            self._find(region, offset, byte_size)
        host = np.zeros(byte_size, dtype=np.uint8)

        def commit() -> None:
            with self._lock:
                found = self._find(region, offset, byte_size)
                self._copy(found.pointer + offset, host.ctypes.data, byte_size, region)

        return host.data, commit

    def _find(self, region: str, offset: int, byte_size: int) -> _CudaRegion:
        found = self._regions.get(region)
        if found is None:
            raise NotFoundError(f"Unable to find shared memory region: '{region}'")
        if offset >= found.byte_size:  # Triton's words, each check as Triton makes it
            raise InvalidArgumentError(
                f"Invalid offset for shared memory region: '{region}' (offset {offset}, the region "
                f"holds {found.byte_size} bytes)"
            )
        if offset + byte_size > found.byte_size:
            raise InvalidArgumentError(
                f"Invalid offset + byte size for shared memory region: '{region}' "
                f"({offset} + {byte_size} is past its {found.byte_size} bytes)"
            )
        return found

    def _copy(self, destination: int, source: int, byte_size: int, region: str) -> None:
        runtime = self._runtime
        (error,) = runtime.cudaMemcpy(
            destination, source, byte_size, runtime.cudaMemcpyKind.cudaMemcpyDefault
        )
        if error != runtime.cudaError_t.cudaSuccess:
            raise InternalError(f"copying CUDA shared memory region '{region}' failed: {error.name}")
