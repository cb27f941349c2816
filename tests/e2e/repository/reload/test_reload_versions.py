"""A reload loads again only the versions that changed, as Triton's does (its QA
L0_lifecycle `test_load_new_model_version`): a version whose files and configuration, but for
the version policy, are unchanged keeps serving in the same instances, with its statistics."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.waiting import wait_until

# Answers with the process id of the stub that runs it: the same id, the same instance.
PID_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        print(f"[PB model] Loading version {args['model_version']}", flush=True)

    def execute(self, requests):
        pid = np.array([os.getpid()], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""
FAILING_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this version never loads")
"""
CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _write_versions(model: Path, versions: tuple[int, ...], policy: str) -> None:
    for version in versions:
        (model / str(version)).mkdir(parents=True, exist_ok=True)
        (model / str(version) / "model.py").write_text(PID_MODEL)
    _set_policy(model, policy)


def _set_policy(model: Path, policy: str, extra: str = "") -> None:
    (model / "config.pbtxt").write_text(f"{CONFIG}version_policy: {policy}\n{extra}")


def _touch_later(path: Path) -> None:
    """Changes the file's time for sure (a clock's granularity could make a touch a no-op)."""
    path.touch()
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def _pid(client: httpclient.InferenceServerClient, version: int) -> int:
    tensor = httpclient.InferInput("IN", [1], "INT64")
    tensor.set_data_from_numpy(np.zeros(1, np.int64))
    return int(client.infer("pids", [tensor], model_version=str(version)).as_numpy("PID")[0])


def _inference_count(client: httpclient.InferenceServerClient, version: int) -> int:
    stats = client.get_inference_statistics("pids", str(version))["model_stats"]
    return int(stats[0]["inference_count"])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return tmp_path / "pids"


@pytest.fixture
def server(coreserve_server: ServerFactory, model: Path) -> ServerProcess:
    _write_versions(model, (1, 2, 3), "{ specific: { versions: [1, 2] } }")
    # Python writes its bytecode caches (`1/__pycache__`), which change no version.
    bytecode = {"PYTHONDONTWRITEBYTECODE": ""}
    return coreserve_server(model.parent, "--model-control-mode=explicit", "--load-model=pids", env=bytecode)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        yield client


def test_a_reload_loads_only_the_versions_that_changed(
    client: httpclient.InferenceServerClient, server: ServerProcess, model: Path
) -> None:
    before = {version: _pid(client, version) for version in (1, 2)}
    _pid(client, 1)
    assert server.log.count("successfully loaded 'pids'") == 1  # once a load, as Triton logs it
    assert (model / "1" / "__pycache__").is_dir()

    _touch_later(model / "2" / "model.py")
    shutil.copytree(model / "3", model / "4")
    _set_policy(model, "{ specific: { versions: [1, 2, 3, 4] } }")
    client.load_model("pids")

    assert all(client.is_model_ready("pids", str(version)) for version in (1, 2, 3, 4))
    assert _pid(client, 1) == before[1]  # the same stub: version 1 was not loaded again
    assert _pid(client, 2) != before[2]
    assert _inference_count(client, 1) == 3  # its statistics go on
    assert _inference_count(client, 2) == 1
    assert "model 'pids' version 1 is unchanged: it keeps serving" in server.log
    assert server.log.count("successfully loaded 'pids'") == 2
    wait_until(lambda: "successfully unloaded 'pids' version 2" in server.log, "the old version 2 unloads")
    assert "successfully unloaded 'pids' version 1" not in server.log
    assert server.log.count("[PB model] Loading version 1") == 1  # (the stub's print, as in Triton's QA)
    assert server.log.count("[PB model] Loading version 2") == 2

    # A file every version uses changed: every version loads again.
    kept = {version: _pid(client, version) for version in (1, 2, 3, 4)}
    _touch_later(model / "2" / "model.py")  # (and a version's own file, which changes nothing more)
    (model / "dummy_dependency.py").write_text("")
    client.load_model("pids")
    after = {version: _pid(client, version) for version in (1, 2, 3, 4)}
    assert all(after[version] != kept[version] for version in kept)
    assert _inference_count(client, 1) == 1

    # Only the version policy changed: version 4 stays, the others unload.
    _set_policy(model, "{ specific: { versions: [4] } }")
    client.load_model("pids")
    assert _pid(client, 4) == after[4]
    assert not any(client.is_model_ready("pids", str(version)) for version in (1, 2, 3))
    assert server.log.count("successfully loaded 'pids'") == 4
    wait_until(
        lambda: all(f"successfully unloaded 'pids' version {v}" in server.log for v in (1, 3)),
        "versions 1 and 3 unload",
    )


def test_a_configuration_change_loads_every_version_again(
    client: httpclient.InferenceServerClient, model: Path
) -> None:
    before = {version: _pid(client, version) for version in (1, 2)}
    _set_policy(
        model, "{ specific: { versions: [1, 2] } }", 'parameters { key: "x" value: { string_value: "y" } }'
    )
    client.load_model("pids")
    assert all(_pid(client, version) != before[version] for version in (1, 2))


def test_a_reload_that_fails_leaves_the_kept_version_serving(
    client: httpclient.InferenceServerClient, server: ServerProcess, model: Path
) -> None:
    before = {version: _pid(client, version) for version in (1, 2)}
    (model / "5").mkdir()
    (model / "5" / "model.py").write_text(FAILING_MODEL)
    _set_policy(model, "{ specific: { versions: [1, 2, 5] } }")
    with pytest.raises(InferenceServerException, match="this version never loads"):
        client.load_model("pids")
    assert "failed to load 'pids' version 5: " in server.log
    assert server.log.count("failed to load 'pids'\"") == 1  # once a load, after the reasons (Triton's)
    # The failed model closes in the background (at once: nothing of it serves), but not the
    # versions it had kept from the one that serves. Its close logs nothing to wait for.
    time.sleep(1.0)
    assert {version: _pid(client, version) for version in (1, 2)} == before
    assert "successfully unloaded 'pids' version 1" not in server.log
    assert "successfully unloaded 'pids' version 2" not in server.log
    assert not client.is_model_ready("pids", "5")
    # And the next reload still finds them unchanged.
    _set_policy(model, "{ specific: { versions: [1, 2] } }")
    client.load_model("pids")
    assert {version: _pid(client, version) for version in (1, 2)} == before


def test_a_poll_keeps_the_versions_already_served(coreserve_server: ServerFactory, model: Path) -> None:
    _write_versions(model, (1,), "{ all: {} }")
    server = coreserve_server(model.parent, "--model-control-mode=poll", "--repository-poll-secs=1")
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        first = _pid(client, 1)
        (model / "2").mkdir()
        (model / "2" / "model.py").write_text(PID_MODEL)
        wait_until(lambda: client.is_model_ready("pids", "2"), "the poll loads version 2", timeout=60)
        assert _pid(client, 1) == first
        assert _pid(client, 2) != first
