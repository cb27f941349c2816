"""Fuzzing the model control API: loads with generated configurations, over HTTP and gRPC.

A load whose configuration is wrong is a client error (the model keeps its last good
configuration, or stays unavailable with the reason); the server keeps serving the other
models and logs no traceback.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import tritonclient.http as httpclient
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.testing import ServerProcess
from fuzz_support import config_documents, json_values
from support.paths import EXAMPLES

# simple_string is the bystander: loaded at start, never touched, it must keep serving.
MODELS = ("simple", "simple", "ensemble_pipeline", "no_such_model", "..", "simple/1")


@pytest.fixture(scope="module")
def explicit_server() -> Iterator[ServerProcess]:
    server = ServerProcess(
        [EXAMPLES], ["--model-control-mode=explicit", "--load-model=simple", "--load-model=simple_string"]
    ).start(timeout=120)
    yield server
    server.close()


@st.composite
def load_configs(draw: st.DrawFn) -> Any:
    """What a load request carries as its "config": a configuration's JSON text (often
    renamed to the model it loads), or any JSON value."""
    document = draw(config_documents())
    if isinstance(document, dict) and draw(st.booleans()):
        document["name"] = "simple"
    return draw(st.just(json.dumps(document)) | json_values | st.text(max_size=20))


def _post(server: ServerProcess, path: str, body: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["HTTP"], timeout=120)
    try:
        connection.request("POST", path, body=body)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _simple_string_still_serves(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_live()
        assert client.is_model_ready("simple_string")
    finally:
        client.close()


def test_http_loads_with_generated_configs_get_4xx_or_load(explicit_server: ServerProcess) -> None:
    @given(st.sampled_from(MODELS), load_configs(), st.booleans())
    @example("simple", '{"name": "simple", "input": [{"name": "x", "data_type": 99, "dims": [1]}]}', False)
    def check(model: str, config: Any, unload_first: bool) -> None:
        if unload_first:
            status = _post(explicit_server, f"/v2/repository/models/{model}/unload", b"")
            assert status < 500, f"unload {model}: {status}"
        body = json.dumps({"parameters": {"config": config}}).encode()
        status = _post(explicit_server, f"/v2/repository/models/{model}/load", body)
        # A model not in the repository may be a 500, as Triton 2.51 answers it (a bad config is a 400 first).
        missing = model == "no_such_model" and status == 500
        assert status < 500 or missing, f"load {model} with {config!r}: {status}"
        _simple_string_still_serves(explicit_server)

    check()
    log = explicit_server.log
    assert "Traceback" not in log, log[-4000:]


def test_grpc_loads_with_generated_configs_never_get_unknown_or_internal(
    explicit_server: ServerProcess,
) -> None:
    with grpc.insecure_channel(explicit_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @given(st.sampled_from(MODELS), load_configs().filter(lambda c: isinstance(c, str)))
        def check(model: str, config: str) -> None:
            request = pb.RepositoryModelLoadRequest(
                model_name=model, parameters={"config": pb.ModelRepositoryParameter(string_param=config)}
            )
            try:
                stub.RepositoryModelLoad(request, timeout=120)
            except grpc.RpcError as exc:
                if model == "no_such_model" and exc.code() == grpc.StatusCode.INTERNAL:  # as Triton 2.51
                    assert "failed to poll from model repository" in exc.details()
                    return
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()

        check()
    _simple_string_still_serves(explicit_server)
    log = explicit_server.log
    assert "Traceback" not in log, log[-4000:]
