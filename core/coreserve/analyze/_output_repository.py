"""The output model repository: the model under its best configuration, ready to serve.

`output_model_repository/<model>/` holds the best settings and `<model>_config_<n>/` the next
ones (Model Analyzer's layout). Each is a copy of the model's folder (its version folders and
files) with a complete `config.pbtxt`: the configuration the sweep started from with the
settings applied and the folder's name, so coreserve and Triton load it as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import ModelSettings

OUTPUT_REPOSITORY = "output_model_repository"


def write_output_repository(analysis: Analysis, out_dir: Path, top: int = 3) -> list[str]:
    """Writes the `top` passing settings, best first; returns the model folders' names.

    Nothing is written where no settings meets the constraints, or where the model's files are
    not known (a running server measured without --model-repository). Folders of this model
    left by an earlier run are removed first, so the repository never mixes two runs' results.
    """
    if analysis.model_dir is None:
        return []
    repository = out_dir / OUTPUT_REPOSITORY
    _remove_earlier(repository, analysis.model)
    passing = analysis.ranking().passing[:top]
    names = [output_model_name(analysis.model, index) for index in range(len(passing))]
    for name, point in zip(names, passing, strict=True):
        _write_model(analysis, analysis.model_dir, point.settings, repository / name)
    return names


def output_model_name(model: str, index: int) -> str:
    """The best settings keep the model's name; the next are `<model>_config_1`, `_2`, …"""
    return model if index == 0 else f"{model}_config_{index}"


def _remove_earlier(repository: Path, model: str) -> None:
    if not repository.is_dir():
        return
    prefix = f"{model}_config_"
    for folder in repository.iterdir():
        numbered = folder.name.startswith(prefix) and folder.name.removeprefix(prefix).isdigit()
        if folder.is_dir() and (folder.name == model or numbered):
            shutil.rmtree(folder)


def _write_model(analysis: Analysis, model_dir: Path, settings: ModelSettings, folder: Path) -> None:
    shutil.copytree(model_dir, folder, ignore=shutil.ignore_patterns("__pycache__"))
    config = settings.applied_to(analysis.base_config)
    config.name = folder.name
    heading = f"# Written by coreserve analyze: {settings.describe()}\n"
    text = heading + text_format.MessageToString(config)
    (folder / "config.pbtxt").write_text(text, encoding="utf-8")
