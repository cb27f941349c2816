"""Configuration fields that parse but that this coreserve version does not act on.

Loading a model logs a warning for each one it uses, so an operator is never left to wonder
why a setting made no difference.
"""

from __future__ import annotations

from coreserve.protos.model_config_pb2 import ModelConfig


def ignored_fields(config: ModelConfig) -> list[str]:
    """The fields `config` sets that coreserve ignores."""
    ignored = []
    if config.model_repository_agents.agents:
        ignored.append("model_repository_agents")
    return ignored
