"""Finding models and versions on disk, and version policies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coreserve.config import parse_config
from coreserve.config.signature import ModelSignature
from coreserve.errors import InvalidArgumentError, ModelConfigError, NotFoundError
from coreserve.repository._layout import (
    ModelFinder,
    ModelLocation,
    list_versions,
    load_order,
    load_waves,
    refuse_cycles,
    select_versions,
)
from coreserve.repository._overrides import LoadOverrides
from coreserve.repository.links import TakenDownEnsembles
from coreserve.repository.model import Model, ModelState, ModelVersion
from coreserve.repository.namespaces import KeyIndex, ModelTable
from coreserve.repository.storage._sources import LocalSource
from coreserve.scheduling.statistics import ModelStatistics


def test_models_and_numeric_versions(tmp_path: Path) -> None:
    for name in ("b", "a", ".hidden"):
        (tmp_path / name).mkdir()
    (tmp_path / "file.txt").write_text("not a model")
    for version in ("1", "10", "2", "0", "07", "latest", "x3", "\u00b2", "\u0663"):  # superscript 2, Arabic 3
        (tmp_path / "a" / version).mkdir()
    (tmp_path / "a" / "3").write_text("a file, not a folder")
    assert sorted(LocalSource(tmp_path).scan()) == ["a", "b"]
    assert list_versions(tmp_path / "a") == [0, 1, 2, 10]  # 0 too, as Triton 2.51 serves it


def test_fingerprints_change_with_the_files(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"one")
    source = LocalSource(tmp_path)
    first = source.scan()["m"]
    assert source.scan()["m"] == first
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"three")
    second = source.scan()["m"]
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.onnx").write_bytes(b"x")
    assert len({first, second, source.scan()["m"]}) == 3


@pytest.mark.parametrize("name", ["", ".", "..", "../m", "a/b", "a\\b", ".hidden", "m\x00"])
def test_model_names_that_could_leave_the_repository(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a valid model name"):
        LocalSource(tmp_path).local_path(name)


def test_linked_model_folders_that_leave_the_repository(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "escape").symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidArgumentError, match="a link that leaves the repository"):
        LocalSource(tmp_path / "repo").local_path("escape")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 10]),
        ("version_policy: { latest: { num_versions: 9 } }", [1, 2, 10]),
        ("version_policy: { all: { } }", [1, 2, 10]),
        ("version_policy: { specific: { versions: [ 2, 1 ] } }", [1, 2]),
    ],
)
def test_version_policies(policy: str, expected: list[int]) -> None:
    assert select_versions(parse_config(policy).version_policy, [1, 2, 10], "m") == expected


def test_version_0_is_a_version_a_specific_policy_may_name_as_in_triton() -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 0, 2 ] } }").version_policy
    assert select_versions(policy, [0, 1, 2], "m") == [0, 2]


def test_models_load_before_the_ensembles_that_use_them_and_cycles_never_load() -> None:
    steps = {"a": None, "b": None, "pipe": {"a", "b"}, "outer": {"pipe"}, "x": {"y"}, "y": {"x"}, "z": {"x"}}
    waves, cycles = load_order(steps)
    assert waves == [["a", "b"], ["pipe"], ["outer"]]
    assert cycles == {
        "x": "ensemble 'x': circular dependency between ensembles: x -> y -> x",
        "y": "ensemble 'y': circular dependency between ensembles: y -> x -> y",
        "z": "ensemble 'z': circular dependency between ensembles: x -> y -> x",  # waits on one
    }


ENSEMBLE = """
platform: "ensemble"
ensemble_scheduling { step [ { model_name: "STEP" model_version: -1 } ] }
"""


def _ensemble_folder(repository: Path, name: str, step: str) -> ModelLocation:
    (repository / name).mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(ENSEMBLE.replace("STEP", step))
    return ModelLocation(name, repository / name, repository, namespace=str(repository))


def _serving(namespace: str, name: str, config_text: str = "") -> Model:
    config = parse_config(f'name: "{name}"\n{config_text}')
    version = ModelVersion(
        name, 1, config, ModelSignature(config), ModelStatistics(name, 1), ModelState.READY
    )
    return Model(name=name, path=None, config=config, versions={1: version}, namespace=namespace)


def _serving_ensemble(namespace: str, name: str, step: str) -> Model:
    return _serving(namespace, name, ENSEMBLE.replace("STEP", step))


def test_an_ensembles_step_is_its_own_repositorys_else_the_one_model_of_that_name() -> None:
    index = KeyIndex(
        {"a::add": "add", "b::add": "add", "b::only": "only", "files": "files", "x::y::s": "y::s"}
    )
    assert index.step_key("a", "add") == "a::add"  # its own repository's
    assert index.step_key("c", "add") is None  # two others: its calls find none
    assert index.step_key("a", "only") == "b::only"  # the one model of that name
    assert index.step_key("a", "files") == "files"  # held under its plain name (loaded from files)
    assert index.step_key("a", "y::s") == "x::y::s"  # a name with the separator in it
    assert index.step_key("a", "s") is None
    assert index.step_keys("c", ["add", "only", "none"]) == {"c::add", "b::only", "c::none"}


def test_without_namespacing_a_step_is_only_its_own_name() -> None:
    # A folder named `x::s` is a model of that name, not model `s` of a namespace `x`.
    index = KeyIndex({"x::s": "x::s"})
    assert index.step_key("", "s") is None
    assert index.step_key("", "x::s") == "x::s"


def test_an_ensemble_loads_after_the_step_another_repository_has(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    ensemble = _ensemble_folder(a, "ens", "add")
    (b / "add").mkdir(parents=True)
    add = ModelLocation("add", b / "add", b, namespace=str(b))
    waves, cycles = load_waves({ensemble.key: ensemble, add.key: add}, {})
    assert (waves, cycles) == ([[add.key], [ensemble.key]], {})


def test_a_cycle_through_another_repository_is_refused(tmp_path: Path) -> None:
    # a's `ens` calls `s`, which only b has: b's `s` is an ensemble that calls `ens`.
    a, b = tmp_path / "a", tmp_path / "b"
    ensemble = _ensemble_folder(a, "ens", "s")
    served = {f"{b}::s": _serving_ensemble(str(b), "s", "ens")}
    with pytest.raises(InvalidArgumentError, match=r"circular dependency between ensembles"):
        refuse_cycles(ensemble, {"s"}, (), served, found={ensemble.key})


def test_no_cycle_where_the_own_repositorys_step_is_on_disk(tmp_path: Path) -> None:
    # As above, but a has an `s` of its own on disk: its load comes first and `ens` calls it.
    a, b = tmp_path / "a", tmp_path / "b"
    ensemble = _ensemble_folder(a, "ens", "s")
    served = {f"{b}::s": _serving_ensemble(str(b), "s", "ens")}
    refuse_cycles(ensemble, {"s"}, (), served, found={ensemble.key, f"{a}::s"})


@pytest.mark.parametrize(
    ("held", "on_disk", "wanted"),
    [
        ({}, set(), ["s"]),  # nothing serves it
        ({"b::s": "serving"}, set(), []),  # another repository's serves: its calls take that one
        ({"b::s": "serving"}, {"a::s"}, ["s"]),  # its own repository's on disk comes first
        ({"a::s": "serving", "b::s": "serving"}, {"a::s"}, []),
        ({"b::s": "unavailable"}, set(), ["s"]),
        ({"b::s": "serving", "c::s": "serving"}, set(), ["s"]),  # which one is ambiguous
    ],
)
def test_the_steps_an_ensemble_loads_first(
    held: dict[str, str], on_disk: set[str], wanted: list[str]
) -> None:
    models = ModelTable()
    for key, state in held.items():
        namespace, _, name = key.partition("::")
        served = _serving(namespace, name)
        models[key] = served if state == "serving" else Model(name=name, path=None, namespace=namespace)
    found = dict.fromkeys(on_disk, (LocalSource(Path("/models")), ""))
    assert ModelFinder.steps_to_load("a", {"s"}, found, models) == wanted


def test_without_namespacing_a_step_loads_first_unless_it_serves() -> None:
    models = ModelTable()
    models["s"] = _serving("", "s")
    found = dict.fromkeys(["s", "t"], (LocalSource(Path("/models")), ""))
    assert ModelFinder.steps_to_load("", {"s", "t"}, found, models) == ["t"]


@pytest.mark.parametrize(
    ("unloaded", "namespaces", "answer"),
    [
        ({"a::s"}, ["a", "b"], "has no available versions (unloaded)"),
        ({"s"}, [], "has no available versions (unloaded)"),
        # A model named `y::s` is not model `s`, with or without namespacing.
        ({"a::y::s"}, ["a", "b"], "is not found"),
        ({"y::s"}, [], "is not found"),
        ({"c::s"}, ["a", "b"], "is not found"),  # not a repository this server has
    ],
)
def test_a_request_for_a_model_unloaded_says_so_and_for_another_name_not_found(
    unloaded: set[str], namespaces: list[str], answer: str
) -> None:
    models = ModelTable()
    models["a::t" if namespaces else "t"] = _serving("a" if namespaces else "", "t")
    assert models.find("t", unloaded, namespaces).name == "t"
    with pytest.raises(NotFoundError, match=rf"^Request for unknown model: 's' {re.escape(answer)}$"):
        models.find("s", unloaded, namespaces)


def _held_down(
    tmp_path: Path, ensembles: dict[str, str]
) -> tuple[dict[str, ModelLocation], TakenDownEnsembles]:
    """Ensembles (name: the step it calls) whose files a poll found changed, each taken down."""
    locations, down = {}, TakenDownEnsembles()
    for name, step in ensembles.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(ENSEMBLE.replace("STEP", step))
        locations[name] = ModelLocation(name, tmp_path / name, tmp_path)
        down.keep(name, "", frozenset({"old_step"}), LoadOverrides())
    return locations, down


def test_a_poll_keeps_down_an_ensemble_whose_step_is_gone_and_those_that_call_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    locations, down = _held_down(tmp_path, {"outer": "inner", "inner": "gone"})
    assert sorted(ModelFinder.still_down(locations, ModelTable(), down)) == ["inner", "outer"]
    assert locations == {}
    # Kept with the steps their files name now: each comes back once that one serves.
    assert [(name, steps) for name, _, steps, _ in down.items()] == [
        ("inner", frozenset({"gone"})),
        ("outer", frozenset({"inner"})),
    ]
    assert "ensemble inner contains models that are not available or ambiguous: gone" in caplog.text


def test_a_poll_loads_a_taken_down_ensemble_whose_step_serves_or_loads_with_it(tmp_path: Path) -> None:
    locations, down = _held_down(tmp_path, {"ens": "step", "other": "loading"})
    (tmp_path / "loading").mkdir()
    locations["loading"] = ModelLocation("loading", tmp_path / "loading", tmp_path)
    models = ModelTable()
    models["step"] = _serving("", "step")
    assert ModelFinder.still_down(locations, models, down) == []
    assert sorted(locations) == ["ens", "loading", "other"]


def test_a_poll_loads_again_an_ensemble_whose_load_failed(tmp_path: Path) -> None:
    # Held as a failed load (not unloaded), it loads again and says why it cannot.
    locations, down = _held_down(tmp_path, {"ens": "gone"})
    models = ModelTable()
    models["ens"] = Model(name="ens", path=None, reason="its step did not serve")
    assert ModelFinder.still_down(locations, models, down) == []
    assert list(locations) == ["ens"]


def test_a_specific_version_must_exist() -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 3 ] } }").version_policy
    with pytest.raises(ModelConfigError, match=r"asks for version\(s\) \[3\]"):
        select_versions(policy, [1, 2], "m")


def test_of_specific_versions_those_present_are_served_as_in_triton(caplog: pytest.LogCaptureFixture) -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 1, 3 ] } }").version_policy
    assert select_versions(policy, [1, 2], "m") == [1]
    assert "version 3 is specified for model 'm', but the version directory is not present" in caplog.text
