"""Offline validation of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1).

No package here ships the operator's CRD schema, so this is a schema of our own: the fields the
chart writes, typed and closed (unknown fields refused), and the ones the operator needs
(selector, endpoints with a port); the LabelSelector and ObjectMeta inside are checked against
Kubernetes' own schema (kube_schemas).
"""

from __future__ import annotations

from typing import Any

import jsonschema
from kube_schemas import definition_errors

# The operator's Duration type (its CRD's pattern).
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_RELABELINGS = {"type": "array", "items": {"type": "object"}}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": _RELABELINGS,
        "metricRelabelings": _RELABELINGS,
    },
}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "jobLabel": {"type": "string"},
                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        },
    },
}


def errors(manifest: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Why a ServiceMonitor breaks the schema (an empty list when it does not)."""
    found = [
        f"ServiceMonitor.{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in jsonschema.Draft202012Validator(SCHEMA).iter_errors(manifest)
    ]
    for field, sdk_type in (("metadata", "V1ObjectMeta"), ("spec.selector", "V1LabelSelector")):
        value: Any = manifest
        for key in field.split("."):
            value = value.get(key, {}) if isinstance(value, dict) else {}
        found += [
            f"ServiceMonitor.{field}.{error}"
            for error in definition_errors(value, sdk_type, kubernetes_version)
        ]
    return found
