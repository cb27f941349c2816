"""How a shadow copy's outputs are compared with the client's: equal values match exactly,
infinities and integers past 2**53 included; a NaN on one side only is a mismatch."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from coreserve.server.traffic._shadow import ShadowCounts, _compare
from coreserve.types import InferenceResponse


def _compared(client: np.ndarray, candidate: np.ndarray) -> tuple[int, float]:
    counts = ShadowCounts()
    _compare({"y": client}, InferenceResponse("m", "2", {"y": candidate}), counts)
    output = counts.outputs["y"]
    assert output.compared == 1
    return output.mismatched, output.max_abs_diff


@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16])
def test_equal_infinities_and_nans_on_both_sides_match(dtype: type) -> None:
    values = np.array([np.inf, -np.inf, np.nan, 1.5], dtype)
    with np.errstate(all="raise"):  # (no warning either)
        assert _compared(values, values.copy()) == (0, 0.0)


def test_a_nan_on_one_side_only_is_a_mismatch_of_infinite_difference() -> None:
    assert _compared(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == (1, math.inf)
    assert _compared(np.array([np.inf, 1.0]), np.array([1.0, 1.0])) == (1, math.inf)


def test_integers_past_2_to_the_53_are_compared_exactly() -> None:
    client = np.array([2**53, 7], np.int64)
    assert _compared(client, np.array([2**53 + 1, 7], np.int64)) == (1, 1.0)  # (1 at least)
    assert _compared(client, client.copy()) == (0, 0.0)


def test_outputs_of_one_value_without_dimensions_are_compared() -> None:
    assert _compared(np.array(1.5, np.float32), np.array(2.5, np.float32)) == (1, 1.0)
    assert _compared(np.array(3), np.array(3)) == (0, 0.0)


def test_numbers_that_differ_give_their_largest_difference() -> None:
    assert _compared(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.5, 2.0])) == (1, 1.0)
