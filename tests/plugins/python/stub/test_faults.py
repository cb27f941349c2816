"""Faults of Python model stubs: crashes under load, stubs that cannot restart, hung models at
shutdown, a killed server, BLS faults inside the server, and slow environment unpacking."""

from __future__ import annotations

import io
import os
import random
import signal
import socket
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import coreserve
from coreserve.testing import ServerFactory, ServerProcess
from coreserve_python.ipc import Channel
from coreserve_python.server._process import StubLaunch
from coreserve_python.server._spawn import describe_exit, reap_blocking
from coreserve_python.server.env import _environment as environment
from support.waiting import wait_until

ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
# Echoes X; PID names the stub that answered. {init} and {execute} are inserted lines.
ECHO_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {init}

    def execute(self, requests):
        {execute}
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
            ])
            for r in requests
        ]
"""


def _echo_model(
    root: Path, name: str, *, init: str = "pass", execute: str = "pass", extra: str = "", config: str = ""
) -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(ECHO_MODEL.format(init=init, execute=execute) + extra)
    (root / name / "config.pbtxt").write_text(ECHO_CONFIG + config)


def _infer_http(client: httpclient.InferenceServerClient, model: str, value: float = 1.0) -> int:
    tensor = httpclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    result = client.infer(model, [tensor])
    assert result.as_numpy("Y").tolist() == [value]
    return int(result.as_numpy("PID")[0])


def _infer_grpc(client: grpcclient.InferenceServerClient, model: str, value: float = 1.0) -> int:
    tensor = grpcclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    result = client.infer(model, [tensor], client_timeout=30)
    assert result.as_numpy("Y").tolist() == [value]
    return int(result.as_numpy("PID")[0])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid:
            found.append(int(entry.name))
    return found


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) "


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a dead stub nobody has reaped yet)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


Connect = Callable[[ServerProcess], httpclient.InferenceServerClient]


@pytest.fixture
def http() -> Iterator[Connect]:
    """Opens HTTP clients to a server (one per thread); closes them after the test."""
    clients: list[httpclient.InferenceServerClient] = []

    def connect(server: ServerProcess) -> httpclient.InferenceServerClient:
        clients.append(httpclient.InferenceServerClient(server.http_url, network_timeout=60))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()


def test_stubs_killed_at_random_under_load_heal_and_other_models_lose_nothing(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    _echo_model(tmp_path, "victim", config="instance_group [ { count: 2 } ]")
    _echo_model(tmp_path, "bystander")
    server = coreserve_server(tmp_path)
    assert server.process is not None
    server_pid = server.process.pid
    stop = threading.Event()
    victim_pids: list[int] = []
    bystander: dict[str, list[str]] = {"ok": [], "failed": []}
    lock = threading.Lock()

    def load_victim(use_grpc: bool) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url) if use_grpc else http(server)
        while not stop.is_set():
            try:
                pid = _infer_grpc(client, "victim") if use_grpc else _infer_http(client, "victim")
                with lock:
                    victim_pids.append(pid)
            except InferenceServerException:
                time.sleep(0.01)  # the request was running in a killed stub: expected here

    def load_bystander(use_grpc: bool) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url) if use_grpc else http(server)
        count = 0
        while not stop.is_set():
            count += 1
            try:
                if use_grpc:
                    _infer_grpc(client, "bystander", float(count))
                else:
                    _infer_http(client, "bystander", float(count))
                bystander["ok"].append("ok")
            except Exception as exc:
                bystander["failed"].append(repr(exc))

    threads = [
        threading.Thread(target=load_victim, args=(False,)),
        threading.Thread(target=load_victim, args=(True,)),
        threading.Thread(target=load_bystander, args=(False,)),
        threading.Thread(target=load_bystander, args=(True,)),
    ]
    for thread in threads:
        thread.start()
    killed: set[int] = set()
    rng = random.Random(19)
    try:
        # 8 s of kills, longer (up to 40 s) where a slow machine restarts stubs too slowly for 4.
        started = time.monotonic()
        while time.monotonic() < started + 8 or (len(killed) < 4 and time.monotonic() < started + 40):
            time.sleep(rng.uniform(0.2, 0.7))
            with lock:
                candidates = [pid for pid in set(victim_pids[-20:]) if pid not in killed]
            # Only a live child of this server: a pid of a reaped stub may belong to anyone now.
            candidates = [pid for pid in candidates if _parent(pid) == server_pid and _running(pid)]
            if candidates:
                pid = rng.choice(candidates)
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert len(killed) >= 4, f"only {len(killed)} stubs were killed"
    assert server.process.poll() is None, server.log
    # The other model lost nothing, over either protocol.
    assert bystander["failed"] == [] and len(bystander["ok"]) > 20

    # The victim heals by itself: once the server has seen every kill and restarted each stub
    # (the requests a killed stub was running failed; those waiting behind them were queued
    # again), it is ready again and answers from stubs that were not killed.
    def every_kill_seen() -> bool:
        log = server.log
        crashes = log.count("exited unexpectedly (killed by SIGKILL)")
        return min(crashes, log.count("the stub was restarted")) >= len(killed)

    wait_until(every_kill_seen, "every killed stub noticed and restarted", 30)
    client = http(server)
    wait_until(lambda: client.is_model_ready("victim"), "victim ready again", 30)
    pids = {_infer_http(client, "victim") for _ in range(10)}
    assert not pids & killed and client.is_server_ready()
    log = server.log
    assert "skipping fork() handlers" not in log
    assert "exited unexpectedly (killed by SIGKILL)" in log and "the stub was restarted" in log
    assert "Traceback" not in log


def test_a_stub_that_cannot_restart_makes_the_model_unavailable_until_it_can(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    marker = tmp_path / "refuse-to-start"
    starts = tmp_path / "starts"  # a dot per initialize() the stubs of `fragile` began
    init = (
        f"open({str(starts)!r}, 'a').write('.'); "
        f"assert not os.path.exists({str(marker)!r}), 'the marker file forbids starting'"
    )
    _echo_model(tmp_path / "models", "fragile", init=init)
    _echo_model(tmp_path / "models", "steady")
    server = coreserve_server(tmp_path / "models")
    client = http(server)
    first = _infer_http(client, "fragile")
    assert starts.read_text() == "."  # the load's start, the only one so far
    marker.touch()
    os.kill(first, signal.SIGKILL)

    def fragile_entry() -> dict[str, str]:
        return next(e for e in client.get_model_repository_index() if e["name"] == "fragile")

    # Not ready from the crash on; UNAVAILABLE once the first restart has failed.
    wait_until(lambda: fragile_entry()["state"] == "UNAVAILABLE", "fragile reported unavailable", 15)
    assert not client.is_model_ready("fragile")
    ready_url = f"http://{server.http_url}/v2/health/ready"
    assert _status(ready_url) != 200 and client.is_model_ready("steady")
    entry = fragile_entry()
    assert "cannot be restarted" in entry["reason"] and "the marker file forbids starting" in entry["reason"]
    with pytest.raises(InferenceServerException, match="the marker file forbids starting") as info:
        _infer_http(client, "fragile")
    assert info.value.status() == "404"  # no available version, as Triton says it
    # Several restarts fail meanwhile (the first, then retries 0.1 s, 0.2 s, 0.4 s ... apart).
    wait_until(lambda: len(starts.read_text()) >= 1 + 4, "four restarts of fragile failed", 30)
    assert not client.is_model_ready("fragile") and fragile_entry()["state"] == "UNAVAILABLE"
    marker.unlink()
    wait_until(lambda: client.is_model_ready("fragile"), "fragile ready again by itself", 20)
    assert _infer_http(client, "fragile") != first
    assert _status(ready_url) == 200
    entry = next(e for e in client.get_model_repository_index() if e["name"] == "fragile")
    assert entry["state"] == "READY" and "reason" not in entry
    log = server.log
    assert log.count("restarting the stub failed") == 1  # logged once, though retried many times
    assert "the stub is running again" in log


def test_shutdown_kills_hung_models_within_the_exit_timeout(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    started = tmp_path / "executing"
    _echo_model(
        tmp_path / "models", "stuck_finalize", extra="\n    def finalize(self):\n        time.sleep(3600)\n"
    )
    execute = f"open({str(started)!r}, 'w').close(); time.sleep(3600)"
    _echo_model(tmp_path / "models", "stuck_execute", execute=execute)
    server = coreserve_server(tmp_path / "models", "--exit-timeout-secs=3")
    assert server.process is not None
    stubs = _children(server.process.pid)
    assert len(stubs) == 2
    errors: list[Exception] = []

    def call() -> None:
        try:
            _infer_http(http(server), "stuck_execute")
        except Exception as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(started.exists, "the request reached execute()", 15)
    server.process.send_signal(signal.SIGTERM)
    # The models hang for an hour: a server that ends before this test's deadline was ended by
    # its exit timeout, which cancelled both models' closes.
    code = server.process.wait(timeout=60)
    caller.join(timeout=30)
    assert code == 1, server.log  # the exit timeout cut work: as Triton, a failure
    log = server.log
    assert "HTTP: 1 requests still running after 3.0s; closing" in log  # the hung request
    for model in ("stuck_execute", "stuck_finalize"):
        assert f"model '{model}': 1 instances did not close within the exit timeout; cancelling them" in log
    assert "coreserve stopped" in log
    # Both stubs are stuck for an hour: only their server's end can end them.
    wait_until(lambda: not any(_running(pid) for pid in stubs), "no stub outlives the server")
    assert errors, "the hung request cannot have succeeded"


def test_the_segments_of_a_stub_that_died_are_unmapped_by_the_server(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    """A stub's output segment the server mapped goes with the stub: its file is gone, and a
    later stub given the same pid must never be read through the old mapping."""
    folder = tmp_path / "models" / "large" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(ECHO_MODEL.format(init="pass", execute="pass"))
    (folder.parent / "config.pbtxt").write_text(
        ECHO_CONFIG.replace("TYPE_FP32 dims: [ 1 ]", "TYPE_FP32 dims: [ 65536 ]")
    )
    server = coreserve_server(tmp_path / "models")
    assert server.process is not None
    client = http(server)

    def infer() -> int:  # 256 KiB each way: past the inline limit, through a segment
        tensor = httpclient.InferInput("X", [65536], "FP32")
        tensor.set_data_from_numpy(np.full(65536, 7, np.float32))
        result = client.infer("large", [tensor])
        assert (result.as_numpy("Y") == 7).all()
        return int(result.as_numpy("PID")[0])

    def mapped(stub: int) -> bool:
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()  # type: ignore[union-attr]
        return f"coreserve-stub-{stub}-" in maps

    first = infer()
    assert mapped(first)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not _running(first), "the stub died")
    second = infer()  # waits for the stub that replaces it
    assert second != first and mapped(second)
    assert not mapped(first)


def test_stubs_die_with_a_killed_server(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    started = tmp_path / "executing"
    execute = f"open({str(started)!r}, 'w').close(); time.sleep(3600)"
    _echo_model(tmp_path / "models", "busy", execute=execute, config="instance_group [ { count: 2 } ]")
    server = coreserve_server(tmp_path / "models")
    assert server.process is not None
    stubs = _children(server.process.pid)
    assert len(stubs) == 2
    errors: list[Exception] = []

    def call() -> None:
        try:
            _infer_http(http(server), "busy")
        except Exception as exc:  # the connection dies with the server
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(started.exists, "the request reached execute()", 15)
    server.process.kill()
    server.process.wait(timeout=10)
    try:  # one stub is busy for an hour, the other idle: only their server's end can end them
        wait_until(lambda: not any(_running(pid) for pid in stubs), "every stub died with its server")
    finally:
        for pid in filter(_running, stubs):  # a failed test leaves no stub behind
            os.kill(pid, signal.SIGKILL)
    caller.join(timeout=30)
    assert errors, "the request cannot have succeeded"


BLS_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="echo",
                inputs=[pb_utils.get_input_tensor_by_name(request, "X")],
                requested_output_names=["Y"],
            )
            # pb_utils refuses such a name (as Triton's bindings); set behind its back, it is
            # unhashable and the server trips over it: a fault of the server.
            call._model_name = ["not", "a", "name"]
            answer = call.exec()
            text = answer.error().message() if answer.has_error() else "no error"
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()], np.object_))]))
        return responses
"""
BLS_CALLER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_a_bls_request_that_fails_inside_the_server_is_answered(
    coreserve_server: ServerFactory, tmp_path: Path, http: Connect
) -> None:
    (tmp_path / "bls_fault" / "1").mkdir(parents=True)
    (tmp_path / "bls_fault" / "1" / "model.py").write_text(BLS_CALLER)
    (tmp_path / "bls_fault" / "config.pbtxt").write_text(BLS_CALLER_CONFIG)
    server = coreserve_server(tmp_path)
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
    try:
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        text = client.infer("bls_fault", [tensor]).as_numpy("TEXT")[0].decode()
    finally:
        client.close()
    assert "internal error of the server in a BLS request: TypeError" in text
    log = server.log
    assert log.count("a BLS request to ['not', 'a', 'name'] failed in the server") == 1
    assert log.count("Traceback") == 1


def _add_file(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    archive.addfile(info, io.BytesIO(data))


def test_unpacking_an_environment_leaves_the_server_responsive(tmp_path: Path) -> None:
    # Unpacking a real environment takes seconds: off the event loop, the server answers others
    # meanwhile. Driven in-process, the unpacking is held until health probes sent after it
    # began have been answered, then runs unchanged: on the loop, no probe could be answered
    # and the hold would give up.
    packed = tmp_path / "env.tar.gz"  # an environment whose python runs this one
    launcher = f'#!/bin/sh\nexec {sys.executable} "$@"\n'.encode()
    with tarfile.open(packed, "w:gz") as archive:
        _add_file(archive, "bin/python", launcher, mode=0o755)
        _add_file(archive, "lib/site-packages/filler.py", b"# filler\n")
    repository = tmp_path / "models"
    _echo_model(
        repository,
        "packed_env",
        config=f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{packed}" }} }}',
    )
    cache = tmp_path / "cache"
    unpacking, probes_answered = threading.Event(), threading.Event()
    held: list[bool] = []
    unpack = environment._unpacked

    def held_unpack(archive: Path, where: str) -> Path:
        unpacking.set()
        held.append(probes_answered.wait(timeout=60))
        return unpack(archive, where)

    with (
        pytest.MonkeyPatch.context() as patch,
        coreserve.Server(
            repository,
            model_control_mode="explicit",
            frontends=["http"],
            http_port=0,
            auto_complete_config=False,  # else the unpacking happens in auto-complete's thread
        ) as inprocess,
    ):
        patch.setattr(environment, "CACHE", cache)
        patch.setattr(environment, "_unpacked", held_unpack)
        address = f"127.0.0.1:{inprocess.ports['http']}"
        client = httpclient.InferenceServerClient(address, network_timeout=120)
        loaded: list[BaseException | None] = []

        def load() -> None:
            loader_client = httpclient.InferenceServerClient(address, network_timeout=120)
            try:
                loader_client.load_model("packed_env")
            except BaseException as exc:  # reported by the test
                loaded.append(exc)
            else:
                loaded.append(None)
            finally:
                loader_client.close()

        loader = threading.Thread(target=load)
        loader.start()
        try:
            assert unpacking.wait(timeout=60), "the environment was never unpacked"
            for _ in range(5):
                assert _status(f"http://{address}/v2/health/live") == 200
            assert not client.is_model_ready("packed_env")
            assert loader.is_alive() and not loaded  # its load waits for the unpacking
        finally:
            probes_answered.set()
            loader.join(timeout=120)
        assert loaded == [None]
        assert client.is_model_ready("packed_env")
        _infer_http(client, "packed_env")  # a stub of the unpacked environment answers
        client.close()
    assert held == [True]
    (complete,) = (cache / "envs").glob("*/.complete")
    assert (complete.parent / "lib" / "site-packages" / "filler.py").read_bytes() == b"# filler\n"


def test_a_busy_stub_ends_when_the_server_closes_its_socket(tmp_path: Path) -> None:
    """The portable watch, without the parent-death signal: this test plays the server."""
    started, returned = tmp_path / "executing", tmp_path / "returned"
    execute = f"open({str(started)!r}, 'w').close(); time.sleep(3600); open({str(returned)!r}, 'w').close()"
    _echo_model(tmp_path, "busy", execute=execute)
    ours, theirs = socket.socketpair()
    pid = StubLaunch(sys.executable).spawn(theirs)
    channel = Channel(ours)
    try:
        args = {"model_config": "{}", "model_name": "busy", "model_instance_name": "busy_0"}
        channel.send(
            {
                "op": "init",
                "id": 1,
                "model_file": str(tmp_path / "busy" / "1" / "model.py"),
                "args": args,
                "decoupled": False,
                "idle_spin_microseconds": 0,
            }
        )
        assert channel.receive() == {"op": "init_done", "reply_to": 1, "error": None}
        request = {
            "key": 0,
            "id": "",
            "inputs": [],
            "requested": [],
            "parameters": {},
            "correlation_id": 0,
            "flags": 0,
        }
        channel.send({"op": "execute", "model_name": "busy", "segment": None, "requests": [request]})
        wait_until(started.exists, "the stub runs execute()")
        assert _running(pid)  # busy in its model, its socket open
    finally:
        channel.close()
    # Killed by reap_blocking (SIGKILL) if it has not ended by itself: an hour-long execute()
    # cannot end it, only the closed socket can, while the model is still busy.
    code = reap_blocking(pid, timeout=60)
    assert code == 0, f"the stub ended {describe_exit(code)}"
    assert not returned.exists()  # execute() never returned: the socket's end ended the stub
