"""The gRPC codec's copy-saving paths: large raw inputs as views, outputs serialized once."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from coreserve.errors import InvalidArgumentError
from coreserve.protocol._grpc_codec import decode_model_infer_request
from coreserve.protocol.grpc_received import VIEW_RAW_CONTENTS_FROM, parse_model_infer_request
from coreserve.protocol.grpc_response import (
    _PLAIN_HEADERS,
    PLAIN_HEADERS,
    UNJOINED_BYTES,
    SerializedPieces,
    encode_model_infer_response,
    serialize_model_infer_response,
    serialize_model_stream_infer_response,
)
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import InferenceResponse


def _request(*arrays: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity", id="7")
    request.parameters["priority"].int64_param = 3
    for index, array in enumerate(arrays):
        tensor = request.inputs.add(name=f"INPUT{index}", datatype="FP32", shape=array.shape)
        tensor.parameters["note"].string_param = "x"
        request.raw_input_contents.append(array.tobytes())
    request.outputs.add(name="OUTPUT0")
    return request


def test_a_large_request_keeps_its_raw_contents_as_views_of_the_received_bytes() -> None:
    big = np.arange(VIEW_RAW_CONTENTS_FROM, dtype=np.float32)
    small = np.ones(3, np.float32)
    data = _request(big, small).SerializeToString()

    received = parse_model_infer_request(data)

    assert received.raw is not None and len(received.raw) == 2
    assert len(received.message.raw_input_contents) == 0
    assert [bytes(view) for view in received.raw] == [big.tobytes(), small.tobytes()]
    assert all(isinstance(view, memoryview) and view.obj is data for view in received.raw)
    # Everything but the raw contents is the message protobuf parses.
    whole = pb.ModelInferRequest.FromString(data)
    del whole.raw_input_contents[:]
    assert received.message == whole
    decoded, _ = decode_model_infer_request(received.message, None, received.raw)
    np.testing.assert_array_equal(decoded.inputs["INPUT0"], big)
    np.testing.assert_array_equal(decoded.inputs["INPUT1"], small)
    assert decoded.id == "7" and decoded.parameters == {"priority": 3}
    assert decoded.requested_outputs == ("OUTPUT0",)
    # The view is used as is where FP32 alignment allows; else copied once, to aligned memory.
    aligned = np.frombuffer(received.raw[0], np.float32).flags.aligned
    assert np.shares_memory(decoded.inputs["INPUT0"], np.frombuffer(data, np.uint8)) == aligned
    uint8 = _request(big)
    uint8.inputs[0].datatype = "UINT8"
    uint8.inputs[0].shape[:] = [big.nbytes]
    data = uint8.SerializeToString()
    received = parse_model_infer_request(data)
    array = decode_model_infer_request(received.message, None, received.raw)[0].inputs["INPUT0"]
    assert np.shares_memory(array, np.frombuffer(data, np.uint8))  # bytes are always aligned


def test_raw_contents_between_other_fields_keep_their_order() -> None:
    first = pb.ModelInferRequest(model_name="m")
    first.raw_input_contents.append(b"a" * VIEW_RAW_CONTENTS_FROM)
    second = pb.ModelInferRequest()
    second.inputs.add(name="INPUT0", datatype="UINT8", shape=[VIEW_RAW_CONTENTS_FROM])
    second.raw_input_contents.append(b"b")
    data = first.SerializeToString() + second.SerializeToString()  # concatenation merges messages

    received = parse_model_infer_request(data)

    assert received.raw is not None
    assert [bytes(view) for view in received.raw] == [b"a" * VIEW_RAW_CONTENTS_FROM, b"b"]
    assert received.message.model_name == "m" and received.message.inputs[0].name == "INPUT0"


def test_a_small_request_is_parsed_whole() -> None:
    data = _request(np.ones(4, np.float32)).SerializeToString()
    received = parse_model_infer_request(data)
    assert received.raw is None
    assert received.message == pb.ModelInferRequest.FromString(data)


@pytest.mark.parametrize(
    "tail",
    [
        b"\x3a\xff\xff\xff\x7f",  # raw contents longer than the data
        b"\x3a",  # a field with no length
        b"\xff" * 11,  # a key varint that never ends
        b"\x0b",  # a group, which this message has none of
    ],
)
def test_malformed_large_requests_raise_protobufs_decode_error(tail: bytes) -> None:
    data = _request(np.zeros(VIEW_RAW_CONTENTS_FROM, np.float32)).SerializeToString() + tail
    with pytest.raises(DecodeError):
        parse_model_infer_request(data)


@pytest.mark.parametrize(
    "outputs",
    [
        {"OUTPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)},
        {"BIG": np.arange(300_000, dtype=np.float64), "EMPTY": np.zeros((0, 3), np.int8)},
        {"TEXT": np.array([b"a", b"", b"xyz" * 50], dtype=np.object_), "T": np.ones((2, 2), np.float32).T},
        {},
    ],
)
def test_a_serialized_response_is_the_bytes_protobuf_writes(outputs: dict[str, np.ndarray]) -> None:
    response = InferenceResponse("m", "1", outputs, id="42", parameters={"sequence_end": True, "n": 3})
    serialized = _joined(serialize_model_infer_response(response))
    assert serialized == encode_model_infer_response(response).SerializeToString()
    parsed = pb.ModelInferResponse.FromString(serialized)
    assert [output.name for output in parsed.outputs] == list(outputs)
    assert len(parsed.raw_output_contents) == len(outputs)

    stream = pb.ModelStreamInferResponse.FromString(
        _joined(serialize_model_stream_infer_response(response, parameters={"triton_final_response": True}))
    )
    expected = encode_model_infer_response(response)
    expected.parameters["triton_final_response"].bool_param = True
    assert stream == pb.ModelStreamInferResponse(infer_response=expected)


def _joined(serialized: bytes | SerializedPieces) -> bytes:
    """A serialized message as bytes; large ones come in pieces, small ones joined."""
    if isinstance(serialized, SerializedPieces):
        assert serialized.size == sum(len(piece) for piece in serialized.pieces) >= UNJOINED_BYTES
        return serialized.joined()
    assert len(serialized) < UNJOINED_BYTES
    return serialized


def test_a_large_response_leaves_its_outputs_bytes_where_they_are() -> None:
    big = np.arange(300_000, dtype=np.float64)
    response = InferenceResponse("m", "1", {"BIG": big, "SMALL": np.ones(3, np.int32)})
    for serialized in (
        serialize_model_infer_response(response),
        serialize_model_stream_infer_response(response, parameters={"triton_final_response": True}),
    ):
        assert isinstance(serialized, SerializedPieces)
        views = [np.frombuffer(piece, np.uint8) for piece in serialized.pieces if len(piece) == big.nbytes]
        assert len(views) == 1 and np.shares_memory(views[0], big)  # a view of the output, not a copy


def test_a_plain_response_serializes_right_the_second_time_from_the_remembered_header() -> None:
    # Without parameters or shared memory, the header (everything but the raw contents) is
    # remembered by model, version, id and the outputs' names, datatypes and shapes.
    def response(data: np.ndarray, id: str = "") -> InferenceResponse:
        return InferenceResponse("m", "1", {"OUT": data, "TEXT": np.array([b"ab"], np.object_)}, id=id)

    answers = [
        response(np.arange(4, dtype=np.float32)),
        response(np.arange(4, 8, dtype=np.float32)),  # the same header, other bytes
        response(np.arange(4, dtype=np.int32)),  # another datatype, as many bytes
        response(np.arange(4, dtype=np.float32).reshape(2, 2)),  # another shape
        response(np.arange(4, dtype=np.float32), id="7"),
        response(np.arange(4, dtype=np.float32)),  # the first again
    ]
    for answer in answers:
        assert (
            serialize_model_infer_response(answer) == encode_model_infer_response(answer).SerializeToString()
        )


def test_the_remembered_headers_stay_bounded() -> None:
    for number in range(PLAIN_HEADERS + 10):  # ids that differ every time
        serialize_model_infer_response(InferenceResponse("m", "1", {"OUT": np.ones(2)}, id=str(number)))
        assert len(_PLAIN_HEADERS) <= PLAIN_HEADERS


def test_typed_bytes_contents_of_the_wrong_count_are_refused_in_tritons_words() -> None:
    request = pb.ModelInferRequest(model_name="ident")
    tensor = request.inputs.add(name="IN", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.append(b"only one")
    with pytest.raises(InvalidArgumentError) as info:
        decode_model_infer_request(request)
    assert (
        info.value.message
        == "[request id: <id_unknown>] expected 2 string elements for inference input 'IN' for model 'ident', got 1"
    )
