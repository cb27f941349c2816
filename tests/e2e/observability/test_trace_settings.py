"""The trace extension's settings: /v2/trace/setting, per model and global, and gRPC TraceSetting.

The answers, the inheritance of a model's setting from the global one, clearing with null and
the error texts are Triton 2.51's, taken from the real server (see each test). Where Triton
accepts nonsense (a negative rate wraps to 4294967295, an unknown level or key is silently
ignored), coreserve refuses it with a 400 and keeps the settings in force.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
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


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in ("scale", "other"):
        write_model(root, name, scale_model(2.0), SCALE)
    return root


def _get(server: ServerProcess, path: str) -> tuple[int, dict[str, object]]:
    status, _, body = request(server.http_url, "GET", path, b"")
    return status, json.loads(body)


def _post(server: ServerProcess, path: str, body: object) -> tuple[int, dict[str, object]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, reply = request(server.http_url, "POST", path, raw)
    return status, json.loads(reply)


def _expected(trace_file: Path, **changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(trace_file),
        "trace_mode": "triton",
    }
    return {**base, **changes}


@pytest.fixture
def traced(coreserve_server: ServerFactory, repository: Path, tmp_path: Path) -> tuple[ServerProcess, Path]:
    trace_file = tmp_path / "trace.json"
    server = coreserve_server(
        repository,
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
        "--trace-config",
        f"triton,file={trace_file}",
    )
    return server, trace_file


def test_a_model_setting_inherits_the_fields_it_does_not_set_and_null_clears(
    traced: tuple[ServerProcess, Path],
) -> None:
    """The sequence and answers of the real Triton 2.51 (same flags, same requests)."""
    server, trace_file = traced
    model = "/v2/models/scale/trace/setting"
    assert _get(server, "/v2/trace/setting") == (200, _expected(trace_file))
    assert _get(server, model) == (200, _expected(trace_file))
    # A model's own field: its answer changes, the global one does not.
    assert _post(server, model, {"trace_rate": "5"}) == (200, _expected(trace_file, trace_rate="5"))
    assert _get(server, "/v2/trace/setting") == (200, _expected(trace_file))
    assert _get(server, "/v2/models/other/trace/setting") == (200, _expected(trace_file))
    # A global change reaches the fields the model did not set, not the one it did.
    assert _post(server, "/v2/trace/setting", {"trace_count": "10"}) == (
        200,
        _expected(trace_file, trace_count="10"),
    )
    assert _get(server, model) == (200, _expected(trace_file, trace_rate="5", trace_count="10"))
    assert _post(server, "/v2/trace/setting", {"trace_rate": "7"})[0] == 200
    assert _get(server, model)[1]["trace_rate"] == "5"
    # null on a model's field: the model follows the global setting again.
    assert _post(server, model, {"trace_rate": None}) == (
        200,
        _expected(trace_file, trace_rate="7", trace_count="10"),
    )
    # null on a global field: back to its start-up value.
    assert _post(server, "/v2/trace/setting", {"trace_rate": None, "trace_count": None}) == (
        200,
        _expected(trace_file),
    )
    levels = {"trace_level": ["TIMESTAMPS", "TENSORS"]}
    assert _post(server, model, levels) == (200, _expected(trace_file, **levels))
    backwards = {"trace_level": ["TENSORS", "TIMESTAMPS"]}  # answered in Triton's order
    assert _post(server, model, backwards) == (200, _expected(trace_file, **levels))
    assert _post(server, model, {"trace_level": ["OFF"]}) == (200, _expected(trace_file, trace_level=["OFF"]))
    assert _post(server, model, {"trace_level": None}) == (200, _expected(trace_file))
    assert _post(server, "/v2/trace/setting", {"log_frequency": "2"}) == (
        200,
        _expected(trace_file, log_frequency="2"),
    )


BAD_CHANGES = [
    # (body, status, the error's text); Triton's words where Triton refuses it.
    ({"trace_rate": "0"}, 400, "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "-1"}, 400, "Unable to parse 'trace_rate'. Expecting value >= 0, got: -1"),
    (
        {"trace_rate": "99999999999"},
        400,
        "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
    ),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_count": "-5"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"),
    ({"log_frequency": "-1"}, 400, "Unable to parse 'log_frequency'. Expecting value >= 0, got: -1"),
    (
        {"trace_count": "10000000000"},
        400,
        "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000",
    ),
    (
        {"log_frequency": "10000000000"},
        400,
        "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 10000000000",
    ),
    ({"trace_level": ["BOGUS"]}, 400, "unknown trace level 'BOGUS' in 'trace_level'"),
    ({"trace_level": [1]}, 400, "expect a list of trace levels for 'trace_level'"),
    ({"trace_rate": True}, 400, "expect a string for 'trace_rate', got true"),
    (
        {"trace_file": "/tmp/elsewhere.json"},
        501,
        "trace file location can not be updated through network protocol",
    ),
    ({"trace_mode": "opentelemetry"}, 400, "trace_mode can be chosen at start-up only"),
    ({"bogus": "1"}, 400, "unknown trace setting 'bogus'"),
    # All or nothing: the good change beside a bad one is not applied either.
    ({"trace_rate": "3", "trace_count": "-5"}, 400, "Unable to parse 'trace_count'"),
    (b"{", 400, "malformed JSON in the trace settings"),
    (b"", 400, "malformed JSON in the trace settings"),
    (b"[]", 400, "the trace settings must be a JSON object"),
]


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/scale/trace/setting"])
def test_bad_changes_get_400_and_the_settings_in_force_stay(
    traced: tuple[ServerProcess, Path], path: str
) -> None:
    server, _ = traced
    assert _post(server, path, {"trace_count": "9"})[0] == 200
    before = _get(server, path)
    for body, status, message in BAD_CHANGES:
        answer = _post(server, path, body)
        assert answer[0] == status, (body, answer)
        assert message in str(answer[1]["error"]), (body, answer)
        assert _get(server, path) == before, body
    assert "Traceback" not in server.log


def test_an_unknown_model_is_refused_in_tritons_words(traced: tuple[ServerProcess, Path]) -> None:
    server, _ = traced
    expected = (400, {"error": "Request for unknown model : nosuch"})
    assert _get(server, "/v2/models/nosuch/trace/setting") == expected
    assert _post(server, "/v2/models/nosuch/trace/setting", {"trace_rate": "3"}) == expected


def test_grpc_trace_setting_reads_changes_and_clears_as_http_does(traced: tuple[ServerProcess, Path]) -> None:
    server, trace_file = traced
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:

        def values(answer: dict[str, object]) -> dict[str, object]:
            settings = answer["settings"]
            assert isinstance(settings, dict)
            return {key: entry["value"] for key, entry in settings.items()}

        expected = {
            key: value if isinstance(value, list) else [value] for key, value in _expected(trace_file).items()
        }
        assert values(client.get_trace_settings(as_json=True)) == expected
        changed = client.update_trace_settings(model_name="scale", settings={"trace_rate": "3"}, as_json=True)
        assert values(changed)["trace_rate"] == ["3"]
        assert _get(server, "/v2/models/scale/trace/setting")[1]["trace_rate"] == "3"
        assert values(client.get_trace_settings(as_json=True))["trace_rate"] == ["1"]
        levels = client.update_trace_settings(
            settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}, as_json=True
        )
        assert values(levels)["trace_level"] == ["TIMESTAMPS", "TENSORS"]
        # None (an empty value list on the wire) clears the model's field.
        cleared = client.update_trace_settings(
            model_name="scale", settings={"trace_rate": None}, as_json=True
        )
        assert values(cleared)["trace_rate"] == ["1"]
        for kwargs, code, message in [
            (
                {"settings": {"trace_rate": "0"}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "Attempting to set invalid trace setting :sample rate must be non-zero",
            ),
            (
                {"settings": {"trace_file": "x.json"}},
                grpc.StatusCode.UNIMPLEMENTED,
                "trace file location can not be updated through network protocol",
            ),
            (
                {"settings": {"trace_rate": ["1", "2"]}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "expect only 1 value for 'trace_rate'",
            ),
            (
                {"settings": {"trace_count": "-5"}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "Unable to parse 'trace_count'. Expecting value >= -1, got: -5",
            ),
            (
                {"settings": {"trace_count": "10000000000"}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000",
            ),
            (
                {"model_name": "nosuch", "settings": {"trace_rate": "2"}},
                grpc.StatusCode.INVALID_ARGUMENT,
                "Request for unknown model : nosuch",
            ),
        ]:
            with pytest.raises(InferenceServerException) as caught:
                client.update_trace_settings(**kwargs)
            assert caught.value.status() == str(code), kwargs
            assert caught.value.message() == message, kwargs
        assert values(client.get_trace_settings(as_json=True))["trace_count"] == ["-1"]
    finally:
        client.close()


def test_server_metadata_lists_trace_once(traced: tuple[ServerProcess, Path]) -> None:
    server, _ = traced
    status, metadata = _get(server, "/v2")
    assert status == 200
    extensions = metadata["extensions"]
    assert isinstance(extensions, list)
    assert extensions.count("trace") == 1


def test_tracing_is_off_by_default_with_tritons_defaults(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository)
    assert _get(server, "/v2/trace/setting") == (
        200,
        {
            "trace_level": ["OFF"],
            "trace_rate": "1000",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_file": "",
            "trace_mode": "triton",
        },
    )


def test_the_older_trace_flags_act(coreserve_server: ServerFactory, repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "old.json"
    server = coreserve_server(
        repository,
        f"--trace-file={trace_file}",
        "--trace-level=TIMESTAMPS",
        "--trace-level=TENSORS",
        "--trace-rate=5",
        "--trace-count=20",
        "--trace-log-frequency=3",
    )
    assert _get(server, "/v2/trace/setting") == (
        200,
        _expected(
            trace_file,
            trace_level=["TIMESTAMPS", "TENSORS"],
            trace_rate="5",
            trace_count="20",
            log_frequency="3",
        ),
    )
    assert "not built yet" not in server.log


def _start_fails(repository: Path, *args: str) -> str:
    """Runs coreserve with `args`; asserts it exits 1 at once; returns what it wrote."""
    command = [sys.executable, "-m", "coreserve", f"--model-repository={repository}", "--http-port=0"]
    command += ["--grpc-port=0", "--metrics-port=0", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    command += ["--metrics-address=127.0.0.1", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace-config", "level=LOUD"], "unknown trace level 'LOUD'"),
        (["--trace-config", "rate=-3"], "--trace-config 'rate=-3': expected 0 or more, got -3"),
        (["--trace-config", "count=many"], "'many' is not a whole number"),
        (["--trace-config", "mode=jaeger"], "unknown mode"),
        (["--trace-config", "triton,url=x"], "unknown setting 'url'"),
        (["--trace-config", "opentelemetry,resource=novalue"], "expected resource=KEY=VALUE"),
        (
            [
                "--trace-config",
                "opentelemetry,bsp_max_export_batch_size=10",
                "--trace-config",
                "opentelemetry,bsp_max_queue_size=5",
            ],
            "must not exceed bsp_max_queue_size",
        ),
    ],
)
def test_a_bad_trace_config_stops_start_up_with_the_reason(
    repository: Path, args: list[str], message: str
) -> None:
    assert message in _start_fails(repository, *args)


def test_an_unwritable_trace_file_stops_start_up_before_the_models_load(
    repository: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-folder" / "trace.json"
    output = _start_fails(
        repository, "--trace-config", "level=TIMESTAMPS", "--trace-config", f"triton,file={missing}"
    )
    assert f"cannot write the trace file '{missing}'" in output
    assert "Started HTTPService" not in output
