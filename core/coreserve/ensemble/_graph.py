"""An ensemble's steps as a graph of tensors, and the checks that run before it loads."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from coreserve.config.signature import ModelSignature, TensorSpec
from coreserve.errors import CoreserveError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

SignatureLookup = Callable[[str, str], ModelSignature]


@dataclass(frozen=True)
class Bridge:
    """A tensor that passes between a model that batches and one that does not, their shapes
    alike but for the batch dimension (Triton allows it): fitted to its consumer at run time as
    Triton's ensemble scheduler fits it (`ReshapeTensorDims`)."""

    batching: bool  # the consumer's
    dims: tuple[int, ...]  # the consumer's shape without its batch dimension

    def fit(self, array: np.ndarray) -> np.ndarray:
        """A batch of 1 around a tensor without one, for a consumer that batches; the batch of 1
        of a tensor taken off, for one that does not (where its shape is not the consumer's)."""
        if self.batching and _compatible(self.dims, array.shape):
            return array[np.newaxis]
        if (
            not self.batching
            and array.ndim
            and array.shape[0] == 1
            and not _compatible(self.dims, array.shape)
        ):
            return np.squeeze(array, axis=0)
        return array


@dataclass(frozen=True)
class Step:
    """One step: a model, which ensemble tensors feed its inputs, which its outputs become."""

    index: int
    model_name: str
    model_version: str
    inputs: dict[str, str]  # model input -> ensemble tensor
    outputs: dict[str, str]  # model output -> ensemble tensor

    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


def steps_decoupled(config: ModelConfig, lookup: SignatureLookup) -> bool | None:
    """Whether one of the ensemble's steps is decoupled, which makes the ensemble so whatever its
    configuration says (Triton's rule); None while a step does not serve (its load says why)."""
    try:
        return any(lookup(s.model_name, s.model_version).decoupled for s in EnsembleGraph(config).steps)
    except CoreserveError:
        return None


def misfit(config: ModelConfig, lookup: SignatureLookup) -> str | None:
    """Why the models serving now do not fit ensemble `config`, as its load would find (a step
    reloaded with other tensors, say), logged in Triton's words; None where they fit."""
    try:
        EnsembleGraph(config).validate(lookup, ModelSignature(config))
    except ModelConfigError as exc:
        logger.error("Invalid argument: %s", exc.message)
        return exc.message
    return None


class EnsembleGraph:
    """The steps of `ensemble_scheduling` and what flows between them."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.steps = [
            Step(
                index=index,
                model_name=step.model_name,
                model_version=str(step.model_version) if step.model_version > 0 else "",
                inputs=dict(step.input_map),
                outputs=dict(step.output_map),
            )
            for index, step in enumerate(config.ensemble_scheduling.step)
        ]
        self.inputs = [tensor.name for tensor in config.input]
        self.outputs = [tensor.name for tensor in config.output]
        self.decoupled_steps: set[int] = set()
        # The tensors that pass between batching and non-batching models (see `Bridge`): each
        # step's, by its input, and the ensemble outputs'. Set by `validate`.
        self.input_bridges: dict[int, dict[str, Bridge]] = {}
        self.output_bridges: dict[str, Bridge] = {}

    def wanted_outputs(self, requested: Sequence[str] | None) -> list[str]:
        """The ensemble outputs a request asks for (every one where it names none)."""
        return [name for name in self.outputs if name in requested] if requested else self.outputs

    def pruned_steps(self, requested: Sequence[str] | None) -> frozenset[int]:
        """The steps that none of the requested outputs needs: Triton prunes them."""
        if not requested:
            return frozenset()
        tensors = set(self.wanted_outputs(requested))
        needed: set[int] = set()
        while True:  # back from the outputs, through the inputs of the steps that make them
            steps = [s for s in self.steps if s.index not in needed and tensors & set(s.outputs.values())]
            if not steps:
                return frozenset(step.index for step in self.steps if step.index not in needed)
            for step in steps:
                needed.add(step.index)
                tensors.update(step.inputs.values())

    def _error(self, problem: str) -> ModelConfigError:
        return ModelConfigError(f"ensemble '{self.name}': {problem}")

    def validate(self, lookup: SignatureLookup, ensemble: ModelSignature) -> None:
        """Raises ModelConfigError naming the step and the tensor of the first problem found."""
        if not self.steps:
            raise self._error("ensemble_scheduling has no steps")
        signatures = {step.index: self._signature(step, lookup) for step in self.steps}
        producers: dict[str, Step] = {}
        for step in self.steps:
            for output, tensor in step.outputs.items():
                if tensor in self.inputs:
                    raise self._error(
                        f"{step.label()} output '{output}' writes tensor '{tensor}', an ensemble input"
                    )
                if tensor in producers:
                    raise self._error(
                        f"tensor '{tensor}' is produced by {producers[tensor].label()} and by {step.label()}"
                    )
                producers[tensor] = step
        consumed = {tensor for step in self.steps for tensor in step.inputs.values()}
        for step in self.steps:
            for model_input, tensor in step.inputs.items():
                if tensor not in producers and tensor not in self.inputs:
                    raise self._error(
                        f"{step.label()} input '{model_input}' reads tensor '{tensor}', "
                        "which no step produces and which is not an ensemble input"
                    )
            for output, tensor in step.outputs.items():
                if tensor not in consumed and tensor not in self.outputs:
                    raise self._error(
                        f"{step.label()} output '{output}' (tensor '{tensor}') is neither read by a step "
                        "nor an ensemble output"
                    )
        for output in self.outputs:
            if output not in producers:
                raise self._error(f"ensemble output '{output}' is produced by no step")
        for name in self.inputs:  # (Triton's words)
            if name not in consumed:
                raise self._error(f"ensemble input '{name}' is not used")
        order = self._run_order(producers)
        self._check_types(signatures, producers, ensemble)
        for step in self.steps:  # Triton's rule and words
            limit = signatures[step.index].max_batch_size
            if 0 < limit < ensemble.max_batch_size:
                raise self._error(
                    f"allows maximum batch size {ensemble.max_batch_size}, but it contains model "
                    f"{step.model_name} which only allows maximum batch size to be {limit}"
                )
        self.decoupled_steps = {index for index, signature in signatures.items() if signature.decoupled}
        self._check_decoupled_origins(order)
        if self.decoupled_steps and not ensemble.decoupled:  # (completion makes it so, as Triton)
            step = self.steps[min(self.decoupled_steps)]
            raise self._error(
                f"{step.label()} is decoupled, so the ensemble must be too: "
                "set model_transaction_policy { decoupled: true }"
            )

    def _check_decoupled_origins(self, order: list[Step]) -> None:
        """Refuses a step, or outputs, fed by different decoupled steps (their responses would
        pair up in every combination), as Triton does. Triton also refuses one fed by a decoupled
        step and by the ensemble's inputs alone; that runs here, each response with the inputs."""
        origins: dict[str, int | None] = dict.fromkeys(self.inputs)  # tensor -> the decoupled step it follows
        for step in order:
            found = {origins[tensor] for tensor in step.inputs.values()} - {None}
            if len(found) > 1:
                raise self._error(
                    f"{step.label()} receives inputs originated from different decoupled models"
                )
            origin = step.index if step.index in self.decoupled_steps else next(iter(found), None)
            origins.update(dict.fromkeys(step.outputs.values(), origin))
        if len({origins[output] for output in self.outputs} - {None}) > 1:
            raise self._error("its outputs originate from different decoupled models")

    def _signature(self, step: Step, lookup: SignatureLookup) -> ModelSignature:
        if not step.model_name:
            raise self._error(f"step {step.index} names no model")
        if step.model_name == self.name:
            raise self._error(f"{step.label()} calls the ensemble itself")
        try:
            signature = lookup(step.model_name, step.model_version)
        except CoreserveError as exc:
            raise self._error(f"{step.label()}: {exc.message}") from None
        for model_input in step.inputs:
            if model_input not in signature.inputs:
                raise self._error(
                    f"{step.label()} input_map names '{model_input}', which is not an input of the model "
                    f"(its inputs: {sorted(signature.inputs)})"
                )
        for name, spec in signature.inputs.items():
            if name not in step.inputs and not spec.optional:
                raise self._error(f"{step.label()} input '{name}' is not mapped to a tensor (input_map)")
        for output in step.outputs:
            if output not in signature.outputs:
                raise self._error(
                    f"{step.label()} output_map names '{output}', which is not an output of the model "
                    f"(its outputs: {sorted(signature.outputs)})"
                )
        return signature

    def _run_order(self, producers: dict[str, Step]) -> list[Step]:
        """The steps in an order they can run in (each after those it reads from); refuses a cycle."""
        waiting = {
            step.index: {producers[t].index for t in step.inputs.values() if t in producers}
            for step in self.steps
        }
        order: list[int] = []
        while True:
            ready = [index for index, needs in waiting.items() if index not in order and needs <= set(order)]
            if not ready:
                break
            order.extend(ready)
        stuck = sorted(set(waiting) - set(order))
        if stuck:
            labels = ", ".join(self.steps[index].label() for index in stuck)
            raise self._error(f"steps form a cycle: {labels}")
        return [self.steps[index] for index in order]

    def _check_types(
        self, signatures: dict[int, ModelSignature], producers: dict[str, Step], ensemble: ModelSignature
    ) -> None:
        def source(tensor: str) -> tuple[TensorSpec, list[int], bool, str]:
            if tensor in producers:
                step = producers[tensor]
                output = next(name for name, value in step.outputs.items() if value == tensor)
                signature = signatures[step.index]
                spec = signature.outputs[output]
                return (
                    spec,
                    signature.client_shape(spec),
                    signature.batching,
                    f"{step.label()} output '{output}'",
                )
            shape = _inner_shape(ensemble, tensor)
            return ensemble.inputs[tensor], shape, ensemble.batching, f"ensemble input '{tensor}'"

        self.input_bridges = {}
        for step in self.steps:
            signature = signatures[step.index]
            for model_input, tensor in step.inputs.items():
                wanted = signature.inputs[model_input]
                consumer = f"{step.label()} input '{model_input}' (tensor '{tensor}')"
                wanted_shape = signature.client_shape(wanted)
                bridge = _compare(self, consumer, wanted, wanted_shape, signature.batching, *source(tensor))
                if bridge is not None:
                    self.input_bridges.setdefault(step.index, {})[model_input] = bridge
        self.output_bridges = {}
        for output in self.outputs:
            wanted = ensemble.outputs[output]
            shape = _inner_shape(ensemble, output)
            bridge = _compare(
                self, f"ensemble output '{output}'", wanted, shape, ensemble.batching, *source(output)
            )
            if bridge is not None:
                self.output_bridges[output] = bridge


def _inner_shape(ensemble: ModelSignature, tensor: str) -> list[int]:
    """An ensemble input's or output's shape as its steps see it: its reshape, where it has one
    (as Triton compares them)."""
    spec = ensemble.inputs.get(tensor) or ensemble.outputs[tensor]
    shape = list(spec.reshape if spec.reshape is not None else spec.dims)
    return [-1, *shape] if ensemble.batching else shape


def _compatible(wanted: Sequence[int], given: Sequence[int]) -> bool:
    return len(wanted) == len(given) and all(
        a == b or -1 in (a, b) for a, b in zip(wanted, given, strict=True)
    )


def _compare(
    graph: EnsembleGraph,
    consumer: str,
    wanted: TensorSpec,
    wanted_shape: list[int],
    wanted_batching: bool,
    given: TensorSpec,
    given_shape: list[int],
    given_batching: bool,
    source: str,
) -> Bridge | None:
    """Refuses a tensor its consumer cannot take; the bridge it needs between a model that
    batches and one that does not, where their shapes differ only by the batch dimension (as
    Triton compares them: with the batch dimensions, or without)."""
    if wanted.datatype is not given.datatype:
        compatible = False
    elif _compatible(wanted_shape, given_shape):
        return None
    else:
        wanted_dims = wanted_shape[1:] if wanted_batching else wanted_shape
        compatible = wanted_batching != given_batching and _compatible(
            wanted_dims, given_shape[1:] if given_batching else given_shape
        )
    if not compatible:
        raise graph._error(
            f"{consumer} expects {wanted.datatype} {wanted_shape}, but {source} gives "
            f"{given.datatype} {given_shape}"
        )
    return Bridge(wanted_batching, tuple(wanted_dims))
