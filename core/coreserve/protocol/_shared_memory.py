"""Tensors that travel in shared memory (Triton's shared-memory extensions), for both codecs.

An input or a requested output whose parameters name `shared_memory_region` (with
`shared_memory_byte_size` and, optionally, `shared_memory_offset`) carries no data on the
wire: an input is read from the region, an output is written into it. The codecs reach the
regions through `SharedMemoryRegions`, an interface the server's registry implements, so that
this module stays free of I/O and HTTP and gRPC share it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from coreserve.errors import InvalidArgumentError, RequestMismatchError
from coreserve.protocol.tensors import array_from_bytes, array_to_bytes, element_count
from coreserve.types import DataType, ParameterValue

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = (REGION, BYTE_SIZE, OFFSET)


class SharedMemoryRegions(Protocol):
    """The registered regions, as the codecs see them."""

    def buffer(self, region: str, offset: int, byte_size: int) -> memoryview:
        """`byte_size` bytes at `offset` in `region`, read-only; raises NotFoundError or
        InvalidArgumentError. The view keeps the mapping alive: unregistering the region
        meanwhile is safe."""
        ...

    def output_writer(self, region: str, offset: int, byte_size: int) -> Callable[[memoryview], None]:
        """The call that writes an output's bytes (at most `byte_size`) at `offset` in `region`
        once they are ready; raises NotFoundError or InvalidArgumentError now for a place that
        does not exist."""
        ...


@dataclass(frozen=True, slots=True)
class SharedMemoryReference:
    """Where in which region a tensor's data lies."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class OutputInSharedMemory:
    """A requested output to be written into a region: the place, resolved when the request arrived."""

    reference: SharedMemoryReference
    write: Callable[[memoryview], None]


def shared_memory_reference(
    parameters: Mapping[str, ParameterValue], where: str
) -> SharedMemoryReference | None:
    """The reference that a tensor's parameters make, or None when they name no region."""
    region = parameters.get(REGION)
    if region is None:
        for key in (BYTE_SIZE, OFFSET):
            if key in parameters:
                raise InvalidArgumentError(f"{where} has parameter '{key}' but no '{REGION}'")
        return None
    if not isinstance(region, str) or not region:
        raise InvalidArgumentError(f"'{REGION}' of {where} must be a region name (a non-empty string)")
    values = []
    for key, default in ((OFFSET, 0), (BYTE_SIZE, None)):
        value = parameters.get(key, default)
        if value is None:
            raise InvalidArgumentError(f"{where} names shared memory region '{region}' but has no '{key}'")
        if type(value) is not int or value < 0:
            raise InvalidArgumentError(
                f"'{key}' of {where} (shared memory region '{region}') must be a non-negative integer"
            )
        values.append(value)
    return SharedMemoryReference(region, values[0], values[1])


def read_input(
    regions: SharedMemoryRegions | None,
    reference: SharedMemoryReference,
    datatype: DataType,
    shape: tuple[int, ...],
    name: str,
    model: str,
) -> np.ndarray:
    """The input as a read-only numpy view over the region (no copy, unless misaligned)."""
    return input_from_buffer(input_buffer(regions, reference, name), reference, datatype, shape, name, model)


def input_buffer(
    regions: SharedMemoryRegions | None, reference: SharedMemoryReference, name: str
) -> memoryview:
    """The bytes an input's reference names; raises if its region is unknown or too small.

    (Triton's gRPC frontend looks the region up while it finds each input's data, and checks
    the size against the input's shape only later: `input_from_buffer`.)
    """
    if regions is None:
        raise _no_shared_memory(reference, f"input '{name}'")
    return regions.buffer(reference.region, reference.offset, reference.byte_size)


def input_from_buffer(
    buffer: memoryview,
    reference: SharedMemoryReference,
    datatype: DataType,
    shape: tuple[int, ...],
    name: str,
    model: str,
) -> np.ndarray:
    """The input in `buffer` (from input_buffer) as a read-only numpy view."""
    if datatype is not DataType.BYTES:
        expected = element_count(shape) * datatype.numpy_dtype.itemsize
        if reference.byte_size != expected:  # Triton's words, then the region
            raise RequestMismatchError(
                f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
                f"got {reference.byte_size} ({BYTE_SIZE} in shared memory region '{reference.region}'; "
                f"{element_count(shape)} {datatype} elements of shape {list(shape)})"
            )
    return array_from_bytes(buffer, datatype, shape, name, model)


def output_target(
    regions: SharedMemoryRegions | None, reference: SharedMemoryReference, name: str
) -> OutputInSharedMemory:
    """Resolves where an output goes when the request arrives, so that a region unregistered
    while the model runs still receives the output instead of failing the request late."""
    if regions is None:
        raise _no_shared_memory(reference, f"output '{name}'")
    write = regions.output_writer(reference.region, reference.offset, reference.byte_size)
    return OutputInSharedMemory(reference, write)


def write_output(target: OutputInSharedMemory, array: np.ndarray, datatype: DataType, name: str) -> None:
    """Copies an output's wire bytes into its region; raises if they do not fit."""
    data = array_to_bytes(array, datatype)
    size = len(data) if isinstance(data, bytes) else data.nbytes
    if size > target.reference.byte_size:
        raise InvalidArgumentError(
            f"shared memory size specified with the request for output '{name}' "
            f"({target.reference.byte_size} bytes) should be at least {size} bytes to hold the results "
            f"(shared memory region '{target.reference.region}')"
        )
    target.write(memoryview(data).cast("B"))


def _no_shared_memory(reference: SharedMemoryReference, name: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{name} names shared memory region '{reference.region}', but this endpoint offers no shared memory"
    )
