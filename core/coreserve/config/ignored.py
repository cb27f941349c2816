"""Configuration settings that parse but that this coreserve version, or this server's flags,
do not act on.

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


def ineffective_settings(config: ModelConfig, *, response_cache: bool, rate_limiter: bool) -> list[str]:
    """Why each setting of `config` has no effect, on a server with or without a response cache
    and the rate limiter: the ignored fields, and those the server's flags leave idle."""
    reasons = [f"config field '{name}' is not supported and has no effect" for name in ignored_fields(config)]
    if config.response_cache.enable and not response_cache:
        # Triton says nothing here; a line spares an operator wondering why nothing is cached.
        reasons.append(
            "response_cache is enabled but the server has no cache "
            "(--cache-config local,size=BYTES); its responses are not cached"
        )
    if any(group.HasField("rate_limiter") for group in config.instance_group) and not rate_limiter:
        # Triton ignores it silently under its default --rate-limit=off.
        reasons.append("instance_group.rate_limiter has no effect without --rate-limit=execution_count")
    return reasons
