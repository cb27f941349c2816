"""Tensors written by one side's SegmentPool come back equal from the other side's SegmentReader.

Real shared memory segments (files in /dev/shm, mapped twice) and real inline blobs: every
layout a model may return (C or Fortran order, strided views, 0-d, empty, strings), alone and
in groups, small enough to go inline and large enough to need a segment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from coreserve_python.ipc import INLINE_LIMIT, SegmentPool, SegmentReader, segment_to_release, write_groups
from coreserve_python.ipc._segments import Segment

LARGE = INLINE_LIMIT // 4 + 1  # float32 elements: just over the inline limit


@pytest.fixture
def sides() -> Iterator[tuple[SegmentPool, SegmentReader]]:
    pool, reader = SegmentPool("test-ipc"), SegmentReader()
    yield pool, reader
    reader.close()
    pool.close()


def _round_trip(
    sides: tuple[SegmentPool, SegmentReader], arrays: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    pool, reader = sides
    blob, refs = pool.write(list(arrays.items()))
    read = reader.arrays(blob, refs, copy=True)
    if (name := segment_to_release(blob)) is not None:
        pool.release(name)
    return read


def _assert_same(read: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
    assert list(read) == list(arrays)
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype
        assert read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)


SMALL: dict[str, np.ndarray] = {
    "c_order": np.arange(12, dtype=np.float32).reshape(3, 4),
    "fortran_order": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
    "strided": np.arange(40, dtype=np.int16).reshape(5, 8)[::2, 1::3],
    "zero_d": np.array(7.5, dtype=np.float64),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "booleans": np.array([[True, False, True]]),
    "strings": np.array([b"a", b"", "\u00e9".encode()], dtype=np.object_),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_a_single_small_tensor_travels_inline_and_comes_back_equal(
    sides: tuple[SegmentPool, SegmentReader], name: str
) -> None:
    array = SMALL[name]
    blob, _ = sides[0].write([(name, array)])
    assert blob is None if array.size == 0 else isinstance(blob, bytearray)
    _assert_same(_round_trip(sides, {name: array}), {name: array})


def test_several_small_tensors_share_one_inline_blob(sides: tuple[SegmentPool, SegmentReader]) -> None:
    blob, refs = sides[0].write(list(SMALL.items()))
    assert isinstance(blob, bytearray)
    assert [ref[0] for ref in refs] == list(SMALL)
    _assert_same(_round_trip(sides, SMALL), SMALL)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(LARGE, dtype=np.float32),
        np.asfortranarray(np.arange(2 * LARGE, dtype=np.float32).reshape(2, LARGE)),
        np.arange(3 * LARGE, dtype=np.float32)[::3],
        np.arange(2 * LARGE, dtype=np.float32).reshape(LARGE, 2).T,
    ],
    ids=["c_order", "fortran_order", "strided", "transposed"],
)
def test_a_large_tensor_goes_through_a_segment_in_any_layout(
    sides: tuple[SegmentPool, SegmentReader], array: np.ndarray
) -> None:
    blob, _ = sides[0].write([("large", array)])
    assert isinstance(blob, str)
    sides[0].release(blob)
    arrays = {"large": array, **SMALL}  # small ones beside it share its segment
    _assert_same(_round_trip(sides, arrays), arrays)


def test_groups_keep_their_own_refs_in_one_blob(sides: tuple[SegmentPool, SegmentReader]) -> None:
    pool, reader = sides
    first = [("OUTPUT0", np.ones((1, 4), dtype=np.float32))]
    second = [("OUTPUT0", np.full((2, 2), 3, dtype=np.int32)), ("OUTPUT1", SMALL["strings"])]
    blob, grouped = write_groups(pool, [first, second])
    assert isinstance(blob, bytearray)
    _assert_same(reader.arrays(blob, grouped[0], copy=True), dict(first))
    _assert_same(reader.arrays(blob, grouped[1], copy=True), dict(second))


@pytest.mark.parametrize("owner", ["m" * 300 + "_0", "group/with spaces/ünïcode_0"])
def test_segments_of_an_owner_no_file_name_can_hold_are_written_and_read(owner: str) -> None:
    """An instance's name comes from its model's name (any length, any character) and its
    group's: its segments' file names stay short and plain, and two such owners never collide."""
    pools, reader = [SegmentPool(owner), SegmentPool(owner)], SegmentReader()
    try:
        array = np.arange(LARGE, dtype=np.float32)
        blobs = [pool.write([("x", array)])[0] for pool in pools]
        assert all(isinstance(blob, str) and len(blob.encode()) <= 100 and "/" not in blob for blob in blobs)
        assert blobs[0] != blobs[1]
        for pool in pools:
            _assert_same(_round_trip((pool, reader), {"x": array}), {"x": array})
    finally:
        reader.close()
        for pool in pools:
            pool.close()


def test_bytes_elements_that_are_not_bytes_travel_as_their_text_as_in_triton(
    sides: tuple[SegmentPool, SegmentReader],
) -> None:
    """Triton's pb_utils writes each element of an object array that is not bytes as its str()."""
    mixed = np.array([1, 10**6, True, 1.5, None, [1, 2], "é", b"\x00raw", bytearray(b"x")], dtype=np.object_)
    read = _round_trip(sides, {"mixed": mixed})["mixed"]
    assert read.tolist() == [
        b"1",
        b"1000000",
        b"True",
        b"1.5",
        b"None",
        b"[1, 2]",
        "é".encode(),
        b"\x00raw",
        b"bytearray(b'x')",
    ]


def test_a_segment_that_cannot_be_mapped_leaves_no_file_behind() -> None:
    # (mmap refuses an empty file; out of descriptors or memory, it refuses as well)
    path = Path("/dev/shm") / f"coreserve-test-unmapped-{os.getpid()}"
    with pytest.raises(ValueError):
        Segment(path, 0, create=True)
    assert not path.exists()
