"""A local repository's fingerprints: what tells a changed model from an unchanged one."""

from __future__ import annotations

from pathlib import Path

from coreserve.repository import source_for


def test_a_version_folder_that_links_elsewhere_changes_its_models_fingerprint(tmp_path: Path) -> None:
    """(Blue and green builds, the version folder a link to one of them.)"""
    for build, text in (("blue", "scale 1"), ("green", "scale 2, and longer")):
        (tmp_path / "builds" / build).mkdir(parents=True)
        (tmp_path / "builds" / build / "model.py").write_text(text)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.pbtxt").write_text('backend: "python"')
    version = tmp_path / "models" / "m" / "1"
    version.symlink_to(tmp_path / "builds" / "blue")
    source = source_for(str(tmp_path / "models"), tmp_path / "cache")
    blue = source.scan()["m"]
    assert source.scan()["m"] == blue  # nothing changed
    version.unlink()
    version.symlink_to(tmp_path / "builds" / "green")
    assert source.scan()["m"] != blue
    (tmp_path / "builds" / "green" / "again").symlink_to(tmp_path / "models" / "m")  # a loop
    assert source.scan()["m"] != blue
