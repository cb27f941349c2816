"""What Triton's FIL backend answers in `output__0`, made from a forest's scores.

- `predict_proba`: each class's probability, [N, classes]; a binary classifier, which
  scores one probability, answers [N, 2] (1 - p, p).
- `output_class` without `predict_proba`: the class id as FP32, [N, 1]; a binary
  classifier's is 1 where its probability exceeds `threshold`, a multi-class one's is the
  most probable class.
- Otherwise (a regressor): the scores themselves, [N, outputs].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from coreserve_fil._forests import Forest
from coreserve_fil._settings import FilSettings

INPUT = "input__0"
OUTPUT = "output__0"

Postprocess = Callable[[np.ndarray], np.ndarray]


def output_width(forest: Forest, settings: FilSettings) -> int:
    """The number of values `output__0` holds per row."""
    if settings.predict_proba:
        return 2 if forest.num_outputs == 1 else forest.num_outputs
    if settings.output_class:
        return 1
    return forest.num_outputs


def postprocess(forest: Forest, settings: FilSettings) -> Postprocess:
    """The function that turns the forest's scores [N, outputs] into `output__0`."""
    binary = forest.num_outputs == 1
    if settings.predict_proba:
        return _both_probabilities if binary else _unchanged
    if settings.output_class:
        threshold = np.float32(settings.threshold)

        def above_threshold(scores: np.ndarray) -> np.ndarray:
            return (scores > threshold).astype(np.float32)

        return above_threshold if binary else _most_probable
    return _unchanged


def _unchanged(scores: np.ndarray) -> np.ndarray:
    return scores


def _both_probabilities(scores: np.ndarray) -> np.ndarray:
    return np.concatenate([1.0 - scores, scores], axis=1)


def _most_probable(scores: np.ndarray) -> np.ndarray:
    classes: np.ndarray = scores.argmax(axis=1).astype(np.float32)
    return classes.reshape(-1, 1)
