"""The data plane driven in-process: health, metadata, inference, streams, statistics, cancellation.

`DataPlane` is what the HTTP and gRPC frontends call; here the test calls it directly, on the
loop of coreserve.testing's `InProcessServer`, over real models: an ONNX add/sub model, an
ensemble of two of its steps, and `gate`, a backend written here (through the public backend
API) that holds the requests a test names until the test releases them or they are cancelled.
So a test decides when an instance is busy and asserts what happened, never how long it took.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest

from coreserve import (
    CancelledError,
    InferenceRequest,
    InferenceResponse,
    InvalidArgumentError,
    ModelConfig,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    __version__,
)
from coreserve.backend import BaseBackend, InstancePlacement, ModelFiles, Responder, ServerContext
from coreserve.errors import ErrorCode, RequestMismatchError
from coreserve.server.dataplane import EXTENSIONS, SERVER_NAME, DataPlane, ServerFlags
from coreserve.testing import InProcessServer
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model

T = TypeVar("T")

# (a, b) -> add_sub -> (a+b, a-b) -> add_sub -> (2a, 2b)
TWICE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "DOUBLE_A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DOUBLE_B" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "difference" }
    },
    {
      model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "difference" }
      output_map { key: "OUTPUT0" value: "DOUBLE_A" } output_map { key: "OUTPUT1" value: "DOUBLE_B" }
    }
  ]
}
"""
GATE = """
backend: "gate"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
GATE_STREAM = GATE + "model_transaction_policy { decoupled: true }\n"
# A model whose file is missing: its load fails.
BROKEN = """
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


class GateBackend(BaseBackend):
    """Doubles IN into OUT (decoupled: answers IN, IN-1, ... 1); holds the requests whose ids
    are in `holding` (a decoupled one after its first response) until `release` or a cancel."""

    name = "gate"
    default_model_filename = "model.gate"

    def __init__(self) -> None:
        self.holding: set[str] = set()
        self.started: list[str] = []  # request ids, in the order the instance took them
        self.cancelled: list[str] = []  # held requests the instance saw cancelled
        self._gates: dict[str, asyncio.Event] = {}
        self._waiting: dict[str, asyncio.Event] = {}

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> GateInstance:
        return GateInstance(self, config.model_transaction_policy.decoupled)

    def gate(self, request_id: str) -> asyncio.Event:
        return self._gates.setdefault(request_id, asyncio.Event())

    def held(self, request_id: str) -> asyncio.Event:
        """Set once the instance holds the request (on the server's loop)."""
        return self._waiting.setdefault(request_id, asyncio.Event())


class GateInstance:
    def __init__(self, backend: GateBackend, decoupled: bool) -> None:
        self._backend = backend
        self._decoupled = decoupled

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        for request in requests:
            self._backend.started.append(request.id)
            value = int(request.inputs["IN"][0])
            if self._decoupled:
                responder.send(request, {"OUT": np.array([value], np.int32)}, final=False)
            if not await self._pass(request):
                responder.send_error(request, CancelledError.of_request(request.model_name))
                continue
            if self._decoupled:
                for left in range(value - 1, 0, -1):
                    responder.send(request, {"OUT": np.array([left], np.int32)}, final=False)
                responder.send_final(request)
            else:
                responder.send(request, {"OUT": np.array([2 * value], np.int32)})

    async def _pass(self, request: InferenceRequest) -> bool:
        """Waits at the gate of a held request; False if it was cancelled there."""
        backend = self._backend
        if request.id not in backend.holding:
            return True
        cancelled = asyncio.Event()
        forget = request.on_cancel(cancelled.set)
        backend.held(request.id).set()
        waits = [
            asyncio.ensure_future(backend.gate(request.id).wait()),
            asyncio.ensure_future(cancelled.wait()),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        forget()
        if request.is_cancelled():
            backend.cancelled.append(request.id)
            return False
        return True

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def gate() -> GateBackend:
    return GateBackend()


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory, gate: GateBackend) -> Iterator[InProcessServer]:
    """One server for the module: every model loaded except `spare` (tests load and unload it)."""
    root = tmp_path_factory.mktemp("dataplane-models")
    for name in ("add_sub", "counted", "spare"):  # counted: for the statistics test alone
        write_model(root, name, add_sub_model(), ADD_SUB_CONFIG)
    (root / "twice" / "1").mkdir(parents=True)
    (root / "twice" / "config.pbtxt").write_text(TWICE)
    for name, config in (("gate", GATE), ("gate_stream", GATE_STREAM)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.gate").write_bytes(b"")
        (root / name / "config.pbtxt").write_text(config)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text(BROKEN)
    server = InProcessServer(root, backends=[gate]).start()
    try:
        for name in ("add_sub", "counted", "twice", "gate", "gate_stream"):
            server.load(name)
        with pytest.raises(InvalidArgumentError, match=r"^load failed for model 'broken': version 1 is at"):
            server.load("broken")
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def plane(kit: InProcessServer) -> DataPlane:
    assert kit.dataplane is not None
    return kit.dataplane


def on_loop(kit: InProcessServer, call: Callable[..., T], *args: Any) -> T:
    """Calls a synchronous data-plane method on the server's loop thread, as a frontend does."""

    async def run() -> T:
        return call(*args)

    return kit.run(run())


def pair(rows: int = 1, request_id: str = "", model: str = "add_sub", **fields: Any) -> InferenceRequest:
    first = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    inputs = {"INPUT0": first, "INPUT1": np.full((rows, 4), 2.0, np.float32)}
    return InferenceRequest(model, inputs, id=request_id, **fields)


def gated(value: int, request_id: str, model: str = "gate") -> InferenceRequest:
    return InferenceRequest(model, {"IN": np.array([value], np.int32)}, id=request_id)


def failures(kit: InProcessServer, model: str) -> dict[str, int]:
    stats = on_loop(kit, kit.dataplane.statistics, model)["model_stats"][0]  # type: ignore[union-attr]
    version = kit.dataplane.model_version(model)  # type: ignore[union-attr]
    return {**dict(version.statistics.failures), "fail": stats["inference_stats"]["fail"]["count"]}


# Health and metadata ----------------------------------------------------------------------


def test_server_metadata_names_the_server_its_version_and_tritons_extensions(plane: DataPlane) -> None:
    expected = list(EXTENSIONS)
    if plane.shared_memory.cuda is not None:  # only where a CUDA device is usable
        expected.insert(expected.index("system_shared_memory") + 1, "cuda_shared_memory")
    assert plane.server_metadata() == {"name": SERVER_NAME, "version": __version__, "extensions": expected}
    assert DataPlane(plane.repository, ServerFlags(), name="edge-7").server_metadata()["name"] == "edge-7"


def test_live_and_ready_follow_the_flags_and_the_models(kit: InProcessServer, plane: DataPlane) -> None:
    # `broken` failed to load, so the repository is not all ready: strict readiness says so.
    assert on_loop(kit, plane.repository.all_ready) is False
    flags = ServerFlags()
    own = DataPlane(plane.repository, flags)
    states = []
    for started, stopping, strict in [
        (False, False, True),
        (True, False, True),
        (True, False, False),
        (True, True, False),
        (False, True, False),
    ]:
        flags.started, flags.stopping, flags.strict_readiness = started, stopping, strict
        states.append((on_loop(kit, own.live), on_loop(kit, own.ready)))
    assert states == [(True, False), (True, False), (True, True), (False, False), (False, False)]


def test_model_readiness(kit: InProcessServer, plane: DataPlane) -> None:
    asked = [("add_sub", ""), ("add_sub", "1"), ("add_sub", "2"), ("nope", ""), ("broken", ""), ("twice", "")]
    assert [on_loop(kit, plane.model_ready, *a) for a in asked] == [True, True, False, False, False, True]
    with pytest.raises(InvalidArgumentError):  # a malformed version stays an error
        on_loop(kit, plane.model_ready, "add_sub", "one")


def test_malformed_versions_are_refused_in_tritons_words(kit: InProcessServer, plane: DataPlane) -> None:
    refusals = []
    for version in ("x", "-1"):
        with pytest.raises(InvalidArgumentError) as refused:
            on_loop(kit, plane.model_metadata, "add_sub", version)
        refusals.append(refused.value.message)
    assert refusals == [
        "failed to get model version from specified version string 'x' (details: stol), version should be "
        "an integral value > 0",
        "invalid model version specified '-1' , version should be an integral value > 0",
    ]


def test_model_metadata_lists_the_signature_as_clients_see_it(kit: InProcessServer, plane: DataPlane) -> None:
    tensors = [
        {"name": f"{kind}{i}", "datatype": "FP32", "shape": [-1, 4]}
        for kind in ("INPUT", "OUTPUT")
        for i in (0, 1)
    ]
    assert on_loop(kit, plane.model_metadata, "add_sub") == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": tensors[:2],
        "outputs": tensors[2:],
    }
    assert on_loop(kit, plane.model_metadata, "add_sub", "1")["versions"] == ["1"]
    assert on_loop(kit, plane.model_metadata, "twice")["platform"] == "ensemble"
    with pytest.raises(NotFoundError, match=r"^Request for unknown model: 'nope' is not found$"):
        on_loop(kit, plane.model_metadata, "nope")


def test_model_config_of_serving_models_only(kit: InProcessServer, plane: DataPlane) -> None:
    config = on_loop(kit, plane.model_config, "add_sub")
    assert (config.name, config.max_batch_size, [i.name for i in config.input]) == (
        "add_sub",
        8,
        ["INPUT0", "INPUT1"],
    )
    assert on_loop(kit, plane.model_config, "gate_stream").model_transaction_policy.decoupled is True
    with pytest.raises(NotFoundError) as missing:
        on_loop(kit, plane.model_config, "add_sub", "3")
    assert missing.value.message == "Request for unknown model: 'add_sub' version 3 is not found"
    with pytest.raises(
        NotFoundError, match=r"^Request for unknown model: 'broken' has no available versions"
    ):
        on_loop(kit, plane.model_config, "broken")


def test_settings_of_an_unknown_model_are_refused(kit: InProcessServer, plane: DataPlane) -> None:
    assert on_loop(kit, plane.trace_setting, "add_sub") == on_loop(kit, plane.trace_setting)
    with pytest.raises(InvalidArgumentError) as refused:
        on_loop(kit, plane.trace_setting, "nope")
    assert (refused.value.code, refused.value.message) == (
        ErrorCode.INVALID_ARG,
        "Request for unknown model : nope",
    )


# Inference ---------------------------------------------------------------------------------


def test_infer_answers_with_the_models_results(kit: InProcessServer, plane: DataPlane) -> None:
    request = pair(rows=2, request_id="r-1")
    response = kit.run(plane.infer(request))
    assert (response.id, response.model_name, response.model_version) == ("r-1", "add_sub", "1")
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], [[2, 3, 4, 5], [6, 7, 8, 9]])
    np.testing.assert_array_equal(response.outputs["OUTPUT1"], [[-2, -1, 0, 1], [2, 3, 4, 5]])
    assert request.batch_size == 2  # set by the signature's check
    only = kit.run(plane.infer(pair(requested_outputs=("OUTPUT1",))))
    assert list(only.outputs) == ["OUTPUT1"]


def test_an_ensemble_runs_its_steps_through_their_schedulers(kit: InProcessServer, plane: DataPlane) -> None:
    steps_before = on_loop(kit, plane.statistics, "add_sub")["model_stats"][0]["execution_count"]
    request = InferenceRequest(
        "twice", {"A": np.array([[1, 2, 3, 4]], np.float32), "B": np.array([[10, 20, 30, 40]], np.float32)}
    )
    response = kit.run(plane.infer(request))
    np.testing.assert_array_equal(response.outputs["DOUBLE_A"], [[2, 4, 6, 8]])
    np.testing.assert_array_equal(response.outputs["DOUBLE_B"], [[20, 40, 60, 80]])
    steps_after = on_loop(kit, plane.statistics, "add_sub")["model_stats"][0]["execution_count"]
    assert steps_after - steps_before == 2


def test_refused_requests_raise_tritons_errors_and_count_as_failures(
    kit: InProcessServer, plane: DataPlane
) -> None:
    before = failures(kit, "add_sub")
    wrong_type = pair(request_id="r-7")
    wrong_type.inputs["INPUT0"] = wrong_type.inputs["INPUT0"].astype(np.float64)
    with pytest.raises(RequestMismatchError) as mismatch:  # Triton puts the request's id first
        kit.run(plane.infer(wrong_type))
    assert mismatch.value.message == (
        "[request id: r-7] inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
    )
    too_many = pair(rows=9)
    with pytest.raises(RequestMismatchError) as batch:
        kit.run(plane.infer(too_many))
    assert batch.value.message == (
        "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub' (input 'INPUT1' has 9)"
    )
    extra = pair()
    extra.inputs["X"] = np.zeros((1, 4), np.float32)
    with pytest.raises(InvalidArgumentError) as unexpected:
        kit.run(plane.infer(extra))
    assert type(unexpected.value) is InvalidArgumentError  # not a mismatch: no request id
    assert unexpected.value.message.startswith("unexpected inference input 'X' for model 'add_sub'")
    after = failures(kit, "add_sub")
    assert (after["OTHER"] - before["OTHER"], after["fail"] - before["fail"]) == (0, 0)  # as on Triton
    assert after["BACKEND"] == before["BACKEND"]
    # A model that does not exist or does not serve fails before any statistics.
    with pytest.raises(NotFoundError) as unknown:
        kit.run(plane.infer(pair(model="nope")))
    assert (unknown.value.code, unknown.value.message) == (
        ErrorCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
    )
    with pytest.raises(NotFoundError, match=r"^Request for unknown model: 'add_sub' version 2 is not found$"):
        kit.run(plane.infer(pair(model_version="2")))


def test_statistics_count_exactly_what_ran(kit: InProcessServer, plane: DataPlane) -> None:
    for rows in (1, 2, 2, 3):
        kit.run(plane.infer(pair(rows=rows, model="counted")))
    bad = pair(model="counted")
    del bad.inputs["INPUT1"]
    with pytest.raises(RequestMismatchError):
        kit.run(plane.infer(bad))
    (stats,) = on_loop(kit, plane.statistics, "counted")["model_stats"]
    assert (stats["name"], stats["version"]) == ("counted", "1")
    assert (stats["inference_count"], stats["execution_count"]) == (8, 4)
    counts = {kind: entry["count"] for kind, entry in stats["inference_stats"].items()}
    assert counts == {
        "success": 4,
        "fail": 0,  # refused before it reached the model: not counted, as on Triton
        "queue": 4,
        "compute_input": 4,
        "compute_infer": 4,
        "compute_output": 4,
        "cache_hit": 0,
        "cache_miss": 0,
    }
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1),
        (2, 2),
        (3, 1),
    ]
    assert on_loop(kit, plane.statistics, "counted", "1") == {"model_stats": [stats]}


def test_statistics_of_every_model_and_of_what_is_not_loaded(kit: InProcessServer, plane: DataPlane) -> None:
    everything = on_loop(kit, plane.statistics)["model_stats"]
    # By name, loaded models only: `broken` has no loaded version and `spare` is not loaded.
    assert [(s["name"], s["version"]) for s in everything] == [
        ("add_sub", "1"),
        ("counted", "1"),
        ("gate", "1"),
        ("gate_stream", "1"),
        ("twice", "1"),
    ]
    refusals = []
    for asked in [("nope",), ("broken",), ("add_sub", "4")]:
        with pytest.raises(InvalidArgumentError) as refused:
            on_loop(kit, plane.statistics, *asked)
        refusals.append(refused.value.message)
    assert refusals == [
        "requested model 'nope' is not available (Request for unknown model: 'nope' is not found)",
        "requested model 'broken' is not available (no version is loaded)",
        "requested model version is not available for model 'add_sub' (version 4 is not loaded)",
    ]


def test_classification_answers_the_top_classes(kit: InProcessServer, plane: DataPlane) -> None:
    response = kit.run(plane.infer(pair(class_counts={"OUTPUT0": 2}, requested_outputs=("OUTPUT0",))))
    assert response.outputs["OUTPUT0"].tolist() == [[b"5.000000:3", b"4.000000:2"]]


# Decoupled models and streams --------------------------------------------------------------


def test_infer_refuses_a_decoupled_model_in_the_callers_words(kit: InProcessServer, plane: DataPlane) -> None:
    with pytest.raises(UnsupportedError) as refused:
        kit.run(
            plane.infer(gated(3, "d-1", "gate_stream"), endpoint="ModelInfer RPC", instead="ModelStreamInfer")
        )
    assert refused.value.message == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy: model 'gate_stream' may "
        "send many responses per request; call it with ModelStreamInfer"
    )


async def _collect(responses: AsyncIterator[InferenceResponse]) -> list[int]:
    return [int(response.outputs["OUT"][0]) async for response in responses]


def test_stream_yields_every_response_of_a_decoupled_model(kit: InProcessServer, plane: DataPlane) -> None:
    assert kit.run(_collect(plane.stream(gated(4, "s-1", "gate_stream")))) == [4, 3, 2, 1]
    assert kit.run(_collect(plane.stream(gated(5, "s-2")))) == [10]  # an ordinary model: one


def test_stream_raises_the_error_that_ends_a_request(kit: InProcessServer, plane: DataPlane) -> None:
    with pytest.raises(NotFoundError):
        kit.run(_collect(plane.stream(gated(1, "s-3", "nope"))))
    refused = gated(1, "s-4")
    refused.inputs["IN"] = np.array([1], np.int64)
    with pytest.raises(
        RequestMismatchError, match=r"^\[request id: s-4\] inference input 'IN' data-type is 'INT64'"
    ):
        kit.run(_collect(plane.stream(refused)))


# Cancellation and pending requests ---------------------------------------------------------


def test_a_cancelled_infer_cancels_its_request_running_or_queued(
    kit: InProcessServer, plane: DataPlane, gate: GateBackend
) -> None:
    before = failures(kit, "gate")
    gate.holding.add("c-run")
    running, queued = gated(1, "c-run"), gated(2, "c-queued")

    async def scenario() -> tuple[list[int], list[bool], list[int]]:
        calls = [asyncio.ensure_future(plane.infer(request)) for request in (running, queued)]
        await gate.held("c-run").wait()  # the instance holds c-run; c-queued waits behind it
        pending = [plane.pending_requests()]
        for call in calls:
            call.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        # The one instance takes the next request once c-run's execution has ended.
        after = await plane.infer(gated(3, "c-after"))
        pending.append(plane.pending_requests())
        return (
            pending,
            [isinstance(result, asyncio.CancelledError) for result in results],
            after.outputs["OUT"].tolist(),
        )

    pending, cancelled, answer = kit.run(scenario())
    assert pending == [2, 0]
    assert cancelled == [True, True]
    assert answer == [6]
    assert [running.is_cancelled(), queued.is_cancelled()] == [True, True]
    # c-queued left the queue: the instance never saw it; it saw c-run cancelled at its gate.
    assert gate.started[-2:] == ["c-run", "c-after"]
    assert "c-queued" not in gate.started
    assert gate.cancelled == ["c-run"]
    after = failures(kit, "gate")
    assert after["CANCELED"] - before["CANCELED"] == 2


def test_leaving_a_stream_early_cancels_its_request(
    kit: InProcessServer, plane: DataPlane, gate: GateBackend
) -> None:
    gate.holding.add("l-1")
    request = gated(50, "l-1", "gate_stream")

    async def scenario() -> list[int]:
        seen = []
        responses = plane.stream(request)
        async for response in responses:
            seen.append(int(response.outputs["OUT"][0]))
            break
        await responses.aclose()  # the caller stops iterating: nobody listens any more
        # The one instance takes l-2 once l-1's execution has ended.
        seen.extend(await _collect(plane.stream(gated(2, "l-2", "gate_stream"))))
        return seen

    assert kit.run(scenario()) == [50, 2, 1]
    assert request.is_cancelled()
    assert gate.started[-2:] == ["l-1", "l-2"]
    assert gate.cancelled[-1] == "l-1"


# Model control -----------------------------------------------------------------------------


def test_load_and_unload_move_a_model_through_the_index(kit: InProcessServer, plane: DataPlane) -> None:
    def row() -> dict[str, str]:
        (entry,) = [entry for entry in kit.run(plane.repository_index()) if entry["name"] == "spare"]
        return entry

    assert row() == {"name": "spare"}  # never loaded: its name alone, as Triton lists it
    (broken,) = [entry for entry in kit.run(plane.repository_index()) if entry["name"] == "broken"]
    assert (broken["version"], broken["state"]) == ("1", "UNAVAILABLE")
    assert broken["reason"].endswith("broken/1/model.onnx not found")
    kit.run(plane.load_model("spare", {}))
    assert row() == {"name": "spare", "version": "1", "state": "READY"}
    assert on_loop(kit, plane.model_ready, "spare") is True
    assert kit.run(plane.infer(pair(model="spare"))).outputs["OUTPUT0"].tolist() == [[2, 3, 4, 5]]
    kit.run(plane.unload_model("spare"))
    assert on_loop(kit, plane.model_ready, "spare") is False
    assert row()["state"] == "UNAVAILABLE"
    with pytest.raises((NotFoundError, UnavailableError)):
        kit.run(plane.infer(pair(model="spare")))
    ready = {entry["name"] for entry in kit.run(plane.repository_index(ready_only=True))}
    assert ready == {"add_sub", "counted", "gate", "gate_stream", "twice"}
