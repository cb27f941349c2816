"""deploy/helm/coreserve linted and rendered by Helm's own Go SDK (the helm-python-sdk wheel binds
it: no helm binary), and the values files it is tested with."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import yaml
from deploy_render import DEPLOY, Manifest

CHART = DEPLOY / "helm" / "coreserve"
# Named as the Kustomize base names its objects: the chart's full name is then "coreserve".
RELEASE = "coreserve"
NAMESPACE = "serving"
# The chart's defaults, and every examples/*.yaml by its stem.
VALUES_FILES: dict[str, Path | None] = {
    "defaults": None,
    **{path.stem: path for path in sorted((DEPLOY / "helm" / "examples").glob("*.yaml"))},
}

Values = dict[str, Any]


def values_of(name: str) -> Values:
    """What a values file says, parsed as `helm -f` parses it (the defaults: nothing)."""
    path = VALUES_FILES[name]
    return {} if path is None else helm_python.values_from_yaml(path.read_text())


def render(name: str) -> list[Manifest]:
    """The objects that `helm template coreserve deploy/helm/coreserve -f FILE` writes."""
    return copy.deepcopy(_rendered(name))


@cache
def _rendered(name: str) -> list[Manifest]:
    return render_values(values_of(name))


def render_values(values: Values) -> list[Manifest]:
    """The objects the chart renders with these values over its defaults (NOTES.txt left out,
    as `helm template` leaves it); raises helm_python.HelmError where Helm refuses them."""
    rendered = _chart().render(values=values, name=RELEASE, namespace=NAMESPACE)
    return [
        item
        for template, text in sorted(rendered.items())
        if not template.endswith("NOTES.txt")
        for item in yaml.safe_load_all(text)
        if item
    ]


def refusal(values: Values) -> str:
    """Why Helm refuses to render with these values (the test fails where it renders)."""
    try:
        render_values(values)
    except helm_python.HelmError as error:
        return str(error)
    raise AssertionError(f"the chart rendered with {values}")


def lint(values: Values, kube_version: str) -> list[str]:
    """`helm lint --strict` of the chart with these values: its findings above info (none when it passes)."""
    report = helm_python.lint(CHART, values, strict=True, kube_version=kube_version)
    findings = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] > 1]
    return findings + [error for error in report["errors"] if not any(error in f for f in findings)]


@cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)
