"""Triton's classification extension: an output answered as its top K classes.

A client asks for it per requested output (HTTP `"parameters": {"classification": K}`, gRPC
`classification` int64 parameter, which tritonclient's `class_count=K` sets). The output comes
back as BYTES strings `"score:index"`, or `"score:index:label"` when the output's
`label_filename` names a label for that index, best score first, formatted as Triton's
frontends format them (C++ `std::to_string`: integers as such, floats with six decimals).
A batching model's output [B, ...] gives [B, min(K, n)] (one top K per batch entry); any other
output is flattened and gives [min(K, n)].

An output of more than a million scores per batch entry is refused, as Triton's releases after
2.51 refuse it ("classification output tensor too large"): sorting it costs the server too much.

Ties keep the lower index first. Triton's std::sort does the same for outputs of up to 16
classes; beyond that its order among equal scores is arbitrary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from coreserve.errors import CoreserveError, InvalidArgumentError
from coreserve.responses import ForwardingSink
from coreserve.types import DataType, InferenceResponse, ParameterValue, ResponseSink

PARAMETER = "classification"

# The types Triton's TopkClassifications reads; FP16, BF16, BOOL and BYTES it refuses.
CLASSIFIABLE = frozenset(
    {
        DataType.UINT8,
        DataType.UINT16,
        DataType.UINT32,
        DataType.UINT64,
        DataType.INT8,
        DataType.INT16,
        DataType.INT32,
        DataType.INT64,
        DataType.FP32,
        DataType.FP64,
    }
)

Labels = Sequence[bytes]
# Triton's kMaxClassificationElements: the most scores one batch entry's classes are taken from.
MAX_CLASSIFIED_SCORES = 1_000_000


def parse_class_count(value: ParameterValue, output_name: str) -> int:
    """The K of a requested output's `classification` parameter; raises for anything but K >= 1."""
    if type(value) is not int:
        raise InvalidArgumentError(
            f"invalid value type for '{PARAMETER}' parameter, expected an integer: "
            f"output '{output_name}' asks for {value!r}"
        )
    if value < 1:
        raise InvalidArgumentError(
            f"invalid value for '{PARAMETER}' parameter, expected >= 1: "
            f"output '{output_name}' asks for {value} classes"
        )
    return value


def check_classifiable(datatype: DataType, output_name: str) -> None:
    """Raises, as Triton does, for an output whose type has no order of scores."""
    if datatype not in CLASSIFIABLE:
        raise InvalidArgumentError(
            f"class result not available for output due to unsupported type '{datatype.value}' "
            f"(output '{output_name}'; classification reads integer, FP32 and FP64 outputs)"
        )


def top_classes(array: np.ndarray, count: int, labels: Labels, batched: bool, name: str) -> np.ndarray:
    """The top `count` classes of output `name` as a BYTES array (see the module docstring)."""
    check_classifiable(DataType.from_numpy(array.dtype), name)
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    if rows.shape[1] > MAX_CLASSIFIED_SCORES:
        raise InvalidArgumentError(
            f"classification output tensor too large (output '{name}' has {rows.shape[1]} scores per "
            f"batch entry; classification takes at most {MAX_CLASSIFIED_SCORES})"
        )
    classes = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], classes), dtype=np.object_)
    integers = array.dtype.kind in "iu"
    for row_index, row in enumerate(rows):
        for rank, index in enumerate(_descending(row)[:classes]):
            score = row[index]
            text = f"{int(score)}:{index}" if integers else f"{float(score):f}:{index}"
            entry = text.encode()
            label = labels[index] if index < len(labels) else b""
            result[row_index, rank] = entry + b":" + label if label else entry
    return result if batched and array.ndim else result.reshape(classes)


def _descending(row: np.ndarray) -> np.ndarray:
    """Indices of `row` by falling value, equal values by rising index (no negation: unsigned)."""
    order: np.ndarray = row.shape[0] - 1 - np.argsort(row[::-1], kind="stable")[::-1]
    return order


def classify_response(
    response: InferenceResponse,
    counts: Mapping[str, int],
    labels: Mapping[str, Labels],
    batched: bool,
) -> InferenceResponse:
    """The response with each output named in `counts` replaced by its top classes."""
    outputs = dict(response.outputs)
    for name, count in counts.items():
        array = outputs.get(name)
        if array is not None:
            outputs[name] = top_classes(array, count, labels.get(name, ()), batched, name)
    response.outputs = outputs
    return response


class ClassifyingSink(ForwardingSink):
    """A sink that turns the requested outputs into classes before passing responses on."""

    __slots__ = ("_batched", "_counts", "_labels")

    def __init__(
        self, sink: ResponseSink, counts: Mapping[str, int], labels: Mapping[str, Labels], batched: bool
    ) -> None:
        super().__init__(sink)
        self._counts = counts
        self._labels = labels
        self._batched = batched

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and response.error is None:
            try:
                response = classify_response(response, self._counts, self._labels, self._batched)
            except CoreserveError as exc:
                self._target.fail(exc)
                return
        self._target.send(response, final)
