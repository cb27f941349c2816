"""The Redis response cache (`--cache-config redis,host=…,port=…`): two coreserve processes
share one real Redis server, started by the test on loopback (Debian's `redis-server`).

A request that one server ran is answered by the other from Redis without running its model
(its statistics say so); a model version's keys carry a fingerprint of its files, so the
other version misses; an unload deletes the entries its process filed.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from support.model_builders import scale_model, write_model
from support.servers.json_worker_processes import stopped
from support.waiting import wait_until

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed (apt-get install redis-server)"
)

CONFIG = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy: { all { } }
response_cache { enable: true }
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer(NamedTuple):
    port: int
    pid: int


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    port = _free_port()
    folder = tmp_path_factory.mktemp("redis")
    assert REDIS_SERVER is not None
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        wait_until(lambda: _answers(client), "redis-server answers", 30)
        yield RedisServer(port, process.pid)
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def redis_port(redis_server: RedisServer) -> int:
    return redis_server.port


def _waiting_in_redis(port: int) -> int:
    """How many connections to Redis hold bytes it has not read yet: commands waiting for it,
    as the kernel reports them (the receive queue of each socket of Redis's port)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()  # sl, local address, remote address, state, tx_queue:rx_queue, ...
        local_port, state, unread = (
            int(fields[1].split(":")[1], 16),
            fields[3],
            int(fields[4].split(":")[1], 16),
        )
        if local_port == port and state == "01" and unread > 0:  # 01: established
            count += 1
    return count


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, redis_port: int) -> Iterator[list[ServerProcess]]:
    repository = tmp_path_factory.mktemp("cached")
    folder = write_model(repository, "scaled", scale_model(2.0), CONFIG, versions=(1,))
    write_model(repository, "scaled", scale_model(3.0), None, versions=(2,))
    assert (folder / "2").is_dir()
    flags = ["--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={redis_port}",
             "--model-control-mode=explicit", "--load-model=scaled"]  # fmt: skip
    started = []
    try:
        for _ in range(2):
            started.append(ServerProcess([repository], flags).start(timeout=120))
        yield started
    finally:
        logs = [server.log for server in started]
        for server in started:
            server.close()
    for log in logs:
        assert "Traceback" not in log and "not answering" not in log, log


def _scale(
    server: ServerProcess, values: list[float], version: str = "1", model: str = "scaled"
) -> list[float]:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([values], np.float32))
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        return client.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0")[0].tolist()


def _stats(server: ServerProcess, version: str) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) of a version of `scaled` on `server`."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics("scaled", version)["model_stats"][0]
    inference = stats["inference_stats"]
    return (
        int(inference["cache_hit"]["count"]),
        int(inference["cache_miss"]["count"]),
        int(stats["execution_count"]),
    )


def test_a_response_one_server_computed_answers_the_other_from_redis(
    servers: list[ServerProcess], redis_port: int
) -> None:
    first, second = servers
    assert _scale(first, [1, 2, 3, 4]) == [2, 4, 6, 8]
    assert _stats(first, "1") == (0, 1, 1)
    assert _scale(second, [1, 2, 3, 4]) == [2, 4, 6, 8]
    assert _stats(second, "1") == (1, 0, 0)  # answered from Redis: its model never ran
    # The other version has other files, so other keys: it misses, and answers its own way.
    assert _scale(second, [1, 2, 3, 4], version="2") == [3, 6, 9, 12]
    assert _stats(second, "2") == (0, 1, 1)
    assert redis.Redis(host="127.0.0.1", port=redis_port).dbsize() == 2


def test_an_unload_deletes_the_entries_its_server_filed(
    servers: list[ServerProcess], redis_port: int
) -> None:
    first, second = servers
    store = redis.Redis(host="127.0.0.1", port=redis_port)
    before = store.dbsize()
    assert _scale(first, [5, 5, 5, 5]) == [10, 10, 10, 10]
    assert store.dbsize() == before + 1
    with httpclient.InferenceServerClient(first.http_url) as client:
        client.unload_model("scaled")
    # Its two entries ([1,2,3,4] and [5,5,5,5]) of version 1 go.
    wait_until(lambda: store.dbsize() == before - 1, "the unloaded version's entries are deleted", 30)
    assert _scale(second, [5, 5, 5, 5]) == [10, 10, 10, 10]
    assert _stats(second, "1")[2] == 1  # the entry is gone: the second server ran it


def test_a_slow_redis_delays_only_the_requests_that_wait_for_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # Redis is stopped (SIGSTOP) while a cached request's lookup, then a scrape, wait for it: it
    # answers no one for as long as the test holds it. The kernel shows each one's command
    # unread in Redis's socket; a model without a cache is answered meanwhile, the waiting ones
    # only once Redis goes on.
    write_model(tmp_path, "scaled", scale_model(2.0), CONFIG.replace("version_policy: { all { } }", ""))
    write_model(tmp_path, "plain", scale_model(3.0), CONFIG.replace("response_cache { enable: true }", ""))
    port = redis_server.port
    flags = ["--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={port}",
             "--cache-config=redis,socket_timeout=60000"]  # fmt: skip
    server = ServerProcess([tmp_path], flags).start(timeout=120)
    store = redis.Redis(host="127.0.0.1", port=port)
    try:
        entries = store.dbsize()  # the module's other tests filed some
        assert _waiting_in_redis(port) == 0
        with ThreadPoolExecutor(1) as pool:
            with stopped(redis_server.pid):
                cached = pool.submit(_scale, server, [7, 7, 7, 7])
                wait_until(lambda: _waiting_in_redis(port) == 1, "the lookup waits for Redis")
                assert _scale(server, [1, 1, 1, 1], model="plain") == [3, 3, 3, 3]  # not held up
                assert not cached.done() and _waiting_in_redis(port) == 1
            assert cached.result(timeout=60) == [14, 14, 14, 14]
        assert _stats(server, "1") == (0, 1, 1)  # its lookup came back a miss, then it ran
        with ThreadPoolExecutor(1) as pool:
            # A scrape asks Redis for its entries and memory, off the event loop: it waits too.
            with stopped(redis_server.pid):
                scrape = pool.submit(urllib.request.urlopen, server.metrics_url, timeout=60)
                wait_until(lambda: _waiting_in_redis(port) == 1, "the scrape waits for Redis")
                assert _scale(server, [1, 1, 1, 1], model="plain") == [3, 3, 3, 3]  # not held up
                assert not scrape.done() and _waiting_in_redis(port) == 1
            with scrape.result(timeout=60) as answer:
                metrics = answer.read().decode()
        # The cached one's entry, filed before it was answered.
        assert f"nv_cache_num_entries {entries + 1}\n" in metrics
        assert "nv_cache_num_lookups 1\n" in metrics and "nv_cache_num_misses 1\n" in metrics
        assert store.dbsize() == entries + 1
        log = server.log
    finally:
        store.close()
        server.close()
    assert "Traceback" not in log and "not answering" not in log, log


def test_redis_settings_are_checked_before_the_start(tmp_path: Path) -> None:
    for flags, message in (
        (
            ["--cache-config=redis,host=127.0.0.1"],
            "didn't specify address. Must at a minimum specify 'host' and 'port'",
        ),
        (
            ["--cache-config=redis,host=h", "--cache-config=redis,port=x"],
            "port must be a whole number, got 'x'",
        ),
        (["--cache-config=redis,host=h", "--cache-config=redis,colour=red"], "unknown setting 'colour'"),
    ):
        server = ServerProcess([tmp_path], flags)
        try:
            with pytest.raises(RuntimeError) as error:
                server.start(timeout=60)
        finally:
            server.close()
        assert message in str(error.value) and "Traceback" not in str(error.value)
