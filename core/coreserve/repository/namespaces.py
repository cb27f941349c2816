"""`--model-namespacing`: the same model name in several repositories, as Triton serves it.

Each repository is a namespace (its path or URL, as Triton uses the repository path). A
model is held under its qualified name, `<namespace>::<name>`; a request that names a model
finds it if one repository only has a model of that name, and is refused with Triton's words
when several do. An ensemble's steps look in its own repository first; a Python model's BLS
calls name models globally, as Triton's do (an ambiguous name fails there too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from coreserve.errors import AmbiguousModelError, NotFoundError

if TYPE_CHECKING:
    from coreserve.backend.api import InferenceClient
    from coreserve.config.signature import ModelSignature
    from coreserve.repository.model import Model
    from coreserve.repository.storage._sources import RepositorySource
    from coreserve.types import InferenceRequest, InferenceResponse

# Models by key (see `qualified`), each with its source and fingerprint.
Found = dict[str, tuple["RepositorySource", str]]

T = TypeVar("T")
SEPARATOR = "::"  # Triton's, between namespace and name in its model identifiers


def qualified(namespace: str, name: str) -> str:
    """The key a model is held under: its name, qualified by its namespace when it has one."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def key_of(source: RepositorySource, name: str, namespacing: bool) -> str:
    """The key of model `name` of `source`: qualified by the source's label under namespacing."""
    return qualified(source.label, name) if namespacing else name


async def find_models(sources: Sequence[RepositorySource], namespacing: bool) -> tuple[Found, dict[str, str]]:
    """The models of every source by key, and the names found in two sources with the reason
    each is refused (without namespacing: a name must be found once)."""
    found: Found = {}
    duplicates: dict[str, str] = {}
    for source in sources:
        listing = await asyncio.to_thread(source.scan)
        for name, fingerprint in listing.items():
            if namespacing:
                found[key_of(source, name, namespacing)] = (source, fingerprint)
            elif name in found:
                duplicates[name] = (
                    f"model '{name}' appears in more than one repository: "
                    f"{found[name][0].label} and {source.label}"
                )
            else:
                found[name] = (source, fingerprint)
    for name in duplicates:
        found.pop(name, None)
    return found, duplicates


def ambiguous(name: str, count: int) -> AmbiguousModelError:
    """Triton's error for a name that several namespaces hold."""
    return AmbiguousModelError(
        f"There are {count} identifiers of model '{name}' in global map, "
        "model namespace must be provided to resolve ambiguity."
    )


class KeyIndex:
    """Keys of models with the keys of each plain name, where an ensemble's steps are found."""

    def __init__(self, names: Mapping[str, str]) -> None:
        """`names`: each model's plain name, by key."""
        self._keys = frozenset(names)
        self._by_name: dict[str, list[str]] = {}
        for key, name in names.items():
            self._by_name.setdefault(name, []).append(key)

    def named(self, name: str) -> list[str]:
        """The keys of the models of that plain name, in every namespace."""
        return self._by_name.get(name, [])

    def step_key(self, namespace: str, step: str) -> str | None:
        """The key of the model an ensemble of `namespace` calls for `step`, as its calls find it
        (`NamespacedClient`, then `ModelTable.find`): its own repository's, one held under the
        plain name (loaded from files), or the one model of that name; None where none or several."""
        for key in (qualified(namespace, step), step):
            if key in self._keys:
                return key
        found = self.named(step)
        return found[0] if len(found) == 1 else None

    def step_keys(self, namespace: str, steps: Iterable[str]) -> set[str]:
        """The keys of the steps an ensemble of `namespace` calls (`step_key`); its own
        repository's where none or several."""
        return {self.step_key(namespace, step) or qualified(namespace, step) for step in steps}


class ModelTable(dict[str, "Model"]):
    """The served models by key, with an index by plain name kept up to date with every change."""

    def __init__(self) -> None:
        super().__init__()
        self._index: KeyIndex | None = None

    def __setitem__(self, key: str, model: Model) -> None:
        super().__setitem__(key, model)
        self._index = None

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._index = None

    def pop(self, key: str, default: Model | None = None) -> Model | None:  # type: ignore[override]
        self._index = None
        return super().pop(key, default)

    def clear(self) -> None:
        super().clear()
        self._index = None

    @property
    def index(self) -> KeyIndex:
        """The keys of the models held (unavailable ones too), by plain name."""
        if self._index is None:
            self._index = KeyIndex({key: model.name for key, model in self.items()})
        return self._index

    def named(self, name: str) -> list[Model]:
        """The models of that plain name, in every namespace."""
        return [self[key] for key in self.index.named(name)]

    def find(self, name: str, unloaded: Collection[str], namespaces: Collection[str] = ()) -> Model:
        """The model a request names; under namespacing (`namespaces`: the repositories'), the
        one repository that has that name. `unloaded`: the keys of the models unloaded, which
        Triton keeps with no version."""
        model = self.get(name)
        if model is None and namespaces:
            matches = self.named(name)
            if len(matches) > 1:
                raise ambiguous(name, len(matches))
            model = matches[0] if matches else None
        if model is not None:
            return model
        if name in unloaded or any(qualified(namespace, name) in unloaded for namespace in namespaces):
            raise NotFoundError(f"Request for unknown model: '{name}' has no available versions (unloaded)")
        raise NotFoundError(f"Request for unknown model: '{name}' is not found")


def resolve_step(namespace: str, name: str, has_model: Callable[[str], bool]) -> str:
    """The model an ensemble of `namespace` calls for step `name`: its own repository's if it
    has one, else the name as any request gives it."""
    key = qualified(namespace, name)
    return key if has_model(key) else name


def step_lookup(
    lookup: Callable[[str, str], T] | None, namespace: str, has_model: Callable[[str], bool] | None
) -> Callable[[str, str], T] | None:
    """`lookup` (a model name, a version) with the names an ensemble of `namespace` gives its
    steps resolved as its calls are (`resolve_step`)."""
    if lookup is None or has_model is None or not namespace:
        return lookup
    return lambda name, version: lookup(resolve_step(namespace, name, has_model), version)


class NamespacedClient:
    """The in-process client a model gets under namespacing: names resolve in its namespace first."""

    def __init__(self, client: InferenceClient, namespace: str, has_model: Callable[[str], bool]) -> None:
        self._client = client
        self._namespace = namespace
        self._has_model = has_model

    def _resolve(self, name: str) -> str:
        return resolve_step(self._namespace, name, self._has_model)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        request.model_name = self._resolve(request.model_name)
        return await self._client.infer(request)

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        request.model_name = self._resolve(request.model_name)
        return self._client.stream(request)

    def stream_with_flags(
        self, request: InferenceRequest
    ) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        request.model_name = self._resolve(request.model_name)
        return self._client.stream_with_flags(request)

    def model_signature(self, name: str, version: str = "") -> ModelSignature:
        return self._client.model_signature(self._resolve(name), version)
