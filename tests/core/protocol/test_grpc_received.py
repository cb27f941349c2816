"""Requests that repeat their metadata are decoded from a template (protocol/grpc_received.py).

A request decoded from a template must be the request the full decode gives: the same inputs,
outputs and errors. Requests whose metadata is read per request are never templated.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from coreserve.errors import CoreserveError
from coreserve.protocol._grpc_codec import decode_model_infer_request
from coreserve.protocol.grpc_received import (
    _LEARN_PERIOD,
    TEMPLATES,
    RequestTemplates,
    parse_model_infer_request,
)
from coreserve.protocol.output_plan import OutputPlan
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import InferenceRequest

_models = itertools.count()


def _model() -> str:
    """A model name no other test used: the module's templates start afresh for it."""
    return f"templated-{next(_models)}"


def _message(model: str, values: list[float], shape: tuple[int, ...] = (1, 4)) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, model_version="2")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    message.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    message.outputs.add(name="OUTPUT0")
    message.raw_input_contents.append(np.array(values, np.float32).tobytes())
    message.raw_input_contents.append(len(b"hello").to_bytes(4, "little") + b"hello")
    return message


def _same(got: InferenceRequest, want: InferenceRequest) -> None:
    assert (got.model_name, got.model_version, got.id) == (want.model_name, want.model_version, want.id)
    assert (got.parameters, got.requested_outputs, got.class_counts) == (
        want.parameters,
        want.requested_outputs,
        want.class_counts,
    )
    assert got.inputs.keys() == want.inputs.keys()
    for name, array in want.inputs.items():
        assert got.inputs[name].dtype == array.dtype and got.inputs[name].shape == array.shape
        assert got.inputs[name].tolist() == array.tolist()


def _full(data: bytes) -> InferenceRequest:
    return decode_model_infer_request(pb.ModelInferRequest.FromString(data))[0]


def test_a_repeated_request_decodes_from_its_template_as_the_full_decode_does() -> None:
    model = _model()
    first = _message(model, [1, 2, 3, 4]).SerializeToString()
    assert parse_model_infer_request(first).template is None  # learned from it
    data = _message(model, [5, 6, 7, 8]).SerializeToString()

    received = parse_model_infer_request(data)

    assert received.template is not None
    decoded, plan = received.decode(None)
    _same(decoded, _full(data))
    assert decoded.inputs["INPUT0"].tolist() == [[5, 6, 7, 8]] and decoded.inputs["TEXT"].tolist() == [
        b"hello"
    ]
    assert plan == OutputPlan()
    decoded.parameters["mine"] = 1  # each request has its own parameters
    assert parse_model_infer_request(data).decode(None)[0].parameters == {}


def test_the_request_parameters_come_with_the_template_a_copy_for_each_request() -> None:
    model = _model()
    message = _message(model, [1, 2, 3, 4])
    message.parameters["triton_enable_empty_final_response"].bool_param = True  # perf_analyzer's
    message.parameters["priority"].int64_param = 2
    parse_model_infer_request(message.SerializeToString())
    data = message.SerializeToString()

    received = parse_model_infer_request(data)

    assert received.template is not None
    decoded = received.decode(None)[0]
    _same(decoded, _full(data))
    assert decoded.parameters.pop("triton_enable_empty_final_response") is True  # as the stream does
    assert parse_model_infer_request(data).decode(None)[0].parameters == {
        "triton_enable_empty_final_response": True,
        "priority": 2,
    }


def test_numbered_requests_share_a_template_and_keep_their_ids() -> None:
    model = _model()
    first = _message(model, [1, 2, 3, 4])
    first.id = "1"
    parse_model_infer_request(first.SerializeToString())
    for request_id in ("2", "", "é" * 200):  # another id, none, a long one
        message = _message(model, [5, 6, 7, 8])
        message.id = request_id
        data = message.SerializeToString()
        received = parse_model_infer_request(data)
        assert received.template is not None and received.request_id == request_id
        _same(received.decode(None)[0], _full(data))
    short = _message(model, [5, 6, 7])
    short.id = "42"
    with pytest.raises(CoreserveError, match=r"^\[request id: 42\] input byte size mismatch"):
        parse_model_infer_request(short.SerializeToString()).decode(None)
    data = _message(model, [5, 6, 7, 8]).SerializeToString()
    head = len(pb.ModelInferRequest(model_name=model, model_version="2").SerializeToString())
    bad = data[:head] + b"\x1a\x02\xff\xfe" + data[head:]  # an id that is not UTF-8, where ids go
    with pytest.raises(DecodeError):  # refused by protobuf's parser, as before templates
        parse_model_infer_request(bad)
    good = data[:head] + b"\x1a\x02ok" + data[head:]
    assert parse_model_infer_request(good).request_id == "ok"


def test_a_wrong_size_gets_the_full_decodes_error() -> None:
    model = _model()
    parse_model_infer_request(_message(model, [1, 2, 3, 4]).SerializeToString())
    data = _message(model, [1, 2, 3]).SerializeToString()  # 12 bytes for [1, 4]

    received = parse_model_infer_request(data)

    assert received.template is not None
    with pytest.raises(CoreserveError) as templated:
        received.decode(None)[0]
    with pytest.raises(CoreserveError) as full:
        _full(data)
    assert templated.value.message == full.value.message
    assert "input byte size mismatch for input 'INPUT0'" in templated.value.message


@pytest.mark.parametrize("variant", ["shared memory", "classification"])
def test_requests_whose_metadata_is_read_per_request_are_never_templated(variant: str) -> None:
    message = _message(_model(), [1, 2, 3, 4])
    if variant == "shared memory":
        message.inputs[0].parameters["shared_memory_region"].string_param = "nowhere"
    else:
        message.outputs[0].parameters["classification"].int64_param = 2
    data = message.SerializeToString()
    assert [parse_model_infer_request(data).template for _ in range(3)] == [None, None, None]


def test_a_request_that_goes_on_after_its_raw_entries_is_parsed_whole() -> None:
    model = _model()
    parse_model_infer_request(_message(model, [1, 2, 3, 4]).SerializeToString())
    more = pb.ModelInferRequest()
    more.outputs.add(name="OUTPUT1")  # after the raw entries: protobuf merges it into the message
    data = _message(model, [1, 2, 3, 4]).SerializeToString() + more.SerializeToString()

    received = parse_model_infer_request(data)

    assert received.template is None
    assert received.decode(None)[0].requested_outputs == ("OUTPUT0", "OUTPUT1")


def test_raw_entries_that_do_not_match_the_inputs_get_the_full_decodes_error() -> None:
    model = _model()
    parse_model_infer_request(_message(model, [1, 2, 3, 4]).SerializeToString())
    message = _message(model, [1, 2, 3, 4])
    del message.raw_input_contents[1]  # TEXT has no data
    data = message.SerializeToString()

    received = parse_model_infer_request(data)

    assert received.template is None
    with pytest.raises(CoreserveError, match="unable to find data for input tensor 'TEXT'"):
        received.decode(None)[0]


def test_learning_pauses_while_prefixes_keep_changing_and_resumes_later() -> None:
    templates = RequestTemplates()
    model = _model()

    def shaped(n: int) -> bytes:
        return _message(model, [0.0] * n, shape=(1, n)).SerializeToString()

    for n in range(1, 40):  # a new shape each time, never one seen before
        assert templates.match(shaped(n)) is None
        templates.learn(shaped(n), pb.ModelInferRequest.FromString(shaped(n)))
    learned = TEMPLATES + 1  # lessons allowed without a match
    assert templates.match(shaped(learned)) is not None
    assert templates.match(shaped(learned + 10)) is None  # seen after learning paused
    for _ in range(_LEARN_PERIOD):  # the period ends: learning resumes
        templates.match(b"")
    templates.learn(shaped(learned + 10), pb.ModelInferRequest.FromString(shaped(learned + 10)))
    assert templates.match(shaped(learned + 10)) is not None


_DTYPES = {"FP32": np.float32, "INT64": np.int64, "UINT8": np.uint8, "FP16": np.float16, "BOOL": np.bool_}


@settings(max_examples=60, deadline=None)
@given(
    datatype=st.sampled_from(sorted(_DTYPES)),
    shape=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    outputs=st.lists(st.sampled_from(["A", "B", "C"]), max_size=2, unique=True),
    seed=st.integers(0, 2**16),
    short=st.booleans(),
    priority=st.one_of(st.none(), st.integers(-2, 3)),
    ids=st.lists(st.text(max_size=4), min_size=2, max_size=2),
)
def test_any_templated_request_is_the_fully_decoded_one(
    datatype: str,
    shape: list[int],
    outputs: list[str],
    seed: int,
    short: bool,
    priority: int | None,
    ids: list[str],
) -> None:
    model = _model()
    rng = np.random.default_rng(seed)

    def message() -> bytes:
        request = pb.ModelInferRequest(model_name=model, id=ids.pop())
        if priority is not None:  # a negative one is refused, by both decodes
            request.parameters["priority"].int64_param = priority
        request.inputs.add(name="X", datatype=datatype, shape=shape)
        for name in outputs:
            request.outputs.add(name=name)
        data = (rng.integers(0, 2, size=shape) * 3).astype(_DTYPES[datatype]).tobytes()
        request.raw_input_contents.append(data[:-1] if short and data else data)
        return request.SerializeToString()

    parse_model_infer_request(message())
    data = message()
    received = parse_model_infer_request(data)
    refused = (short and int(np.prod(shape)) > 0) or (priority is not None and priority < 0)
    assert (received.template is not None) == (not refused)  # a bad first one teaches nothing
    try:
        want = _full(data)
    except CoreserveError as exc:
        with pytest.raises(CoreserveError) as got:
            received.decode(None)[0]
        assert got.value.message == exc.message
        return
    _same(received.decode(None)[0], want)


def test_a_request_with_raw_entries_among_its_other_fields_teaches_nothing() -> None:
    model = _model()
    whole = _message(model, [1, 2, 3, 4])
    first, rest = pb.ModelInferRequest(), pb.ModelInferRequest()
    first.model_name = model
    first.raw_input_contents.append(whole.raw_input_contents[0])  # before the inputs
    rest.CopyFrom(whole)
    rest.ClearField("model_name")
    del rest.raw_input_contents[0]
    data = first.SerializeToString() + rest.SerializeToString()

    received = [parse_model_infer_request(data) for _ in range(2)]

    assert [r.template for r in received] == [None, None]
    _same(received[1].decode(None)[0], _full(data))
