"""--model-namespacing: one model name in two repositories serves as two models, as Triton's.

Each repository holds a Python model `add` (repository a adds 1, b adds 100, each output
labelled with its repository's letter), an ensemble of its own (`ens_a`, `ens_b`) whose step
names `add`, and a model only it has. Triton 2.51, run on these repositories, answers the
ensembles with +1 and +100 and classifies their outputs with their own `add`'s labels, refuses a
request for `add` with the text asserted here (400 / INVALID_ARGUMENT), and labels the metrics
with `namespace`.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.waiting import wait_until

AMBIGUOUS = (
    "There are 2 identifiers of model 'add' in global map, model namespace must be provided to resolve "
    "ambiguity."
)
SIGNATURE = """
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
ADD = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + INCREMENT)]
            )
            for r in requests
        ]
"""
BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            call = pb_utils.InferenceRequest(
                model_name="TARGET",
                inputs=[pb_utils.get_input_tensor_by_name(r, "X")],
                requested_output_names=["Y"],
            ).exec()
            if call.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(call.error().message())))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(call, "Y")]))
        return responses
"""
ENSEMBLE = """
platform: "ensemble"
ensemble_scheduling { step [ {
  model_name: "add" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""


def _python_model(root: Path, name: str, increment: int) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'backend: "python"\n{SIGNATURE}')
    (root / name / "1" / "model.py").write_text(ADD.replace("INCREMENT", str(increment)))


def _label_output(model: Path, letter: str) -> None:
    """Labels the model's output Y with its repository's letter: `a0`, `a1` in repository a."""
    (model / "labels.txt").write_text(f"{letter}0\n{letter}1\n")
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "Y"', 'name: "Y" label_filename: "labels.txt"'))


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    roots = []
    for letter, increment in (("a", 1), ("b", 100)):
        root = tmp_path_factory.mktemp(f"namespace_{letter}")
        _python_model(root, "add", increment)
        _label_output(root / "add", letter)
        _python_model(root, f"only_{letter}", increment)
        (root / f"ens_{letter}" / "1").mkdir(parents=True)
        (root / f"ens_{letter}" / "config.pbtxt").write_text(SIGNATURE + ENSEMBLE)
        roots.append(root)
    # Python models of repository a that call another model (BLS).
    for name, target in (("bls_add", "add"), ("bls_only_b", "only_b")):
        (roots[0] / name / "1").mkdir(parents=True)
        (roots[0] / name / "config.pbtxt").write_text(f'backend: "python"\n{SIGNATURE}')
        (roots[0] / name / "1" / "model.py").write_text(BLS.replace("TARGET", target))
    return roots[0], roots[1]


@pytest.fixture(scope="module")
def namespaced(repositories: tuple[Path, Path]) -> Iterator[ServerProcess]:
    server = ServerProcess(list(repositories), ["--model-namespacing=true"]).start()
    yield server
    server.close()


def _http(server: ServerProcess, model: str) -> np.ndarray:
    tensor = httpclient.InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.zeros(2, np.float32))
    with httpclient.InferenceServerClient(server.http_url) as client:  # (a client left open leaks its socket)
        return client.infer(model, [tensor]).as_numpy("Y")


def _grpc(server: ServerProcess, model: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.zeros(2, np.float32))
    try:
        return client.infer(model, [tensor]).as_numpy("Y")
    finally:
        client.close()


def _post(server: ServerProcess, path: str) -> tuple[int, object]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_each_ensemble_resolves_its_step_in_its_own_repository(namespaced: ServerProcess) -> None:
    for call in (_http, _grpc):
        assert call(namespaced, "ens_a").tolist() == [1.0, 1.0]
        assert call(namespaced, "ens_b").tolist() == [100.0, 100.0]
        assert call(namespaced, "only_a").tolist() == [1.0, 1.0]
        assert call(namespaced, "only_b").tolist() == [100.0, 100.0]


def test_each_ensemble_takes_the_labels_of_the_step_it_calls(namespaced: ServerProcess) -> None:
    # Neither ensemble names a label file: each classifies with those of its own repository's `add`.
    tensor = httpclient.InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.array([0.0, 1.0], np.float32))
    top = [httpclient.InferRequestedOutput("Y", class_count=1)]
    with httpclient.InferenceServerClient(namespaced.http_url) as client:
        assert client.infer("ens_a", [tensor], outputs=top).as_numpy("Y").tolist() == [b"2.000000:1:a1"]
        assert client.infer("ens_b", [tensor], outputs=top).as_numpy("Y").tolist() == [b"101.000000:1:b1"]


def test_an_ensemble_calls_a_step_that_only_another_repository_has(tmp_path: Path) -> None:
    # As Triton 2.51 does (checked side by side): the step loads first, then the ensemble,
    # which answers with the step's sums and labels.
    a, b = tmp_path / "a", tmp_path / "b"
    _python_model(b, "add", 100)
    _label_output(b / "add", "b")
    (a / "ens" / "1").mkdir(parents=True)
    (a / "ens" / "config.pbtxt").write_text(SIGNATURE + ENSEMBLE)
    server = ServerProcess([a, b], ["--model-namespacing=true"]).start()
    try:
        tensor = httpclient.InferInput("X", [2], "FP32")
        tensor.set_data_from_numpy(np.array([0.0, 1.0], np.float32))
        top = [httpclient.InferRequestedOutput("Y", class_count=1)]
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.infer("ens", [tensor], outputs=top).as_numpy("Y").tolist() == [b"101.000000:1:b1"]
    finally:
        server.close()


def test_in_poll_mode_a_change_of_a_step_of_another_repository_loads_it_once(tmp_path: Path) -> None:
    # The ensemble follows its step's change; its reload takes the step as it serves, and does
    # not load it a second time as a step its own repository lacks.
    a, b = tmp_path / "a", tmp_path / "b"
    _python_model(b, "add", 100)
    (a / "ens" / "1").mkdir(parents=True)
    (a / "ens" / "config.pbtxt").write_text(SIGNATURE + ENSEMBLE)
    flags = ["--model-namespacing=true", "--model-control-mode=poll", "--repository-poll-secs=0.5"]
    server = ServerProcess([a, b], flags).start()
    try:
        assert _answers(server, "ens") == [100.0, 100.0]
        changed = b / "add" / "1" / "model.new"  # written whole before a poll can see it
        changed.write_text(ADD.replace("INCREMENT", "200"))
        changed.replace(b / "add" / "1" / "model.py")
        wait_until(lambda: server.log.count("successfully loaded 'ens'") == 2, "ens reloads after its step")
        assert _answers(server, "ens") == [200.0, 200.0]
        assert server.log.count("successfully loaded 'add'") == 2  # at start, then the change
        assert "loading model 'add' first" not in server.log
    finally:
        server.close()


def test_a_name_two_repositories_hold_is_refused_in_tritons_words(namespaced: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as http_error:
        _http(namespaced, "add")
    assert (http_error.value.status(), http_error.value.message()) == ("400", AMBIGUOUS)
    with pytest.raises(InferenceServerException) as grpc_error:
        _grpc(namespaced, "add")
    assert (grpc_error.value.status(), grpc_error.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        AMBIGUOUS,
    )
    with pytest.raises(urllib.error.HTTPError) as metadata:
        urllib.request.urlopen(f"http://{namespaced.http_url}/v2/models/add", timeout=30)
    assert metadata.value.code == 400
    assert json.loads(metadata.value.read()) == {"error": AMBIGUOUS}
    # Readiness is no error, as Triton 2.51 answers it (run here): not ready, on both transports.
    with pytest.raises(urllib.error.HTTPError) as ready:
        urllib.request.urlopen(f"http://{namespaced.http_url}/v2/models/add/ready", timeout=30)
    assert (ready.value.code, json.loads(ready.value.read())) == (400, {"error": "Model version not ready"})
    with grpcclient.InferenceServerClient(namespaced.grpc_url) as client:
        assert client.is_model_ready("add") is False
    # The server goes on serving.
    assert _http(namespaced, "ens_a").tolist() == [1.0, 1.0]


def test_bls_calls_name_models_globally_as_tritons(namespaced: ServerProcess) -> None:
    # Triton's Python backend sends BLS requests to the server by name: an ambiguous name fails
    # (Triton 2.51: "Model 'add' is not ready"), a name one repository has is found.
    assert _answers(namespaced, "bls_only_b") == [100.0, 100.0]
    assert AMBIGUOUS in str(_answers(namespaced, "bls_add"))


def test_index_and_metrics_show_both_models(
    namespaced: ServerProcess, repositories: tuple[Path, Path]
) -> None:
    status, index = _post(namespaced, "/v2/repository/index")
    assert status == 200
    names = sorted(entry["name"] for entry in index)
    assert names == ["add", "add", "bls_add", "bls_only_b", "ens_a", "ens_b", "only_a", "only_b"]
    assert all(entry["state"] == "READY" for entry in index)
    _http(namespaced, "ens_a")
    with urllib.request.urlopen(namespaced.metrics_url, timeout=30) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    success = {
        (s.labels["model"], s.labels["namespace"]): s.value
        for s in families["nv_inference_request_success"].samples
    }
    a, b = (str(root) for root in repositories)
    assert {(model, namespace) for model, namespace in success} == {
        ("add", a),
        ("add", b),
        ("bls_add", a),
        ("bls_only_b", a),
        ("ens_a", a),
        ("ens_b", b),
        ("only_a", a),
        ("only_b", b),
    }
    assert success[("add", a)] >= 1  # counted where the ensemble's step ran
    assert success[("add", a)] == success[("ens_a", a)]
    assert success[("add", b)] == success[("ens_b", b)]
    # The start-up table names each as Triton's does: <repository>::<name>.
    assert f"| {a}::add " in namespaced.log and f"| {b}::add " in namespaced.log


def test_explicit_mode_loads_and_unloads_a_name_in_every_repository(repositories: tuple[Path, Path]) -> None:
    flags = ["--model-namespacing", "--model-control-mode=explicit", "--load-model=ens_a"]
    server = ServerProcess(list(repositories), flags).start()
    try:
        assert _http(server, "ens_a").tolist() == [1.0, 1.0]  # loading it loaded its step first
        assert _post(server, "/v2/repository/models/ens_b/load")[0] == 200
        assert _http(server, "ens_b").tolist() == [100.0, 100.0]
        assert _post(server, "/v2/repository/models/add/unload")[0] == 200  # both of them
        _, index = _post(server, "/v2/repository/index")
        add_states = [entry["state"] for entry in index if entry["name"] == "add"]
        assert add_states == ["UNAVAILABLE", "UNAVAILABLE"]
        with pytest.raises(InferenceServerException):
            _http(server, "ens_a")
    finally:
        server.close()


def test_without_namespacing_a_duplicate_name_stays_an_error(repositories: tuple[Path, Path]) -> None:
    server = ServerProcess(list(repositories), ["--exit-on-error=false"]).start()
    try:
        _, index = _post(server, "/v2/repository/index")
        reasons = {entry["name"]: entry.get("reason", "") for entry in index}
        assert "appears in more than one repository" in reasons["add"]
        assert _http(server, "only_b").tolist() == [100.0, 100.0]
        with pytest.raises(InferenceServerException):
            _http(server, "add")
    finally:
        server.close()
    failing = ServerProcess(list(repositories))
    failing.start(wait_for=[])
    assert failing.wait(timeout=60) == 1
    assert "model 'add' appears in more than one repository" in failing.log
    failing.close()
    # The duplicate alone (no ensemble of it failing too) stops the start as well.
    alone = [repositories[0].parent / f"alone_{letter}" for letter in "ab"]
    for root in alone:
        _python_model(root, "add", 1)
    failing = ServerProcess(alone)
    failing.start(wait_for=[])
    assert failing.wait(timeout=60) == 1
    failing.close()


def _answers(server: ServerProcess, model: str) -> object:
    try:
        return _http(server, model).tolist()
    except InferenceServerException as exc:
        return exc.message()


def test_poll_mode_follows_names_arriving_and_leaving(
    tmp_path: Path, repositories: tuple[Path, Path]
) -> None:
    a, b = (shutil.copytree(root, tmp_path / root.name) for root in repositories)
    flags = ["--model-namespacing=true", "--model-control-mode=poll", "--repository-poll-secs=0.5"]
    server = ServerProcess([a, b], flags).start()
    try:
        assert _answers(server, "only_a") == [1.0, 1.0]
        shutil.copytree(b / "only_b", b / "only_a")  # b now has an only_a too (it adds 100)
        ambiguous_only_a = AMBIGUOUS.replace("'add'", "'only_a'")
        wait_until(lambda: _answers(server, "only_a") == ambiguous_only_a, "only_a becomes ambiguous")
        shutil.rmtree(a / "only_a")  # one repository has it again: b's
        wait_until(
            lambda: _answers(server, "only_a") == [100.0, 100.0], "only_a answers from one repository again"
        )
        assert _answers(server, "ens_a") == [1.0, 1.0]
    finally:
        server.close()


def test_same_named_ensembles_taken_down_come_back_each_with_its_own_configuration(tmp_path: Path) -> None:
    """Each repository has an ensemble `ens` over its `add`, b's naming its output Z, and a model
    of its own that uses its `ens`: unloading `add` takes all four down, loading it brings each
    back as it was (they were kept by name, and b's came back with a's configuration)."""
    roots = []
    for letter, increment, output in (("a", 1, "Y"), ("b", 100, "Z")):
        root = tmp_path / letter
        _python_model(root, "add", increment)
        (root / "ens" / "1").mkdir(parents=True)
        signature = SIGNATURE.replace('"Y"', f'"{output}"')
        (root / "ens" / "config.pbtxt").write_text(
            signature + ENSEMBLE.replace('value: "Y"', f'value: "{output}"')
        )
        outer = ENSEMBLE.replace('"add"', '"ens"').replace('key: "Y"', f'key: "{output}"')
        (root / f"outer_{letter}" / "1").mkdir(parents=True)
        (root / f"outer_{letter}" / "config.pbtxt").write_text(SIGNATURE + outer)
        roots.append(root)
    flags = [
        "--model-namespacing",
        "--model-control-mode=explicit",
        "--load-model=outer_a",
        "--load-model=outer_b",
    ]
    server = ServerProcess(roots, flags).start()
    try:
        assert (_http(server, "outer_a").tolist(), _http(server, "outer_b").tolist()) == ([1, 1], [100, 100])
        assert _post(server, "/v2/repository/models/add/unload")[0] == 200
        _, index = _post(server, "/v2/repository/index")
        assert {entry["state"] for entry in index} == {"UNAVAILABLE"}
        assert _post(server, "/v2/repository/models/add/load")[0] == 200
        assert (_http(server, "outer_a").tolist(), _http(server, "outer_b").tolist()) == ([1, 1], [100, 100])
    finally:
        server.close()
