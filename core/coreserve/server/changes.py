"""The changes a client makes to the server: a model loaded or unloaded, a shared-memory region
registered or unregistered, the log or trace settings changed, a model's traffic policy set.

`DataPlane.change` takes one and makes it; in a server of several workers it travels to every
worker as a message (`message_of`, `change_from`) and is kept for the workers that start later.
Each change says what it replaces in that replay (`replay_key`: the last change of a model or a
region is what counts; None: each one is replayed, in order) and what an unregistration
forgets (`forgets`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from coreserve.errors import InvalidArgumentError, UnsupportedError


@dataclass(frozen=True)
class LoadModel:
    call: ClassVar[str] = "load_model"
    name: str
    parameters: dict[str, object]  # as Triton's load request carries them
    by_model: bool = False  # asked by a model (pb_utils.load_model): see ModelRepository.load

    @property
    def replay_key(self) -> tuple[str, str]:
        return ("model", self.name)


@dataclass(frozen=True)
class UnloadModel:
    call: ClassVar[str] = "unload_model"
    name: str
    dependents: bool = False
    by_model: bool = False

    @property
    def replay_key(self) -> tuple[str, str]:
        return ("model", self.name)


@dataclass(frozen=True)
class RegisterSystemRegion:
    call: ClassVar[str] = "register_system_shared_memory"
    name: str
    key: str
    offset: int
    byte_size: int

    @property
    def replay_key(self) -> tuple[str, str]:
        return ("system", self.name)

    def undo(self) -> UnregisterSystemRegion:
        return UnregisterSystemRegion(self.name)


@dataclass(frozen=True)
class UnregisterSystemRegion:
    call: ClassVar[str] = "unregister_system_shared_memory"
    name: str  # "": every region

    def forgets(self, key: tuple[str, ...]) -> bool:
        return key[0] == "system" and (not self.name or key[1] == self.name)


@dataclass(frozen=True)
class RegisterCudaRegion:
    call: ClassVar[str] = "register_cuda_shared_memory"
    name: str
    raw_handle: bytes
    device_id: int
    byte_size: int

    @property
    def replay_key(self) -> tuple[str, str]:
        return ("cuda", self.name)

    def undo(self) -> UnregisterCudaRegion:
        return UnregisterCudaRegion(self.name)


@dataclass(frozen=True)
class UnregisterCudaRegion:
    call: ClassVar[str] = "unregister_cuda_shared_memory"
    name: str  # "": every region

    def forgets(self, key: tuple[str, ...]) -> bool:
        return key[0] == "cuda" and (not self.name or key[1] == self.name)


@dataclass(frozen=True)
class UpdateLogSettings:
    call: ClassVar[str] = "update_log_settings"
    replay_key: ClassVar[None] = None  # replayed in order, each one
    changes: dict[str, Any]


@dataclass(frozen=True)
class UpdateTraceSetting:
    call: ClassVar[str] = "update_trace_setting"
    replay_key: ClassVar[None] = None  # replayed in order, each one
    changes: dict[str, Any]
    model: str = ""  # "": the global setting


@dataclass(frozen=True)
class SetTraffic:
    call: ClassVar[str] = "set_traffic"
    name: str
    policy: dict[str, Any]  # as the repository API takes it (see repository.traffic.policy)
    rollout: bool = False  # a rollout's own move (others are refused while one runs)

    @property
    def replay_key(self) -> tuple[str, str, str]:
        # A model's: a worker that took a snapshot on has the policy from it (see adoption).
        return ("model", self.name, "traffic")


Change = (
    LoadModel
    | UnloadModel
    | RegisterSystemRegion
    | UnregisterSystemRegion
    | RegisterCudaRegion
    | UnregisterCudaRegion
    | UpdateLogSettings
    | UpdateTraceSetting
    | SetTraffic
)
Registration = RegisterSystemRegion | RegisterCudaRegion
Unregistration = UnregisterSystemRegion | UnregisterCudaRegion

_BY_CALL: dict[str, type[Change]] = {kind.call: kind for kind in get_args(Change)}


def message_of(change: Change) -> dict[str, Any]:
    """The change as it travels between processes: its `call` and its fields."""
    fields = {field.name: getattr(change, field.name) for field in dataclasses.fields(change)}
    return {"call": change.call, **fields}


def change_from(message: dict[str, Any]) -> Change:
    """The change a message carries; InvalidArgumentError for one that is no change."""
    call = message.get("call")
    kind = _BY_CALL.get(call) if isinstance(call, str) else None
    if kind is None:
        raise InvalidArgumentError(f"no such change: '{call}'")
    try:
        return kind(**{key: value for key, value in message.items() if key != "call"})
    except TypeError as exc:
        raise InvalidArgumentError(f"change '{call}' is malformed: {exc}") from None


def fault_key(change: Change) -> str:
    """What a change concerns, as a worker names a fault of it ("model/<name>", "system/<region>",
    or the change's call for a settings change)."""
    key = getattr(change, "replay_key", None)
    return "/".join(key) if key is not None else change.call


def forgets(change: Change, fault: str) -> bool:
    """Whether `change` makes the fault named `fault` moot (a region unregistered)."""
    return isinstance(change, UnregisterSystemRegion | UnregisterCudaRegion) and change.forgets(
        tuple(fault.split("/", 1))
    )


def repository_named() -> UnsupportedError:
    """The error of a load, unload or index request that names a repository (HTTP
    `/v2/repository/{repository}/...`, gRPC `repository_name`): Triton's 501 / UNIMPLEMENTED."""
    return UnsupportedError("'repository_name' specification is not supported")


def loads_files(message: dict[str, Any]) -> bool:
    """Whether a change's message is a load whose files the request carries."""
    parameters = message.get("parameters")
    return (
        message.get("call") == LoadModel.call
        and isinstance(parameters, dict)
        and any(str(key).startswith("file:") for key in parameters)
    )


class ModelsForBackends:
    """The model repository API the server gives its backends (`ModelControl`, Triton's
    `pb_utils.load_model`): changes made as a client's (`change`: DataPlane.change), marked as
    asked by a model; those a model asks for while it loads, in this process alone (`apply_here`:
    DataPlane.apply_change). Relayed to every worker, such a change would wait for the change
    that loads the model, which waits for it."""

    def __init__(
        self,
        change: Callable[[Change], Awaitable[None]],
        apply_here: Callable[[Change], Awaitable[None]],
        model_ready: Callable[[str, str], bool],
    ) -> None:
        self._change = change
        self._apply_here = apply_here
        self._model_ready = model_ready

    async def load_model(self, name: str, parameters: dict[str, object], while_loading: bool = False) -> None:
        await self._make(LoadModel(name, parameters, by_model=True), while_loading)

    async def unload_model(self, name: str, dependents: bool = False, while_loading: bool = False) -> None:
        await self._make(UnloadModel(name, dependents, by_model=True), while_loading)

    async def _make(self, change: Change, while_loading: bool) -> None:
        await (self._apply_here if while_loading else self._change)(change)

    def model_ready(self, name: str, version: str = "") -> bool:
        return self._model_ready(name, version)
