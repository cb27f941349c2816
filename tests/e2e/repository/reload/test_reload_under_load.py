"""Reloading models while clients keep sending: no request fails, answers switch to the new model."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory, ServerProcess
from support.client_threads import ClientThreads
from support.model_builders import scale_model, write_model
from support.waiting import wait_until

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
MAX_SECONDS = 60.0


class ClientLoop(ClientThreads[float]):
    """Sends requests back to back on two threads, for a bounded time, recording every outcome."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(server.http_url, _scaled, seconds=MAX_SECONDS)

    def wait_for(self, value: float, timeout: float = 30.0) -> None:
        wait_until(lambda: self.last() == value, f"answers switch to {value}", timeout)


def _scaled(client: httpclient.InferenceServerClient) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0])


def _add_version(repository: Path, version: int) -> None:
    write_model(repository, "scaled", scale_model(float(version)), None, versions=(version,))


def _switches(answers: list[float]) -> list[float]:
    """The distinct answers in the order they appeared."""
    seen: list[float] = []
    for value in answers:
        if not seen or seen[-1] != value:
            seen.append(value)
    return seen


def _assert_switched_in_order(loop: ClientLoop) -> None:
    """Every version answered, and no client got an older version after a newer one."""
    assert sorted(set(loop.answers)) == [1.0, 2.0, 3.0, 4.0]
    for answers in loop.by_thread:
        switches = _switches(answers)
        assert switches == sorted(switches), switches


def _reload_several_times(server: ServerProcess, repository: Path, reload: Callable[[], None]) -> ClientLoop:
    with ClientLoop(server) as loop:
        loop.wait_for(1.0)
        for version in (2, 3, 4):
            _add_version(repository, version)
            reload()
            loop.wait_for(float(version))
        # Every client, not only the one that answered first, gets the last version.
        wait_until(lambda: all(4.0 in answers for answers in loop.by_thread), "every client gets version 4")
    return loop


def test_explicit_reloads_drop_no_request(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path, "--model-control-mode=explicit", "--load-model=scaled")
    control = httpclient.InferenceServerClient(server.http_url)
    try:
        loop = _reload_several_times(server, tmp_path, lambda: control.load_model("scaled"))
    finally:
        control.close()
    assert loop.failures == []
    assert len(loop.answers) > 50
    _assert_switched_in_order(loop)


def test_poll_mode_reloads_drop_no_request(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    loop = _reload_several_times(server, tmp_path, lambda: None)
    assert loop.failures == []
    _assert_switched_in_order(loop)
    assert "repository changes found for: scaled" in server.log


def test_poll_mode_notices_added_and_removed_models(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        write_model(tmp_path, "late", scale_model(5.0), SCALE)
        wait_until(lambda: _ready(client, "late"), "the added model is ready")
        assert client.is_model_ready("late")
        import shutil

        shutil.rmtree(tmp_path / "late")
        wait_until(lambda: not _ready(client, "late"), "the removed model is no longer ready")
        # A broken change is reported and the served version stays.
        (tmp_path / "scaled" / "config.pbtxt").write_text(SCALE + "max_batch_size: nonsense")
        wait_until(lambda: "did not reload" in server.log, "the broken change is reported")
        assert "model 'scaled' did not reload, the loaded version keeps serving" in server.log
        assert client.is_model_ready("scaled")
    finally:
        client.close()


def _ready(client: httpclient.InferenceServerClient, name: str) -> bool:
    try:
        return client.is_model_ready(name)
    except Exception:
        return False


@pytest.mark.parametrize("seconds", ["0", "-1"])
def test_poll_mode_without_a_positive_interval_does_not_poll(
    coreserve_server: ServerFactory, tmp_path: Path, seconds: str
) -> None:
    """As Triton: 0 (or less) is no polling, not polling without pause (the loop's CPU is the behaviour)."""
    write_model(tmp_path, "scaled", scale_model(1.0), SCALE)
    server = coreserve_server(tmp_path, "--model-control-mode=poll", f"--repository-poll-secs={seconds}")
    assert f"--repository-poll-secs={float(seconds):g}: the repository is not polled" in server.log
    before = _main_thread_cpu_s(server)
    time.sleep(1.0)
    assert _main_thread_cpu_s(server) - before < 0.3  # a loop polling without pause takes the whole second


def _main_thread_cpu_s(server: ServerProcess) -> float:
    assert server.process is not None
    pid = server.process.pid
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
