"""Triton's Python-based backends (`<backend-directory>/<backend>/model.py`, as vLLM's Triton
backend ships): models that name such a backend run its model.py with the python backend, its
helpers beside it importable, their own version folder theirs, completed as Triton completes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.backend.python_based import python_based_runtime
from coreserve.errors import InvalidArgumentError
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.testing import ServerProcess

# The backend: it completes the configuration (as vLLM's does), reads its model's own file and
# imports a helper that lies beside it (as vLLM's imports its utils package).
SHOUTER = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from helpers.words import shout


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        config.add_output({"name": "LOUD", "data_type": "TYPE_STRING", "dims": [1]})
        config.add_output({"name": "WHERE", "data_type": "TYPE_STRING", "dims": [1]})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "model.json")) as file:
            self.suffix = json.load(file)["suffix"]
        self.where = f"{pb_utils.get_model_dir()}|{__name__}"

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()[0].decode()
            loud = np.array([(shout(text) + self.suffix).encode()], np.object_)
            where = np.array([self.where.encode()], np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LOUD", loud), pb_utils.Tensor("WHERE", where)]))
        return responses
"""
HELPER = "def shout(text):\n    return text.upper()\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python-based")
    backend = root / "backends" / "shouter"
    (backend / "helpers").mkdir(parents=True)
    (backend / "model.py").write_text(SHOUTER)
    (backend / "helpers" / "words.py").write_text(HELPER)
    models = root / "models"
    for name, config, suffix in (
        ("first", 'backend: "shouter"\n', "!"),
        ("second", 'backend: "shouter"\nruntime: "model.py"\n', "?"),
        ("lost", 'backend: "nowhere"\nruntime: "model.py"\n', ""),
        ("absent", 'backend: "absent"\n', ""),
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
        (models / name / "1" / "model.json").write_text(json.dumps({"suffix": suffix}))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    arguments = ["--backend-directory", str(repository / "backends"), "--exit-on-error=false"]
    process = ServerProcess([repository / "models"], arguments).start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        yield client


def _shout(client: httpclient.InferenceServerClient, model: str) -> tuple[str, str]:
    tensor = httpclient.InferInput("TEXT", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"hello"], np.object_))
    result = client.infer(model, [tensor])
    return result.as_numpy("LOUD")[0].decode(), result.as_numpy("WHERE")[0].decode()


def test_models_of_a_python_based_backend_run_its_model_py(
    client: httpclient.InferenceServerClient, repository: Path
) -> None:
    # Its model.py is module `model`; get_model_dir() is the model's own version folder.
    assert _shout(client, "first") == ("HELLO!", f"{repository / 'models' / 'first' / '1'}|model")
    assert _shout(client, "second") == ("HELLO?", f"{repository / 'models' / 'second' / '1'}|model")


def test_its_configuration_reads_as_on_triton(
    client: httpclient.InferenceServerClient, server: ServerProcess, repository: Path
) -> None:
    assert (
        f"model 'first': Python-based backend 'shouter' runs {repository / 'backends' / 'shouter' / 'model.py'}"
        in server.log
    )
    config = client.get_model_config("first")
    assert (config["backend"], config["runtime"], config["default_model_filename"]) == (
        "shouter",
        "model.py",
        "",
    )
    assert [tensor["name"] for tensor in config["input"]] == ["TEXT"]  # from its auto_complete_config
    assert client.get_model_metadata("first")["platform"] == "shouter"


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "lost",
            "unable to find Python backend based backend library 'model.py' for model 'lost', searched: ",
        ),
        ("absent", "backend 'absent' is not served by any installed backend"),
    ],
)
def test_a_backend_found_nowhere_leaves_its_model_unavailable_with_the_reason(
    client: httpclient.InferenceServerClient, model: str, reason: str
) -> None:
    assert not client.is_model_ready(model)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert reason in index[model]["reason"]
    with pytest.raises(InferenceServerException):
        client.get_model_metadata(model)


def test_an_environment_beside_the_backend_is_the_models_unless_it_names_one(tmp_path: Path) -> None:
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "model.py").write_text(SHOUTER)
    (tmp_path / "packed" / "pb_exec_env_model.py.tar.gz").write_bytes(b"")
    config = ModelConfig(name="m", backend="packed")
    assert python_based_runtime(config, tmp_path, False) == tmp_path / "packed" / "model.py"
    assert config.runtime == "model.py"
    assert config.parameters["EXECUTION_ENV_PATH"].string_value == str(
        tmp_path / "packed" / "pb_exec_env_model.py.tar.gz"
    )
    named = ModelConfig(name="m", backend="packed")
    named.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    python_based_runtime(named, tmp_path, False)
    assert named.parameters["EXECUTION_ENV_PATH"].string_value == "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    # An installed backend of the name serves it (as Triton prefers a backend library), unless
    # the configuration names the runtime; a runtime named but missing is Triton's error.
    assert python_based_runtime(ModelConfig(name="m", backend="packed"), tmp_path, True) is None
    assert python_based_runtime(ModelConfig(name="m", backend="packed", runtime="model.py"), tmp_path, True)
    with pytest.raises(InvalidArgumentError, match=r"searched: '.*/gone/model\.py'"):
        python_based_runtime(ModelConfig(name="m", backend="gone", runtime="model.py"), tmp_path, False)
