"""A server of workers on an operator's bad day: a worker that hangs (SIGSTOP), is killed while
it hangs, or dies while the repository on disk has changed. The server never splits its state
or stops: the others serve and take changes, a hung worker is killed and started again, and
ready tells the truth. Each test asserts states and counts, not timings."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.utils.shared_memory as shm

from coreserve.testing import ServerProcess
from support.model_builders import ENSEMBLE_OF_SCALE, scale_model, write_model
from support.servers.worker_servers import (
    ADD_BODY,
    CONNECTIONS,
    SCALE_CONFIG,
    answer_of,
    free_port,
    start_workers,
    status_of,
    urlopen_text,
    worker_index,
    worker_of,
    worker_pids,
    write_repository,
)
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
HEARTBEAT_TIMEOUT = "--worker-heartbeat-timeout-secs=2"


@pytest.fixture
def region() -> Iterator[str]:
    """A POSIX shared-memory segment of 64 bytes: its key."""
    key = f"/coreserve-faults-{os.getpid()}"
    handle = shm.create_shared_memory_region("faults", key, 64)
    yield key
    shm.destroy_shared_memory_region(handle)


def _worker_0(server: ServerProcess) -> int:
    return next(pid for pid in worker_pids(server) if worker_index(pid) == 0)


def _connection_to_another_worker(server: ServerProcess, worker_pid: int) -> http.client.HTTPConnection:
    """A kept-alive connection, answered once, that a worker other than process `worker_pid` holds."""
    host, port = server.http_url.split(":")
    for _ in range(64):  # (the kernel spreads new connections over the workers)
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        connection.request("GET", "/v2/health/live")
        connection.getresponse().read()
        if worker_of(server, connection) not in (worker_pid, None):
            return connection
        connection.close()
    raise AssertionError(f"no connection reached a worker other than process {worker_pid}")


def _close(connections: list[http.client.HTTPConnection]) -> None:
    for connection in connections:
        connection.close()


def _register(connection: http.client.HTTPConnection, key: str, answers: list[int]) -> None:
    body = json.dumps({"key": key, "offset": 0, "byte_size": 64})
    connection.request("POST", "/v2/systemsharedmemory/region/during_stall/register", body=body)
    response = connection.getresponse()
    response.read()
    answers.append(response.status)


def _every_worker_serves(server: ServerProcess, key: str) -> None:
    """Every connection: ready, the add model answers, the region is there."""
    wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "every worker ready", timeout=120)
    assert {status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) for _ in range(CONNECTIONS)} == {
        200
    }
    for _ in range(CONNECTIONS // 2):
        status, body = answer_of(server, "GET", "/v2/systemsharedmemory/status")
        assert status == 200 and key.encode() in body


def test_a_hung_worker_is_killed_and_started_again_while_the_others_serve_and_take_changes(
    tmp_path: Path, region: str
) -> None:
    server = start_workers(write_repository(tmp_path / "models"), HEARTBEAT_TIMEOUT)
    connections: list[http.client.HTTPConnection] = []
    try:
        hung = _worker_0(server)
        connections = [_connection_to_another_worker(server, hung)]
        os.kill(hung, signal.SIGSTOP)
        try:
            # A change asked of the live worker while worker 0 is stopped: answered once worker 0
            # is declared hung.
            answers: list[int] = []
            _register(connections[0], region, answers)
            assert answers == [200]
            # The supervisor killed it (and reaps it in a moment: a zombie is still its child).
            wait_until(lambda: hung not in worker_pids(server), "the hung worker killed and reaped", 10)
            # Until it serves again, the server says it is not ready; the live worker answers.
            assert status_of(server, "GET", "/v2/health/ready") == 400
            assert status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) == 200
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGCONT)
        _every_worker_serves(server, region)  # the new worker 0 made the change too
        assert len(worker_pids(server)) == 2
        assert "worker 0 has not answered for 2 s: it is hung; killing it" in server.log
        assert "Traceback" not in server.log
    finally:
        _close(connections)
        server.close()


def test_a_worker_killed_while_it_hangs_is_replaced_and_the_change_waiting_on_it_ends(
    tmp_path: Path, region: str
) -> None:
    """The relay of a change never holds up the restart of the worker it waits for."""
    server = start_workers(write_repository(tmp_path / "models"), "--worker-heartbeat-timeout-secs=60")
    connections: list[http.client.HTTPConnection] = []
    hung = 0
    try:
        hung = _worker_0(server)
        connections = [_connection_to_another_worker(server, hung)]
        os.kill(hung, signal.SIGSTOP)
        answers: list[int] = []
        registering = threading.Thread(target=_register, args=(connections[0], region, answers))
        registering.start()
        time.sleep(1.0)  # for the change to reach the supervisor, which waits on worker 0
        assert registering.is_alive()
        os.kill(hung, signal.SIGKILL)
        registering.join(120)
        assert answers == [200]
        _every_worker_serves(server, region)
        assert hung not in worker_pids(server) and len(worker_pids(server)) == 2
        assert "Traceback" not in server.log
    finally:
        if hung:  # a failure before the kill must not leave a stopped worker that the stop waits for
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGCONT)
        _close(connections)
        server.close()


def _inference_count(server: ServerProcess) -> int:
    status, body = answer_of(server, "GET", "/v2/models/add_sub/stats")
    assert status == 200
    return int(json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"])


def _success(server: ServerProcess) -> int:
    found = re.search(
        r'^nv_inference_request_success\{model="add_sub",version="1"\} (\d+)$',
        urlopen_text(server.metrics_url),
        re.M,
    )
    assert found is not None
    return int(found.group(1))


def test_statistics_and_metrics_read_never_go_back_when_a_worker_dies(tmp_path: Path) -> None:
    """What a client read of one model's statistics, and of the metrics, is carried when worker 0
    dies right after (before the supervisor's next look at the figures)."""
    # The metrics port is worker 0's: named, so that the worker started again binds it too.
    server = start_workers(write_repository(tmp_path / "models"), f"--metrics-port={free_port()}")
    try:
        assert {
            status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) for _ in range(CONNECTIONS)
        } == {200}
        assert _inference_count(server) == CONNECTIONS
        assert _success(server) == CONNECTIONS
        dead = _worker_0(server)
        os.kill(dead, signal.SIGKILL)
        wait_until(lambda: dead not in worker_pids(server), "worker 0 gone")
        assert _inference_count(server) == CONNECTIONS  # while it starts again
        wait_until(
            lambda: status_of(server, "GET", "/v2/health/ready") == 200, "every worker ready", timeout=120
        )
        assert _inference_count(server) == CONNECTIONS
        assert _success(server) == CONNECTIONS
        assert {status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) for _ in range(4)} == {200}
        assert _inference_count(server) == CONNECTIONS + 4
    finally:
        server.close()


SCALE_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
)


def _scaled(server: ServerProcess, model: str) -> tuple[int, object]:
    """One infer of a scale model on a connection of its own: status, and (version, first output)."""
    status, body = answer_of(server, "POST", f"/v2/models/{model}/infer", SCALE_BODY)
    if status != 200:
        return status, json.loads(body).get("error")
    answer = json.loads(body)
    return status, (answer["model_version"], answer["outputs"][0]["data"][0])


def _kill_and_wait(server: ServerProcess, index: int) -> None:
    """Kills worker `index` and waits until another process has taken its place."""
    dead = next(pid for pid in worker_pids(server) if worker_index(pid) == index)
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: dead not in worker_pids(server) and len(worker_pids(server)) == 2, "started again")


def test_a_worker_that_served_is_started_again_after_a_second_however_often_it_dies(tmp_path: Path) -> None:
    """Only starts that fail before the worker joins, five in a row, slow its restarts to one
    each 30 s. A worker's line closes before its exit is seen, which made every death count as
    a failed start: the fifth crash of a server's life was restarted 30 s later."""
    server = start_workers(write_repository(tmp_path / "models"))
    try:
        for _ in range(6):
            wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
            _kill_and_wait(server, 1)
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
        delays = re.findall(r"worker 1 exited with status -9; starting it again in (\S+) s", server.log)
        assert delays == ["1"] * 6
    finally:
        server.close()


def test_a_worker_started_again_serves_what_the_others_serve_not_a_version_staged_since(
    tmp_path: Path,
) -> None:
    repository = write_repository(tmp_path / "models")
    write_model(repository, "staged", scale_model(2.0), SCALE_CONFIG)
    server = start_workers(repository, "--load-model=staged")
    try:
        write_model(repository, "staged", scale_model(3.0), versions=(2,))  # staged: no API call
        for index in (0, 1):  # worker 0's truth comes from worker 1 then, and the other way round
            _kill_and_wait(server, index)
            wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
            assert {_scaled(server, "staged") for _ in range(CONNECTIONS)} == {(200, ("1", 2.0))}
            assert {status_of(server, "GET", "/v2/models/staged/versions/1/ready") for _ in range(16)} == {
                200
            }
            assert 200 not in {
                status_of(server, "GET", "/v2/models/staged/versions/2/ready") for _ in range(16)
            }
        assert "Traceback" not in server.log
    finally:
        server.close()


@pytest.mark.parametrize("namespacing", [[], ["--model-namespacing=true"]], ids=["plain", "namespacing"])
def test_a_worker_started_again_knows_the_models_the_others_unloaded(
    tmp_path: Path, namespacing: list[str]
) -> None:
    """A model unloaded through the API, then each worker killed in turn: the one started again
    answers for the model and lists it in the index as the other does (unloaded, with the
    version it had), not as a model it never heard of."""
    repository = write_repository(tmp_path / "models")
    write_model(repository, "staged", scale_model(2.0), SCALE_CONFIG)
    server = start_workers(repository, "--load-model=staged", *namespacing)
    try:
        assert status_of(server, "POST", "/v2/repository/models/staged/unload") == 200
        wait_until(lambda: {_scaled(server, "staged")[0] for _ in range(16)} == {404}, "unloaded everywhere")
        for index in (0, 1):
            _kill_and_wait(server, index)
            wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "ready", timeout=120)
            answers = {_scaled(server, "staged") for _ in range(CONNECTIONS)}
            assert answers == {
                (404, "Request for unknown model: 'staged' has no available versions (unloaded)")
            }, answers
            indexes = {answer_of(server, "POST", "/v2/repository/index", "{}")[1] for _ in range(16)}
            assert len(indexes) == 1, indexes
            staged = [entry for entry in json.loads(indexes.pop()) if entry["name"] == "staged"]
            assert staged == [
                {"name": "staged", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
            ]
        assert "Traceback" not in server.log
    finally:
        server.close()


def test_a_worker_that_cannot_load_what_the_others_serve_is_not_ready_and_never_stops_them(
    tmp_path: Path,
) -> None:
    """Version 1's file half copied (empty) after the others loaded it, no API call, then a
    worker killed: started again, it cannot serve what the others serve, and says so; it does
    not exit (whatever --exit-on-error says), the other serves on, and a load through the API
    of the mended files mends it."""
    repository = write_repository(tmp_path / "models")
    write_model(repository, "copied", scale_model(2.0), SCALE_CONFIG)
    server = start_workers(repository, "--load-model=copied", "--exit-on-error=true")
    try:
        (repository / "copied" / "1" / "model.onnx").write_bytes(b"")
        _kill_and_wait(server, 1)
        reason = "the files of model 'copied' version 1 changed since the other workers loaded it"
        wait_until(lambda: reason in server.log, "the new worker says why")
        restarted = set(worker_pids(server))

        def refused_somewhere() -> set[tuple[int, object]] | None:  # (once the new worker listens too)
            answers = {_scaled(server, "copied") for _ in range(CONNECTIONS)}
            return answers if any(status != 200 for status, _ in answers) else None

        answers = wait_until(refused_somewhere, "the new worker answers")
        assert (200, ("1", 2.0)) in answers  # worker 0 serves it
        refused = {answer for answer in answers if answer[0] != 200}
        assert refused and all(reason in str(message) for _, message in refused), answers
        assert {status_of(server, "GET", "/v2/health/ready") for _ in range(16)} == {400}
        assert set(worker_pids(server)) == restarted  # the new worker stays, the other too
        write_model(repository, "copied", scale_model(2.0), SCALE_CONFIG)  # the copy done
        assert status_of(server, "POST", "/v2/repository/models/copied/load") == 200
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "mended: ready")
        assert {_scaled(server, "copied") for _ in range(CONNECTIONS)} == {(200, ("1", 2.0))}
        assert "stopping" not in server.log and "Traceback" not in server.log
    finally:
        server.close()


LOADS_ONCE_PY = """
import os

import triton_python_backend_utils as pb_utils

FLAG = {flag!r}


class TritonPythonModel:
    def initialize(self, args):
        # The first instance anywhere takes the flag; the other worker's fails.
        os.close(os.open(FLAG, os.O_CREAT | os.O_EXCL))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "INPUT0")]) for r in requests]
"""
ONCE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def test_a_load_that_fails_in_one_worker_is_undone_in_the_others(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models")
    (repository / "once" / "1").mkdir(parents=True)
    (repository / "once" / "config.pbtxt").write_text(ONCE_CONFIG)
    (repository / "once" / "1" / "model.py").write_text(LOADS_ONCE_PY.format(flag=str(tmp_path / "flag")))
    server = start_workers(repository)
    try:
        status, body = answer_of(server, "POST", "/v2/repository/models/once/load")
        assert (
            status == 400 and "FileExistsError" in json.loads(body)["error"]
        )  # the failing worker's own error
        assert (tmp_path / "flag").exists()  # so it loaded in the other worker, then was undone there
        statuses = {status_of(server, "GET", "/v2/models/once/ready") for _ in range(CONNECTIONS)}
        assert 200 not in statuses  # served nowhere
        # Every worker holds the model as one server would after that failed load: unavailable
        # for that reason (so not ready, as one server is not with a model that failed to load).
        for _ in range(16):
            status, body = answer_of(server, "POST", "/v2/repository/index")
            (entry,) = [model for model in json.loads(body) if model["name"] == "once"]
            assert entry["state"] == "UNAVAILABLE" and "FileExistsError" in entry["reason"]
        assert {status_of(server, "GET", "/v2/health/ready") for _ in range(16)} == {400}
        assert status_of(server, "POST", "/v2/repository/models/once/unload") == 200
        assert {status_of(server, "GET", "/v2/health/ready") for _ in range(16)} == {200}
        # (The log holds the traceback of the model's initialize, as Triton logs it: the model's.)
    finally:
        server.close()


ONCE_WHEN_ASKED_PY = LOADS_ONCE_PY.replace(
    "    def initialize(self, args):\n",
    "    def initialize(self, args):\n"
    "        import json\n\n"
    "        if 'once' not in json.loads(args['model_config']).get('parameters', {{}}):\n"
    "            return\n",
)
ENSEMBLE_OF_ONCE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "once" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "INPUT0" value: "OUT" } } ] }
"""


def test_a_step_change_undone_in_a_worker_brings_back_there_the_ensemble_it_took_down(tmp_path: Path) -> None:
    """`once` loaded again with an output the ensemble does not fit (and a parameter that makes
    its load hold in one worker only): that worker takes the ensemble down, then undoes the
    change, and the ensemble comes back there with it."""
    repository = write_repository(tmp_path / "models")
    for name, config in (("once", ONCE_CONFIG), ("ens", ENSEMBLE_OF_ONCE)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(config)
    (repository / "once" / "1" / "model.py").write_text(
        ONCE_WHEN_ASKED_PY.format(flag=str(tmp_path / "flag"))
    )
    body = json.dumps({"inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    server = start_workers(repository, "--model-control-mode=explicit", "--load-model=ens")
    try:
        assert {status_of(server, "POST", "/v2/models/ens/infer", body) for _ in range(CONNECTIONS)} == {200}
        config = {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
            "parameters": {"once": {"string_value": "yes"}},
        }
        load = json.dumps({"parameters": {"config": json.dumps(config)}})
        status, answer = answer_of(server, "POST", "/v2/repository/models/once/load", load)
        assert status == 400 and "FileExistsError" in json.loads(answer)["error"]
        assert (tmp_path / "flag").exists()  # so it loaded in the other worker, then was undone there
        assert "Invalid argument: ensemble 'ens'" in server.log  # where it took the ensemble down
        assert {status_of(server, "POST", "/v2/models/ens/infer", body) for _ in range(CONNECTIONS)} == {200}
        assert {status_of(server, "GET", "/v2/health/ready") for _ in range(16)} == {200}
    finally:
        server.close()


def test_a_worker_started_again_in_poll_mode_keeps_an_ensemble_down_while_its_step_is_gone(
    tmp_path: Path,
) -> None:
    """`scale` leaves the repository and takes `ens` down in every worker; a worker killed then
    starts again with `ens` held down, and its polls keep it down (no load of it alone, which
    would fail) until `scale` is back."""
    repository = tmp_path / "models"
    write_model(repository, "scale", scale_model(2.0), SCALE_CONFIG)
    (repository / "ens" / "1").mkdir(parents=True)
    (repository / "ens" / "config.pbtxt").write_text(ENSEMBLE_OF_SCALE)
    server = start_workers(repository, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    missing = "ensemble ens contains models that are not available or ambiguous: scale"
    try:
        assert {_scaled(server, "ens") for _ in range(8)} == {(200, ("1", 2.0))}
        (repository / "scale").rename(tmp_path / "scale")
        wait_until(lambda: server.log.count(missing) == 2, "ens down in both workers")
        _kill_and_wait(server, 1)
        wait_until(lambda: server.log.count(missing) == 3, "the new worker's first poll keeps ens down")
        time.sleep(1.5)  # five more polls: none tries it again
        assert server.log.count(missing) == 3
        assert {_scaled(server, "ens")[0] for _ in range(CONNECTIONS)} == {404}
        (tmp_path / "scale").rename(repository / "scale")
        # Loaded at start in both workers, then back in both.
        wait_until(lambda: server.log.count("successfully loaded 'ens'") == 4, "ens back in both workers")
        assert {_scaled(server, "ens") for _ in range(CONNECTIONS)} == {(200, ("1", 2.0))}
        assert "failed to load 'ens'" not in server.log and "Traceback" not in server.log
    finally:
        server.close()


def test_a_region_whose_segment_is_gone_fails_the_replay_and_the_worker_is_not_ready_until_mended(
    tmp_path: Path,
) -> None:
    key = f"/coreserve-replay-{os.getpid()}"
    handle = shm.create_shared_memory_region("replay", key, 64)
    server = start_workers(write_repository(tmp_path / "models"))
    try:
        body = json.dumps({"key": key, "offset": 0, "byte_size": 64})
        assert status_of(server, "POST", "/v2/systemsharedmemory/region/replayed/register", body) == 200
        shm.destroy_shared_memory_region(handle)  # the segment unlinked behind the server's back
        handle = None
        _kill_and_wait(server, 1)
        wait_until(lambda: "could not make register_system_shared_memory" in server.log, "the replay failed")
        wait_until(
            lambda: {status_of(server, "GET", "/v2/health/ready") for _ in range(8)} == {400}, "not ready"
        )
        assert status_of(server, "POST", "/v2/systemsharedmemory/region/replayed/unregister") == 200
        wait_until(lambda: status_of(server, "GET", "/v2/health/ready") == 200, "mended: ready")
        assert {status_of(server, "GET", "/v2/health/ready") for _ in range(16)} == {200}
        assert "Traceback" not in server.log
    finally:
        if handle is not None:
            shm.destroy_shared_memory_region(handle)
        server.close()


def test_a_killed_workers_cache_folder_is_removed_and_nothing_is_left_after_the_stop(
    tmp_path: Path, short_temp: Path
) -> None:
    """Each worker's cache folder (where a remote repository's models are downloaded) is the
    supervisor's to remove: a killed worker cannot remove its own, and each crash would leave
    one behind in the system temp folder."""
    server = start_workers(write_repository(tmp_path / "models"), env={"TMPDIR": str(short_temp)})

    def folders() -> set[str]:
        return {folder.name for folder in short_temp.glob("coreserve-workers-*/cache-*")}

    try:
        first = worker_pids(server)
        assert folders() == {f"cache-{pid}" for pid in first}
        _kill_and_wait(server, 0)
        wait_until(
            lambda: folders() == {f"cache-{pid}" for pid in worker_pids(server)}, "the dead's folder gone"
        )
        assert set(worker_pids(server)) != set(first)
    finally:
        server.close()
    assert list(short_temp.iterdir()) == []


def test_a_temp_folder_too_long_for_a_unix_socket_puts_the_workers_folder_in_tmp(tmp_path: Path) -> None:
    """A TMPDIR whose path leaves no room for the supervisor's socket (108 bytes on Linux) made
    the server fail to start, with a traceback."""
    temp = tmp_path / ("long-" * 20)
    temp.mkdir()
    server = start_workers(write_repository(tmp_path / "models"), env={"TMPDIR": str(temp)})
    try:
        assert status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) == 200
        assert f"the temp folder {temp} is too long a path for the workers' Unix sockets" in server.log
        assert "Traceback" not in server.log
    finally:
        server.close()
    assert list(temp.iterdir()) == []
