"""The hooks a coreserve plugin may implement. Every hook is named `coreserve_*`.

Hooks register things at start-up; none is called on the request path. After start-up the
server calls the registered backend objects directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from coreserve.backend.plugins._commands import CommandRegistry
    from coreserve.backend.plugins.registry import BackendRegistry

hookspec = pluggy.HookspecMarker("coreserve")
hookimpl = pluggy.HookimplMarker("coreserve")


@hookspec
def coreserve_register_backends(register: BackendRegistry) -> None:
    """Adds the plugin's backends: `register.add(MyBackend())`.

    Called once when the server starts (and by `coreserve backends`), before any model
    loads. It must be quick: create backend objects, import nothing heavy that a model load
    could import later, and load no models.
    """


@hookspec
def coreserve_register_commands(register: CommandRegistry) -> None:
    """Adds the plugin's subcommands of `coreserve`: `register.add("name", main, "one line of help")`.

    Called only when `coreserve` is run with a first argument that is no flag and no built-in
    command, never when the server starts. `main` gets the arguments after the name and
    returns the exit code; a built-in command of the same name wins.
    """
