"""A FIL model's `parameters` as Triton's FIL backend reads them, checked, and where its file lies.

No framework is imported here: a bad parameter is reported before any model file is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coreserve import ModelConfig, ModelConfigError
from coreserve.backend import ModelFiles, bool_parameter, choice_parameter, int_parameter, str_parameter

# Triton FIL's model types and the file each one looks for in a version folder.
MODEL_FILENAMES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
    # Not one of Triton's: a pickled scikit-learn forest, read only when `allow_pickle` is true.
    "sklearn": "model.pkl",
}
# Accepted and checked as Triton spells them; they tune FIL's GPU kernels and mean nothing on a CPU.
STORAGE_TYPES = ("AUTO", "DENSE", "SPARSE", "SPARSE8")
ALGORITHMS = ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG")
GPU_ONLY_INTEGERS = ("threads_per_tree", "blocks_per_sm", "transfer_threshold")
IGNORED_FLAGS = ("use_experimental_optimizations", "xgboost_allow_unknown_field")
# Below this many rows a prediction runs on one thread unless `cpu_nthread` says otherwise: an
# OpenMP parallel region costs more than such a batch takes, and its spinning threads slow the
# other instances down (benchmarks/backends/fil.py, README of plugin-fil).
SMALL_BATCH_ROWS = 128


@dataclass(frozen=True)
class FilSettings:
    """What a FIL model's configuration asks for.

    `output_class`: the model classifies (Triton's newer name `is_classifier` is read too);
    `predict_proba`: answer each class's probability instead of the class id; `threshold`:
    the probability above which a binary classifier answers class 1; `cpu_nthread`: the
    threads one prediction uses (None: see `threads_for`).
    """

    model_type: str = "xgboost"
    output_class: bool = False
    predict_proba: bool = False
    threshold: float = 0.5
    cpu_nthread: int | None = None
    allow_pickle: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> FilSettings:
        """Reads and checks the parameters; raises ModelConfigError naming a bad one."""
        model_type = choice_parameter(config, "model_type", tuple(MODEL_FILENAMES)) or "xgboost"
        output_class = bool_parameter(config, "output_class")
        if output_class is None:
            output_class = bool_parameter(config, "is_classifier")
        choice_parameter(config, "storage_type", STORAGE_TYPES)
        choice_parameter(config, "algo", ALGORITHMS)
        for key in GPU_ONLY_INTEGERS:
            int_parameter(config, key)
        for key in IGNORED_FLAGS:
            bool_parameter(config, key)
        settings = cls(
            model_type=model_type,
            output_class=bool(output_class),
            predict_proba=bool(bool_parameter(config, "predict_proba")),
            threshold=_threshold(config),
            cpu_nthread=int_parameter(config, "cpu_nthread", minimum=1),
            allow_pickle=bool(bool_parameter(config, "allow_pickle")),
        )
        if settings.model_type == "sklearn" and not settings.allow_pickle:
            raise ModelConfigError(
                f"model '{config.name}': model_type 'sklearn' unpickles the model file, which runs any code "
                "the file holds; set parameter 'allow_pickle' to 'true' only for files you trust"
            )
        return settings

    def threads_for(self, rows: int) -> int | None:
        """The threads a prediction of `rows` rows uses: `cpu_nthread` if set, else one for a
        small batch and None (the framework's default: every core) for a large one."""
        if self.cpu_nthread is not None:
            return self.cpu_nthread
        return 1 if rows < SMALL_BATCH_ROWS else None

    def model_file(self, model: ModelFiles) -> Path:
        """The file to read: `default_model_filename` when the configuration names one, else
        the name Triton's FIL expects for the model type (`xgboost.json`, `model.txt`, ...)."""
        path = model.model_file
        if path.is_dir() or not model.filename:
            path = model.version_path / MODEL_FILENAMES[self.model_type]
        if not path.is_file():
            raise ModelConfigError(
                f"model '{model.name}': model file {path} not found (model_type '{self.model_type}' "
                f"reads {MODEL_FILENAMES[self.model_type]} unless default_model_filename names another file)"
            )
        return path


def _threshold(config: ModelConfig) -> float:
    value = str_parameter(config, "threshold")
    if value is None:
        return 0.5
    try:
        return float(value)
    except ValueError:
        raise ModelConfigError(
            f"model '{config.name}': parameter 'threshold' must be a number, got '{value}'"
        ) from None
