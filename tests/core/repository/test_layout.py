"""Finding models and versions on disk, and version policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from coreserve.config import parse_config
from coreserve.errors import InvalidArgumentError, ModelConfigError
from coreserve.repository._layout import list_versions, load_order, select_versions
from coreserve.repository.storage._sources import LocalSource


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


def test_a_specific_version_must_exist() -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 3 ] } }").version_policy
    with pytest.raises(ModelConfigError, match=r"asks for version\(s\) \[3\]"):
        select_versions(policy, [1, 2], "m")


def test_of_specific_versions_those_present_are_served_as_in_triton(caplog: pytest.LogCaptureFixture) -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 1, 3 ] } }").version_policy
    assert select_versions(policy, [1, 2], "m") == [1]
    assert "version 3 is specified for model 'm', but the version directory is not present" in caplog.text
