"""A model's environment build (its requirements.txt, installed by pip in processes of their own)
never outlives its owner: a server stopped by SIGTERM while it builds exits within
--exit-timeout-secs and leaves no installer running; a worker killed while it builds takes its
installer with it (the supervisor ends what a dead worker left), and the server serves on.

The package the model needs is a source distribution whose setup.py sleeps for minutes, served
from a local folder (no package index), so that the build is under way whenever the test acts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tarfile
import threading
import urllib.request
from pathlib import Path

import pytest

from coreserve.testing import ServerProcess
from support.servers.worker_servers import start_workers, status_of, worker_pids, write_repository
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
EXIT_TIMEOUT_S = 5
SETUP_PY = "import time\ntime.sleep(600)\nfrom setuptools import setup\nsetup(name='coreserve-slow-dep', version='1.0')\n"
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
"""


def _slow_model(repository: Path, links: Path) -> dict[str, str]:
    """Writes model `slow` (its requirements name the slow package) and the package's sdist
    into `links`; returns the environment that has pip find it there alone."""
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(CONFIG)
    (repository / "slow" / "1" / "model.py").write_text(MODEL_PY)
    (repository / "slow" / "requirements.txt").write_text("coreserve-slow-dep==1.0\n")
    source = links / "source" / "coreserve-slow-dep-1.0"
    source.mkdir(parents=True)
    (source / "setup.py").write_text(SETUP_PY)
    with tarfile.open(links / "coreserve-slow-dep-1.0.tar.gz", "w:gz") as archive:
        archive.add(source, arcname="coreserve-slow-dep-1.0")
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_NO_BUILD_ISOLATION": "1",
            "UV_NO_BUILD_ISOLATION": "1"}  # fmt: skip


def _builders(cache: Path) -> dict[int, int]:
    """The processes that work on an environment in `cache` (a folder in it on their command
    line, as the server's own has the cache itself): pid -> parent pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if f"{cache}/".encode() in command:
                found[int(entry.name)] = parent
    return found


def _running(pids: set[int]) -> set[int]:
    """Those of `pids` that are still processes (zombies included, till reaped)."""
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def test_a_server_stopped_while_it_builds_exits_in_time_and_leaves_no_installer(tmp_path: Path) -> None:
    cache = tmp_path / "envs"
    env = _slow_model(tmp_path / "models", tmp_path / "links")
    server = ServerProcess(
        [tmp_path / "models"],
        [f"--python-env-cache-dir={cache}", f"--exit-timeout-secs={EXIT_TIMEOUT_S}"],
        env,
    )
    server.start(wait_for=[])  # its ports open once the model has loaded: never, here
    try:
        builders = wait_until(lambda: _builders(cache), "pip builds the model's environment")
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(EXIT_TIMEOUT_S + 5) == 0
        assert "signal received while starting; stopping" in server.log
        # pip and setup.py are gone (a killed one's zombie may wait a moment to be reaped)
        wait_until(lambda: not _running(set(builders)), "pip and setup.py gone", timeout=10)
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_a_worker_killed_while_it_builds_takes_its_installer_and_the_server_serves_on(tmp_path: Path) -> None:
    cache = tmp_path / "envs"
    repository = write_repository(tmp_path / "models")
    env = _slow_model(repository, tmp_path / "links")
    server = start_workers(
        repository, f"--python-env-cache-dir={cache}", f"--exit-timeout-secs={EXIT_TIMEOUT_S}", env=env
    )

    def load() -> None:  # answered only once the build ends: never, here
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/slow/load", method="POST"
        )
        with contextlib.suppress(OSError):
            urllib.request.urlopen(request, timeout=120).read()

    loading = threading.Thread(target=load, daemon=True)
    try:
        loading.start()
        # One worker builds (the other waits for the environment's lock): pip is its child.
        builders = wait_until(
            lambda: set(_builders(cache).values()) & set(worker_pids(server)), "a worker runs pip"
        )
        assert len(builders) == 1
        (builder,) = builders
        first = _builders(cache)
        os.kill(builder, signal.SIGKILL)
        wait_until(lambda: not _running(set(first)), "the dead worker's build is ended")
        wait_until(lambda: status_of(server, "GET", "/v2/models/add_sub/ready") == 200, "add_sub served")
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(EXIT_TIMEOUT_S + 15) == 0
        assert not _builders(cache)  # the other worker's build, which followed, is gone too
        assert "ended" in server.log and "Traceback" not in server.log
    finally:
        server.close()
