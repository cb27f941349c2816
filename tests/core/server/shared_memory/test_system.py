"""The shared-memory registry in-process, over real POSIX segments: views, not copies, and views
that outlive their region's registration."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from coreserve.errors import InvalidArgumentError
from coreserve.protocol._shared_memory import (
    SharedMemoryReference,
    output_target,
    read_input,
    write_output,
)
from coreserve.server.shared_memory._system_regions import SystemSharedMemory
from coreserve.types import DataType


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    name = f"coreserve-unit-{uuid.uuid4().hex[:12]}"
    created = shared_memory.SharedMemory(name, create=True, size=4096)
    yield created
    created.close()
    created.unlink()


def test_an_input_is_a_view_of_the_segment_not_a_copy(segment: shared_memory.SharedMemory) -> None:
    regions = SystemSharedMemory()
    regions.register("in", f"/{segment.name}", 64, 256)
    source = np.ndarray((16,), np.float32, buffer=segment.buf, offset=64 + 128)
    source[:] = np.arange(16, dtype=np.float32)

    array = read_input(regions, SharedMemoryReference("in", 128, 64), DataType.FP32, (16,), "INPUT0", "m")

    np.testing.assert_array_equal(array, np.arange(16, dtype=np.float32))
    assert not array.flags.writeable  # the model cannot scribble on the client's memory
    source[0] = 42.0  # the client's later write shows through: the array is the segment's memory
    assert array[0] == 42.0
    del array
    regions.close()


def test_a_view_outlives_the_unregistration_of_its_region(segment: shared_memory.SharedMemory) -> None:
    regions = SystemSharedMemory()
    regions.register("io", f"/{segment.name}", 0, 4096)
    array = read_input(regions, SharedMemoryReference("io", 0, 64), DataType.INT32, (16,), "INPUT0", "m")
    target = output_target(regions, SharedMemoryReference("io", 64, 64), "OUTPUT0")

    regions.unregister("io")  # a request still holds both: the mapping must stay
    assert regions.status() == []
    gc.collect()
    assert array.sum() == 0  # reading after unregister does not crash
    write_output(target, np.arange(16, dtype=np.int32), DataType.INT32, "OUTPUT0")
    np.testing.assert_array_equal(np.ndarray((16,), np.int32, buffer=segment.buf, offset=64), np.arange(16))
    del array, target
    gc.collect()


def test_an_output_larger_than_its_place_is_refused_before_writing(
    segment: shared_memory.SharedMemory,
) -> None:
    regions = SystemSharedMemory()
    regions.register("out", f"/{segment.name}", 0, 4096)
    target = output_target(regions, SharedMemoryReference("out", 0, 8), "OUTPUT0")
    with pytest.raises(InvalidArgumentError, match=r"should be at least 64 bytes.*region 'out'"):
        write_output(target, np.ones(16, np.float32), DataType.FP32, "OUTPUT0")
    assert bytes(segment.buf[:8]) == b"\0" * 8
    del target
    regions.close()


def test_the_number_of_regions_is_bounded(segment: shared_memory.SharedMemory) -> None:
    regions = SystemSharedMemory(max_regions=2)
    regions.register("a", segment.name, 0, 16)  # a key without its leading '/' is accepted too
    regions.register("b", segment.name, 16, 16)
    with pytest.raises(InvalidArgumentError, match=r"'c'.*2 regions are registered"):
        regions.register("c", segment.name, 32, 16)
    regions.unregister("a")
    regions.register("c", segment.name, 32, 16)
    regions.close()


@pytest.mark.parametrize("key", ["../etc/passwd", "/etc/passwd", "/..", "a/b", "", "/", "x" * 300, "/a\0b"])
def test_keys_that_are_not_shared_memory_names_are_refused(key: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"'r'.*not a POSIX shared memory name"):
        SystemSharedMemory().register("r", key, 0, 16)


def test_a_link_in_dev_shm_is_not_followed() -> None:
    name = f"coreserve-unit-link-{uuid.uuid4().hex[:8]}"
    os.symlink("/etc/hostname", f"/dev/shm/{name}")
    try:
        with pytest.raises(InvalidArgumentError, match="Unable to open shared memory region 'r'"):
            SystemSharedMemory().register("r", f"/{name}", 0, 1)
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_a_segment_truncated_after_registration_is_refused_not_read(
    segment: shared_memory.SharedMemory,
) -> None:
    """Reading a mapping past its file's end is SIGBUS: the registry checks the size first."""
    regions = SystemSharedMemory()
    regions.register("r", f"/{segment.name}", 0, 4096)
    os.truncate(f"/dev/shm/{segment.name}", 1024)
    with pytest.raises(InvalidArgumentError, match=r"region 'r'.*shrank to 1024 bytes"):
        regions.buffer("r", 0, 16)
    regions.close()


def test_an_output_is_written_to_the_file_of_a_segment_truncated_meanwhile(
    segment: shared_memory.SharedMemory,
) -> None:
    """A store through the mapping of a truncated file would be SIGBUS (this process killed)."""
    regions = SystemSharedMemory()
    regions.register("r", f"/{segment.name}", 1024, 64)
    target = output_target(regions, SharedMemoryReference("r", 0, 64), "OUTPUT0")
    os.truncate(f"/dev/shm/{segment.name}", 0)
    write_output(target, np.arange(16, dtype=np.int32), DataType.INT32, "OUTPUT0")
    with open(f"/dev/shm/{segment.name}", "rb") as written:
        written.seek(1024)
        np.testing.assert_array_equal(np.frombuffer(written.read(), np.int32), np.arange(16))
    del target
    regions.close()


def test_a_segments_file_closes_once_unregistered_and_no_writer_holds_it(
    segment: shared_memory.SharedMemory,
) -> None:
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    regions = SystemSharedMemory()
    regions.register("r", f"/{segment.name}", 0, 64)
    target = output_target(regions, SharedMemoryReference("r", 0, 64), "OUTPUT0")
    regions.unregister("r")
    gc.collect()
    assert open_files() == before + 1  # the writer's: the output still goes to the segment
    write_output(target, np.arange(16, dtype=np.int32), DataType.INT32, "OUTPUT0")
    del target
    gc.collect()
    assert open_files() == before
