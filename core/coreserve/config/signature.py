"""A model's inputs and outputs as the request path needs them, and checks of requests against them.

Built once when a model version loads, so that checking a request costs a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from coreserve.errors import InvalidArgumentError, RequestMismatchError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.types import DataType, InferenceRequest


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: its datatype and dims (without the batch dimension)."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None

    def matches(self, shape: tuple[int, ...]) -> bool:
        """True if a shape without the batch dimension fits `dims` (-1 matches any size)."""
        if len(shape) != len(self.dims):
            return False
        return all(want == -1 or want == got for want, got in zip(self.dims, shape, strict=True))


# What Triton adds to a shape error of a model that batches.
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim "
    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
    "docs for more info on max_batch_size."
)


def _names(names: list[str]) -> str:
    """Tensor names as Triton lists them: ['a','b']."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _spec(tensor: Any, optional: bool = False) -> TensorSpec:
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorSpec(
        name=tensor.name,
        datatype=DataType.from_config_value(tensor.data_type),
        dims=tuple(tensor.dims),
        optional=optional,
        reshape=reshape,
    )


def control_datatype(control: Any) -> DataType:
    """The datatype of a sequence batcher control tensor (`ModelSequenceBatching.Control`)."""
    if control.int32_false_true:
        return DataType.INT32
    if control.fp32_false_true:
        return DataType.FP32
    if control.bool_false_true:
        return DataType.BOOL
    return DataType.from_config_value(control.data_type) if control.data_type else DataType.UINT64


def _internal_tensors(config: ModelConfig) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """Inputs and outputs the server supplies or keeps itself: sequence controls and state."""
    inputs: dict[str, TensorSpec] = {}
    outputs: dict[str, TensorSpec] = {}
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        for control_input in sequence.control_input:
            datatype = control_datatype(control_input.control[0]) if control_input.control else DataType.INT32
            inputs[control_input.name] = TensorSpec(control_input.name, datatype, (1,))
        for state in sequence.state:
            datatype = DataType.from_config_value(state.data_type)
            inputs[state.input_name] = TensorSpec(state.input_name, datatype, tuple(state.dims))
            outputs[state.output_name] = TensorSpec(state.output_name, datatype, tuple(state.dims))
    for batch_input in config.batch_input:  # ragged batching: counts and shapes of the batch
        datatype = DataType.from_config_value(batch_input.data_type)
        for name in batch_input.target_name:
            inputs[name] = TensorSpec(name, datatype, (-1,))
    return inputs, outputs


class ModelSignature:
    """The tensors of one model configuration and the batch limit that applies to them.

    `inputs` and `outputs` are what clients see. A backend's model may also take
    `internal_inputs` (sequence control and state tensors, which the server fills in) and
    produce `internal_outputs` (state); `model_inputs` and `model_outputs` hold all of them.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.model_name = config.name
        self.max_batch_size = config.max_batch_size
        self.decoupled = config.model_transaction_policy.decoupled
        self.inputs: dict[str, TensorSpec] = {t.name: _spec(t, t.optional) for t in config.input}
        self.outputs: dict[str, TensorSpec] = {t.name: _spec(t) for t in config.output}
        self.internal_inputs, self.internal_outputs = _internal_tensors(config)
        self.model_inputs = {**self.inputs, **self.internal_inputs}
        self.model_outputs = {**self.outputs, **self.internal_outputs}
        # Ragged batching (coreserve/backend/tensors/_ragged.py): inputs the model takes flat, the
        # batch_input tensors the server makes and the batch_output tensors it scatters.
        self.ragged_inputs = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        self.batch_inputs = tuple(config.batch_input)
        self.batch_outputs = tuple(config.batch_output)
        self._required = tuple(name for name, spec in self.inputs.items() if not spec.optional)
        self._output_reshapes = {
            name: spec.dims for name, spec in self.outputs.items() if spec.reshape is not None
        }

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def client_shape(self, spec: TensorSpec) -> list[int]:
        """The shape a client sees in model metadata: -1 first for the batch dimension."""
        return [-1, *spec.dims] if self.batching else list(spec.dims)

    def check_request(self, request: InferenceRequest) -> None:
        """Checks input names, datatypes and shapes and the requested outputs.

        Sets `request.batch_size` and applies the configuration's input reshapes.
        Raises InvalidArgumentError naming the tensor and the model: RequestMismatchError where
        Triton puts the request's id first.
        """
        model = self.model_name
        inputs = request.inputs
        batch_size = 0
        if len(inputs) < len(self._required):  # counted first, as Triton counts them first
            missing = [name for name in self._required if name not in inputs]
            raise RequestMismatchError(self._missing_error(list(reversed(inputs)), missing))
        # Last input first, as Triton walks them: an error names the input Triton's would name.
        for name, array in reversed(inputs.items()):
            spec = self.inputs.get(name)
            if spec is None:
                raise InvalidArgumentError(
                    f"unexpected inference input '{name}' for model '{model}'; "
                    f"its inputs are {sorted(self.inputs)}"
                )
            if array.dtype != spec.datatype.numpy_dtype:
                got = DataType.from_numpy(array.dtype)
                raise RequestMismatchError(
                    f"inference input '{name}' data-type is '{got}', but model '{model}' expects "
                    f"'{spec.datatype}'"
                )
            shape = array.shape
            if self.max_batch_size > 0:
                if not shape:
                    raise RequestMismatchError(self._shape_error(spec, shape))
                if batch_size == 0:
                    batch_size = shape[0]
                    if batch_size > self.max_batch_size:
                        raise RequestMismatchError(
                            f"inference request batch-size must be <= {self.max_batch_size} for "
                            f"'{model}' (input '{name}' has {batch_size})"
                        )
                    if batch_size < 1:
                        raise RequestMismatchError(
                            f"inference request batch size 0 (first dimension of input '{name}') "
                            f"must be between 1 and {self.max_batch_size} for model '{model}'"
                        )
                elif shape[0] != batch_size:
                    raise RequestMismatchError(
                        f"input '{name}' batch size does not match other inputs for '{model}' "
                        f"(it has {shape[0]}, another input has {batch_size})"
                    )
                shape = shape[1:]
            if not spec.matches(shape):
                raise RequestMismatchError(self._shape_error(spec, array.shape))
            if spec.reshape is not None:
                lead = (array.shape[0],) if self.max_batch_size > 0 else ()
                inputs[name] = array.reshape(lead + spec.reshape)
        if len(inputs) < len(self.inputs):  # (an optional input given in place of a required one)
            missing = [name for name in self._required if name not in inputs]
            if missing:
                raise RequestMismatchError(self._missing_error(list(reversed(inputs)), missing))
        requested = request.requested_outputs
        if requested is not None:
            for name in requested:
                if name not in self.outputs:
                    raise InvalidArgumentError(
                        f"unexpected inference output '{name}' for model '{model}'; "
                        f"its outputs are {sorted(self.outputs)}"
                    )
        request.batch_size = batch_size or 1

    def _missing_error(self, given: list[str], missing: list[str]) -> str:
        """Triton's words for a request without some required inputs."""
        required, total = len(self._required), len(self.inputs)
        expected = (
            f"{required} inputs" if required == total else f"number of inputs between {required} and {total}"
        )
        return (
            f"expected {expected} but got {len(given)} inputs for model '{self.model_name}'. "
            f"Got input(s) {_names(given)}, but missing required input(s) {_names(missing)}. "
            "Please provide all required input(s)."
        )

    def _shape_error(self, spec: TensorSpec, shape: tuple[int, ...]) -> str:
        """Triton's words for an input whose shape does not fit its dims (and its hint)."""
        expected = ",".join(str(dim) for dim in self.client_shape(spec))
        got = ",".join(str(dim) for dim in shape)
        message = (
            f"unexpected shape for input '{spec.name}' for model '{self.model_name}'. "
            f"Expected [{expected}], got [{got}]. "
        )
        return message + _BATCH_NOTE if self.batching else message.rstrip()

    def restore_output_shapes(self, outputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Undoes output reshapes: the model produced `reshape`, the client sees `dims`."""
        if not self._output_reshapes:
            return outputs
        restored = dict(outputs)
        for name, dims in self._output_reshapes.items():
            array = restored.get(name)
            if array is not None:
                lead = array.shape[:1] if self.max_batch_size > 0 else ()
                restored[name] = array.reshape(lead + dims)
        return restored
