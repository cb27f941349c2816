"""Small tree models trained with XGBoost and LightGBM themselves, and FIL repository folders around them."""

from __future__ import annotations

from pathlib import Path

import lightgbm
import numpy as np
import xgboost

FEATURES = 6


def samples(rows: int, seed: int = 0) -> np.ndarray:
    """FP32 rows of FEATURES features, some of them missing (NaN), as tree models take them."""
    data = np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)
    data[::7, 2] = np.nan
    return data


def labels(data: np.ndarray, classes: int) -> np.ndarray:
    """Classes that depend on the first features, so that the trees have something to learn."""
    score = np.nan_to_num(data[:, 0] + 0.5 * data[:, 1] * data[:, 2])
    if classes == 0:
        return score
    edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    return np.digitize(score, edges)


def xgboost_booster(objective: str, classes: int = 0, trees: int = 20) -> xgboost.Booster:
    data = samples(300)
    params: dict[str, object] = {"objective": objective, "max_depth": 4, "nthread": 1, "seed": 0}
    if objective.startswith("multi:"):
        params["num_class"] = classes
    target = labels(data, classes if classes else (2 if objective.startswith("binary:") else 0))
    return xgboost.train(params, xgboost.DMatrix(data, target), trees)


def lightgbm_booster(objective: str, classes: int = 0, trees: int = 20) -> lightgbm.Booster:
    data = samples(300)
    params: dict[str, object] = {"objective": objective, "num_leaves": 8, "num_threads": 1, "verbose": -1}
    if objective == "multiclass":
        params["num_class"] = classes
    target = labels(data, classes if classes else (2 if objective == "binary" else 0))
    return lightgbm.train(params, lightgbm.Dataset(data, target, params={"verbose": -1}), trees)


def fil_config(
    model_type: str,
    *,
    output_class: bool,
    predict_proba: bool = False,
    width: int | None = None,
    **extra: str,
) -> str:
    """A Triton FIL config.pbtxt; `width` None leaves inputs and outputs to auto-completion."""
    parameters = {
        "model_type": model_type,
        "output_class": str(output_class).lower(),
        "predict_proba": str(predict_proba).lower(),
        **extra,
    }
    lines = ['backend: "fil"', "max_batch_size: 1024"]
    if width is not None:
        lines += [
            f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]',
            f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]',
        ]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()]
    return "\n".join(lines) + "\n"


def write_fil_model(repository: Path, name: str, config: str, files: dict[str, bytes]) -> Path:
    """A model folder: config.pbtxt, and version 1 holding `files` (name -> content)."""
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    for filename, content in files.items():
        (version / filename).write_bytes(content)
    return repository / name
