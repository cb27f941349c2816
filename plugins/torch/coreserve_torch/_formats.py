"""The model files plugin-torch loads: TorchScript (`model.pt`) and torch.export (`model.pt2`).

Imports no torch: the backend tells the formats apart before a model loads (and torch with it).
"""

from __future__ import annotations

from pathlib import Path

EXPORT_SUFFIX = ".pt2"


def is_export(path: Path | str) -> bool:
    """Whether the file is a torch.export program (else TorchScript)."""
    return Path(path).suffix == EXPORT_SUFFIX
