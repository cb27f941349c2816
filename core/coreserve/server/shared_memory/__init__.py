"""Shared-memory regions that clients register: system (POSIX) and CUDA, in one region table.

Both frontends use the same registries through the data plane. `_system_regions` maps POSIX regions,
`_cuda` opens CUDA IPC handles where a CUDA runtime loads, `_region_table` is the locked table
both keep their regions in. May import coreserve's errors and the process's open-file limit
(`coreserve.server.httpd`), nothing of the frontends that use it.
"""

from __future__ import annotations

from coreserve.server.shared_memory._cuda import CudaSharedMemory, load_cuda_runtime
from coreserve.server.shared_memory._system_regions import SystemSharedMemory, cuda_shared_memory_unavailable

__all__ = ["CudaSharedMemory", "SystemSharedMemory", "cuda_shared_memory_unavailable", "load_cuda_runtime"]
