"""The backends that plugins registered, found by name or by platform."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from coreserve.backend.api import Backend
from coreserve.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

# Which distribution provides each of the backends coreserve's project publishes; used to
# tell a user what to install when a model needs a backend that is missing.
KNOWN_DISTRIBUTIONS = {
    "onnxruntime": "plugin-onnx",
    "pytorch": "plugin-torch",
    "tensorrt": "plugin-tensorrt",
    "openvino": "plugin-openvino",
    "python": "plugin-python",
}
KNOWN_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "openvino": "openvino",
    "python": "python",
}


class BackendRegistry:
    """Backends by name; `add` is what a plugin's `coreserve_register_backends` calls."""

    def __init__(self) -> None:
        self._by_name: dict[str, Backend] = {}
        self._by_platform: dict[str, Backend] = {}

    def add(self, backend: Backend) -> None:
        for attribute in ("name", "platforms", "default_model_filename"):
            if not hasattr(backend, attribute):
                raise TypeError(f"backend {backend!r} has no attribute '{attribute}'")
        if not backend.name:
            raise TypeError(f"backend {backend!r} has an empty name; set its `name`")
        if not isinstance(backend, Backend):
            raise TypeError(f"backend {backend!r} lacks auto_complete_config or create_instance")
        if backend.name in self._by_name:
            logger.warning(
                "backend '%s' is registered twice (%r and %r); keeping the first",
                backend.name,
                self._by_name[backend.name],
                backend,
            )
            return
        self._by_name[backend.name] = backend
        for platform in backend.platforms:
            self._by_platform.setdefault(platform, backend)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    def by_platform(self, platform: str) -> Backend | None:
        return self._by_platform.get(platform)

    def require(self, *, name: str = "", platform: str = "") -> Backend:
        """The backend a configuration names by `backend` or `platform`, or an error saying
        what to install."""
        backend = self.get(name) if name else self.by_platform(platform)
        if backend is not None:
            if name and platform and platform not in backend.platforms and platform in self._by_platform:
                # As Triton: the backend serves it, whatever the platform says.
                logger.warning("backend '%s' serves a model whose platform is '%s'", name, platform)
            return backend
        wanted = name or KNOWN_PLATFORMS.get(platform, "")
        what = f"backend '{name}'" if name else f"platform '{platform}'"
        hint = f" (pip install {KNOWN_DISTRIBUTIONS[wanted]})" if wanted in KNOWN_DISTRIBUTIONS else ""
        installed = ", ".join(self.names()) or "none"
        raise InvalidArgumentError(
            f"{what} is not served by any installed backend{hint}; installed backends: {installed}"
        )
