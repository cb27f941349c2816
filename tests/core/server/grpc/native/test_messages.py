"""The native gRPC server's message reader: messages cut right wherever the DATA bytes split."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coreserve.server.grpc.native._message_reader import MessageReader, MessageTooLarge


def _framed(messages: list[bytes]) -> bytes:
    return b"".join(struct.pack(">BI", 0, len(body)) + body for body in messages)


@settings(deadline=None, derandomize=True)  # (a stall of the machine is no failure)
@given(
    messages=st.lists(st.binary(max_size=300), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    stable=st.booleans(),
)
def test_messages_come_out_whole_whatever_the_split(
    messages: list[bytes], cuts: list[int], stable: bool
) -> None:
    wire = _framed(messages)
    points = sorted({0, len(wire), *(cut % (len(wire) + 1) for cut in cuts)})
    reader = MessageReader()
    out = []
    for start, end in itertools.pairwise(points):
        out += reader.feed(memoryview(wire)[start:end], stable, max_size=1000)
    assert out == [(False, body) for body in messages]
    assert not reader.inside_message


def test_a_prefix_over_the_limit_is_refused_before_its_bytes_come() -> None:
    reader = MessageReader()
    with pytest.raises(MessageTooLarge) as info:
        reader.feed(memoryview(struct.pack(">BI", 0, 2000)), False, max_size=1000)
    assert info.value.length == 2000


def test_a_half_message_is_reported_as_unfinished() -> None:
    reader = MessageReader()
    assert reader.feed(memoryview(_framed([b"abcdef"])[:7]), False, max_size=1000) == []
    assert reader.inside_message
