"""Fuzzing the gRPC codec: generated ModelInferRequest messages and random message bytes."""

from __future__ import annotations

import copy

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from coreserve.protocol._grpc_codec import decode_model_infer_request
from coreserve.protocol.grpc_response import encode_model_infer_response
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.types import InferenceResponse
from fuzz_support import SIMPLE, client_error_or_answer, model_infer_requests


@given(model_infer_requests(model_names=("simple", "")))
def test_generated_messages_get_a_client_error_or_a_request(message: pb.ModelInferRequest) -> None:
    request = client_error_or_answer(lambda: decode_model_infer_request(message)[0])
    if request is None:
        return
    for array in request.inputs.values():
        assert isinstance(array, np.ndarray)
    client_error_or_answer(lambda: SIMPLE.check_request(copy.copy(request)))
    echo = InferenceResponse(model_name="m", model_version="1", outputs=dict(request.inputs), id=request.id)
    client_error_or_answer(lambda: encode_model_infer_response(echo))


@given(st.binary(max_size=200))
def test_random_message_bytes_get_a_client_error_or_a_request(data: bytes) -> None:
    try:
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return  # grpc's deserializer refuses it before coreserve sees it
    client_error_or_answer(lambda: decode_model_infer_request(message))
