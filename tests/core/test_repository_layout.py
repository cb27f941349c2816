"""Finding models and versions on disk, and version policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from coreserve.config import parse_config
from coreserve.errors import ModelConfigError
from coreserve.repository.layout import find_models, list_versions, select_versions


def test_models_and_numeric_versions(tmp_path: Path) -> None:
    for name in ("b", "a", ".hidden"):
        (tmp_path / name).mkdir()
    (tmp_path / "file.txt").write_text("not a model")
    for version in ("1", "10", "2", "0", "07", "latest", "x3"):
        (tmp_path / "a" / version).mkdir()
    (tmp_path / "a" / "3").write_text("a file, not a folder")
    models, duplicates = find_models([tmp_path])
    assert sorted(models) == ["a", "b"] and not duplicates
    assert list_versions(tmp_path / "a") == [1, 2, 10]


def test_duplicate_model_names_across_repositories(tmp_path: Path) -> None:
    (tmp_path / "r1" / "m").mkdir(parents=True)
    (tmp_path / "r2" / "m").mkdir(parents=True)
    (tmp_path / "r2" / "n").mkdir(parents=True)
    models, duplicates = find_models([tmp_path / "r1", tmp_path / "r2"])
    assert list(models) == ["n"]
    assert "more than one repository" in duplicates["m"]


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


def test_specific_versions_must_exist() -> None:
    policy = parse_config("version_policy: { specific: { versions: [ 3 ] } }").version_policy
    with pytest.raises(ModelConfigError, match=r"asks for version\(s\) \[3\]"):
        select_versions(policy, [1, 2], "m")
