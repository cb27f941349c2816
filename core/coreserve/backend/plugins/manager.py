"""The one wrapper around pluggy: loads plugins from entry points and collects their backends.

Core code calls `Plugins.backends()` (and `Plugins.commands()`); nothing else touches the plugin
manager's hooks. A plugin that fails to import is reported with its distribution and skipped, so one broken
plugin never stops the server. Two environment variables control loading, as pytest's do:

- `CORESERVE_DISABLE_PLUGIN_AUTOLOAD=1` loads no entry points (plugins registered in code still count);
- `CORESERVE_BLOCKED_PLUGINS=name,other` skips the named entry points or distributions.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from dataclasses import dataclass

import pluggy

from coreserve.backend.plugins import hookspecs
from coreserve.backend.plugins._commands import CommandRegistry
from coreserve.backend.plugins.registry import BackendRegistry

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "coreserve.backends"
# Built-in plugins, registered through the same hook as entry-point plugins.
DEFAULT_PLUGINS = ("coreserve.ensemble",)
DISABLE_AUTOLOAD_ENV = "CORESERVE_DISABLE_PLUGIN_AUTOLOAD"
BLOCKED_PLUGINS_ENV = "CORESERVE_BLOCKED_PLUGINS"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    entry_point: str
    distribution: str
    error: str


@dataclass(frozen=True)
class BackendOrigin:
    """Where an installed backend comes from, for `coreserve backends`."""

    distribution: str
    version: str


class Plugins:
    """coreserve's plugin manager: entry-point plugins plus plugins registered in code."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        self._manager = pluggy.PluginManager("coreserve")
        self._manager.add_hookspecs(hookspecs)
        self._backends: BackendRegistry | None = None
        self._origins: dict[str, BackendOrigin] = {}
        self.failures: list[PluginFailure] = []
        for module_name in DEFAULT_PLUGINS:
            self._manager.register(importlib.import_module(module_name), name=module_name)
        self._origins["coreserve"] = BackendOrigin("core-server", _core_version())
        if autoload is None:
            autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "") in ("", "0")
        if autoload:
            self._load_entry_points()

    def register(self, plugin: object, name: str | None = None) -> None:
        """Registers a plugin object or module directly (embedding, tests)."""
        self._manager.register(plugin, name=name)
        self._backends = None

    def backends(self) -> BackendRegistry:
        """Every backend the plugins registered; the hook runs once."""
        if self._backends is None:
            registry = BackendRegistry()
            self._manager.hook.coreserve_register_backends(register=registry)
            self._backends = registry
        return self._backends

    def commands(self) -> CommandRegistry:
        """Every subcommand the plugins registered (`coreserve NAME ...`)."""
        registry = CommandRegistry()
        self._manager.hook.coreserve_register_commands(register=registry)
        return registry

    def origin(self, backend: object) -> BackendOrigin:
        """The distribution that provides a backend, for `coreserve backends`."""
        package = type(backend).__module__.split(".")[0]
        found = self._origins.get(package)
        if found is not None:
            return found
        distributions = importlib.metadata.packages_distributions().get(package, [])
        if not distributions:
            return BackendOrigin(distribution=f"(module {package})", version="")
        return BackendOrigin(distributions[0], importlib.metadata.version(distributions[0]))

    def _load_entry_points(self) -> None:
        blocked = {
            item.strip() for item in os.environ.get(BLOCKED_PLUGINS_ENV, "").split(",") if item.strip()
        }
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = _distribution_label(entry_point)
            dist_name = entry_point.dist.name if entry_point.dist else ""
            if entry_point.name in blocked or dist_name in blocked:
                logger.info(
                    "plugin '%s' (%s) is blocked by %s", entry_point.name, distribution, BLOCKED_PLUGINS_ENV
                )
                continue
            if self._manager.get_plugin(entry_point.name) is not None:
                continue
            try:
                plugin = entry_point.load()
                self._manager.register(plugin, name=entry_point.name)
                self._manager.check_pending()
            except Exception as exc:
                self._record_failure(entry_point.name, distribution, exc)
                continue
            if entry_point.dist is not None:
                package = entry_point.module.split(".")[0]
                self._origins[package] = BackendOrigin(entry_point.dist.name, entry_point.dist.version)

    def _record_failure(self, name: str, distribution: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.failures.append(PluginFailure(name, distribution, error))
        logger.warning(
            "backend plugin '%s' from distribution %s failed to load and is skipped: %s",
            name,
            distribution,
            error,
        )
        plugin = self._manager.get_plugin(name)
        if plugin is not None:
            self._manager.unregister(plugin)


def _distribution_label(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist else "(unknown distribution)"


def _core_version() -> str:
    try:
        return importlib.metadata.version("core-server")
    except importlib.metadata.PackageNotFoundError:
        return ""
