"""What the sequence batcher adds to each request: control tensors and implicit state.

Control inputs (`control_input`) tell a stateful model where a request sits in its sequence:
START and END flags, READY (always true for a request that carries data) and CORRID, the
sequence id. Implicit state (`state`) is an output of one request that the server feeds back
as an input of the next request of the same sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coreserve.config.signature import control_datatype
from coreserve.errors import InvalidArgumentError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelSequenceBatching
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest

Control = ModelSequenceBatching.Control
SequenceId = int | str


def sequence_flags(request: InferenceRequest, model_name: str) -> tuple[SequenceId, bool, bool]:
    """The request's sequence id, start flag and end flag (Triton's request parameters)."""
    parameters = request.parameters
    sequence_id = parameters.get("sequence_id", 0)
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
        raise InvalidArgumentError(
            f"request parameter 'sequence_id' must be an integer or a string, got {sequence_id!r}"
        )
    if sequence_id in (0, ""):
        raise InvalidArgumentError(
            f"inference request to model '{model_name}' must specify a non-zero or non-empty correlation ID"
        )
    if isinstance(sequence_id, int) and not 0 < sequence_id < 2**64:
        raise InvalidArgumentError(
            f"request parameter 'sequence_id' must fit in 64 unsigned bits, got {sequence_id}"
        )
    start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
    if not isinstance(start, bool) or not isinstance(end, bool):
        raise InvalidArgumentError(
            "request parameters 'sequence_start' and 'sequence_end' must be true or false"
        )
    return sequence_id, start, end


@dataclass(frozen=True)
class ControlTensor:
    """One control input: its name, kind and the values it takes."""

    name: str
    kind: int
    datatype: DataType
    false_true: tuple[object, object] = (0, 1)

    def value(self, sequence_id: SequenceId, start: bool, end: bool, batching: bool) -> np.ndarray:
        shape = (1, 1) if batching else (1,)
        dtype = NUMPY_DTYPES[self.datatype]
        if self.kind == Control.CONTROL_SEQUENCE_CORRID:
            if self.datatype is DataType.BYTES:
                return np.full(shape, str(sequence_id).encode(), dtype=np.object_)
            if isinstance(sequence_id, str):
                raise InvalidArgumentError(
                    f"control input '{self.name}' takes numeric sequence ids; got the string '{sequence_id}'"
                )
            # The id's 64 bits in the control's type, as Triton casts them (2**64 - 3 is -3 in INT64).
            return np.full(shape, np.array(sequence_id, np.uint64).astype(dtype), dtype=dtype)
        flags: dict[int, bool] = {
            Control.CONTROL_SEQUENCE_START: start,
            Control.CONTROL_SEQUENCE_END: end,
            Control.CONTROL_SEQUENCE_READY: True,
        }
        flag = flags[self.kind]
        return np.full(shape, self.false_true[1 if flag else 0], dtype=dtype)


def control_tensors(batching: ModelSequenceBatching) -> list[ControlTensor]:
    """The control inputs of a configuration (already checked by validate_config)."""
    tensors = []
    for control_input in batching.control_input:
        control = control_input.control[0]
        datatype = control_datatype(control)
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            tensors.append(ControlTensor(control_input.name, control.kind, datatype))
            continue
        pair = next(
            p for p in (control.int32_false_true, control.fp32_false_true, control.bool_false_true) if p
        )
        tensors.append(ControlTensor(control_input.name, control.kind, datatype, (pair[0], pair[1])))
    return tensors


@dataclass(frozen=True)
class StateTensor:
    """One implicit state: fed from `output_name` of a request to `input_name` of the next."""

    input_name: str
    output_name: str
    initial: np.ndarray  # without the batch dimension


def state_tensors(
    batching: ModelSequenceBatching, model_name: str, model_path: Path | None
) -> list[StateTensor]:
    """The implicit states of a configuration (already checked), with their initial values."""
    tensors = []
    for index, state in enumerate(batching.state):
        datatype = DataType.from_config_value(state.data_type)
        initial = state.initial_state[0] if state.initial_state else None
        dims = tuple(initial.dims) if initial is not None and initial.dims else tuple(state.dims)
        dtype = NUMPY_DTYPES[datatype]
        if initial is not None and initial.WhichOneof("state_data") == "data_file":
            where = f"model '{model_name}': config field 'sequence_batching.state[{index}]'"
            if model_path is None:
                raise ModelConfigError(f"{where}: initial_state data_file needs the model's folder")
            path = model_path / "initial_state" / initial.data_file
            try:
                value = np.frombuffer(path.read_bytes(), dtype=dtype).reshape(dims)
            except (OSError, ValueError) as exc:
                raise ModelConfigError(f"{where}: cannot read initial state from {path}: {exc}") from None
        elif datatype is DataType.BYTES:
            value = np.full(dims, b"", dtype=np.object_)
        else:
            value = np.zeros(dims, dtype=dtype)
        tensors.append(StateTensor(state.input_name, state.output_name, value))
    return tensors
