"""The instances of a Python model load at once, as Triton's python backend has them loaded
(its backend attribute `parallel_instance_loading`; Triton's QA L0_lifecycle
`test_concurrent_model_instance_load_speedup`): each instance's `initialize` below waits until
every instance has begun, which instances loaded one after another never do."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import InProcessServer, ServerFactory
from support.waiting import wait_until

MODEL = """
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        self.name = args["model_instance_name"]
        (self.folder / "started").mkdir(exist_ok=True)
        (self.folder / "started" / self.name).write_text(str(os.getpid()))
        if self.name.endswith("_1") and (self.folder / "fail").exists():
            raise RuntimeError("instance 1 fails as asked")
        if self.name.endswith("_2") and (self.folder / "slow").exists():
            time.sleep(30)
        deadline = time.monotonic() + 30
        while len(list((self.folder / "started").iterdir())) < 3:
            if time.monotonic() > deadline:
                raise RuntimeError("the other instances did not begin while this one initialized")
            time.sleep(0.02)
        (self.folder / "initialized").mkdir(exist_ok=True)
        (self.folder / "initialized" / self.name).touch()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]

    def finalize(self):
        (self.folder / "finalized").mkdir(exist_ok=True)
        (self.folder / "finalized" / self.name).touch()
"""
CONFIG = 'backend: "python"\nmax_batch_size: 0\ninstance_group [ { count: 3 kind: KIND_CPU } ]\n'


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "together"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    return folder


def test_the_instances_of_a_python_model_load_at_once(folder: Path, coreserve_server: ServerFactory) -> None:
    server = coreserve_server(folder.parent, "--model-control-mode=explicit")
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.load_model("together")
        assert client.is_model_ready("together")
    assert sorted(path.name for path in (folder / "started").iterdir()) == [
        f"together_0_{k}" for k in range(3)
    ]


def test_an_instance_that_fails_fails_the_load_and_the_others_are_finalized(
    folder: Path, coreserve_server: ServerFactory
) -> None:
    (folder / "fail").touch()
    server = coreserve_server(folder.parent, "--model-control-mode=explicit")
    with httpclient.InferenceServerClient(server.http_url) as client:
        with pytest.raises(InferenceServerException, match="instance 1 fails as asked"):
            client.load_model("together")
        assert not client.is_model_ready("together")
        finalized = folder / "finalized"
        wait_until(
            lambda: finalized.is_dir() and len(list(finalized.iterdir())) == 2, "two instances finalized"
        )
        assert sorted(path.name for path in finalized.iterdir()) == ["together_0_0", "together_0_2"]
        (folder / "fail").unlink()
        for path in (folder / "started").iterdir():
            path.unlink()
        client.load_model("together")  # the server keeps serving loads
        assert client.is_model_ready("together")


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, not yet reaped, has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_load_cancelled_while_instances_load_leaves_no_stub_running(
    folder: Path, coreserve_server: ServerFactory
) -> None:
    """A client's deadline ends the load while instance 2 still initializes: the stubs of the
    instances created end at once (they ran on until the server stopped), and so does instance 2's."""
    (folder / "slow").touch()
    server = coreserve_server(folder.parent, "--model-control-mode=explicit")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.load_model("together", client_timeout=3)
        pids = [int(path.read_text() or 0) for path in (folder / "started").iterdir()]
        wait_until(lambda: not any(_running(pid) for pid in pids if pid), "every stub of the load ended", 20)
        assert not client.is_model_ready("together")


async def _until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the load did not get there in time"
        await asyncio.sleep(0.02)


def test_a_load_cancelled_again_while_it_closes_its_instances_still_closes_them(folder: Path) -> None:
    """A second cancellation that comes while a cancelled load closes the instances it created
    (a frontend that cancels once more, a server stopping) does not leave their stubs running."""
    (folder / "slow").touch()
    server = InProcessServer(folder.parent).start()
    assert server.dataplane is not None
    dataplane, started, initialized = server.dataplane, folder / "started", folder / "initialized"

    async def load_cancelled_twice() -> None:
        load = asyncio.ensure_future(dataplane.load_model("together", {}))
        await _until(lambda: initialized.is_dir() and len(list(initialized.iterdir())) == 2)
        await asyncio.sleep(0.5)  # instances 0 and 1 created (their replies read); 2 sleeps on
        load.cancel()
        slow = int((started / "together_0_2").read_text())
        await _until(lambda: not _running(slow))  # the cancelled load now closes instances 0 and 1
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load

    try:
        server.run(load_cancelled_twice())
        pids = [int(path.read_text()) for path in started.iterdir()]
        wait_until(lambda: not any(_running(pid) for pid in pids), "every stub of the load ended", 20)
        assert server.state("together")[0] != "READY"
    finally:
        server.stop()
