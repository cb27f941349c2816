"""The log flags and the logging extension: /v2/logging and gRPC LogSettings, as Triton's."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_model
from support.wire.http_raw import request

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWED] \d+ \S+\] ", re.MULTILINE)
DEFAULT_LINE = re.compile(r"^[IWED]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \S+\] ", re.MULTILINE)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in ("first", "second", "third"):
        write_model(root, name, scale_model(2.0), SCALE)
    return root


def _settings(server: ServerProcess) -> dict[str, object]:
    status, _, body = request(server.http_url, "GET", "/v2/logging", b"")
    assert status == 200
    return json.loads(body)


def _post(server: ServerProcess, body: bytes) -> tuple[int, dict[str, object]]:
    status, _, reply = request(server.http_url, "POST", "/v2/logging", body)
    return status, json.loads(reply)


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_log_flags_set_the_log_and_what_v2_logging_reports(
    coreserve_server: ServerFactory, repository: Path, tmp_path: Path
) -> None:
    log_file = tmp_path / "server.log"
    server = coreserve_server(
        repository,
        f"--log-file={log_file}",
        "--log-format=ISO8601",
        "--log-verbose=1",
        "--log-warning=false",
    )
    assert _settings(server) == {
        **DEFAULTS,
        "log_file": str(log_file),
        "log_warning": False,
        "log_verbose_level": 1,
        "log_format": "ISO8601",
    }
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.get_log_settings() == _settings(server)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.infer("first", [tensor])  # at verbose level 1, a request's lines are logged
    written = log_file.read_text()
    assert "Started HTTPService" in written and ISO_LINE.search(written)
    assert re.search(r"Z I \d+ \S+\] \"request for model 'first' version 1: received\"", written)  # verbose
    assert not DEFAULT_LINE.search(written)


def test_settings_change_at_run_time_and_shape_the_lines_that_follow(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit")
    assert _settings(server) == DEFAULTS
    assert DEFAULT_LINE.search(server.log)
    with httpclient.InferenceServerClient(server.http_url) as client:
        # Info lines off: loading a model says nothing.
        assert client.update_log_settings({"log_info": False}) == {**DEFAULTS, "log_info": False}
        before = server.log
        client.load_model("first")
        assert client.is_model_ready("first")
        assert "first" not in server.log[len(before) :]
        # ISO 8601 and info on again: the next load is logged in that form.
        client.update_log_settings({"log_info": True, "log_format": "ISO8601"})
        before = server.log
        client.load_model("second")
        assert _wait_for(lambda: ISO_LINE.search(server.log[len(before) :]) is not None)
        assert not DEFAULT_LINE.search(server.log[len(before) :])
    assert _settings(server) == {**DEFAULTS, "log_format": "ISO8601"}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "malformed JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"bogus": true}', "unknown log setting 'bogus'"),
        (b'{"log_info": "true"}', "expect boolean for 'log_info', got 'true'"),
        (b'{"log_error": 1}', "expect boolean for 'log_error', got 1"),
        (b'{"log_warning": null}', "expect boolean for 'log_warning', got null"),
        (b'{"log_verbose_level": -1}', "expect int32 for 'log_verbose_level', got -1"),
        (b'{"log_verbose_level": 1.5}', "expect int32 for 'log_verbose_level', got 1.5"),
        (b'{"log_verbose_level": true}', "expect int32 for 'log_verbose_level', got true"),
        (b'{"log_verbose_level": 4294967296}', "expect int32 for 'log_verbose_level', got 4294967296"),
        (
            b'{"log_format": "json"}',
            "invalid argument for log_format, got: json (expected default or ISO8601)",
        ),
        (b'{"log_format": 1}', "expect string for 'log_format', got 1"),
        (b'{"log_verbose_level": 2, "log_info": "no"}', "expect boolean for 'log_info'"),  # all or nothing
    ],
)
def test_bad_settings_are_refused_and_the_previous_ones_stay(
    coreserve_server: ServerFactory, repository: Path, body: bytes, reason: str
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--log-verbose=0")
    status, reply = _post(server, body)
    assert status == 400 and reason in str(reply["error"])
    assert _settings(server) == DEFAULTS
    assert "Traceback" not in server.log
    assert request(server.http_url, "GET", "/v2/health/live", b"")[0] == 200


def test_the_log_file_cannot_be_moved_over_the_network(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit")
    status, reply = _post(server, json.dumps({"log_file": "/tmp/elsewhere.log"}).encode())
    assert status == 501  # Triton 2.51's answer, with its words
    assert reply["error"] == "log file location can not be updated through network protocol"
    assert _settings(server) == DEFAULTS


def test_grpc_log_settings(coreserve_server: ServerFactory, repository: Path) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--log-error=false")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        settings = client.get_log_settings(as_json=True)["settings"]
        assert settings["log_error"] == {"bool_param": False}
        assert settings["log_verbose_level"] == {"uint32_param": 0}
        assert settings["log_format"] == {"string_param": "default"}
        updated = client.update_log_settings({"log_verbose_level": 2, "log_error": True}, as_json=True)
        assert updated["settings"]["log_verbose_level"] == {"uint32_param": 2}
        assert updated["settings"]["log_error"] == {"bool_param": True}

        def refused(key: str, field: str, value: object) -> grpc.RpcError:
            message = service_pb2.LogSettingsRequest()
            setattr(message.settings[key], field, value)
            with pytest.raises(grpc.RpcError) as info:
                stub.LogSettings(message, timeout=10)
            return info.value

        error = refused("log_info", "uint32_param", 1)
        assert (
            error.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "expect boolean for 'log_info'" in error.details()
        )
        error = refused("log_verbose_level", "string_param", "2")  # Triton's words, then what came
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("expect int32 for 'log_verbose_level'")
        error = refused("log_format", "string_param", "json")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("invalid argument for log_format, got: json")
        error = refused("log_format", "bool_param", True)
        assert error.details().startswith("expect string for 'log_format'")
        error = refused("colour", "bool_param", True)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown log setting" in error.details()
        error = refused("log_file", "string_param", "/tmp/elsewhere.log")
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        after = client.get_log_settings(as_json=True)["settings"]
        assert after["log_verbose_level"] == {"uint32_param": 2} and after["log_error"] == {
            "bool_param": True
        }
    finally:
        channel.close()
        client.close()


def test_an_unwritable_log_file_stops_the_start_clearly(repository: Path, tmp_path: Path) -> None:
    server = ServerProcess([repository], [f"--log-file={tmp_path / 'missing' / 'server.log'}"])
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start()
    assert "cannot write the log file" in server.log and "No such file or directory" in server.log
    assert "Traceback" not in server.log
    server.close()


def test_the_logging_category_can_be_restricted(coreserve_server: ServerFactory, repository: Path) -> None:
    server = coreserve_server(
        repository,
        "--model-control-mode=explicit",
        "--http-restricted-api=logging:admin-key=secret",
        "--grpc-restricted-protocol=logging:admin-key=secret",
    )
    assert request(server.http_url, "GET", "/v2/logging", b"")[0] == 403
    status, _, _ = request(server.http_url, "POST", "/v2/logging", b'{"log_verbose_level": 1}')
    assert status == 403 and _settings_with_key(server)["log_verbose_level"] == 0
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.get_log_settings()
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        secret = {"triton-grpc-protocol-admin-key": "secret"}
        client.update_log_settings({"log_verbose_level": 1}, headers=secret)
    finally:
        client.close()
    assert _settings_with_key(server)["log_verbose_level"] == 1


def _settings_with_key(server: ServerProcess) -> dict[str, object]:
    status, _, body = request(server.http_url, "GET", "/v2/logging", b"", headers={"admin-key": "secret"})
    assert status == 200
    return json.loads(body)


def test_verbose_levels_follow_requests(coreserve_server: ServerFactory, repository: Path) -> None:
    server = coreserve_server(repository)

    def infer(request_id: str) -> str:
        before = len(server.log)
        with httpclient.InferenceServerClient(server.http_url) as client:
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.infer("first", [tensor], request_id=request_id)
        _wait_for(lambda: f"'{request_id}'" in server.log[before:], timeout=2.0)
        return server.log[before:]

    assert "'quiet'" not in infer("quiet")  # level 0: nothing per request
    _post(server, b'{"log_verbose_level": 1}')
    lines = infer("lifecycle")
    assert "request 'lifecycle' for model 'first' version 1: received" in lines
    assert "request 'lifecycle' for model 'first' version 1: answered" in lines
    assert "inputs [" not in lines
    _post(server, b'{"log_verbose_level": 2}')
    lines = infer("detailed")
    assert "request 'detailed' for model 'first' version 1: inputs [INPUT0 float32 [1, 4]]" in lines
