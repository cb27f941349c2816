"""The worked Ray Serve config (examples/ray/serve_config.yaml) is valid and names real objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import yaml
from ray.serve import schema as serve_schema

from support.paths import REPO


def _config() -> dict:
    return yaml.safe_load((REPO / "examples" / "ray" / "serve_config.yaml").read_text())


def test_the_config_passes_ray_serves_schema() -> None:
    schema = serve_schema.ServeDeploySchema.model_validate(_config())
    (app,) = schema.applications
    assert app.import_path == "coreserve.ray:build_app"
    (deployment,) = app.deployments
    assert deployment.name == "coreserve"
    assert (
        deployment.autoscaling_config["policy"]["policy_function"] == "coreserve.ray:pending_requests_policy"
    )


def test_the_names_it_gives_resolve_and_build_the_application() -> None:
    (app,) = _config()["applications"]
    module, _, name = app["import_path"].partition(":")
    build = getattr(importlib.import_module(module), name)
    application = build(app["args"])
    assert type(application).__name__ == "Application"
    policy = app["deployments"][0]["autoscaling_config"]["policy"]["policy_function"]
    module, _, name = policy.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    with pytest.raises(ValueError, match="model_repository"):
        build({})


def test_coreserve_ray_help_gives_its_flags_and_defaults() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "coreserve", "ray", "--help"], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    text = " ".join(completed.stdout.split())
    for expected in (
        "--num-replicas",
        "(default 1)",
        "--autoscaling-config",
        "coreserve.ray:pending_requests_policy",
        "--serve-port",
        "(default 8000)",
        "--proxy-location",
        "--detach",
    ):
        assert expected in text, expected
