"""The frames between a worker and worker 0 (`coreserve.server.workers._line_frames`), over a real
Unix socket pair: every datatype's tensors arrive as they left, requests and responses keep
their fields, an empty final response stays empty, and a frame past the limits is refused.
And the interface digest a request carries, which tells worker 0 what it was checked against."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from coreserve.config import parse_config
from coreserve.config.signature import ModelSignature
from coreserve.errors import InvalidArgumentError
from coreserve.repository.model import ModelVersion
from coreserve.scheduling import ModelStatistics
from coreserve.server.workers._line_frames import (
    MAX_HEADER_BYTES,
    Frame,
    Pieces,
    frame,
    read_frame,
    request_frame,
    request_from,
    response_frame,
    response_from,
    tensors_of,
)
from coreserve.types import InferenceRequest, InferenceResponse
from support.paths import TESTS


def _through_socket(pieces: list[Pieces]) -> list[Frame | None]:
    """The frames as the other end of a Unix socket reads them (and then the end)."""

    async def run() -> list[Frame | None]:
        one, two = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=one)
        reader, other = await asyncio.open_unix_connection(sock=two)
        for piece in pieces:
            writer.writelines(piece)
        writer.close()
        frames = [await read_frame(reader) for _ in range(len(pieces) + 1)]
        other.close()
        await asyncio.gather(writer.wait_closed(), other.wait_closed())
        return frames

    return asyncio.run(run())


TENSORS = {
    "fp32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "int64": np.array([[-1, 2**40]], dtype=np.int64),
    "bool": np.array([True, False, True]),
    "fp16": np.array([0.5, -2.0], dtype=np.float16),
    "bf16": np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16),
    "uint8": np.array([[[0, 255]]], dtype=np.uint8),
    "bytes": np.array([[b"a", b""], [b"\x00\xff", "text"]], dtype=object),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "strided": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
}


def test_every_datatype_arrives_as_it_left() -> None:
    received, end = _through_socket([frame({"n": 1}, TENSORS)])
    assert received is not None and end is None
    arrived = tensors_of(received)
    assert list(arrived) == list(TENSORS)
    for name, sent in TENSORS.items():
        assert arrived[name].shape == sent.shape, name
        if name == "bytes":
            assert arrived[name].tolist() == [[b"a", b""], [b"\x00\xff", b"text"]]
        else:
            assert arrived[name].dtype == sent.dtype, name
            np.testing.assert_array_equal(arrived[name], sent)


def test_a_request_and_its_responses_keep_their_fields() -> None:
    request = InferenceRequest(
        model_name="counter",
        inputs={"INPUT": np.array([[4]], dtype=np.int32)},
        model_version="",
        id="req-7",
        parameters={"sequence_id": 2**63 + 5, "sequence_start": True, "priority": 2, "tag": "x"},
        requested_outputs=("OUTPUT",),
        batch_size=1,
    )
    response = InferenceResponse("counter", "3", {"OUTPUT": np.array([[9]], np.int32)}, "req-7", {"p": 1.5})
    sent = [
        request_frame(12, request, 3, "0123456789abcdef"),
        response_frame(12, response, False),
        response_frame(12, None, True),
    ]
    received_request, received_response, empty_final, _ = _through_socket(sent)
    assert received_request is not None and received_response is not None and empty_final is not None
    assert received_request.header["interface"] == "0123456789abcdef"
    again = request_from(received_request)
    assert (again.model_name, again.model_version, again.id, again.batch_size) == ("counter", "3", "req-7", 1)
    assert again.parameters == request.parameters
    assert again.requested_outputs == ("OUTPUT",)
    np.testing.assert_array_equal(again.inputs["INPUT"], request.inputs["INPUT"])
    answer = response_from(received_response, "counter")
    assert (
        answer is not None and received_response.header["n"] == 12 and not received_response.header["final"]
    )
    assert (answer.model_version, answer.id, answer.parameters) == ("3", "req-7", {"p": 1.5})
    np.testing.assert_array_equal(answer.outputs["OUTPUT"], [[9]])
    assert empty_final.header["final"] and response_from(empty_final, "counter") is None


def test_all_outputs_are_asked_for_when_none_is_named() -> None:
    request = InferenceRequest(model_name="m", inputs={})
    (received, _) = _through_socket([request_frame(1, request, 1, "")])
    assert received is not None and request_from(received).requested_outputs is None


def test_a_frame_past_the_limits_is_refused() -> None:
    async def run() -> None:
        one, two = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=one)
        reader, other = await asyncio.open_unix_connection(sock=two)
        writer.write(struct.pack("!IQ", MAX_HEADER_BYTES + 1, 0))
        with pytest.raises(InvalidArgumentError, match="too large"):
            await read_frame(reader)
        writer.close()
        other.close()
        await asyncio.gather(writer.wait_closed(), other.wait_closed())

    asyncio.run(run())


def test_a_frame_cut_short_reads_as_the_end() -> None:
    pieces = frame({"n": 1}, {"x": np.ones(1000, np.float32)})
    cut: Pieces = [b"".join(bytes(piece) for piece in pieces)[:-10]]
    assert _through_socket([cut]) == [None, None]


def _interface_digest(config_text: str) -> str:
    config = parse_config(config_text)
    return ModelVersion("m", 1, config, ModelSignature(config), ModelStatistics("m", 1)).interface_digest


def test_the_interface_digest_tells_apart_only_what_requests_are_checked_against() -> None:
    """The digest a forwarded request carries: the same for two loads of one configuration,
    and for configurations that differ in how the model is run; not for other inputs,
    outputs, batch size or transaction policy."""
    base = """
    max_batch_size: 2
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    digest = _interface_digest(base)
    assert len(digest) == 16 and digest == _interface_digest(base)
    # Computed in another process (as each worker does), from the tensors listed in another order.
    two = base.replace(
        "dims: [ 1 ] } ]\n    output",
        'dims: [ 1 ] }, { name: "W" data_type: TYPE_FP32 dims: [ 3 ] } ]\n    output',
    )
    swapped = two.replace('{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "W" data_type: TYPE_FP32 dims: [ 3 ] }',
                          '{ name: "W" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "X" data_type: TYPE_INT32 dims: [ 1 ] }')  # fmt: skip
    assert swapped != two
    elsewhere = subprocess.run(
        [sys.executable, "-c", f"import {__name__} as t; print(t._interface_digest({swapped!r}))"],
        cwd=TESTS,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
    ).stdout.strip()
    assert elsewhere == _interface_digest(two) != digest
    assert digest == _interface_digest(base + "dynamic_batching { } instance_group [ { count: 3 } ]")
    for other in (
        base.replace("max_batch_size: 2", "max_batch_size: 4"),
        base.replace("dims: [ 1 ] } ]\n    output", "dims: [ 2 ] } ]\n    output"),
        base.replace('name: "Y"', 'name: "Z"'),
        base + "model_transaction_policy { decoupled: true }",
    ):
        assert _interface_digest(other) != digest, other
