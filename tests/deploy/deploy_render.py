"""deploy/'s Kustomize trees rendered by the real kubectl, and the pieces the tests read from them."""

from __future__ import annotations

import copy
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from paths import REPO

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


def _kustomize_command() -> list[str] | None:
    """kubectl's built-in Kustomize, else a standalone kustomize; None when neither is here."""
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


def render(tree: Path) -> list[Manifest]:
    """The objects that `kubectl kustomize TREE` writes (skips the test when no tool is here)."""
    return copy.deepcopy(_rendered(tree))


@cache
def _rendered(tree: Path) -> list[Manifest]:
    command = _kustomize_command()
    if command is None:
        pytest.skip("neither kubectl nor kustomize is installed (Debian/apt: kubectl)")
    result = subprocess.run([*command, str(tree)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)} {tree} failed:\n{result.stderr}"
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
