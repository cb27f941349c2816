"""The class labels of a model's outputs, read from each output's `label_filename`."""

from __future__ import annotations

from pathlib import Path

from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelConfig


def read_output_labels(config: ModelConfig, model_path: Path) -> dict[str, tuple[bytes, ...]]:
    """Labels per output that names a label file in the model folder: one label per line.

    Read when a version loads, as Triton does: a file that cannot be read makes the version
    unavailable, with Triton's words for it. Lines split at '\\n' only (a '\\r' stays part of
    its label, as in Triton).
    """
    labels: dict[str, tuple[bytes, ...]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_path / output.label_filename
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(
                f"failed to open text file for read {path}: {exc.strerror or exc} "
                f"(label_filename of output '{output.name}')"
            ) from None
        lines = text.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the last line opens no further one
        labels[output.name] = tuple(lines)
    return labels
