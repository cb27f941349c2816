"""Offline validation against the Kubernetes API's schemas, as the kubernetes-validate package ships them."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

# The oldest Kubernetes the manifests are meant for: gRPC probes are GA from 1.27.
OLDEST = "1.27"
_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
_VERSIONED_TYPE = re.compile(r"(?P<version>V\d+(?:alpha\d+|beta\d+)?)(?P<kind>[A-Z]\w*)")


def versions() -> list[str]:
    """The oldest Kubernetes meant, and the newest the installed schemas know."""
    return [OLDEST, ".".join(kubernetes_validate.latest_version().split(".")[:2])]


def validate_object(manifest: dict[str, Any], version: str) -> None:
    """Raises kubernetes_validate.ValidationError when the object breaks the strict schema."""
    kubernetes_validate.validate(manifest, version, strict=True)


@cache
def _definitions(version: str) -> dict[str, Any]:
    # The folder of the newest schemas not newer than `version`, as kubernetes-validate picks it.
    known = [v for v in kubernetes_validate.utils.all_versions() if _minor(v) <= _minor(version)]
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{known[-1]}-local-strict"
    loaded: dict[str, Any] = json.loads((folder / "_definitions.json").read_text())
    return loaded


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def definition_name(sdk_type: str, version: str) -> str:
    """The schema definition an SDK type name stands for: V1Container → io.k8s.api.core.v1.Container."""
    special = {"ResourceQuantity": "io.k8s.apimachinery.pkg.api.resource.Quantity"}
    if sdk_type in special:
        return special[sdk_type]
    names = _definitions(version)["$defs"]
    if sdk_type.startswith("K8sIo"):  # K8sIoApiAppsV1DeploymentStrategy: k8s.io/api/apps/v1's type
        flat = sdk_type.lower().replace("k8sio", "iok8s", 1)
        matches = [name for name in names if name.replace(".", "").lower() == flat]
    else:  # V1Container, V2HorizontalPodAutoscaler: a version, then the name
        parts = _VERSIONED_TYPE.fullmatch(sdk_type)
        assert parts is not None, f"not a Kubernetes type name: {sdk_type}"
        suffix = f".{parts['version'].lower()}.{parts['kind']}"
        matches = [name for name in names if name.endswith(suffix)]
    assert len(matches) == 1, f"no single Kubernetes definition for {sdk_type}: {matches}"
    return str(matches[0])


def definition_errors(value: Any, sdk_type: str, version: str) -> list[str]:
    """Why `value` breaks the strict schema of a Kubernetes type (none when it does not)."""
    definitions = _definitions(version)
    registry: Registry = Resource.from_contents(definitions) @ Registry()
    schema = {"$ref": f"{_DEFINITIONS_ID}#/$defs/{definition_name(sdk_type, version)}"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(value)
    ]
