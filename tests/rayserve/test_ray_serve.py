"""coreserve on Ray Serve, on a real two-node local Ray cluster (tests/ray/conftest.py).

In the issue's order: two replicas both serve; a replica killed under load; scaling from one
replica to two under load; a repository on S3 read by every replica. Clients are
tritonclient.http (unchanged) and plain HTTP where the replica header is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from support.model_builders import add_sub_model, scale_model, write_model
from support.paths import CANCELLATION_MODELS
from support.servers.ray_cluster import Deployment, RayCluster
from support.servers.s3_server import free_port, s3_client, start_moto
from support.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SCALE = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
REPLICA = "coreserve-replica"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_sub (ONNX) and sleepy (Python, 0.5 s a request on one instance)."""
    root = tmp_path_factory.mktemp("ray-models")
    write_model(root, "add_sub", add_sub_model(), ADD_SUB)
    shutil.copytree(CANCELLATION_MODELS / "sleepy", root / "sleepy")
    return root


@pytest.fixture(scope="module")
def two_replicas(
    ray_cluster: RayCluster, repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    log = tmp_path_factory.mktemp("ray-deploy") / "coreserve-ray.log"
    deployment = Deployment(ray_cluster, str(repository), "--num-replicas=2", log=log)
    yield deployment
    deployment.close()


def _add_sub_inputs(value: float) -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32), binary_data=True)
        inputs.append(tensor)
    return inputs


def _infer_json(deployment: Deployment, value: float) -> tuple[str, list[float]]:
    """One JSON inference through the proxy: the replica that answered, and OUTPUT0."""
    body = {
        "inputs": [
            {"name": n, "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    status, headers, answer = deployment.post("/v2/models/add_sub/infer", body)
    assert status == 200, answer
    outputs = {o["name"]: o["data"] for o in json.loads(answer)["outputs"]}
    return headers[REPLICA], outputs["OUTPUT0"]


def _replica_counts(deployment: Deployment, replicas: set[str]) -> dict[str, int]:
    """Each replica's own add_sub inference count, asking through the proxy until all answered."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while set(counts) != replicas and time.monotonic() < deadline:
        status, headers, body = deployment.get("/v2/models/add_sub/stats")
        assert status == 200, body
        counts[headers[REPLICA]] = json.loads(body)["model_stats"][0]["inference_count"]
    return counts


def test_two_replicas_both_serve(two_replicas: Deployment) -> None:
    client = httpclient.InferenceServerClient(two_replicas.cluster.url, network_timeout=60)
    try:
        assert client.is_server_ready()
        assert client.get_model_metadata("add_sub")["name"] == "add_sub"
        result = client.infer("add_sub", _add_sub_inputs(2.0))  # binary tensor extension
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[4, 4, 4, 4]])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [[0, 0, 0, 0]])
    finally:
        client.close()
    replicas: Counter[str] = Counter()
    for i in range(40):
        replica, output = _infer_json(two_replicas, float(i))
        assert output == [2.0 * i] * 4
        replicas[replica] += 1
    assert len(replicas) == 2, replicas
    # Each replica's statistics count what it served: together, every request sent.
    counts = _replica_counts(two_replicas, set(replicas))
    assert set(counts) == set(replicas)
    assert all(count > 0 for count in counts.values())
    assert sum(counts.values()) >= 41  # 40 JSON + 1 binary (earlier tests may add more)


def test_a_replica_killed_under_load_fails_only_requests_in_flight(two_replicas: Deployment) -> None:
    # Ordered by one clock, not bounded by it: each request's start and end, the kill, and the
    # first answer of the replica Ray Serve starts in the killed one's place.
    clients = 6
    killed, _ = _infer_json(two_replicas, 1.0)
    stop = threading.Event()
    # Each request's start, end, and the replica that answered it (None: it failed).
    outcomes: list[tuple[float, float, str | None]] = []
    lock = threading.Lock()

    def load() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                replica, output = _infer_json(two_replicas, 1.0)
                answered: str | None = replica if output == [2.0] * 4 else None
            except Exception:  # any failure a client sees counts
                answered = None
            with lock:
                outcomes.append((started, time.monotonic(), answered))

    def seen() -> list[tuple[float, float, str | None]]:
        with lock:
            return list(outcomes)

    def answers() -> Counter[str | None]:
        return Counter(replica for _, _, replica in seen())

    threads = [threading.Thread(target=load) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        # Under load: both replicas have answered the clients' requests (each, more than one
        # round of them) before one is killed.
        wait_until(
            lambda: len(set(answers()) - {None}) == 2 and min(answers()[r] for r in answers() if r) > clients,
            "both replicas answer the load",
        )
        (survivor,) = set(answers()) - {None, killed}
        pid = int(killed.rsplit(":", 1)[1])
        os.kill(pid, signal.SIGKILL)  # a replica process of this test's own cluster
        kill = time.monotonic()
        # Ray Serve starts a replica in the killed one's place: its first answer …
        first_answer = wait_until(
            lambda: min((o[1] for o in seen() if o[2] not in {None, killed, survivor}), default=None),
            "a replica started in place of the killed one answers",
            120,
        )
        # … and more than 20 requests sent after it.
        wait_until(
            lambda: len([o for o in seen() if o[0] > first_answer]) > 20, "requests after the replacement"
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
    failed = [o for o in outcomes if o[2] is None]
    in_flight = [o for o in outcomes if o[0] < kill < o[1]]
    assert in_flight, "no request was in flight when the replica was killed"
    # Only requests in flight when the replica died fail (one per client at most): none that
    # ended before the kill, none sent after it (Ray Serve retries a request its replica had
    # not taken) …
    assert len(failed) <= clients, failed
    assert all(start < kill < end for start, end, _ in failed), (kill, failed)
    # … and every later one succeeds, through the surviving replica and then the new one.
    later = [o for o in outcomes if o[0] > first_answer]
    assert len(later) > 20 and all(replica is not None for _, _, replica in later)


def test_scales_from_one_replica_to_two_under_load(
    ray_cluster: RayCluster, repository: Path, tmp_path: Path
) -> None:
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "initial_replicas": 1,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 2,
        "downscale_delay_s": 600,
        "look_back_period_s": 11,  # Ray wants it above metrics_interval_s (10 s by default)
        "policy": {"policy_function": "coreserve.ray:pending_requests_policy"},
    }
    deployment = Deployment(
        ray_cluster,
        str(repository),
        f"--autoscaling-config={json.dumps(autoscaling)}",
        log=tmp_path / "scale.log",
    )
    try:
        seen: Counter[str] = Counter()
        stop = threading.Event()
        lock = threading.Lock()

        def load() -> None:
            while not stop.is_set():
                status, headers, body = deployment.post(
                    "/v2/models/sleepy/infer",
                    {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]},
                )
                assert status == 200, body
                with lock:
                    seen[headers[REPLICA]] += 1

        # Six clients on a model that answers two requests a second per replica: the pending
        # count stays near six, three times the target of two.
        threads = [threading.Thread(target=load) for _ in range(6)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: len(seen) >= 2, "a second replica answers", 120, 0.5)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert len(seen) == 2, seen
    finally:
        deployment.close()


def test_an_s3_repository_is_read_by_every_replica(ray_cluster: RayCluster, tmp_path: Path) -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    moto = start_moto(port)
    try:
        s3 = s3_client(endpoint)
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="repo/add_sub/config.pbtxt", Body=ADD_SUB.encode())
        s3.put_object(
            Bucket="models", Key="repo/add_sub/1/model.onnx", Body=add_sub_model().SerializeToString()
        )
        deployment = Deployment(
            ray_cluster, f"s3://{endpoint}/models/repo", "--num-replicas=2", log=tmp_path / "s3.log"
        )
        try:
            replicas: Counter[str] = Counter()
            for i in range(30):
                replica, output = _infer_json(deployment, float(i))
                assert output == [2.0 * i] * 4
                replicas[replica] += 1
            assert len(replicas) == 2, replicas  # each replica fetched the repository itself
        finally:
            deployment.close()
    finally:
        moto.terminate()
        moto.wait(timeout=10)


def _scale_json(deployment: Deployment, model: str) -> tuple[str, float]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    status, headers, answer = deployment.post(f"/v2/models/{model}/infer", body)
    assert status == 200, answer
    return headers[REPLICA], json.loads(answer)["outputs"][0]["data"][0]


def _ready_per_replica(deployment: Deployment) -> dict[str, list[str]]:
    """The names each of the two replicas lists as ready, asked through the proxy until both answered."""
    ready: dict[str, list[str]] = {}
    deadline = time.monotonic() + 60
    while len(ready) < 2 and time.monotonic() < deadline:
        status, headers, body = deployment.post("/v2/repository/index", {"ready": True})
        assert status == 200, body
        ready[headers[REPLICA]] = [entry["name"] for entry in json.loads(body)]
    assert len(ready) == 2, ready
    return ready


def test_many_models_are_multiplexed_over_replicas_holding_at_most_n(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    repository = tmp_path / "many"
    factors = {"double": 2.0, "triple": 3.0, "fivefold": 5.0}
    for name, factor in factors.items():
        write_model(repository, name, scale_model(factor), SCALE)
    deployment = Deployment(
        ray_cluster, str(repository), "--num-replicas=2", "--models-per-replica=1", log=tmp_path / "many.log"
    )
    try:
        client = httpclient.InferenceServerClient(ray_cluster.url, network_timeout=120)
        try:  # tritonclient unchanged: the model name in the path is what routes it
            for name, factor in factors.items():
                tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
                assert client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist() == [[factor] * 4]
        finally:
            client.close()
        # Once a replica has told Ray Serve which models it holds (replicas report it every few
        # seconds), a model's requests go to the replicas that hold it, and load it nowhere else.
        # Ray's affinity is soft: a request routed before the holder's report (a busy machine
        # delays reports) loads the model on the second replica too, and from then on both hold
        # it and both are chosen. Each replica holds at most one model: the others were unloaded
        # (least recently used).
        deadline = time.monotonic() + 60
        while True:
            before = _ready_per_replica(deployment)
            holders = {_scale_json(deployment, "double")[0] for _ in range(10)}
            after = _ready_per_replica(deployment)
            holding = {replica for replica, names in before.items() if names == ["double"]}
            if (holders <= holding and after == before) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert holders <= holding and after == before, (holders, before, after)
        assert all(len(names) <= 1 for names in after.values()), after
        for name, factor in factors.items():  # evicted models load again on demand
            assert _scale_json(deployment, name)[1] == factor
    finally:
        deployment.close()
