"""The output model repository: the model under its best configuration, ready to serve.

`output_model_repository/<model>/` holds the best settings and `<model>_config_<n>/` the next
ones (Model Analyzer's layout). A model composed of others (an ensemble, a BLS model) is
written once, the best, beside its composing models under their own names, since it names
them. Each is a copy of the model's folder (its version folders and
files) with a complete `config.pbtxt`: the configuration the sweep started from with the
settings applied and the folder's name, so coreserve and Triton load it as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format

from coreserve.analyze._analysis import Analysis
from coreserve.analyze._points import ModelSettings, with_instance_count
from coreserve.protos.model_config_pb2 import ModelConfig

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
    if passing and passing[0].settings.composing:
        # Its steps or callees are named in the model: one loadable set, the best, is written.
        return _write_composed(analysis, analysis.model_dir, passing[0].settings, repository)
    names = [output_model_name(analysis.model, index) for index in range(len(passing))]
    for name, point in zip(names, passing, strict=True):
        _write_model(analysis, analysis.model_dir, point.settings, repository / name)
    return names


def _write_composed(
    analysis: Analysis, model_dir: Path, settings: ModelSettings, repository: Path
) -> list[str]:
    """The model and each composing model under its own name, with the best settings' counts."""
    _write_model(analysis, model_dir, settings, repository / analysis.model)
    for name, count in settings.composing:
        folder = repository / name
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(model_dir.parent / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
        config = with_instance_count(analysis.composing_configs[name], count)
        _write_config(config, folder, f"{name}: {count} instance(s), with {analysis.model}'s best settings")
    return [analysis.model, *(name for name, _ in settings.composing)]


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
    _write_config(settings.applied_to(analysis.base_config), folder, settings.describe())


def _write_config(config: ModelConfig, folder: Path, what: str) -> None:
    written = ModelConfig()
    written.CopyFrom(config)
    written.name = folder.name
    text = f"# Written by coreserve analyze: {what}\n" + text_format.MessageToString(written)
    (folder / "config.pbtxt").write_text(text, encoding="utf-8")
