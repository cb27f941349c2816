"""What a finished (or resumed) analysis holds: what the writers of its outputs read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from coreserve.analyze._points import Measurement, ModelSettings
from coreserve.analyze._ranking import Constraints, Ranking, rank
from coreserve.protos.model_config_pb2 import ModelConfig


@dataclass
class Analysis:
    """One model's sweep: its configuration as found, the constraints, every measurement."""

    model: str
    model_dir: Path | None  # its folder in the repository (copied to the output); None: not known
    base_config: ModelConfig
    constraints: Constraints
    objective: str
    measurements: list[Measurement]
    # The composing models' configurations as found (an ensemble's steps, a BLS model's callees).
    composing_configs: dict[str, ModelConfig] = field(default_factory=dict)

    @property
    def baseline(self) -> ModelSettings:
        return ModelSettings.of(self.base_config, self.composing_configs)

    @property
    def measured_gpus(self) -> bool:
        """Whether the server reported GPUs: the tables then have the GPUs' columns."""
        return any(point.gpu_memory_mb is not None for point in self.measurements)

    def ranking(self) -> Ranking:
        return rank(self.measurements, self.constraints, self.objective)

    def baseline_best(self) -> Measurement | None:
        """The current configuration's best passing level: what the table's change is against."""
        ranking = rank(
            [point for point in self.measurements if point.settings == self.baseline],
            self.constraints,
            self.objective,
        )
        return ranking.passing[0] if ranking.passing else None
