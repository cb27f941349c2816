"""The response cache (`--cache-config local,size=BYTES` + `response_cache { enable: true }`):
hits skip the backend, what changes the answer misses, LRU eviction by size, reloads and
unloads drop entries, ensembles, statistics and metrics as Triton's, over HTTP and gRPC."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.paths import TESTS

REFERENCE = json.loads((TESTS / "fixtures" / "triton_metric_families.json").read_text())["families"]
# Two entries of 500 floats fit (4,008 bytes of outputs and 848 of overheads each), a third
# evicts; 2,000 floats (16 kB of outputs) never fit.
CACHE_SIZE = 12_000
COUNTER_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Doubles INPUT0 (plus the request parameter 'offset'); CALLS counts its executions."""

    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.calls += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            offset = float(json.loads(request.parameters()).get("offset", 0))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (x * 2 + offset).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (x + 1).astype(np.float32)),
                pb_utils.Tensor("CALLS", np.array([self.calls], dtype=np.int64)),
            ]))
        return responses
'''
COUNTER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
CACHE_ON = "response_cache { enable: true }\n"
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "%s" model_version: -1
  input_map { key: "INPUT0" value: "IN" }
  output_map { key: "OUTPUT0" value: "OUT" } output_map { key: "CALLS" value: "N" } } ] }
"""


def _counter(root: Path, name: str, cached: bool) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(COUNTER_PY)
    (root / name / "config.pbtxt").write_text(COUNTER_CONFIG + (CACHE_ON if cached else ""))


def _ensemble(root: Path, name: str, step: str, cached: bool) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(ENSEMBLE % step + (CACHE_ON if cached else ""))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    for name, cached in (
        ("counter", True),
        ("plain", False),
        ("lru", True),
        ("reloaded", True),
        ("over_grpc", True),
        ("step", False),
        ("step_cached", True),
    ):
        _counter(root, name, cached)
    _counter(root, "versions", cached=True)
    shutil.copytree(root / "versions" / "1", root / "versions" / "2")
    with (root / "versions" / "config.pbtxt").open("a") as config:
        config.write("version_policy { all { } }\n")
    _ensemble(root, "pipeline_cached", "step", cached=True)
    _ensemble(root, "pipeline", "step_cached", cached=False)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        [repository],
        ["--model-control-mode=explicit", "--load-model=*", f"--cache-config=local,size={CACHE_SIZE}"],
    ).start()
    yield process
    process.close()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    http = httpclient.InferenceServerClient(server.http_url)
    yield http
    http.close()


def _infer(
    client: httpclient.InferenceServerClient,
    model: str,
    values: list[float] | np.ndarray,
    *,
    outputs: list[str] | None = None,
    parameters: dict[str, object] | None = None,
    priority: int = 0,
) -> httpclient.InferResult:
    data = np.asarray(values, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    requested = [httpclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, [tensor], outputs=requested, parameters=parameters, priority=priority)


def _calls(result: httpclient.InferResult) -> int:
    return int(result.as_numpy("CALLS")[0])


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, object]:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    assert isinstance(stats, dict)
    return stats


def _count(stats: dict[str, object], kind: str) -> int:
    inference = stats["inference_stats"]
    assert isinstance(inference, dict)
    return int(inference[kind]["count"])


def test_a_hit_answers_without_running_the_model(client: httpclient.InferenceServerClient) -> None:
    first = _infer(client, "counter", [1, 2, 3])
    second = _infer(client, "counter", [1, 2, 3])
    assert _calls(first) == _calls(second) == 1  # the second answer is the first one, not a new run
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), [2, 4, 6])
    stats = _stats(client, "counter")
    assert stats["execution_count"] == 1 and stats["inference_count"] == 1  # hits are not inferences
    assert (_count(stats, "cache_hit"), _count(stats, "cache_miss"), _count(stats, "success")) == (1, 1, 2)
    # The same model without response_cache runs every time.
    assert [_calls(_infer(client, "plain", [1, 2, 3])) for _ in range(2)] == [1, 2]
    plain = _stats(client, "plain")
    assert (_count(plain, "cache_hit"), _count(plain, "cache_miss")) == (0, 0)


def test_what_changes_the_answer_misses(client: httpclient.InferenceServerClient) -> None:
    base = _calls(_infer(client, "counter", [5, 6]))
    assert _calls(_infer(client, "counter", [5, 7])) == base + 1  # other bytes
    with_offset = _infer(client, "counter", [5, 6], parameters={"offset": 10})
    assert _calls(with_offset) == base + 2  # a parameter the model reads
    np.testing.assert_array_equal(with_offset.as_numpy("OUTPUT0"), [20, 22])
    # Requested outputs: a subset never gets another subset's (or the full) answer.
    only_one = _infer(client, "counter", [5, 6], outputs=["OUTPUT1"])
    assert only_one.as_numpy("OUTPUT0") is None and only_one.as_numpy("CALLS") is None
    np.testing.assert_array_equal(only_one.as_numpy("OUTPUT1"), [6, 7])
    subset = _infer(client, "counter", [5, 6], outputs=["OUTPUT0", "CALLS"])
    assert _calls(subset) == base + 4 and subset.as_numpy("OUTPUT1") is None
    again = _infer(client, "counter", [5, 6], outputs=["OUTPUT0", "CALLS"])
    assert _calls(again) == base + 4  # the same subset hits
    # A scheduling parameter does not change the answer: a hit.
    assert _calls(_infer(client, "counter", [5, 6], priority=1)) == base


def test_a_hit_is_classified_like_a_run(client: httpclient.InferenceServerClient) -> None:
    def classes() -> list[bytes]:
        data = np.array([3, 9, 1], np.float32)
        tensor = httpclient.InferInput("INPUT0", [3], "FP32")
        tensor.set_data_from_numpy(data)
        wanted = [httpclient.InferRequestedOutput("OUTPUT1", class_count=2)]
        return list(client.infer("counter", [tensor], outputs=wanted).as_numpy("OUTPUT1"))

    before = _stats(client, "counter")["execution_count"]
    assert classes() == classes() == [b"10.000000:1", b"4.000000:0"]
    assert _stats(client, "counter")["execution_count"] == before + 1  # the second was a hit
    plain = _infer(client, "counter", [3, 9, 1], outputs=["OUTPUT1"])  # the raw values, not classes
    np.testing.assert_array_equal(plain.as_numpy("OUTPUT1"), [4, 10, 2])


def test_a_version_never_gets_another_versions_answer(client: httpclient.InferenceServerClient) -> None:
    data = np.array([6], np.float32)
    for version in ("1", "2", "1", "2"):
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(data)
        assert (
            client.infer("versions", [tensor], model_version=version).get_response()["model_version"]
            == version
        )
    for version in ("1", "2"):
        stats = client.get_inference_statistics("versions", version)["model_stats"][0]
        assert stats["execution_count"] == 1 and _count(stats, "cache_hit") == 1, version


def test_failures_are_not_cached(client: httpclient.InferenceServerClient) -> None:
    before = _stats(client, "counter")["execution_count"]
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="negative input"):
            _infer(client, "counter", [-1])
    assert _stats(client, "counter")["execution_count"] == before + 2


def test_least_recently_used_is_evicted_by_size(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    a, b, c = (np.full(500, value, np.float32) for value in (1, 2, 3))
    assert [_calls(_infer(client, "lru", x)) for x in (a, b, a, c)] == [1, 2, 1, 3]  # a hit, c evicts b
    assert _calls(_infer(client, "lru", a)) == 1  # a, used last before c, stayed
    assert _calls(_infer(client, "lru", c)) == 3
    assert _calls(_infer(client, "lru", b)) == 4  # b was evicted
    # An answer larger than the whole cache is never kept (and evicts nothing).
    big = np.full(2000, 9, np.float32)
    assert [_calls(_infer(client, "lru", big)) for _ in range(2)] == [5, 6]
    assert _calls(_infer(client, "lru", b)) == 4
    # Logged each time, in Triton's words (its QA L0_response_cache greps them).
    refused = re.findall(
        r"Failed to insert key \[[0-9a-f]+\] into response cache: Requested byte_size: (\d+) is greater "
        rf"than total cache size: {CACHE_SIZE}",
        server.log,
    )
    assert len(refused) == 2 and int(refused[0]) > CACHE_SIZE


def test_grpc_hits_what_http_filed(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    first = _infer(client, "over_grpc", [7, 8])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([7, 8], np.float32))
        answer = grpc.infer("over_grpc", [tensor], request_id="mine")
        assert answer.get_response().id == "mine"  # a hit answers with this request's id
        assert int(answer.as_numpy("CALLS")[0]) == _calls(first) == 1
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), [14, 16])
        stats = grpc.get_inference_statistics("over_grpc").model_stats[0].inference_stats
        assert (stats.cache_hit.count, stats.cache_miss.count) == (1, 1)
        assert stats.cache_hit.ns > 0 and stats.cache_miss.ns > 0
    finally:
        grpc.close()


def test_ensembles_cache_the_whole_pipeline_or_their_steps(client: httpclient.InferenceServerClient) -> None:
    def run(model: str) -> int:
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1, 1], np.float32))
        result = client.infer(model, [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUT"), [2, 2])
        return int(result.as_numpy("N")[0])

    # response_cache on the ensemble: the second request never reaches the pipeline's step.
    assert [run("pipeline_cached") for _ in range(2)] == [1, 1]
    assert _stats(client, "step")["execution_count"] == 1
    assert _count(_stats(client, "pipeline_cached"), "cache_hit") == 1
    # On a step only: the ensemble runs each time, its step answers from the cache.
    assert [run("pipeline") for _ in range(2)] == [1, 1]
    assert _stats(client, "step_cached")["execution_count"] == 1
    assert _count(_stats(client, "step_cached"), "cache_hit") == 1
    assert _count(_stats(client, "pipeline"), "cache_hit") == 0


def _scrape(server: ServerProcess) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def test_reload_and_unload_drop_the_models_entries(
    server: ServerProcess, client: httpclient.InferenceServerClient, repository: Path
) -> None:
    assert [_calls(_infer(client, "reloaded", [4])) for _ in range(2)] == [1, 1]
    entries = _entries(server)
    # Its configuration's time changed, not what it says: as on Triton, the version is kept,
    # and so are its answers.
    _touch(repository / "reloaded" / "config.pbtxt")
    client.load_model("reloaded")
    assert _calls(_infer(client, "reloaded", [4])) == 1 and _entries(server) == entries
    _touch(repository / "reloaded" / "1" / "model.py")  # changed: a load that changes nothing reloads nothing
    client.load_model("reloaded")  # a reload: new instances, new statistics, no old answers
    assert _entries_become(server, entries - 1)
    assert _calls(_infer(client, "reloaded", [4])) == 1
    stats = _stats(client, "reloaded")
    assert stats["execution_count"] == 1 and _count(stats, "cache_hit") == 0
    assert _entries(server) == entries
    client.unload_model("reloaded")
    assert _entries_become(server, entries - 1)
    client.load_model("reloaded")


def _touch(path: Path) -> None:
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))


def _entries(server: ServerProcess) -> float:
    return _scrape(server)["nv_cache_num_entries"][()]


def _entries_become(server: ServerProcess, expected: float) -> bool:
    """True once the cache holds `expected` entries (a replaced model closes just after)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _entries(server) == expected:
            return True
        time.sleep(0.1)
    return False


def test_metrics_as_tritons(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    for _ in range(3):
        _infer(client, "counter", [42])
    stats = _stats(client, "counter")
    families = _scrape(server)
    labels = (("model", "counter"), ("version", "1"))
    inference = stats["inference_stats"]
    assert isinstance(inference, dict)
    assert families["nv_cache_num_hits_per_model"][labels] == inference["cache_hit"]["count"]
    assert families["nv_cache_num_misses_per_model"][labels] == inference["cache_miss"]["count"]
    assert families["nv_cache_hit_duration_per_model"][labels] == inference["cache_hit"]["ns"] // 1000
    assert families["nv_cache_miss_duration_per_model"][labels] == inference["cache_miss"]["ns"] // 1000
    # Only models that use the cache have per-model samples.
    assert all(dict(key)["model"] != "plain" for key in families["nv_cache_num_hits_per_model"])
    hits, misses = families["nv_cache_num_hits"][()], families["nv_cache_num_misses"][()]
    assert hits >= 2 and families["nv_cache_num_lookups"][()] == hits + misses
    assert 0 < families["nv_cache_util"][()] <= 1
    assert families["nv_cache_num_evictions"][()] >= 1  # the LRU test evicted


def _families_as_tritons(server: ServerProcess, when: str) -> dict[str, Metric]:
    """The server's metric families, after checking that those Triton writes `when` (see the
    reference) are there with Triton's type, labels and HELP."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    expected = [family for family in REFERENCE if family["when"] == when]
    assert expected
    for reference in expected:
        family = families[reference["name"]]
        labels = sorted({key for sample in family.samples for key in sample.labels})
        assert (family.type, labels, family.documentation) == (
            reference["type"],
            reference["labels"],
            reference["help"],
        ), reference["name"]
    return families


def test_cache_families_have_tritons_names_types_labels_and_help(server: ServerProcess) -> None:
    families = _families_as_tritons(server, "cache")
    assert len([name for name in families if name.startswith("nv_cache")]) == 12


def test_cache_summaries_come_with_summary_latencies_as_tritons(
    tmp_path: Path, coreserve_server: ServerFactory
) -> None:
    """Triton's QA L0_metrics test_cache_summaries_exist: a summary of each model's hits and
    misses, for the models that use the cache."""
    _counter(tmp_path, "counter", cached=True)
    _counter(tmp_path, "plain", cached=False)
    server = coreserve_server(
        tmp_path, f"--cache-config=local,size={CACHE_SIZE}", "--metrics-config=summary_latencies=true"
    )
    with httpclient.InferenceServerClient(server.http_url) as client:
        for model in ("counter", "counter", "counter", "plain"):
            _infer(client, model, [7])
    families = _families_as_tritons(server, "cache+summary_latencies")
    for name in ("nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model"):
        assert {sample.labels["model"] for sample in families[name].samples} == {"counter"}
    counts = {
        family: {s.name: s.value for s in families[family].samples if not s.labels.get("quantile")}
        for family in ("nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model")
    }
    assert counts["nv_cache_hit_summary_per_model"]["nv_cache_hit_summary_per_model_count"] == 2
    assert counts["nv_cache_miss_summary_per_model"]["nv_cache_miss_summary_per_model_count"] == 1


def _start_failure(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coreserve", f"--model-repository={tmp_path}", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-config=local,size=abc"], "size must be a whole number of bytes above 0, got 'abc'"),
        (["--cache-config=local,size=-5"], "size must be a whole number of bytes above 0, got '-5'"),
        (["--cache-config=local,size=0"], "size must be a whole number of bytes above 0, got '0'"),
        (["--cache-config=local,colour=red"], "unknown setting 'colour'"),
        (["--cache-config=local"], "expected <cache>,<key>=<value>"),
        (["--cache-config=memcached,size=10"], "unknown cache 'memcached'"),
        (["--cache-config=local,port=1"], "unknown setting 'port'"),
        (
            ["--cache-config=local,size=10", "--cache-config=redis,host=x"],
            "found multiple cache configurations, but only a single cache is currently supported",
        ),
        (
            ["--cache-config=local,size=10", "--response-cache-byte-size=10"],
            "Incompatible flags --response-cache-byte-size and --cache-config both provided",
        ),
    ],
)
def test_bad_cache_flags_stop_the_start_in_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    result = _start_failure(tmp_path, *flags)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("coreserve: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_decoupled_and_sequence_models_refuse_the_cache_as_triton(tmp_path: Path) -> None:
    shutil.copytree(TESTS / "plugins" / "python" / "models" / "countdown", tmp_path / "countdown")
    with (tmp_path / "countdown" / "config.pbtxt").open("a") as config:
        config.write(CACHE_ON)
    _counter(tmp_path, "sequenced", cached=True)
    with (tmp_path / "sequenced" / "config.pbtxt").open("a") as config:
        config.write("sequence_batching { }\n")
    # An ensemble written decoupled, over a step that is not (Triton's QA L0_response_cache
    # ensemble_cache_decoupled): the flag as written is refused, before the steps would set it.
    _counter(tmp_path, "step", cached=False)
    _ensemble(tmp_path, "written_decoupled", "step", cached=True)
    with (tmp_path / "written_decoupled" / "config.pbtxt").open("a") as config:
        config.write("model_transaction_policy { decoupled: true }\n")
    result = _start_failure(tmp_path, "--cache-config=local,size=1000", "--http-port=0", "--grpc-port=0",
                            "--metrics-port=0")  # fmt: skip
    assert result.returncode == 1
    assert (
        "Response Cache does not currently support model written_decoupled with 'decoupled' transaction "
        "policy. Please disable the response cache."
    ) in result.stderr
    assert (
        "Response Cache does not currently support model countdown with 'decoupled' transaction policy. "
        "Please disable the response cache."
    ) in result.stderr
    assert (
        "Response Cache does not currently support model sequenced with sequence batching scheduler. "
        "Please disable the response cache."
    ) in result.stderr


def test_enabled_without_a_server_cache_serves_uncached_with_one_warning(tmp_path: Path) -> None:
    _counter(tmp_path, "counter", cached=True)
    process = ServerProcess([tmp_path]).start()
    try:
        http = httpclient.InferenceServerClient(process.http_url)
        assert [_calls(_infer(http, "counter", [1])) for _ in range(2)] == [1, 2]
        http.close()
        assert process.log.count("response_cache is enabled but the server has no cache") == 1
        families = _scrape(process)  # Triton's per-model families at zero, and no cache-wide ones
        labels = (("model", "counter"), ("version", "1"))
        per_model = ("num_hits", "hit_duration", "num_misses", "miss_duration")
        assert [families[f"nv_cache_{name}_per_model"][labels] for name in per_model] == [0, 0, 0, 0]
        assert "nv_cache_num_entries" not in families
    finally:
        process.close()
