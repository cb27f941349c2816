"""EXECUTION_ENV_PATH: the stubs of a model run in another Python environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory

MODEL = Path(__file__).resolve().parent / "env_models" / "which_python"


@pytest.fixture(scope="session")
def other_environment(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """A separate venv with only numpy in it (no coreserve)."""
    root = tmp_path_factory.mktemp("other-env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
         str(wheelhouse), "numpy"],
        check=True,
    )  # fmt: skip
    return root


def _model(repository: Path, name: str, environment: str) -> None:
    shutil.copytree(MODEL, repository / name)
    config = repository / name / "config.pbtxt"
    config.write_text(config.read_text().replace("@ENV@", environment))


def _which(server, model: str) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([5], np.int32))
        result = client.infer(model, [tensor])
        return result.as_numpy("EXECUTABLE")[0].decode(), int(result.as_numpy("Y")[0])
    finally:
        client.close()


def test_stubs_run_in_the_named_environment(
    coreserve_server: ServerFactory, tmp_path: Path, other_environment: Path
) -> None:
    packed = tmp_path / "packed-env.tar.gz"
    with tarfile.open(packed, "w:gz") as archive:
        archive.add(other_environment, arcname=".")
    repository = tmp_path / "models"
    _model(repository, "by_folder", str(other_environment))
    _model(repository, "by_executable", str(other_environment / "bin" / "python"))
    _model(repository, "by_archive", str(packed))
    _model(repository, "missing", str(tmp_path / "nowhere"))
    server = coreserve_server(repository, "--exit-on-error=false")
    executable, value = _which(server, "by_folder")
    assert executable.startswith(str(other_environment)) and value == 15
    assert _which(server, "by_executable")[0].startswith(str(other_environment))
    unpacked, _ = _which(server, "by_archive")
    assert unpacked != sys.executable and "envs" in unpacked
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=r"EXECUTION_ENV_PATH: .*nowhere does not exist"):
            client.get_model_metadata("missing")
    finally:
        client.close()
