"""The conformance suite catches each kind of broken backend, naming the rule and the fix."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from coreserve import InferenceRequest, ModelConfig
from coreserve.backend import (
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    Responder,
    ServerContext,
    run_batched,
)
from coreserve.testing import BackendConformance, ConformanceFailure, InProcessServer
from coreserve.testing._conformance import LoadedModel, load

# Threads a leaky instance starts; set at the end so that they end with the test module.
_RELEASE = threading.Event()


class FlawedInstance:
    """Echoes IN as OUT, with the flaw its configuration's `flaw` parameter names."""

    def __init__(self, config: ModelConfig) -> None:
        self.flaw = config.parameters["flaw"].string_value if "flaw" in config.parameters else ""
        self.decoupled = config.model_transaction_policy.decoupled
        if self.flaw == "leaky":
            threading.Thread(target=_RELEASE.wait, name=f"leaky-{config.name}", daemon=True).start()

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        if self.decoupled:
            for request in requests:
                responder.send(request, {"OUT": request.inputs["IN"]}, final=False)
                if self.flaw != "no_final":
                    responder.send_final(request)
            return
        await run_batched(requests, responder, self._run)

    def _run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        out = inputs["IN"]
        if self.flaw == "wrong_dtype":
            out = out.astype(np.float64)
        elif self.flaw == "mixed_rows":
            out = out[::-1].copy()
        return {"OUT": out}

    async def close(self) -> None:
        pass


class FlawedBackend(BaseBackend):
    name = "flawed"
    default_model_filename = "model.bin"

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        return FlawedInstance(config)


def _write_model(root: Path, name: str, flaw: str = "", decoupled: bool = False) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.bin").write_bytes(b"")
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    (folder / "config.pbtxt").write_text(
        f'backend: "flawed"\nmax_batch_size: {0 if decoupled else 8}\n{policy}\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        f'parameters {{ key: "flaw" value: {{ string_value: "{flaw}" }} }}\n'
    )


FLAWS = {
    # model: (rule method, the rule it names, a piece of the fix it gives)
    "wrong_dtype": ("test_every_datatype_round_trips", "datatypes", "return FP32 as numpy float32"),
    "mixed_rows": ("test_a_batch_gives_each_request_its_rows", "batch", "run_batched"),
    "no_final": ("test_responses_end_with_a_final_flag", "final flag", "send_final(request)"),
    "leaky": ("test_unload_releases_resources", "unload", "close()"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    root = tmp_path_factory.mktemp("flawed")
    _write_model(root, "good")
    _write_model(root, "good_stream", decoupled=True)
    for flaw in FLAWS:
        _write_model(root, flaw, flaw, decoupled=flaw == "no_final")
    server = InProcessServer(root, backends=[FlawedBackend()], request_timeout=3.0).start()
    yield server
    server.stop()
    _RELEASE.set()


def _loaded(server: InProcessServer, name: str) -> LoadedModel:
    load(server, name)
    return LoadedModel(server, name, server.config(name))


@pytest.mark.parametrize("model", list(FLAWS))
def test_each_flaw_breaks_its_rule_with_a_fix(server: InProcessServer, model: str) -> None:
    method, rule, fix = FLAWS[model]
    loaded = _loaded(server, model)
    try:
        with pytest.raises(ConformanceFailure) as info:
            getattr(BackendConformance(), method)(loaded)
    finally:
        server.unload(model)
    message = str(info.value)
    assert info.value.rule == rule and info.value.model == model
    assert message.startswith(f"conformance rule '{rule}' broke for model '{model}': ")
    assert "How to fix: " in message and fix in message


@pytest.mark.parametrize("model", ["good", "good_stream"])
def test_a_correct_backend_keeps_every_rule(server: InProcessServer, model: str) -> None:
    suite = BackendConformance()
    rules = [name for name in dir(BackendConformance) if name.startswith("test_")]
    assert len(rules) == 10
    kept = []
    for rule in rules:
        loaded = _loaded(server, model)
        try:
            getattr(suite, rule)(loaded)
            kept.append(rule)
        except pytest.skip.Exception as skipped:
            assert model == "good_stream" and rule == "test_a_batch_gives_each_request_its_rows"
            assert "model 'good_stream' cannot show batches" in skipped.msg
            assert "list it in `unbatched_models`" in skipped.msg
            assert skipped._use_item_location  # reported at the suite's test, not at conformance's line
        finally:
            server.unload(model)
    assert len(kept) == (10 if model == "good" else 9)


class _SaysGoodCannotBatch(BackendConformance):
    unbatched_models = ("good", "good_stream")


def test_a_model_listed_as_unbatched_is_checked_to_be_so(server: InProcessServer) -> None:
    """A decoupled model listed in `unbatched_models` keeps the batch rule (no skip); a batching
    one listed there breaks it, with the fix."""
    rule = "test_a_batch_gives_each_request_its_rows"
    loaded = _loaded(server, "good_stream")
    try:
        getattr(_SaysGoodCannotBatch(), rule)(loaded)
    finally:
        server.unload("good_stream")
    loaded = _loaded(server, "good")
    try:
        with pytest.raises(ConformanceFailure, match="take it out of `unbatched_models`"):
            getattr(_SaysGoodCannotBatch(), rule)(loaded)
    finally:
        server.unload("good")


def test_a_model_that_does_not_load_breaks_the_load_rule(server: InProcessServer) -> None:
    with pytest.raises(ConformanceFailure, match=r"rule 'load' broke for model 'absent'"):
        load(server, "absent")
