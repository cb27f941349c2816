"""Reading a tree model with its own framework, and predicting with it.

Each framework is imported only when a model of its type loads. The predictor is the
framework's own (XGBoost's, LightGBM's; Treelite's GTIL for checkpoints, which nothing else
reads): measured on a 500-tree model with 32 features, XGBoost's predictor answers a batch of
1024 rows about 15 times faster than Treelite's GTIL, LightGBM's about twice as fast, and both
are as quick at batch 1 (see benchmarks/backends/fil.py).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coreserve import ModelConfigError
from coreserve_fil._settings import FilSettings

Predict = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Forest:
    """A loaded tree model: how many features it reads, how many scores it gives per row
    (1 for a regressor or a binary classifier, the class count for a multi-class one), and
    `predict`, which maps FP32 rows [N, features] to FP32 scores [N, outputs] (probabilities
    for a classifier, as the framework's own predict gives them)."""

    num_features: int
    num_outputs: int
    predict: Predict


def load_forest(path: Path, settings: FilSettings, model_name: str) -> Forest:
    """Reads the model file with the framework its model type names; raises ModelConfigError
    with the framework's reason when it cannot."""
    loader = _LOADERS[settings.model_type]
    try:
        return loader(path, settings)
    except ModelConfigError:
        raise
    except Exception as exc:  # each framework raises errors of its own
        framework = _FRAMEWORKS[settings.model_type]
        raise ModelConfigError(
            f"model '{model_name}': {framework} cannot read {path} as model_type "
            f"'{settings.model_type}': {_first_line(exc)}"
        ) from None


def _xgboost(path: Path, settings: FilSettings) -> Forest:
    import xgboost

    booster = xgboost.Booster()
    # From bytes, XGBoost tells JSON from UBJSON by their content (from a path, by the suffix).
    booster.load_model(bytearray(path.read_bytes()))
    learner = json.loads(booster.save_config())["learner"]
    parameters = learner["learner_model_param"]
    classes = int(parameters.get("num_class", "0"))
    outputs = max(classes, int(parameters.get("num_target", "1")), 1)
    softmax = learner["objective"]["name"] == "multi:softmax"
    current = [-1]  # the booster's nthread; set_param only when it changes

    def predict(rows: np.ndarray) -> np.ndarray:
        threads = settings.threads_for(len(rows)) or 0  # 0: XGBoost's default, every core
        if threads != current[0]:
            booster.set_param({"nthread": threads})
            current[0] = threads
        if softmax:
            # Its predictions are class ids; FIL's outputs are the probabilities behind them.
            margins = booster.inplace_predict(rows, predict_type="margin")
            return _softmax(np.asarray(margins, np.float32).reshape(len(rows), outputs))
        return np.asarray(booster.inplace_predict(rows), np.float32).reshape(len(rows), outputs)

    return Forest(booster.num_features(), outputs, predict)


def _lightgbm(path: Path, settings: FilSettings) -> Forest:
    import lightgbm

    booster = lightgbm.Booster(model_file=str(path))
    outputs = booster.num_model_per_iteration()

    def predict(rows: np.ndarray) -> np.ndarray:
        threads = settings.threads_for(len(rows)) or 0  # 0: LightGBM's default, every core
        scores = booster.predict(rows, num_threads=threads)
        return np.asarray(scores, np.float32).reshape(len(rows), outputs)

    return Forest(booster.num_feature(), outputs, predict)


def _treelite(path: Path, settings: FilSettings) -> Forest:
    import treelite

    return _gtil_forest(treelite.Model.deserialize(str(path)), settings)


def _gtil_forest(model: Any, settings: FilSettings) -> Forest:
    import treelite.gtil

    header = model.get_header_accessor()
    targets = int(header.get_field("num_target")[0])
    if targets != 1:
        raise ModelConfigError(f"a forest of {targets} targets is not served (FIL serves one)")
    outputs = int(header.get_field("num_class")[0])

    def predict(rows: np.ndarray) -> np.ndarray:
        threads = settings.threads_for(len(rows)) or -1  # -1: Treelite's default, every core
        scores = treelite.gtil.predict(model, np.ascontiguousarray(rows), nthread=threads)
        return np.asarray(scores, np.float32).reshape(len(rows), outputs)

    return Forest(model.num_feature, outputs, predict)


def _sklearn(path: Path, settings: FilSettings) -> Forest:
    # Only reached when the configuration sets allow_pickle (FilSettings refuses otherwise).
    with path.open("rb") as file:
        estimator = pickle.load(file)
    if not hasattr(estimator, "n_features_in_") or not hasattr(estimator, "predict"):
        raise ModelConfigError(f"the pickle holds a {type(estimator).__name__}, not a fitted estimator")
    classes = len(getattr(estimator, "classes_", ()))
    if classes == 0:

        def regress(rows: np.ndarray) -> np.ndarray:
            return np.asarray(estimator.predict(rows), np.float32).reshape(len(rows), -1)

        return Forest(int(estimator.n_features_in_), 1, regress)
    outputs = 1 if classes == 2 else classes

    def classify(rows: np.ndarray) -> np.ndarray:
        probabilities = np.asarray(estimator.predict_proba(rows), np.float32)
        # A binary classifier answers the positive class's probability, as FIL counts it.
        return probabilities[:, 1:] if classes == 2 else probabilities

    return Forest(int(estimator.n_features_in_), outputs, classify)


def _softmax(margins: np.ndarray) -> np.ndarray:
    shifted = np.exp(margins - margins.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


_LOADERS: dict[str, Callable[[Path, FilSettings], Forest]] = {
    "xgboost": _xgboost,
    "xgboost_json": _xgboost,
    "xgboost_ubj": _xgboost,
    "lightgbm": _lightgbm,
    "treelite_checkpoint": _treelite,
    "sklearn": _sklearn,
}
_FRAMEWORKS = {
    "xgboost": "XGBoost",
    "xgboost_json": "XGBoost",
    "xgboost_ubj": "XGBoost",
    "lightgbm": "LightGBM",
    "treelite_checkpoint": "Treelite",
    "sklearn": "pickle",
}
