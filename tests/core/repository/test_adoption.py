"""A worker taking on what another serves (`coreserve.repository.adoption`), with real servers
in this process over one repository: the versions and configuration the other loaded, not what
the files hold now; files changed since are a fault, with the reason, and the model unavailable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coreserve.repository.adoption import adopt, restore, snapshot
from coreserve.repository.model import ModelState
from coreserve.testing import InProcessServer
from support.model_builders import ENSEMBLE_OF_SCALE, scale_model, write_model

SCALE = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_model(tmp_path, "scale", scale_model(2.0), SCALE)
    return tmp_path


@pytest.fixture
def serving(repository: Path) -> Iterator[InProcessServer]:
    """The worker whose state the others take on: `scale` version 1 loaded."""
    server = InProcessServer(repository).start()
    server.load("scale")
    yield server
    server.stop()


def _taking_on(repository: Path, entries: list[dict[str, object]]) -> tuple[InProcessServer, dict[str, str]]:
    server = InProcessServer(repository).start()
    assert server.dataplane is not None
    return server, server.run(adopt(server.dataplane.repository, entries))


def test_the_versions_the_other_loaded_are_taken_on_not_one_staged_since(
    repository: Path, serving: InProcessServer
) -> None:
    assert serving.dataplane is not None
    entries = snapshot(serving.dataplane.repository)
    write_model(repository, "scale", scale_model(3.0), versions=(2,))  # the policy would take 2 now
    server, faults = _taking_on(repository, entries)
    try:
        assert faults == {}
        assert server.dataplane is not None
        (model,) = server.dataplane.repository.models()
        assert sorted(model.versions) == [1] and model.versions[1].state is ModelState.READY
        assert model.versions[1].files_fingerprint == entries[0]["versions"]["1"]  # type: ignore[index]
    finally:
        server.stop()


def test_files_changed_since_are_a_fault_and_the_model_is_unavailable(
    repository: Path, serving: InProcessServer
) -> None:
    assert serving.dataplane is not None
    entries = snapshot(serving.dataplane.repository)
    (repository / "scale" / "1" / "model.onnx").write_bytes(b"")  # half copied
    server, faults = _taking_on(repository, entries)
    try:
        assert list(faults) == ["scale"]
        assert (
            "the files of model 'scale' version 1 changed since the other workers loaded it"
            in faults["scale"]
        )
        assert server.dataplane is not None
        (model,) = server.dataplane.repository.models()
        assert not model.takes_requests and model.reason == faults["scale"]
    finally:
        server.stop()


def test_a_model_that_failed_there_is_unavailable_here_for_its_reason(repository: Path) -> None:
    entry = {"name": "scale", "namespace": "", "config": None, "versions": {}, "reason": "it broke there",
             "from_files": False}  # fmt: skip
    server, faults = _taking_on(repository, [entry])
    try:
        assert faults == {}
        assert server.dataplane is not None
        (model,) = server.dataplane.repository.models()
        assert model.reason == "it broke there" and not model.versions
        # Undone as it was (not loaded) where a load failed elsewhere: unavailable for that failure.
        assert server.run(restore(server.dataplane.repository, "other", None, "failed there")) == ""
        assert {m.name: m.reason for m in server.dataplane.repository.models()}["other"] == "failed there"
    finally:
        server.stop()


def test_a_model_unloaded_there_is_unloaded_here_with_the_versions_it_had(
    repository: Path, serving: InProcessServer
) -> None:
    serving.unload("scale")
    assert serving.dataplane is not None
    entries = snapshot(serving.dataplane.repository)
    assert entries == [{"unloaded": "scale", "versions": [1]}]
    server, faults = _taking_on(repository, entries)
    try:
        assert faults == {}
        assert server.dataplane is not None
        assert server.dataplane.repository.models() == []
        index = server.run(server.dataplane.repository.index())
        assert index == server.run(serving.dataplane.repository.index())
        assert index == [{"name": "scale", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    finally:
        server.stop()


def test_an_ensemble_taken_down_with_its_step_is_listed_here_as_there_and_comes_back_with_it(
    repository: Path, serving: InProcessServer
) -> None:
    write_model(repository, "pipeline", None, ENSEMBLE_OF_SCALE)
    serving.load("pipeline")
    serving.unload("scale")  # takes the ensemble down with it
    assert serving.dataplane is not None
    there = serving.run(serving.dataplane.repository.index())
    server, faults = _taking_on(repository, snapshot(serving.dataplane.repository))
    try:
        assert faults == {}
        assert server.dataplane is not None
        assert server.run(server.dataplane.repository.index()) == there
        assert {row["name"]: row["reason"] for row in there} == {"pipeline": "unloaded", "scale": "unloaded"}
        server.load("scale")  # the ensemble comes back with its step, as in the other worker
        assert server.state("pipeline") == ("READY", "")
    finally:
        server.stop()
