"""Polling, a model whose files change, leave or come back takes the ensembles that use it
along, as Triton 2.51's polls do (checked side by side): they load again with it, go down
(`unloaded`, Triton's words in the log) where it no longer fits them or has left, stay down
while it is gone (their own files changed too), and load again from their files once it fits
or is back."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.waiting import wait_until

from .test_reload_ensemble_steps import ADD, ENSEMBLE, STEP

STEP_OUTPUT = 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
assert STEP_OUTPUT in STEP


def _write_step(root: Path, increment: int, out_dims: int = 1) -> None:
    """Writes what changes of `step` (each file whole, renamed in place: a poll sees no file half
    written), or the whole folder at once where it is not there."""
    folder = root / "step" if (root / "step").exists() else root.parent / "staging"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    for path, text in (
        (folder / "config.pbtxt", STEP.replace(STEP_OUTPUT, STEP_OUTPUT.replace("1", str(out_dims)))),
        (folder / "1" / "model.py", ADD.replace("INCREMENT", str(increment))),
    ):
        if not path.exists() or path.read_text() != text:
            staged = root.parent / path.name  # (beside the repository, on its file system)
            staged.write_text(text)
            staged.replace(path)
    if folder != root / "step":
        folder.rename(root / "step")


def _answer(client: httpclient.InferenceServerClient) -> int | str:
    """What `ens` answers for 1, or its state and reason in the index where it does not answer."""
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    try:
        return int(client.infer("ens", [tensor]).as_numpy("OUT")[0])
    except InferenceServerException:
        (entry,) = [entry for entry in client.get_model_repository_index() if entry["name"] == "ens"]
        return f"{entry['state']}: {entry.get('reason', '')}"


def test_an_ensemble_follows_its_step_through_polls(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    _write_step(repository, 1)
    (repository / "ens" / "1").mkdir(parents=True)
    (repository / "ens" / "config.pbtxt").write_text(ENSEMBLE.replace("STEP", "step"))
    flags = ["--model-control-mode=poll", "--repository-poll-secs=0.3"]
    server = ServerProcess([repository], flags).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            assert _answer(client) == 2
            _write_step(repository, 10)  # the step changes: the ensemble loads again with it
            wait_until(lambda: _answer(client) == 11, "ens answers through the new step")
            wait_until(lambda: server.log.count("successfully loaded 'ens'") == 2, "ens loaded again")
            _write_step(repository, 10, out_dims=2)  # it no longer fits the ensemble
            reason = wait_until(lambda: (answer := _answer(client)) != 11 and answer, "ens goes down")
            assert isinstance(reason, str) and reason.startswith("UNAVAILABLE: ") and "OUT" in reason
            assert f"Invalid argument: {reason.removeprefix('UNAVAILABLE: ')}" in server.log
            _write_step(repository, 10)  # it fits again
            wait_until(lambda: _answer(client) == 11, "ens comes back with the step")
            (repository / "step").rename(tmp_path / "step")  # it leaves the repository (at once)
            shutil.rmtree(tmp_path / "step")
            wait_until(lambda: _answer(client) == "UNAVAILABLE: unloaded", "ens goes down with it")
            missing = (
                "Invalid argument: ensemble ens contains models that are not available or ambiguous: step"
            )
            assert server.log.count(missing) == 1
            edited = tmp_path / "config.pbtxt"  # the ensemble changes while its step is gone: it stays down
            edited.write_text(ENSEMBLE.replace("STEP", "step") + "# edited\n")
            edited.replace(repository / "ens" / "config.pbtxt")
            wait_until(lambda: server.log.count(missing) == 2, "the poll sees the ensemble's change")
            time.sleep(1.5)  # five more polls: none tries it again
            assert server.log.count(missing) == 2 and _answer(client) == "UNAVAILABLE: unloaded"
            _write_step(repository, 7)  # it is back
            wait_until(lambda: _answer(client) == 8, "ens comes back with it")
        # Down, it waited for its step: no poll loaded it on its own (and failed).
        assert "failed to load 'ens'" not in server.log and "Traceback" not in server.log
    finally:
        server.close()


def test_an_ensemble_found_before_its_step_loads_once_the_step_comes(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "ens" / "1").mkdir(parents=True)
    (repository / "ens" / "config.pbtxt").write_text(ENSEMBLE.replace("STEP", "first"))
    flags = ["--model-control-mode=poll", "--repository-poll-secs=0.3", "--exit-on-error=false"]
    server = ServerProcess([repository], flags).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            answer = _answer(client)
            assert isinstance(answer, str) and answer.startswith("UNAVAILABLE: ") and "'first'" in answer
            edited = tmp_path / "config.pbtxt"  # it calls another model, not there either
            edited.write_text(ENSEMBLE.replace("STEP", "step"))
            edited.replace(repository / "ens" / "config.pbtxt")
            wait_until(lambda: "'step'" in str(_answer(client)), "ens fails for its new step")
            _write_step(repository, 3)
            wait_until(lambda: _answer(client) == 4, "ens loads with its step")
        assert server.log.count("successfully loaded 'ens'") == 1 and "Traceback" not in server.log
    finally:
        server.close()
