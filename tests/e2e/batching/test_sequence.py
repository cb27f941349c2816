"""The sequence batcher: running sums of interleaved sequences on several slots, and its errors."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import accumulator_model, write_model
from support.waiting import requests_in, wait_until

ACCUMULATOR = """
backend: "onnxruntime"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "CORR_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "acc_in" output_name: "acc_out" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
"""


def _server(
    coreserve_server: ServerFactory,
    tmp_path: Path,
    *,
    count: int = 2,
    max_batch: int = 2,
    idle: int = 5_000_000,
    strategy: str = "",
) -> ServerProcess:
    config = ACCUMULATOR.format(count=count, max_batch=max_batch, idle=idle, strategy=strategy)
    write_model(tmp_path, "accumulator", accumulator_model(), config)
    return coreserve_server(tmp_path)


def _step(
    client: httpclient.InferenceServerClient,
    sequence_id: int | str,
    value: int,
    *,
    start: bool = False,
    end: bool = False,
    model: str = "accumulator",
) -> tuple[int, int]:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0]), int(result.as_numpy("CORR_OUT")[0, 0])


def _run_sequence(
    server: ServerProcess, sequence_id: int, values: list[int], pause: float = 0.0
) -> list[int]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    sums = []
    try:
        for index, value in enumerate(values):
            total, corrid = _step(client, sequence_id, value, start=index == 0, end=index == len(values) - 1)
            assert corrid == sequence_id
            sums.append(total)
            time.sleep(pause)
    finally:
        client.close()
    return sums


@pytest.mark.parametrize("strategy", ["", "oldest { max_candidate_sequences: 4 }"], ids=["direct", "oldest"])
def test_interleaved_sequences_get_their_running_sums(
    coreserve_server: ServerFactory, tmp_path: Path, strategy: str
) -> None:
    server = _server(coreserve_server, tmp_path, strategy=strategy)  # 4 slots, 6 sequences
    sequences = {1000 + n: [n * 10 + step for step in range(5)] for n in range(6)}
    with ThreadPoolExecutor(len(sequences)) as pool:
        futures = {
            sid: pool.submit(_run_sequence, server, sid, values, 0.01) for sid, values in sequences.items()
        }
        results = {sid: future.result(timeout=120) for sid, future in futures.items()}
    for sid, values in sequences.items():
        assert results[sid] == list(np.cumsum(values)), sid
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("accumulator")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == 30
    assert stats["execution_count"] <= 30


def test_restarting_a_sequence_resets_its_state(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    server = _server(coreserve_server, tmp_path)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert _step(client, 7, 5, start=True)[0] == 5
        assert _step(client, 7, 5)[0] == 10
        assert _step(client, 7, 1, start=True)[0] == 1
        assert _step(client, 7, 2, end=True)[0] == 3
        assert _step(client, 8, 1, start=True, end=True)[0] == 1  # started after its end: no conflict
    finally:
        client.close()
    conflict = "sequence {} for model 'accumulator' has a conflict. The previous sequence did not end"
    assert conflict.format(7) in server.log and conflict.format(8) not in server.log  # Triton's warning


def test_sequence_errors(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    server = _server(coreserve_server, tmp_path, idle=300_000)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(
            InferenceServerException, match="must specify a non-zero or non-empty correlation ID"
        ) as info:
            _step(client, 0, 1)
        assert info.value.status() == "400"
        with pytest.raises(
            InferenceServerException, match="must specify the START flag on the first request"
        ):
            _step(client, 42, 1)
        _step(client, 43, 1, start=True, end=True)
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            _step(client, 43, 1)
        _step(client, 44, 1, start=True)
        time.sleep(1.0)  # longer than max_sequence_idle_microseconds
        with pytest.raises(
            InferenceServerException, match="released: idle for more than 300000 microseconds"
        ):
            _step(client, 44, 1)
        batch = httpclient.InferInput("INPUT", [2, 1], "INT32")
        batch.set_data_from_numpy(np.array([[1], [2]], np.int32))
        with pytest.raises(
            InferenceServerException,
            match="must specify batch-size 1 due to requirements of sequence batcher",
        ):
            client.infer("accumulator", [batch], sequence_id=45, sequence_start=True)
        assert _step(client, 46, 4, start=True, end=True)[0] == 4  # still serving
    finally:
        client.close()


def _step_alone(
    server: ServerProcess, sequence_id: int, value: int, model: str = "accumulator", **flags: bool
) -> tuple[int, int]:
    """One step on a client of its own (tritonclient's HTTP clients stay on their thread)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        return _step(client, sequence_id, value, model=model, **flags)
    finally:
        client.close()


def _statistics(server: ServerProcess, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return dict(client.get_inference_statistics(model)["model_stats"][0])
    finally:
        client.close()


def test_sequences_beyond_the_slots_wait_then_give_up(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    server = _server(coreserve_server, tmp_path, count=1, max_batch=1, idle=600_000)  # one slot
    assert _step_alone(server, 1, 1, start=True)[0] == 1
    with ThreadPoolExecutor(2) as pool:
        # Sequence 2 waits for the slot while sequence 1 is active; it gets the slot when 1 ends.
        waiting = pool.submit(_step_alone, server, 2, 5, start=True)
        wait_until(lambda: requests_in(server.metrics_url, "accumulator") == 1, "sequence 2 is in")
        assert not waiting.done()
        assert _step_alone(server, 1, 1, end=True)[0] == 2
        assert waiting.result(timeout=30) == (5, 2)

        # Sequence 3 waits while sequence 2 stays active past the idle limit: it is rejected.
        def keep_busy() -> None:
            for _ in range(12):
                _step_alone(server, 2, 0)
                time.sleep(0.1)

        busy = pool.submit(keep_busy)
        with pytest.raises(InferenceServerException) as info:
            _step_alone(server, 3, 1, start=True)
        busy.result(timeout=30)
    assert info.value.status() == "503"
    assert "sequence slots of model 'accumulator' stayed busy" in info.value.message()


def _batch_sizes(stats: dict[str, Any]) -> dict[int, int]:
    """How many executions ran each batch size."""
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}


@pytest.mark.parametrize(
    "strategy",
    [
        "direct {{ max_queue_delay_microseconds: {delay} minimum_slot_utilization: 1.0 }}",
        "oldest {{ max_queue_delay_microseconds: {delay} preferred_batch_size: [ 2 ] }}",
    ],
    ids=["direct", "oldest"],
)
def test_a_batch_waits_for_more_sequences_up_to_the_queue_delay(
    coreserve_server: ServerFactory, tmp_path: Path, strategy: str
) -> None:
    # "held" waits up to a minute for a second sequence, "accumulator" 0.4 s; both run at once
    # with two ready sequences (both slots of their instance).
    held = ACCUMULATOR.format(
        count=1, max_batch=2, idle=5_000_000, strategy=strategy.format(delay=60_000_000)
    )
    write_model(tmp_path, "held", accumulator_model(), held)
    server = _server(
        coreserve_server, tmp_path, count=1, max_batch=2, strategy=strategy.format(delay=400_000)
    )
    with ThreadPoolExecutor(2) as pool:
        # A sequence alone waits in the queue for another, unexecuted...
        first = pool.submit(_step_alone, server, 1, 1, "held", start=True, end=True)
        wait_until(lambda: requests_in(server.metrics_url, "held") == 1, "sequence 1 waits")
        assert _statistics(server, "held")["execution_count"] == 0
        assert not first.done()
        # ...and one that comes within the delay joins it: one execution of both.
        second = pool.submit(_step_alone, server, 2, 2, "held", start=True, end=True)
        assert (first.result(timeout=30), second.result(timeout=30)) == ((1, 1), (2, 2))
    stats = _statistics(server, "held")
    assert (stats["inference_count"], stats["execution_count"]) == (2, 1)
    assert _batch_sizes(stats) == {2: 1}
    # A sequence that none joins runs alone once the delay is over.
    assert _step_alone(server, 7, 5, start=True, end=True) == (5, 7)
    stats = _statistics(server, "accumulator")
    assert (stats["inference_count"], stats["execution_count"]) == (1, 1)
    assert _batch_sizes(stats) == {1: 1}


ECHO_SEQUENCES = """
backend: "echo"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 } ]
sequence_batching { oldest { max_candidate_sequences: 2 preserve_ordering: %s } }
"""


@pytest.mark.parametrize("preserve", [False, True])
def test_oldest_preserve_ordering_holds_later_responses(
    coreserve_server: ServerFactory, tmp_path: Path, echo_backend_site: Path, preserve: bool
) -> None:
    write_model(tmp_path, "echo", b"", ECHO_SEQUENCES % str(preserve).lower(), filename="model.echo")
    pythonpath = os.pathsep.join(filter(None, [str(echo_backend_site), os.environ.get("PYTHONPATH")]))
    server = coreserve_server(tmp_path, env={"PYTHONPATH": pythonpath})

    def step(sequence_id: int, **parameters: object) -> int:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[sequence_id]], np.int32))
        try:
            result = client.infer(
                "echo",
                [tensor],
                sequence_id=sequence_id,
                sequence_start=True,
                sequence_end=True,
                parameters=parameters or None,
            )
        finally:
            client.close()
        return int(result.as_numpy("OUT")[0, 0])

    def executions() -> int:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            return int(client.get_inference_statistics("echo")["model_stats"][0]["execution_count"])
        finally:
            client.close()

    # The first sequence runs two seconds on one instance; the second, sent while it runs,
    # runs at once on the other. Without preserve_ordering its answer comes while the first
    # still runs; with it, its answer is held until the first's has left. Asserted on what the
    # server reports (the second's execution counted) and which answers had come, not on how
    # long the second one took. tests/core/scheduling/test_ordering.py asserts the order of
    # release exactly.
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(step, 1, delay_ms=2000)
        wait_until(lambda: requests_in(server.metrics_url, "echo") == 1, "the first sequence is in")
        fast = pool.submit(step, 2)
        if preserve:
            wait_until(lambda: executions() == 1, "the second sequence ran")
            assert not slow.done()
            assert not fast.done()  # executed, its answer held behind the first's
        else:
            assert fast.result(timeout=30) == 2
            assert not slow.done()  # answered while the first still runs
        assert (slow.result(timeout=30), fast.result(timeout=30)) == (1, 2)
    assert executions() == 2


def test_sequence_ids_over_grpc(coreserve_server: ServerFactory, tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "accumulator",
        accumulator_model(),
        ACCUMULATOR.format(count=1, max_batch=2, idle=5_000_000, strategy=""),
    )
    write_model(
        tmp_path,
        "named",
        accumulator_model("BYTES"),
        ACCUMULATOR.format(count=1, max_batch=2, idle=5_000_000, strategy="").replace(
            "TYPE_UINT64", "TYPE_STRING"
        ),
    )
    write_model(
        tmp_path,
        "signed",
        accumulator_model("INT64"),
        ACCUMULATOR.format(count=1, max_batch=2, idle=5_000_000, strategy="").replace(
            "TYPE_UINT64", "TYPE_INT64"
        ),
    )
    server = coreserve_server(tmp_path)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[3]], np.int32))
        # An INT64 CORRID takes the id's 64 bits, as Triton casts them; the model serves on.
        for sequence_id, corrid in ((-3, -3), (7, 7)):
            result = client.infer(
                "signed", [tensor], sequence_id=sequence_id, sequence_start=True, sequence_end=True
            )
            assert int(result.as_numpy("CORR_OUT")[0, 0]) == corrid
        with pytest.raises(InferenceServerException, match="takes numeric sequence ids"):
            client.infer("accumulator", [tensor], sequence_id="abc", sequence_start=True)
        result = client.infer(
            "accumulator", [tensor], sequence_id=2**62 + 5, sequence_start=True, sequence_end=True
        )
        assert int(result.as_numpy("CORR_OUT")[0, 0]) == 2**62 + 5
        # gRPC's int64 parameter read unsigned, as Triton reads it (HTTP refuses a negative id).
        result = client.infer("accumulator", [tensor], sequence_id=-3, sequence_start=True, sequence_end=True)
        assert int(result.as_numpy("CORR_OUT")[0, 0]) == 2**64 - 3
        for expected in (3, 6, 9):
            result = client.infer("named", [tensor], sequence_id="user-17", sequence_start=expected == 3)
            assert int(result.as_numpy("OUTPUT")[0, 0]) == expected
            assert result.as_numpy("CORR_OUT")[0, 0] == b"user-17"
    finally:
        client.close()


BAD_SEQUENCE_CONFIGS = {
    "control without values": (
        "int32_false_true: [ 0, 1 ]",
        "",
        "needs exactly one of int32_false_true, fp32_false_true, bool_false_true",
    ),
    "corrid without datatype": (
        "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64",
        "kind: CONTROL_SEQUENCE_CORRID",
        "a CORRID control needs data_type",
    ),
    "slot utilization above 1": (
        "max_sequence_idle_microseconds: 1000000\n",
        "max_sequence_idle_microseconds: 1000000\n  direct { minimum_slot_utilization: 1.5 }\n",
        "'sequence_batching.direct.minimum_slot_utilization' must lie in 0..1, got 1.5",
    ),
    "preferred batch above max_batch_size": (
        "max_sequence_idle_microseconds: 1000000\n",
        "max_sequence_idle_microseconds: 1000000\n  oldest { preferred_batch_size: [ 4 ] }\n",
        "'sequence_batching.oldest.preferred_batch_size' has 4, outside 1..max_batch_size (2)",
    ),
    "state with open dims": (
        "data_type: TYPE_INT32 dims: [ 1 ] } ]\n}",
        "data_type: TYPE_INT32 dims: [ -1 ] } ]\n}",
        "are not fixed; give initial_state dims",
    ),
}


def test_bad_sequence_configurations_make_the_model_unavailable(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    good = ACCUMULATOR.format(count=1, max_batch=2, idle=1_000_000, strategy="")
    for index, (old, new, _) in enumerate(BAD_SEQUENCE_CONFIGS.values()):
        assert old in good
        write_model(tmp_path, f"bad{index}", accumulator_model(), good.replace(old, new, 1))
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for index, (_, _, reason) in enumerate(BAD_SEQUENCE_CONFIGS.values()):
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata(f"bad{index}")
            assert info.value.status() == "404" and reason in info.value.message()
    finally:
        client.close()


WHICH_INSTANCE_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([[os.getpid()]], np.int64)  # each instance is a process of its own
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""
WHICH_INSTANCE_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  %s
}
"""


@pytest.mark.parametrize(
    "strategy",
    ["oldest { max_candidate_sequences: 10 }", "oldest { max_candidate_sequences: 2 }", "direct { }"],
    ids=["oldest", "oldest-backlog", "direct"],
)
def test_every_request_of_a_sequence_runs_on_one_instance(
    coreserve_server: ServerFactory, tmp_path: Path, strategy: str
) -> None:
    folder = write_model(tmp_path, "which", None, WHICH_INSTANCE_CONFIG % strategy)
    (folder / "1" / "model.py").write_text(WHICH_INSTANCE_MODEL)
    server = coreserve_server(tmp_path)

    def run_sequence(sequence_id: int) -> list[int]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        pids = []
        try:
            for step in range(5):
                tensor = httpclient.InferInput("IN", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[step]], np.int32))
                result = client.infer(
                    "which",
                    [tensor],
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == 4,
                )
                pids.append(int(result.as_numpy("PID")[0, 0]))
        finally:
            client.close()
        return pids

    with ThreadPoolExecutor(20) as pool:
        runs = list(pool.map(run_sequence, range(1, 21), timeout=120))
    instances_per_sequence = {sequence_id: set(pids) for sequence_id, pids in enumerate(runs, start=1)}
    assert all(len(instances) == 1 for instances in instances_per_sequence.values()), instances_per_sequence
    # Both instances served sequences: the test would prove nothing with one.
    assert len(set().union(*instances_per_sequence.values())) == 2
