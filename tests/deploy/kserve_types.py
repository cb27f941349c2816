"""Offline validation of KServe objects against the API types of KServe's own Python SDK.

KServe publishes no schema file on PyPI; its SDK (the `kserve` distribution) carries one class
per API type, generated from the same Go types as the CRDs, each listing its fields
(`attribute_map`), their types (`openapi_types`) and, in its setters, the required ones. This
module reads those classes' source with `ast` (importing `kserve` would pull in its whole model
server) and checks an object field by field: unknown fields, wrong types and missing required
fields are errors. The Kubernetes types inside (V1Container, V1ObjectMeta …) are checked against
the Kubernetes schema instead (kube_schemas). What the CRD alone says (enums, patterns) is not
checked here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from kube_schemas import definition_errors

# Which SDK class is the root of each kind the manifests use.
ROOT_TYPES = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
}
_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_SCALARS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


@dataclass(frozen=True)
class ApiType:
    """One SDK class: its JSON field names → their type names, and the required JSON fields."""

    fields: dict[str, str]
    required: frozenset[str]


@cache
def api_types() -> dict[str, ApiType]:
    """Every class of kserve/models, by class name."""
    models = Path(str(metadata.distribution("kserve").locate_file("kserve/models")))
    types: dict[str, ApiType] = {}
    for source in sorted(models.glob("v*.py")):
        text = source.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                types[node.name] = _api_type(node, ast.get_source_segment(text, node) or "")
    return types


def _api_type(node: ast.ClassDef, source: str) -> ApiType:
    assigned = {
        target.id: ast.literal_eval(statement.value)
        for statement in node.body
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map")
    }
    json_names: dict[str, str] = assigned["attribute_map"]
    fields = {json_names[attribute]: type_name for attribute, type_name in assigned["openapi_types"].items()}
    required = frozenset(json_names[attribute] for attribute in _REQUIRED.findall(source))
    return ApiType(fields, required)


def errors(manifest: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Why a KServe object breaks its API types (an empty list when it does not)."""
    root = ROOT_TYPES.get((manifest.get("apiVersion", ""), manifest.get("kind", "")))
    if root is None:
        return [f"not a KServe kind these tests know: {manifest.get('apiVersion')} {manifest.get('kind')}"]
    return _check(manifest, root, manifest["kind"], kubernetes_version)


def _check(value: Any, type_name: str, path: str, version: str) -> list[str]:
    if type_name == "object":
        return []
    if type_name in _SCALARS:
        wanted = _SCALARS[type_name]
        wrong = not isinstance(value, wanted) or (bool not in wanted and isinstance(value, bool))
        return [f"{path}: expected {type_name}, got {value!r}"] if wrong else []
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        item_type = type_name[len("list[") : -1]
        return [
            error
            for n, item in enumerate(value)
            for error in _check(item, item_type, f"{path}[{n}]", version)
        ]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {value!r}"]
        item_type = type_name[len("dict(") : -1].partition(", ")[2]
        return [
            error
            for key, item in value.items()
            for error in _check(item, item_type, f"{path}.{key}", version)
        ]
    api_type = api_types().get(type_name)
    if api_type is None:  # a Kubernetes type that KServe embeds
        return [f"{path}.{error}" for error in definition_errors(value, type_name, version)]
    if not isinstance(value, dict):
        return [f"{path}: expected a {type_name} mapping, got {value!r}"]
    found = [
        f"{path}: unknown field '{key}' (not in {type_name})" for key in value if key not in api_type.fields
    ]
    found += [f"{path}: missing required field '{key}'" for key in sorted(api_type.required - value.keys())]
    for key, item in value.items():
        if key in api_type.fields:
            found += _check(item, api_type.fields[key], f"{path}.{key}", version)
    return found
