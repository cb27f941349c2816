"""Top-K classes as Triton formats them, and the label files they read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coreserve.config import parse_config
from coreserve.errors import InvalidArgumentError, ModelConfigError
from coreserve.protocol.classification import parse_class_count, top_classes
from coreserve.repository._layout import read_output_labels


def _texts(array: np.ndarray) -> list:
    return np.vectorize(bytes.decode)(array).tolist()


def test_equal_scores_keep_the_lower_index_first() -> None:
    scores = np.array([1.0, 3.0, 1.0, 3.0, 1.0], dtype=np.float32)
    assert _texts(top_classes(scores, 5, (), False, "OUT")) == [
        "3.000000:1",
        "3.000000:3",
        "1.000000:0",
        "1.000000:2",
        "1.000000:4",
    ]


def test_unsigned_scores_sort_without_wrapping() -> None:
    scores = np.array([0, 2**64 - 1, 7], dtype=np.uint64)
    assert _texts(top_classes(scores, 2, (), False, "OUT")) == ["18446744073709551615:1", "7:2"]


def test_a_batching_output_gives_one_row_per_batch_entry() -> None:
    scores = np.array([[[0.1, 0.9]], [[0.8, 0.2]]], dtype=np.float64)  # [B, 1, 2]: flattened per entry
    result = top_classes(scores, 1, (b"no", b"yes"), True, "OUT")
    assert result.shape == (2, 1) and _texts(result) == [["0.900000:1:yes"], ["0.800000:0:no"]]


def test_an_empty_label_adds_nothing_as_in_triton() -> None:
    scores = np.array([3, 2, 1], dtype=np.int8)
    assert _texts(top_classes(scores, 3, (b"a", b""), False, "OUT")) == ["3:0:a", "2:1", "1:2"]


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.object_])
def test_types_without_order_are_refused(dtype: type) -> None:
    with pytest.raises(
        InvalidArgumentError, match="class result not available for output due to unsupported type"
    ):
        top_classes(np.zeros(3, dtype=dtype), 1, (), False, "OUT")


def test_more_than_a_million_scores_per_batch_entry_are_refused() -> None:
    batch = np.zeros((2, 1_000_000), dtype=np.float32)  # a million per entry: taken
    assert top_classes(batch, 1, (), True, "OUT").shape == (2, 1)
    with pytest.raises(InvalidArgumentError, match=r"^classification output tensor too large \(output 'OUT'"):
        top_classes(np.zeros(1_000_001, dtype=np.float32), 1, (), False, "OUT")


@pytest.mark.parametrize("value", [0, -3, 1.0, "2", True])
def test_a_class_count_must_be_an_integer_of_one_or_more(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="'classification' parameter"):
        parse_class_count(value, "OUT")  # type: ignore[arg-type]


def test_label_files_split_at_newlines_only(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes(b"cat\r\n\nbird\nfish")
    config = parse_config(
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]'
    )
    assert read_output_labels(config, tmp_path) == {"OUT": (b"cat\r", b"", b"bird", b"fish")}


def test_a_missing_label_file_is_refused_in_triton_words(tmp_path: Path) -> None:
    config = parse_config(
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "x.txt" } ]'
    )
    with pytest.raises(ModelConfigError, match=r"^failed to open text file for read .*x\.txt: No such file"):
        read_output_labels(config, tmp_path)
