"""A requirements.txt beside a Python model: its stubs run in an environment built from it.

The package the models need is a wheel built here, one the server's environment lacks; pip
finds it offline (PIP_FIND_LINKS, PIP_NO_INDEX), as an operator's mirror or wheel folder would
serve it. With `uv` installed the environments are built with uv (these variables are handed to
it as its options), else with venv and pip.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import json
import logging
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.errors import UnavailableError
from coreserve.testing import ServerFactory, ServerProcess
from coreserve_python.server.env._build import Builds, build_environment, uv_binary
from coreserve_python.server.env._environment import ENV_CACHE_DIR, _requirements_launch
from coreserve_python.server.env.cache import EnvironmentCache, environment_key
from support.waiting import wait_until

PACKAGE = "coreserve_test_dep_xyz"
REQUIREMENTS = "coreserve-test-dep-xyz==1.0\n"
BUILDING = "building a Python environment"
MODEL_PY = f"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

import {PACKAGE}


class TritonPythonModel:
    def execute(self, requests):
        found = []
        for name in ("pytest", "pluggy"):  # in the server's site-packages, not in this environment's own
            try:
                __import__(name)
                found.append(name)
            except ImportError:
                pass
        answer = {{"greeting": {PACKAGE}.greet(), "executable": sys.executable, "server_packages": found,
                  "numpy": np.__version__}}
        text = np.array([json.dumps(answer).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ANSWER", text)]) for _ in requests]
"""
PLAIN_MODEL_PY = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answer = {"executable": sys.executable}
        text = np.array([json.dumps(answer).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ANSWER", text)]) for _ in requests]
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ANSWER" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the wheel of a tiny pure-Python package, built here with setuptools."""
    source = tmp_path_factory.mktemp("dep-source")
    (source / PACKAGE).mkdir()
    (source / PACKAGE / "__init__.py").write_text('def greet():\n    return "hello from xyz"\n')
    (source / "pyproject.toml").write_text(
        textwrap.dedent(f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "coreserve-test-dep-xyz"
            version = "1.0"

            [tool.setuptools]
            packages = ["{PACKAGE}"]
        """)
    )
    folder = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(folder), str(source)],
        check=True,
    )  # fmt: skip
    assert len(list(folder.glob("*.whl"))) == 1
    return folder


def _offline(wheels: Path) -> dict[str, str]:
    return {"PIP_FIND_LINKS": str(wheels), "PIP_NO_INDEX": "1"}


def _model(repository: Path, name: str, requirements: str | None, *, in_version: bool = False) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(CONFIG)
    (repository / name / "1" / "model.py").write_text(
        MODEL_PY if requirements is not None else PLAIN_MODEL_PY
    )
    if requirements is not None:
        folder = repository / name / "1" if in_version else repository / name
        (folder / "requirements.txt").write_text(requirements)


def _ask(server: ServerProcess, model: str) -> dict[str, object]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        answer = client.infer(model, [tensor]).as_numpy("ANSWER")[0].decode()
    finally:
        client.close()
    result: dict[str, object] = json.loads(answer)
    return result


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return {entry["name"]: entry for entry in json.loads(response.read())}


def _python_envs(*args: str, cache: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "coreserve", "python-envs", *args, f"--cache-dir={cache}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_models_run_in_environments_built_from_their_requirements(
    coreserve_server: ServerFactory, tmp_path: Path, wheels: Path
) -> None:
    assert importlib.util.find_spec(PACKAGE) is None, "the server's environment must lack the package"
    repository, cache = tmp_path / "models", tmp_path / "envs"
    _model(repository, "first", REQUIREMENTS)
    _model(repository, "second", REQUIREMENTS, in_version=True)  # the same requirements, by content
    _model(repository, "unresolvable", "coreserve-test-missing-xyz==9.9\n")
    _model(repository, "plain", None)
    # What the server has already is not installed again (offline here: it could not be).
    _model(repository, "satisfied", f"{REQUIREMENTS}numpy=={np.__version__}\npluggy\n")
    server = coreserve_server(
        repository, "--exit-on-error=false", f"--python-env-cache-dir={cache}", env=_offline(wheels)
    )

    first, second = _ask(server, "first"), _ask(server, "second")
    assert first["greeting"] == second["greeting"] == "hello from xyz"
    assert str(first["executable"]).startswith(str(cache)) and first["executable"] == second["executable"]
    # the server's packages stay in sight, below the environment's own
    assert first["server_packages"] == ["pytest", "pluggy"]
    assert first["numpy"] == np.__version__  # the stub imports the server's numpy
    assert _ask(server, "plain")["executable"] == sys.executable  # no requirements.txt: nothing changes

    log = server.log
    builds = [
        line for line in log.splitlines() if BUILDING in line and ("'first'" in line or "'second'" in line)
    ]
    assert len(builds) == 1, log  # the second model found the first's environment
    assert "using the cached Python environment" in log
    installer = "uv" if uv_binary() else "pip"
    progress = (
        "Installed 1 package" if installer == "uv" else "Successfully installed coreserve-test-dep-xyz-1.0"
    )
    # The two models load at once: whichever took the lock first built it, and logged the installer.
    files = {
        "first": repository / "first" / "requirements.txt",
        "second": repository / "second" / "1" / "requirements.txt",
    }
    assert [name for name, file in files.items() if f"model '{name}': {file}: {progress}" in log] in (
        ["first"],
        ["second"],
    ), log
    if installer == "pip":  # what the server has is not installed again
        satisfied = f"model 'satisfied': {repository / 'satisfied' / 'requirements.txt'}"
        for name in ("numpy", "pluggy"):
            assert f"{satisfied}: Requirement already satisfied: {name}" in log
    index = _index(server)
    assert index["first"]["state"] == index["plain"]["state"] == index["satisfied"]["state"] == "READY", index
    assert _ask(server, "satisfied")["server_packages"] == ["pytest", "pluggy"]
    broken = index["unresolvable"]
    assert broken["state"] == "UNAVAILABLE"
    assert broken["reason"].startswith(
        f"model 'unresolvable': installing {repository / 'unresolvable' / 'requirements.txt'} failed:\n"
    )
    if installer == "pip":
        assert "ERROR: No matching distribution found for coreserve-test-missing-xyz==9.9" in broken["reason"]
    else:
        assert "coreserve-test-missing-xyz" in broken["reason"]
    assert "Traceback" not in log
    assert _ask(server, "first")["greeting"] == "hello from xyz"  # still serving
    key = Path(str(first["executable"])).parents[1]
    assert json.loads((key / "coreserve-env.json").read_text())["installer"] == installer


def test_servers_sharing_the_cache_build_once_and_python_envs_lists_and_prunes(
    tmp_path: Path, wheels: Path
) -> None:
    repository, cache = tmp_path / "models", tmp_path / "envs"
    _model(repository, "needs_dep", REQUIREMENTS)
    # Two servers start at once over one cache folder while this test holds the folder's lock
    # for those requirements: both wait for it; once it is free, one builds, the other finds
    # the environment built.
    servers = [
        ServerProcess([repository], [f"--python-env-cache-dir={cache}"], _offline(wheels)) for _ in "ab"
    ]
    key, _ = environment_key(REQUIREMENTS.encode(), np.__version__)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            with EnvironmentCache(cache).locked(key, timeout=1):
                starts = [pool.submit(server.start, 120.0) for server in servers]
                wait_until(
                    lambda: all("waiting for" in s.log for s in servers), "both servers wait for the lock"
                )
            for started in starts:
                started.result()
        answers = [_ask(server, "needs_dep") for server in servers]
        assert answers[0] == answers[1] and answers[0]["greeting"] == "hello from xyz"
        logs = [server.log for server in servers]
        assert sum(log.count(BUILDING) for log in logs) == 1, logs
        assert all("using the cached Python environment" in log for log in logs), logs
        environment = Path(str(answers[0]["executable"])).parents[1]

        listed = _python_envs("list", cache=cache)
        requirements_hash = hashlib.sha256(REQUIREMENTS.encode()).hexdigest()
        row = next(line for line in listed.splitlines() if line.startswith(str(environment)))
        version = ".".join(map(str, sys.version_info[:3]))
        assert requirements_hash[:16] in row and f"{sys.implementation.name}-{version}" in row
        assert " MiB " in row and time.strftime("%Y-%m-%d") in row

        # In use by the running servers: kept.
        assert _python_envs("prune", cache=cache) == f"kept (in use) {environment}\n"
        servers[0].stop()
        assert _python_envs("prune", cache=cache) == f"kept (in use) {environment}\n"
        servers[1].stop()
        # Unused now, but used less than a day ago.
        assert _python_envs("prune", "--older-than=1", cache=cache) == ""
        assert environment.is_dir()
        assert _python_envs("prune", cache=cache) == f"removed {environment}\n"
        assert not environment.exists() and not (cache / environment.name.partition(".")[0]).exists()
        assert _python_envs("list", cache=cache) == f"(no environments in {cache})\n"
    finally:
        for server in servers:
            server.close()


def test_a_build_that_outruns_its_timeout_is_stopped_and_fails_only_its_model(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    # The package index accepts connections and never answers: the installer waits on it
    # until coreserve stops it.
    index = socket.create_server(("127.0.0.1", 0))
    index.listen(16)
    repository, empty = tmp_path / "models", tmp_path / "no-wheels"
    empty.mkdir()
    _model(repository, "waits", REQUIREMENTS)
    _model(repository, "plain", None)
    env = {"PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple", "PIP_FIND_LINKS": str(empty)}
    try:
        server = coreserve_server(
            repository,
            "--exit-on-error=false",
            f"--python-env-cache-dir={tmp_path / 'envs'}",
            "--backend-config=python,env-build-timeout-secs=3",
            env=env,
        )
    finally:
        index.close()
    entry = _index(server)["waits"]
    assert entry["state"] == "UNAVAILABLE"
    assert " ran out of time and was stopped" in entry["reason"], entry["reason"]
    assert _ask(server, "plain")["executable"] == sys.executable
    assert "Traceback" not in server.log
    assert list((tmp_path / "envs" / ".store").iterdir()) == []  # nothing half-built is kept


def test_requirements_named_by_a_relative_path_build(
    tmp_path: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository given as a relative path: the installer, which runs in the requirements'
    folder, still finds the file."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "requirements.txt").write_text(REQUIREMENTS)
    monkeypatch.chdir(tmp_path)
    for name, value in _offline(wheels).items():
        monkeypatch.setenv(name, value)
    build_environment(Path("model/requirements.txt"), tmp_path / "env", np.__version__, 300, "relative")
    greeting = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "-c", f"import {PACKAGE}; print({PACKAGE}.greet())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert greeting.stdout.strip() == "hello from xyz"


def test_a_load_waiting_for_another_build_is_given_up_when_its_server_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A load that waits for the lock of a build running elsewhere must not build after its
    server stopped (the server would not end until the build did), nor may a later one."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("nothing-to-install\n")
    settings = {ENV_CACHE_DIR: str(tmp_path / "envs")}
    key, _ = environment_key(requirements.read_bytes(), np.__version__)
    builds = Builds()
    caplog.set_level(logging.INFO, logger="coreserve.backend.python")
    held = EnvironmentCache(tmp_path / "envs").locked(key, timeout=10)  # another server builds them
    with held, concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_requirements_launch, requirements, "m", settings, builds)
        wait_until(lambda: "another load builds or removes this environment" in caplog.text, "the load waits")
        builds.stop()
        with pytest.raises(UnavailableError, match="was given up"):
            waiting.result(timeout=30)
    with pytest.raises(UnavailableError, match="the server stopped before the build began"):
        _requirements_launch(requirements, "m", settings, builds)
    assert not list((tmp_path / "envs" / ".store").iterdir())  # nothing was built, nothing left
