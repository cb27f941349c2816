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
from waiting import wait_until
from worker_servers import (
    ADD_BODY,
    CONNECTIONS,
    answer_of,
    free_port,
    start_workers,
    status_of,
    urlopen_text,
    worker_index,
    worker_pids,
    write_repository,
)

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


def _connections(server: ServerProcess, count: int = 8) -> list[http.client.HTTPConnection]:
    """Kept-alive connections, each to whichever worker the kernel gave it, each answered once."""
    host, port = server.http_url.split(":")
    made = []
    for _ in range(count):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", "/v2/health/live")
        connection.getresponse().read()
        made.append(connection)
    return made


def _answering(connections: list[http.client.HTTPConnection]) -> http.client.HTTPConnection:
    """One of the connections whose worker still answers (the others' time out)."""
    for connection in connections:
        assert connection.sock is not None
        connection.sock.settimeout(1.0)
        try:
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
        except TimeoutError:
            connection.close()
            continue
        connection.sock.settimeout(120)
        return connection
    raise AssertionError("no connection reached a worker that answers")


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
        connections = _connections(server)
        os.kill(hung, signal.SIGSTOP)
        try:
            # A change asked of the live worker while worker 0 is stopped: answered once worker 0
            # is declared hung.
            answers: list[int] = []
            _register(_answering(connections), region, answers)
            assert answers == [200]
            assert hung not in worker_pids(server)  # the supervisor killed it
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
    try:
        hung = _worker_0(server)
        connections = _connections(server)
        os.kill(hung, signal.SIGSTOP)
        answers: list[int] = []
        registering = threading.Thread(target=_register, args=(_answering(connections), region, answers))
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
