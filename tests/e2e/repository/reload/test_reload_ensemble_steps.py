"""A model reloaded through the repository API reloads the ensembles that use it, as Triton 2.51
does (checked side by side): one the new model still fits loads again beside the served one
(its statistics start over), one it no longer fits goes down with the ensembles that use it,
and comes back when a model it uses loads again and fits."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

STEP = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ADD = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + INCREMENT)]
            )
            for r in requests
        ]
"""
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "STEP" model_version: -1
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
"""


def _step_config(dims: int, increment: int) -> str:
    """A load request's configuration of `step`: OUT of `dims` elements, the increment a parameter."""
    tensor = {"data_type": "TYPE_INT32"}
    return json.dumps(
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "IN", **tensor, "dims": [1]}],
            "output": [{"name": "OUT", **tensor, "dims": [dims]}],
            "parameters": {"increment": {"string_value": str(increment)}},
        }
    )


INITIALIZE = """    def initialize(self, args):
        import json
        parameters = json.loads(args['model_config']).get('parameters', {})
        self.increment = parameters.get('increment', {}).get('string_value', '1')

"""
# Through `step`, then `ens`: IN + 2 increments.
TWICE = ENSEMBLE.replace("STEP", "step").replace(
    'output_map { key: "OUT" value: "OUT" } } ] }',
    'output_map { key: "OUT" value: "MID" } }, { model_name: "ens" model_version: -1\n'
    '  input_map { key: "IN" value: "MID" } output_map { key: "OUT" value: "OUT" } } ] }',
)


def _write_step(root: Path, name: str) -> None:
    """A Python model that adds its `increment` parameter (1 by default) to IN."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(STEP)
    body = ADD.replace("INCREMENT", "int(self.increment)")
    (root / name / "1" / "model.py").write_text(
        body.replace("    def execute", INITIALIZE + "    def execute")
    )


def _write_ensemble(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    _write_step(tmp_path, "step")
    _write_ensemble(tmp_path, "ens", ENSEMBLE.replace("STEP", "step"))
    _write_ensemble(tmp_path, "outer", ENSEMBLE.replace("STEP", "ens"))
    process = ServerProcess([tmp_path], ["--model-control-mode=explicit", "--load-model=outer"])
    process.start(timeout=120)
    try:
        yield process
    finally:
        process.close()


def _infer(client: httpclient.InferenceServerClient, model: str) -> int:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    return int(client.infer(model, [tensor]).as_numpy("OUT")[0])


def _index(client: httpclient.InferenceServerClient) -> dict[str, tuple[str, str]]:
    return {
        entry["name"]: (entry["state"], entry.get("reason", ""))
        for entry in client.get_model_repository_index()
    }


def test_a_step_reloaded_to_fit_reloads_its_ensembles_without_a_gap(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        assert (_infer(client, "ens"), _infer(client, "outer")) == (2, 2)
        answers: list[int] = []
        failures: list[Exception] = []
        done = threading.Event()

        def keep_asking() -> None:
            with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as own:
                while not done.is_set() and len(answers) < 10_000:
                    try:
                        answers.append(_infer(own, "outer"))
                    except InferenceServerException as exc:
                        failures.append(exc)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            client.load_model("step", config=_step_config(1, 10))
        finally:
            done.set()
            asker.join(timeout=60)
        assert failures == [] and answers  # the ensembles served through the reload
        assert set(answers) <= {2, 11}
        assert (_infer(client, "ens"), _infer(client, "outer")) == (11, 11)
    for name in ("ens", "outer"):  # loaded again, as on Triton (an ensemble is never kept as it is)
        assert server.log.count(f"successfully loaded '{name}'") == 2


def test_a_step_that_no_longer_fits_takes_its_ensembles_down_until_it_fits_again(
    server: ServerProcess,
) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        client.load_model("step", config=_step_config(2, 1))  # the step's load itself succeeds
        index = _index(client)
        assert index["step"] == ("READY", "")
        assert index["ens"][0] == "UNAVAILABLE" and "OUT" in index["ens"][1]
        assert index["outer"] == ("UNAVAILABLE", "unloaded")
        with pytest.raises(InferenceServerException, match="unknown model"):
            _infer(client, "ens")
        assert f"Invalid argument: {index['ens'][1]}" in server.log
        assert "ensemble outer contains models that are not available or ambiguous: ens" in server.log
        client.load_model("step", config=_step_config(1, 5))
        assert (_infer(client, "ens"), _infer(client, "outer")) == (6, 6)
        assert {name: state for name, (state, _) in _index(client).items()} == dict.fromkeys(
            ("step", "ens", "outer"), "READY"
        )
    assert "Traceback" not in server.log


def test_an_ensemble_unloaded_by_name_is_not_brought_back_by_its_step(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        client.unload_model("outer")
        client.load_model("step", config=_step_config(1, 3))
        index = _index(client)
        assert index["outer"] == ("UNAVAILABLE", "unloaded")
        assert _infer(client, "ens") == 4


def test_a_step_that_no_longer_fits_two_ensembles_one_using_the_other_takes_both_down(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`twice` calls `step` and `ens`: `ens` going down takes it down before its own turn comes."""
    _write_ensemble(tmp_path, "twice", TWICE)
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        client.load_model("twice")
        assert _infer(client, "twice") == 3
        client.load_model("step", config=_step_config(2, 1))
        index = _index(client)
        assert index["ens"][0] == "UNAVAILABLE" and "OUT" in index["ens"][1]
        assert index["outer"] == index["twice"] == ("UNAVAILABLE", "unloaded")
        client.load_model("step", config=_step_config(1, 5))
        assert (_infer(client, "ens"), _infer(client, "outer"), _infer(client, "twice")) == (6, 6, 11)
    assert "Traceback" not in server.log


def test_an_ensemble_reloaded_then_taken_down_by_a_later_one_of_the_same_load_stays_down(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`a_twice` calls `step`, then `ens_any` (whose input takes any length): it still fits the
    step's new output and loads again first, then goes down with `ens_any`, which does not."""
    _write_ensemble(
        tmp_path, "ens_any", ENSEMBLE.replace("STEP", "step").replace("dims: [ 1 ] }", "dims: [ -1 ] }", 1)
    )
    _write_ensemble(tmp_path, "a_twice", TWICE.replace('"ens"', '"ens_any"'))
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        client.load_model("a_twice")
        assert _infer(client, "a_twice") == 3
        client.load_model("step", config=_step_config(2, 1))
        index = _index(client)
        assert index["ens"][0] == index["ens_any"][0] == "UNAVAILABLE"
        assert index["outer"] == index["a_twice"] == ("UNAVAILABLE", "unloaded")
        client.load_model("step", config=_step_config(1, 1))
        assert (_infer(client, "ens"), _infer(client, "outer"), _infer(client, "a_twice")) == (2, 2, 3)
    assert "Traceback" not in server.log


def test_an_ensemble_that_fails_to_come_back_stays_down_until_a_step_fits_again(
    server: ServerProcess,
) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        client.load_model("step", config=_step_config(2, 1))
        client.load_model("step", config=_step_config(3, 1))  # it still does not fit `ens`
        index = _index(client)
        assert index["step"] == ("READY", "")
        assert index["ens"][0] == "UNAVAILABLE" and "OUT" in index["ens"][1]
        assert index["outer"] == ("UNAVAILABLE", "unloaded")
        assert "ensemble 'ens' did not load again" in server.log
        client.load_model("step", config=_step_config(1, 2))
        assert (_infer(client, "ens"), _infer(client, "outer")) == (3, 3)


def test_a_load_that_changes_nothing_reloads_no_ensemble(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        assert _infer(client, "ens") == 2
        client.load_model("step")  # its files, as loaded
        (statistics,) = client.get_inference_statistics("ens")["model_stats"]
        assert statistics["inference_count"] == 1  # the same ensemble serves
    assert "nothing to reload" in server.log
    assert server.log.count("successfully loaded 'ens'") == 1


def test_under_namespacing_only_the_ensembles_calling_the_step_go_down(tmp_path: Path) -> None:
    """a's `ens` calls a's `step`; b has an `ens` of its own (over `other`) and `user`, which
    calls b's `ens`: a step of a that no longer fits takes down a's `ens` only."""
    a, b = tmp_path / "a", tmp_path / "b"
    _write_step(a, "step")
    _write_ensemble(a, "ens", ENSEMBLE.replace("STEP", "step"))
    _write_step(b, "other")
    _write_ensemble(b, "ens", ENSEMBLE.replace("STEP", "other"))
    _write_ensemble(b, "user", ENSEMBLE.replace("STEP", "ens"))
    flags = ["--model-namespacing", "--model-control-mode=explicit", "--load-model=ens", "--load-model=user"]
    server = ServerProcess([a, b], flags).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            assert _infer(client, "user") == 2
            client.load_model("step", config=_step_config(2, 1))
            states = sorted(
                entry["state"] for entry in client.get_model_repository_index() if entry["name"] == "ens"
            )
            assert states == ["READY", "UNAVAILABLE"]
            assert client.is_model_ready("user") and _infer(client, "user") == 2
            client.load_model("step", config=_step_config(1, 1))
            index = client.get_model_repository_index()
            assert len(index) == 5 and {entry["state"] for entry in index} == {"READY"}
        assert "Traceback" not in server.log
    finally:
        server.close()
