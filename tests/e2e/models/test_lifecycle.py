"""Start-up, shutdown, readiness, versions and instances of a real coreserve process."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import add_sub_model, scale_model, write_model
from support.waiting import requests_in, wait_until

ClientFactory = Callable[[ServerProcess], httpclient.InferenceServerClient]

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _scale_repository(repository: Path, policy: str = "") -> Path:
    """Model 'scaled' with versions 1, 2, 3 that multiply by 1, 2 and 3."""
    for version in (1, 2, 3):
        write_model(repository, "scaled", scale_model(float(version)), SCALE + policy, versions=(version,))
    return repository


def _scale(client: httpclient.InferenceServerClient, version: str = "") -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor], model_version=version).as_numpy("OUTPUT0")[0, 0])


def _env_with(*sites: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([*(str(s) for s in sites), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 3]),
        ("version_policy: { all: { } }", [1, 2, 3]),
        ("version_policy: { specific: { versions: [ 1, 3 ] } }", [1, 3]),
    ],
)
def test_version_policy(
    coreserve_server: ServerFactory,
    http_client: ClientFactory,
    tmp_path: Path,
    policy: str,
    served: list[int],
) -> None:
    server = coreserve_server(_scale_repository(tmp_path, policy))
    client = http_client(server)
    assert client.get_model_metadata("scaled")["versions"] == [str(v) for v in served]
    assert _scale(client) == served[-1]  # no version: the latest
    for version in served:
        assert _scale(client, str(version)) == version
    for version in {1, 2, 3} - set(served):
        with pytest.raises(InferenceServerException, match=f"'scaled' version {version} is not found"):
            _scale(client, str(version))


def test_specific_version_that_does_not_exist(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    _scale_repository(tmp_path, "version_policy: { specific: { versions: [ 4 ] } }")
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    client = http_client(server)
    with pytest.raises(InferenceServerException, match=r"asks for version\(s\) \[4\]"):
        client.get_model_metadata("scaled")


def test_exit_on_error_is_the_default(tmp_path: Path) -> None:
    write_model(tmp_path, "good", scale_model(1.0), SCALE)
    write_model(tmp_path, "broken", b"garbage", SCALE)
    server = ServerProcess([tmp_path])
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start()
    assert "onnxruntime cannot load" in server.log
    assert "exit-on-error" in server.log
    server.close()


def test_unavailable_model_does_not_stop_the_others(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    write_model(tmp_path, "good", scale_model(1.0), SCALE)
    write_model(tmp_path, "broken", b"garbage", SCALE)
    server = coreserve_server(tmp_path, "--exit-on-error=false", "--strict-readiness=false")
    client = http_client(server)
    assert client.is_server_ready()  # not strict: ready although 'broken' is not
    assert client.is_model_ready("good") and not client.is_model_ready("broken")
    assert "| broken" in server.log and "UNAVAILABLE" in server.log


def test_disable_auto_complete_config(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    write_model(tmp_path, "bare", scale_model(2.0), 'backend: "onnxruntime"')
    server = coreserve_server(tmp_path, "--exit-on-error=false", "--disable-auto-complete-config")
    client = http_client(server)
    assert not client.is_model_ready("bare")
    with pytest.raises(InferenceServerException, match="configuration does not list"):
        client.get_model_metadata("bare")


def test_model_without_config_is_found_by_its_file(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    write_model(tmp_path, "scaled", scale_model(5.0))
    server = coreserve_server(tmp_path)
    client = http_client(server)
    assert client.get_model_config("scaled")["max_batch_size"] == 4
    assert _scale(client) == 5.0


def test_several_repositories(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    write_model(tmp_path / "a", "scaled", scale_model(2.0), SCALE)
    write_model(tmp_path / "b", "other", scale_model(3.0), SCALE)
    write_model(tmp_path / "b", "scaled", scale_model(3.0), SCALE)  # duplicate name: refused
    server = coreserve_server([tmp_path / "a", tmp_path / "b"], "--exit-on-error=false")
    client = http_client(server)
    assert client.is_model_ready("other")
    with pytest.raises(InferenceServerException, match="appears in more than one repository"):
        client.get_model_metadata("scaled")


@pytest.mark.parametrize("flags", [[], ["--exit-on-error=false"]], ids=["default", "exit-on-error-false"])
def test_missing_repository_folder_fails_start(tmp_path: Path, flags: list[str]) -> None:
    # Even with --exit-on-error=false (Triton 2.51 keeps running, never live: docs/triton-differences.md).
    server = ServerProcess([tmp_path / "nowhere"], flags)
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start()
    assert "is not a folder" in server.log
    server.close()


@pytest.mark.parametrize("service", ["http", "grpc", "metrics"])
def test_a_port_in_use_fails_start_in_one_line(tmp_path: Path, service: str) -> None:
    write_model(tmp_path, "good", scale_model(1.0), SCALE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServerProcess([tmp_path], [f"--{service}-port={port}"])
        with pytest.raises(RuntimeError, match="exited with 1"):
            server.start()
    label = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}[service]
    assert f"failed to start {label} service" in server.log
    assert str(port) in server.log
    assert "Traceback" not in server.log
    assert "coreserve stopped" in server.log  # the models that had loaded were unloaded
    server.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signals_stop_cleanly(coreserve_server: ServerFactory, tmp_path: Path, signum: int) -> None:
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path)
    assert server.process is not None
    server.process.send_signal(signum)
    assert server.wait(timeout=30) == 0
    assert "coreserve stopped" in server.log


ECHO_SLOW = """
backend: "echo"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} }} ]
parameters {{ key: "delay_ms" value: {{ string_value: "400" }} }}
"""


@pytest.mark.parametrize("count", [1, 3])
def test_instances_run_requests_in_parallel(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path, count: int
) -> None:
    write_model(tmp_path, "slow", b"", ECHO_SLOW.format(count=count), filename="model.echo")
    server = coreserve_server(tmp_path, env=_env_with(echo_backend_site))

    def call(value: int, delay_ms: int = 0) -> int:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            parameters = {"delay_ms": delay_ms} if delay_ms else None
            return int(client.infer("slow", [tensor], parameters=parameters).as_numpy("OUT")[0])
        finally:
            client.close()

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(call, [1, 2, 3])) == [1, 2, 3]
    # A long request sent first: on one instance the short ones sent while it runs wait for
    # it (they end after it); on three they do not (they end while it runs). Asserted by the
    # order the answers came in, not by how long they took.
    with ThreadPoolExecutor(3) as pool:
        long = pool.submit(call, 4, 2000 if count == 1 else 5000)
        wait_until(lambda: requests_in(server.metrics_url, "slow") == 1, "the long request is in")
        short = [pool.submit(call, value) for value in (5, 6)]
        if count == 1:
            assert short[0].result(timeout=60) == 5
            assert long.done()
        else:
            assert [future.result(timeout=60) for future in short] == [5, 6]
            assert not long.done()
        assert long.result(timeout=60) == 4
        assert [future.result(timeout=60) for future in short] == [5, 6]


def test_third_party_backend_serves_and_passes_parameters(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    config = ECHO_SLOW.format(count=1).replace('"400"', '"0"')
    write_model(tmp_path, "echo_model", b"", config, filename="model.echo")
    server = coreserve_server(tmp_path, env=_env_with(echo_backend_site))
    client = http_client(server)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([42], np.int32))
    result = client.infer("echo_model", [tensor], parameters={"colour": "blue", "count": 3, "ok": True})
    assert result.as_numpy("OUT").tolist() == [42]
    assert result.get_response()["parameters"] == {"colour": "blue", "count": 3, "ok": True}
    assert client.get_model_config("echo_model")["backend"] == "echo"


def _coreserve_backends(env: dict[str, str]) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "coreserve", "backends"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
        timeout=60,
    )
    return completed.stdout + completed.stderr


def test_backends_command_lists_distributions(echo_backend_site: Path) -> None:
    output = _coreserve_backends(_env_with(echo_backend_site))
    lines = {line.split()[0]: line.split() for line in output.splitlines() if line.strip()}
    assert lines["onnxruntime"][1:] == ["onnxruntime_onnx", "plugin-onnx", "0.1.0"]
    assert lines["echo"][1:] == ["echo_platform", "coreserve-echo-backend", "0.1.0"]


def test_broken_plugin_is_reported_and_server_starts(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, broken_plugin_site: Path
) -> None:
    output = _coreserve_backends(_env_with(broken_plugin_site))
    assert "coreserve-broken-plugin 0.0.1" in output and "coreserve_missing_dependency" in output
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path, env=_env_with(broken_plugin_site))
    assert "from distribution coreserve-broken-plugin 0.0.1 failed to load" in server.log
    assert http_client(server).is_model_ready("scaled")


def test_blocked_plugin_is_not_loaded(echo_backend_site: Path) -> None:
    env = {**_env_with(echo_backend_site), "CORESERVE_BLOCKED_PLUGINS": "coreserve-echo-backend"}
    output = _coreserve_backends(env)
    assert "echo_platform" not in output and "onnxruntime" in output


def test_batch_of_rows_in_one_request(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    write_model(tmp_path, "add_sub", add_sub_model("FP32", ["batch", 4]), None)
    server = coreserve_server(tmp_path)
    client = http_client(server)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    inputs = [
        httpclient.InferInput("INPUT0", [3, 4], "FP32"),
        httpclient.InferInput("INPUT1", [3, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * a)


def test_fields_without_effect_are_logged(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    rate_limited = "instance_group [ { kind: KIND_CPU rate_limiter { priority: 1 } } ]"
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE + rate_limited)
    server = coreserve_server(tmp_path)
    expected = (
        "model 'scaled': instance_group.rate_limiter has no effect without --rate-limit=execution_count"
    )
    assert expected in server.log


def _slow_echo_server(
    coreserve_server: ServerFactory, tmp_path: Path, site: Path, delay_ms: int, *args: str
) -> ServerProcess:
    config = ECHO_SLOW.format(count=1).replace('"400"', f'"{delay_ms}"')
    write_model(tmp_path, "slow", b"", config, filename="model.echo")
    return coreserve_server(tmp_path, *args, env=_env_with(site))


def _echo_once(server: ServerProcess, value: int, model: str = "slow") -> int:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        return int(client.infer(model, [tensor]).as_numpy("OUT")[0])
    finally:
        client.close()


def test_sigterm_lets_requests_in_flight_finish(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    server = _slow_echo_server(coreserve_server, tmp_path, echo_backend_site, 1000)
    assert server.process is not None
    with ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(_echo_once, server, value) for value in (1, 2)]
        wait_until(lambda: requests_in(server.metrics_url, "slow") == 2, "both requests are in")
        server.process.send_signal(signal.SIGTERM)
        assert [future.result(timeout=30) for future in in_flight] == [1, 2]
    assert server.wait(timeout=30) == 0
    assert "coreserve stopped" in server.log


def test_a_request_that_comes_once_the_stop_began_is_refused_in_tritons_words(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    """As Triton (its QA L0_grpc_state_cleanup): the request taken before the stop finishes; one
    sent afterwards on the same gRPC stream is refused, not run (it was run)."""
    server = _slow_echo_server(coreserve_server, tmp_path, echo_backend_site, 1000)
    got = _stream_through_a_stop(server, [{"request_id": "before"}, {"request_id": "after"}])
    assert [int(result.as_numpy("OUT")[0]) for result, error in got if error is None] == [1]
    assert [error.message() for _, error in got if error is not None] == [  # (a stream's has no status)
        "[request id: after] Server is stopping, scheduler for model has stopped accepting new inference requests"
    ]
    assert server.wait(timeout=30) == 0


def test_a_sequence_under_way_ends_during_the_stop_and_a_new_one_is_refused(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    """As Triton's sequence batcher: only a new sequence is refused (without the request's id)."""
    config = ECHO_SLOW.format(count=1).replace('"400"', '"1000"') + "sequence_batching { }\n"
    write_model(tmp_path, "slow", b"", config, filename="model.echo")
    server = coreserve_server(tmp_path, env=_env_with(echo_backend_site))
    got = _stream_through_a_stop(
        server,
        [
            {"request_id": "r1", "sequence_id": 5, "sequence_start": True},
            {"request_id": "r2", "sequence_id": 5, "sequence_end": True},
            {"request_id": "r3", "sequence_id": 6, "sequence_start": True, "sequence_end": True},
        ],
    )
    assert sorted(int(result.as_numpy("OUT")[0]) for result, error in got if error is None) == [1, 2]
    assert [error.message() for _, error in got if error is not None] == [
        "Server is stopping, scheduler for model has stopped accepting new inference requests"
    ]
    assert server.wait(timeout=30) == 0


def _stream_through_a_stop(server: ServerProcess, requests: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """Sends requests to `slow` on one gRPC stream (IN: 1, 2, ...; `requests`: the rest of
    async_stream_infer's arguments), SIGTERM once the first runs; (result, error) of each."""
    assert server.process is not None
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value, arguments in enumerate(requests, start=1):
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            client.async_stream_infer("slow", [tensor], **arguments)
            if value == 1:
                wait_until(lambda: requests_in(server.metrics_url, "slow") == 1, "the first request runs")
                server.process.send_signal(signal.SIGTERM)
                wait_until(lambda: "signal received; stopping" in server.log, "the stop began", 10)
        return [answers.get(timeout=30) for _ in requests]
    finally:
        client.stop_stream()
        client.close()


TWICE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "slow" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "MID" } },
  { model_name: "slow" model_version: -1 input_map { key: "IN" value: "MID" } output_map { key: "OUT" value: "OUT" } }
] }
"""


def test_the_requests_a_running_request_makes_are_taken_during_the_stop(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    """An ensemble's second step, submitted once the stop began, still runs: the request the
    server took finishes (Triton refuses the step and fails it)."""
    write_model(tmp_path, "twice", None, TWICE)
    server = _slow_echo_server(coreserve_server, tmp_path, echo_backend_site, 1000)
    assert server.process is not None
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_echo_once, server, 7, "twice")
        wait_until(lambda: requests_in(server.metrics_url, "slow") == 1, "the first step runs")
        server.process.send_signal(signal.SIGTERM)
        assert answer.result(timeout=30) == 7
    assert server.wait(timeout=30) == 0


def test_exit_timeout_bounds_the_wait(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path
) -> None:
    # The request would run for an hour: a server that ends before this test's deadline was
    # ended by its exit timeout, which cut the request.
    server = _slow_echo_server(
        coreserve_server, tmp_path, echo_backend_site, 3_600_000, "--exit-timeout-secs=1"
    )
    assert server.process is not None
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(_echo_once, server, 1)
        wait_until(lambda: requests_in(server.metrics_url, "slow") == 1, "the request is in")
        server.process.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 1  # as Triton: an exit timeout that cut work is a failure
        assert "HTTP: 1 requests still running after 1.0s; closing" in server.log
        assert "failed to stop server: Internal - Exit timeout expired. Exiting immediately." in server.log
        with pytest.raises(Exception):  # noqa: B017 - the connection is cut; its kind depends on the client
            stuck.result(timeout=30)
