"""The plugin manager wrapper and the backend registry."""

from __future__ import annotations

import logging

import pytest

from coreserve.backend import BackendRegistry, hookimpl
from coreserve.backend.plugins.manager import Plugins
from coreserve.errors import InvalidArgumentError


class FakeBackend:
    def __init__(self, name: str = "fake", platforms: tuple[str, ...] = ("fake_platform",)) -> None:
        self.name = name
        self.platforms = platforms
        self.default_model_filename = "model.fake"

    def auto_complete_config(self, model, config, server):
        return config

    async def create_instance(self, model, config, placement, server):
        raise NotImplementedError


class FakePlugin:
    @hookimpl
    def coreserve_register_backends(self, register: BackendRegistry) -> None:
        register.add(FakeBackend())


def test_plugins_registered_in_code_add_backends() -> None:
    plugins = Plugins(autoload=False)
    plugins.register(FakePlugin(), name="fake")
    assert plugins.backends().names() == ["ensemble", "fake"]  # the built-in and ours


def test_entry_points_are_loaded_unless_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "onnxruntime" in Plugins().backends().names()
    monkeypatch.setenv("CORESERVE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert Plugins().backends().names() == ["ensemble"]
    monkeypatch.setenv("CORESERVE_DISABLE_PLUGIN_AUTOLOAD", "0")
    monkeypatch.setenv("CORESERVE_BLOCKED_PLUGINS", "plugin-onnx")
    assert "onnxruntime" not in Plugins().backends().names()


def test_registry_finds_by_name_and_platform_and_says_what_to_install() -> None:
    registry = BackendRegistry()
    registry.add(FakeBackend())
    assert registry.require(name="fake").name == "fake"
    assert registry.require(platform="fake_platform").name == "fake"
    with pytest.raises(InvalidArgumentError, match=r"pip install plugin-torch"):
        registry.require(platform="pytorch_libtorch")
    with pytest.raises(
        InvalidArgumentError, match=r"backend 'mystery' is not served.*installed backends: fake"
    ):
        registry.require(name="mystery")


def test_registry_rejects_objects_that_are_not_backends(caplog: pytest.LogCaptureFixture) -> None:
    registry = BackendRegistry()
    with pytest.raises(TypeError, match="has no attribute 'name'"):
        registry.add(object())  # type: ignore[arg-type]
    registry.add(FakeBackend())
    with caplog.at_level(logging.WARNING):
        registry.add(FakeBackend())
    assert "registered twice" in caplog.text
    assert len(registry) == 1
