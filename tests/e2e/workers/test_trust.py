"""The workers' internal lines take only the server's own workers: another process of the same
user that connects to the supervisor's line or to worker 0's (the Unix sockets in the
supervisor's private folder) is refused at once, before it can send anything; what it would
have sent (a `join` for worker 1's index, an unload, a region, a line of hundreds of MB) is
never read; the refusal is counted in `coreserve_worker_line_errors_total`; the server serves
on with the same workers and models. (How a line treats a worker's frame it must not take is
tested in tests/core/server/workers/test_owner.py and test_channel.py.)"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from coreserve.server.workers._owner import owner_socket
from coreserve.testing import ServerProcess
from support.servers.worker_servers import (
    ADD_BODY,
    CONNECTIONS,
    answer_of,
    start_workers,
    status_of,
    urlopen_text,
    worker_pids,
    worker_role,
    write_repository,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = start_workers(write_repository(tmp_path / "models"), "--metrics-port=0")
    yield process
    process.close()


def _message(message: dict[str, object]) -> bytes:
    body = orjson.dumps(message)
    return struct.pack("!I", len(body)) + body


def _refused(path: str, *messages: bytes) -> bool:
    """Whether the line at `path` closes on this process without answering what it sends."""
    with socket.socket(socket.AF_UNIX) as line:
        line.settimeout(30)
        line.connect(path)
        try:
            for message in messages:
                line.sendall(message)
            return line.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):
            return True


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB$", status, re.M).group(1))  # type: ignore[union-attr]


def test_a_process_that_is_no_worker_is_refused_on_every_line(server: ServerProcess) -> None:
    assert server.process is not None
    workers = worker_pids(server)
    supervisor_line = worker_role(workers[0])[2]
    assert oct(Path(supervisor_line).parent.stat().st_mode & 0o777) == "0o700"  # other users' way
    forged_join = _message({"ask": 1, "call": "join", "index": 1})
    forged_unload = _message(
        {"ask": 2, "call": "everywhere", "what": {"call": "unload_model", "name": "add_sub"}}
    )
    forged_region = _message({"ask": 3, "call": "everywhere", "what": {
        "call": "register_system_shared_memory", "name": "r", "key": "/k", "offset": 0, "byte_size": 8}})  # fmt: skip
    assert _refused(supervisor_line, forged_join, forged_unload, forged_region)
    assert _refused(owner_socket(supervisor_line), struct.pack("!IQ", 2, 0) + b"{}")
    # A line of 900 MB, announced and sent: closed before any of it is taken in.
    rss_before = _rss_kib(server.process.pid)
    huge = struct.pack("!I", 900 * 1024 * 1024)
    with socket.socket(socket.AF_UNIX) as line:
        line.settimeout(30)
        line.connect(supervisor_line)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            line.sendall(huge)
            chunk = bytes(1024 * 1024)
            while sent < 900:  # MB
                line.sendall(chunk)
                sent += 1
    assert sent < 900
    assert _rss_kib(server.process.pid) - rss_before < 20 * 1024

    # The same workers, every model, no region, the line's refusals counted.
    assert worker_pids(server) == workers
    answers = {status_of(server, "POST", "/v2/models/add_sub/infer", ADD_BODY) for _ in range(CONNECTIONS)}
    assert answers == {200}
    regions = {answer_of(server, "GET", "/v2/systemsharedmemory/status") for _ in range(CONNECTIONS // 4)}
    assert regions == {(200, b"[]")}
    metrics = urlopen_text(server.metrics_url)
    refused = re.search(r'^coreserve_worker_line_errors_total\{reason="stranger"\} (\d+)$', metrics, re.M)
    assert refused is not None and int(refused.group(1)) == 3  # two at the supervisor, one at worker 0
    assert "refused a connection to the workers' line from process" in server.log
    assert "worker 0 refused a connection from process" in server.log
    assert "Traceback" not in server.log
