"""BaseBackend carries the defaults that every backend used to repeat."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from coreserve import ModelConfig, ModelConfigError
from coreserve.backend import (
    BackendRegistry,
    BaseBackend,
    InstanceKind,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    ServerContext,
)

PLACEMENT = InstancePlacement("m_0", "m", 0, InstanceKind.CPU)


class _Instance:
    def __init__(self, thread: str) -> None:
        self.thread = thread

    async def execute(self, requests: object, responder: object) -> None:
        pass

    async def close(self) -> None:
        pass


class _Completing(BaseBackend):
    name = "completing"
    default_model_filename = "model.bin"

    def __init__(self) -> None:
        self.completed = 0

    def complete_config(self, model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
        self.completed += 1
        config.input.add(name="IN")
        return config

    def load_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        return _Instance(threading.current_thread().name)


def _model(tmp_path: Path, with_file: bool = True) -> ModelFiles:
    (tmp_path / "1").mkdir()
    if with_file:
        (tmp_path / "1" / "model.bin").write_bytes(b"x")
    return ModelFiles("m", tmp_path, 1, "model.bin")


def test_a_config_with_inputs_and_outputs_is_not_completed_again(tmp_path: Path) -> None:
    backend = _Completing()
    model = _model(tmp_path)
    complete = ModelConfig(name="m")
    complete.input.add(name="A")
    complete.output.add(name="B")
    assert backend.auto_complete_config(model, complete, ServerContext()) is complete
    assert backend.completed == 0
    completed = backend.auto_complete_config(model, ModelConfig(name="m"), ServerContext())
    assert [i.name for i in completed.input] == ["IN"] and backend.completed == 1


def test_a_missing_model_file_is_named_before_completing_and_loading(tmp_path: Path) -> None:
    backend = _Completing()
    model = _model(tmp_path, with_file=False)
    with pytest.raises(ModelConfigError, match=r"model 'm': model file .*model\.bin not found"):
        backend.auto_complete_config(model, ModelConfig(name="m"), ServerContext())
    with pytest.raises(ModelConfigError, match="not found"):
        asyncio.run(backend.create_instance(model, ModelConfig(name="m"), PLACEMENT, ServerContext()))
    assert backend.completed == 0


def test_load_instance_runs_on_a_worker_thread(tmp_path: Path) -> None:
    instance = asyncio.run(
        _Completing().create_instance(_model(tmp_path), ModelConfig(name="m"), PLACEMENT, ServerContext())
    )
    assert isinstance(instance, _Instance)
    assert instance.thread != threading.main_thread().name


def test_a_backend_that_loads_nothing_says_what_to_override(tmp_path: Path) -> None:
    class Bare(BaseBackend):
        name = "bare"
        default_model_filename = "model.bin"

    with pytest.raises(NotImplementedError, match="Bare must override load_instance"):
        asyncio.run(
            Bare().create_instance(_model(tmp_path), ModelConfig(name="m"), PLACEMENT, ServerContext())
        )


def test_the_registry_refuses_a_backend_without_a_name() -> None:
    with pytest.raises(TypeError, match="empty name"):
        BackendRegistry().add(BaseBackend())
    registry = BackendRegistry()
    registry.add(_Completing())
    assert registry.names() == ["completing"]
