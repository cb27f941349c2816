"""The conformance suite: the contract every backend keeps, as tests a backend's own suite runs.

Subclass `BackendConformance` in a test module and point it at the model folders the backend
ships (each a Triton model folder: `config.pbtxt`, `1/<model file>`)::

    from coreserve.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        model_folders = [Path(__file__).parent / "models" / "identity"]
        backends = [MyBackend()]  # optional: registered in code, no installed entry point needed

Each rule is a test method, run for each model, in-process (no ports): the models load in a
server without frontends, one at a time. A broken rule fails with a `ConformanceFailure` that
names the rule, the model, what happened and how to fix it. Models built by code instead of
shipped: override the `conformance_repository` fixture and set `model_names`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from coreserve.backend import Backend, ModelSignature
from coreserve.config import ModelConfig
from coreserve.errors import CancelledError, InvalidArgumentError
from coreserve.protos.model_config_pb2 import ModelInstanceGroup
from coreserve.testing._inprocess import InProcessServer, Outcome
from coreserve.testing._requests import make_request, rows_of, sample_inputs
from coreserve.testing._resources import leaks_after, snapshot
from coreserve.types import DataType

NO_MODELS = "(no models)"


class ConformanceFailure(AssertionError):
    """A conformance rule that a backend broke: which rule, for which model, and how to fix it."""

    def __init__(self, rule: str, model: str, problem: str, fix: str) -> None:
        super().__init__(f"conformance rule '{rule}' broke for model '{model}': {problem}\nHow to fix: {fix}")
        self.rule = rule
        self.model = model


@dataclass
class LoadedModel:
    """A loaded model under test: the server that serves it, and its served configuration."""

    server: InProcessServer
    name: str
    config: ModelConfig

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature(self.config)

    @property
    def decoupled(self) -> bool:
        return self.config.model_transaction_policy.decoupled

    def request(self, batch: int = 1, seed: int = 0, **options: Any) -> Any:
        """A request with sample data; a sequence model's request is a whole sequence."""
        inputs = sample_inputs(self.signature, batch, seed)
        return make_request(
            self.signature, inputs, sequence=self.config.HasField("sequence_batching"), **options
        )

    def answer(self, rule: str, outcome: Outcome) -> list[Mapping[str, np.ndarray]]:
        """The outputs of a request that must have succeeded (else the rule breaks)."""
        if not outcome.done:
            raise ConformanceFailure(
                rule,
                self.name,
                "the request never ended",
                "answer every request with responder.send(...) (final=True by default) or "
                "responder.send_error(...); a decoupled model ends with responder.send_final(request)",
            )
        if outcome.error is not None:
            raise ConformanceFailure(
                rule,
                self.name,
                f"a valid request failed: {outcome.error.message}",
                "the request fits the configuration; execute() must answer it (check the inputs the "
                "configuration declares against what the model expects)",
            )
        return outcome.outputs


class BackendConformance:
    """The rules every backend keeps; subclass it and set `model_folders` (see the module doc).

    Class attributes a subclass may set:

    - `model_folders`: the model folders to check (each is copied into a temporary repository);
    - `model_names`: with an overridden `conformance_repository` fixture, the models in it;
    - `backends`: backend objects to register in code, beside the installed plugins;
    - `backend_config`: `--backend-config` values, `{backend: {key: value}}`;
    - `deterministic`: False for models whose outputs differ between equal requests (the rules
      that compare a batch with single requests are then skipped);
    - `unbatched_models`: the models that cannot batch (`max_batch_size` below 2, decoupled): the
      batch rule checks that they cannot, instead of skipping them as it does other such models;
    - `instances`: how many instances the concurrency rule loads (2);
    - `request_timeout`: seconds a request may take to end before a rule says it never did.
    """

    model_folders: ClassVar[Sequence[Path]] = ()
    model_names: ClassVar[Sequence[str]] = ()
    backends: ClassVar[Sequence[Backend]] = ()
    backend_config: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    deterministic: ClassVar[bool] = True
    unbatched_models: ClassVar[Sequence[str]] = ()
    instances: ClassVar[int] = 2
    request_timeout: ClassVar[float] = 60.0
    tolerance: ClassVar[float] = 1e-5

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "conformance_model" in metafunc.fixturenames:
            names = list(self.model_names) or [Path(folder).name for folder in self.model_folders]
            metafunc.parametrize("conformance_model", names or [NO_MODELS])

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """A repository holding copies of `model_folders`; override it to build models instead."""
        root = tmp_path_factory.mktemp("conformance")
        for folder in cls.model_folders:
            shutil.copytree(folder, root / Path(folder).name, symlinks=True)
        return root

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_server(cls, conformance_repository: Path) -> Iterator[InProcessServer]:
        server = InProcessServer(
            conformance_repository,
            backends=cls.backends,
            backend_config=cls.backend_config,
            request_timeout=cls.request_timeout,
        ).start()
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture
    def loaded(self, conformance_server: InProcessServer, conformance_model: str) -> Iterator[LoadedModel]:
        """The model under test, loaded (the `load` rule breaks if it cannot), unloaded after."""
        if conformance_model == NO_MODELS:
            raise ConformanceFailure(
                "setup", NO_MODELS, "the suite has no models to check", "set model_folders on your subclass"
            )
        load(conformance_server, conformance_model)
        try:
            yield LoadedModel(
                conformance_server, conformance_model, conformance_server.config(conformance_model)
            )
        finally:
            conformance_server.unload(conformance_model)

    # The rules.

    def test_loads_and_completes_its_config(self, loaded: LoadedModel) -> None:
        """The model loads, and its served configuration lists inputs and outputs."""
        if not loaded.config.input or not loaded.config.output:
            raise ConformanceFailure(
                "auto-complete",
                loaded.name,
                f"the served configuration has {len(loaded.config.input)} inputs and "
                f"{len(loaded.config.output)} outputs",
                "fill inputs and outputs from the model file in complete_config() (BaseBackend) or "
                "auto_complete_config(), or list them in config.pbtxt",
            )

    def test_metadata_matches_config(self, loaded: LoadedModel) -> None:
        """Model metadata names the configured inputs and outputs with their datatypes and shapes."""
        metadata = loaded.server.metadata(loaded.name)
        signature = loaded.signature
        for side, specs in (("inputs", signature.inputs), ("outputs", signature.outputs)):
            expected = [
                {"name": s.name, "datatype": s.datatype.value, "shape": signature.client_shape(s)}
                for s in specs.values()
            ]
            if metadata[side] != expected:
                raise ConformanceFailure(
                    "metadata",
                    loaded.name,
                    f"metadata {side} {metadata[side]} differ from the configuration's {expected}",
                    "return the configuration you completed from auto_complete_config(); do not change it "
                    "when an instance loads",
                )

    def test_every_datatype_round_trips(self, loaded: LoadedModel) -> None:
        """Each input is accepted in its declared datatype; each output comes back in its own."""
        batch = 2 if loaded.signature.max_batch_size >= 2 else 1
        request = loaded.request(batch)
        (outcome,) = loaded.server.send([request])
        answers = loaded.answer("datatypes", outcome)
        if not answers:
            raise ConformanceFailure("datatypes", loaded.name, "no response carried outputs", _SEND_OUTPUTS)
        for outputs in answers:
            for name, array in outputs.items():
                spec = loaded.signature.outputs.get(name)
                if spec is None:
                    continue  # the core answers only declared, requested outputs
                got = _datatype_of(array)
                if got is not spec.datatype:
                    raise ConformanceFailure(
                        "datatypes",
                        loaded.name,
                        f"output '{name}' is {got or array.dtype}, "
                        f"the configuration says {spec.datatype.value}",
                        f"return {spec.datatype.value} as numpy {_numpy_name(spec.datatype)} "
                        "(BYTES: an object array of bytes; BF16: ml_dtypes.bfloat16)",
                    )
                shape = tuple(array.shape[1:] if loaded.signature.batching else array.shape)
                if not loaded.decoupled and not spec.matches(shape) and spec.reshape is None:
                    raise ConformanceFailure(
                        "datatypes",
                        loaded.name,
                        f"output '{name}' has shape {list(array.shape)}, the configuration says "
                        f"{loaded.signature.client_shape(spec)}",
                        "return outputs of the configured dims, with the batch rows first for a "
                        "batching model",
                    )

    def test_a_batch_gives_each_request_its_rows(self, loaded: LoadedModel) -> None:
        """N single-row requests sent together get the rows a batch of N gets, each its own."""
        rows = min(loaded.signature.max_batch_size, 4)
        batches = rows >= 2 and not loaded.decoupled and self.deterministic
        if loaded.name in self.unbatched_models:
            if batches:
                raise ConformanceFailure(
                    "batch",
                    loaded.name,
                    "the model batches, but the suite lists it in `unbatched_models`",
                    "take it out of `unbatched_models`, so that its batches are checked",
                )
            return
        if not batches:
            _skip_at_the_test(
                f"model '{loaded.name}' cannot show batches (it needs to be deterministic, not decoupled, "
                "with max_batch_size >= 2): list it in `unbatched_models` to check that it cannot batch"
            )
        inputs = sample_inputs(loaded.signature, rows, seed=7)
        sequence = loaded.config.HasField("sequence_batching")
        (whole,) = loaded.server.send([make_request(loaded.signature, inputs, sequence=sequence)])
        (batched,) = loaded.answer("batch", whole)
        singles = loaded.server.send(
            [
                make_request(loaded.signature, rows_of(inputs, i, i + 1), sequence=sequence)
                for i in range(rows)
            ]
        )
        for index, outcome in enumerate(singles):
            (single,) = loaded.answer("batch", outcome)
            for name, array in single.items():
                expected = batched[name][index : index + 1]
                if not _equal(array, expected, self.tolerance):
                    raise ConformanceFailure(
                        "batch",
                        loaded.name,
                        f"request {index} of {rows} got output '{name}' {array.tolist()!r}, but row {index} "
                        f"of the batch is {expected.tolist()!r}",
                        "give each request the rows of its own inputs (coreserve.backend.run_batched "
                        "concatenates a batch and splits the outputs back)",
                    )

    def test_requested_outputs_are_honoured(self, loaded: LoadedModel) -> None:
        """A request that asks for one output gets exactly that one."""
        for name in loaded.signature.outputs:
            (outcome,) = loaded.server.send([loaded.request(requested_outputs=(name,))])
            for outputs in loaded.answer("requested outputs", outcome):
                if set(outputs) != {name}:
                    raise ConformanceFailure(
                        "requested outputs",
                        loaded.name,
                        f"asked for '{name}' only, got {sorted(outputs)}",
                        "compute at least the outputs a request asks for (request.requested_outputs, "
                        "or run_batched's output_names); the core drops the rest",
                    )

    def test_wrong_shapes_and_datatypes_are_refused_clearly(self, loaded: LoadedModel) -> None:
        """A wrong datatype or shape is refused with a message naming the input; serving goes on."""
        name, spec = next(iter(loaded.signature.inputs.items()))
        good = loaded.request()
        wrong_type = DataType.INT32 if spec.datatype is not DataType.INT32 else DataType.FP32
        cases = {
            "datatype": good.inputs[name].astype(wrong_type.numpy_dtype)
            if spec.datatype is not DataType.BYTES
            else np.zeros(good.inputs[name].shape, np.int32),
            "shape": good.inputs[name].reshape(*good.inputs[name].shape, 1),
        }
        for what, array in cases.items():
            bad = loaded.request()
            bad.inputs[name] = array
            (outcome,) = loaded.server.send([bad])
            if not isinstance(outcome.error, InvalidArgumentError) or name not in outcome.error.message:
                raise ConformanceFailure(
                    "wrong inputs",
                    loaded.name,
                    f"an input '{name}' of the wrong {what} got {outcome.error or outcome.responses!r}",
                    "the core refuses requests that do not fit the configuration: the served configuration "
                    "must say what the model takes",
                )
        (outcome,) = loaded.server.send([loaded.request()])
        loaded.answer("wrong inputs", outcome)

    def test_concurrent_requests_on_several_instances(self, loaded: LoadedModel) -> None:
        """Requests sent at once to several instances each get their own, complete answer."""
        config = ModelConfig()
        config.CopyFrom(loaded.config)
        kind = config.instance_group[0].kind if config.instance_group else ModelInstanceGroup.KIND_CPU
        del config.instance_group[:]
        config.instance_group.add(count=self.instances, kind=kind)
        load(loaded.server, loaded.name, config)
        requests = [loaded.request(seed=seed) for seed in range(4 * self.instances)]
        references = [loaded.request(seed=seed) for seed in range(4 * self.instances)]
        together = loaded.server.send(requests)
        for index, outcome in enumerate(together):
            answers = loaded.answer("concurrency", outcome)
            if loaded.decoupled or not self.deterministic:
                continue
            (alone,) = loaded.answer("concurrency", loaded.server.send([references[index]])[0])
            for name, array in alone.items():
                if not _equal(answers[0].get(name), array, self.tolerance):
                    raise ConformanceFailure(
                        "concurrency",
                        loaded.name,
                        f"request {index} sent with {len(requests) - 1} others over {self.instances} "
                        f"instances got another '{name}' than when sent alone",
                        "keep the state of a request on the instance that runs it, never in module or "
                        "backend globals shared by instances",
                    )

    def test_responses_end_with_a_final_flag(self, loaded: LoadedModel) -> None:
        """An ordinary model answers once; a decoupled one streams and ends with the final flag."""
        (outcome,) = loaded.server.send([loaded.request()])
        loaded.answer("final flag", outcome)
        if not outcome.final_sent:
            raise ConformanceFailure(
                "final flag",
                loaded.name,
                "the responses did not end with the final flag",
                "end a decoupled request with responder.send(..., final=True) or "
                "responder.send_final(request)",
            )
        if not loaded.decoupled and len(outcome.responses) != 1:
            raise ConformanceFailure(
                "final flag",
                loaded.name,
                f"an ordinary model sent {len(outcome.responses)} responses to one request",
                "send one response per request, or declare model_transaction_policy { decoupled: true }",
            )

    def test_cancellation_is_observed(self, loaded: LoadedModel) -> None:
        """A cancelled request ends (cancelled, or answered) and the model keeps serving."""
        request = loaded.request()
        outcome = loaded.server.start_request(request)
        loaded.server.cancel(request)
        if not loaded.server.wait(outcome):
            raise ConformanceFailure(
                "cancellation",
                loaded.name,
                "a cancelled request never ended",
                "end every request, cancelled or not: check request.is_cancelled() between responses and "
                "answer with responder.send_error(request, CancelledError(...)) or send_final",
            )
        if outcome.error is not None and not isinstance(outcome.error, CancelledError):
            raise ConformanceFailure(
                "cancellation",
                loaded.name,
                f"a cancelled request failed with {type(outcome.error).__name__}: {outcome.error.message}",
                "end a cancelled request with coreserve.CancelledError, or answer it in full",
            )
        (after,) = loaded.server.send([loaded.request(seed=1)])
        loaded.answer("cancellation", after)

    def test_unload_releases_resources(self, loaded: LoadedModel) -> None:
        """Unloading gives back the threads, files and processes that loading took."""
        server, name = loaded.server, loaded.name
        server.send([loaded.request()])
        server.unload(name)  # a first cycle lets frameworks set up what they keep for the process
        before = snapshot()
        load(server, name)
        server.send([loaded.request()])
        server.unload(name)
        leaks = leaks_after(before)
        if leaks:
            raise ConformanceFailure(
                "unload",
                name,
                "after unloading: " + "; ".join(leaks),
                "release everything in the instance's close(): InstanceThread.close(), close files, kill "
                "and reap worker processes (in a finally block)",
            )
        load(server, name)  # the fixture unloads it


_SEND_OUTPUTS = "send each request its outputs: responder.send(request, {'OUTPUT': array})"


def load(server: InProcessServer, name: str, config: ModelConfig | None = None) -> None:
    """Loads a model; a model that cannot load breaks the `load` rule with the reason."""
    try:
        server.load(name, config)
    except Exception as exc:
        state, reason = server.state(name)
        raise ConformanceFailure(
            "load",
            name,
            f"it did not load ({state}: {reason or exc})",
            "raise a CoreserveError (ModelConfigError) whose message says what is wrong only when the model "
            "is broken; check the model folder and the backend's create_instance",
        ) from None


def _datatype_of(array: np.ndarray) -> DataType | None:
    try:
        return DataType.from_numpy(array.dtype)
    except Exception:
        return None


def _numpy_name(datatype: DataType) -> str:
    return "object" if datatype is DataType.BYTES else str(datatype.numpy_dtype)


def _equal(got: np.ndarray | None, expected: np.ndarray, tolerance: float) -> bool:
    if got is None or got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if got.dtype == object or got.dtype == bool or np.issubdtype(got.dtype, np.integer):
        return bool(np.array_equal(got, expected))
    return bool(
        np.allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tolerance, atol=tolerance)
    )


def _skip_at_the_test(reason: str) -> None:
    """Skips the running test, reported at the suite's test that skipped rather than at this
    file's line (as pytest reports a `skipif` mark; older pytests report this line)."""
    try:
        skipped = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:
        pytest.skip(reason)
    raise skipped
