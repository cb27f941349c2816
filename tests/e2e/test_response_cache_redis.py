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
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from model_builders import scale_model, write_model

redis = pytest.importorskip("redis", reason="the redis package (core-server[redis]) is not installed")
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


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
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
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield port
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=30)


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
    deadline = time.monotonic() + 30
    while store.dbsize() != before - 1:  # its two entries ([1,2,3,4] and [5,5,5,5]) of version 1
        assert time.monotonic() < deadline, f"{store.dbsize()} entries left"
        time.sleep(0.05)
    assert _scale(second, [5, 5, 5, 5]) == [10, 10, 10, 10]
    assert _stats(second, "1")[2] == 1  # the entry is gone: the second server ran it


def test_a_slow_redis_delays_only_the_requests_that_wait_for_it(tmp_path: Path, redis_port: int) -> None:
    write_model(tmp_path, "scaled", scale_model(2.0), CONFIG.replace("version_policy: { all { } }", ""))
    write_model(tmp_path, "plain", scale_model(3.0), CONFIG.replace("response_cache { enable: true }", ""))
    flags = ["--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={redis_port}",
             "--cache-config=redis,socket_timeout=20000"]  # fmt: skip
    server = ServerProcess([tmp_path], flags).start(timeout=120)
    store = redis.Redis(host="127.0.0.1", port=redis_port)
    try:
        store.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # Redis answers no one for 3 s
        paused = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            cached = pool.submit(_scale, server, [7, 7, 7, 7])
            # A scrape asks Redis for its entries and memory: that waits too, off the loop.
            scrape = pool.submit(urllib.request.urlopen, server.metrics_url, timeout=60)
            time.sleep(0.3)  # the lookup and the scrape now wait for Redis, off the event loop
            assert _scale(server, [1, 1, 1, 1], model="plain") == [3, 3, 3, 3]
            assert time.monotonic() - paused < 2.0  # the model without a cache was not held up
            assert not cached.done() and not scrape.done()
            assert cached.result(timeout=60) == [14, 14, 14, 14]
            with scrape.result(timeout=60) as answer:
                metrics = answer.read().decode()
        assert time.monotonic() - paused >= 2.9  # the cached one did wait for Redis
        assert "nv_cache_num_entries " in metrics
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
