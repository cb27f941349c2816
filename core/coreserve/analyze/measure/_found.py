"""The model as the server serves it before the sweep: its configuration and those of the
models it is composed of (an ensemble's steps, or the models a BLS model calls, which only the
user can name: --composing-models, Model Analyzer's bls_composing_models)."""

from __future__ import annotations

from dataclasses import dataclass, field

from coreserve.analyze.measure._client import LoadFailed, ServerClient, ServerGone
from coreserve.protos.model_config_pb2 import ModelConfig


class AnalyzeError(Exception):
    """Something the user can fix, said in one message."""


@dataclass
class ModelAsFound:
    config: ModelConfig
    composing: dict[str, ModelConfig] = field(default_factory=dict)  # in the order of the steps


async def find_model(client: ServerClient, model: str, called: tuple[str, ...], load: bool) -> ModelAsFound:
    """Reads the configurations; with `load` (a server we started, in explicit mode) it loads
    the models first: the called ones, then the model (an ensemble loads its steps itself)."""
    if load:
        for name in (*called, model):
            try:
                await client.load(name)
            except LoadFailed as exc:
                raise AnalyzeError(f"model {name!r} does not load as it is: {exc}") from None
    config = await _config(client, model)
    if config.HasField("sequence_batching"):
        raise AnalyzeError(
            f"model {model!r} is a sequence model: the load generator does not send sequences "
            "(correlation ids, start and end flags), so the server would refuse its requests"
        )
    names = list(called)
    names += [step.model_name for step in config.ensemble_scheduling.step if step.model_name not in names]
    found = ModelAsFound(config)
    for name in names:
        part = await _config(client, name)
        if part.platform == "ensemble":
            raise AnalyzeError(
                f"model {model!r} has a step {name!r} that is an ensemble itself: nested ensembles "
                "are not swept (analyze the inner ensemble, or each model of it)"
            )
        found.composing[name] = part
    return found


async def _config(client: ServerClient, model: str) -> ModelConfig:
    try:
        return await client.model_config(model)
    except ServerGone:
        raise
    except Exception as exc:  # the server's words name the reason
        raise AnalyzeError(f"model {model!r} is not served at {client.address}: {exc}") from None
