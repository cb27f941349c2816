"""The benchmark tables in the docs are made from the results files, and are up to date."""

from __future__ import annotations

import subprocess
import sys

from support.paths import REPO

TABLES = REPO / "benchmarks" / "results" / "TABLES.md"


def test_the_docs_tables_are_rendered_from_the_results_files(tmp_path) -> None:
    rendered = tmp_path / "TABLES.md"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.tables",
            "--heading-level",
            "3",
            "--output",
            str(rendered),
        ],
        check=True,
        cwd=REPO,
    )
    assert rendered.read_text() == TABLES.read_text(), (
        "benchmarks/results/TABLES.md is stale: run python -m benchmarks.tables --heading-level 3 --output it"
    )
    assert '--8<-- "benchmarks/results/TABLES.md"' in (REPO / "docs" / "benchmarks.md").read_text()
