"""The start-up table of models: a load error of several lines stays inside its column."""

from __future__ import annotations

from coreserve.repository import Model
from coreserve.server.status_table import model_status_table


def test_a_reason_of_several_lines_takes_as_many_lines_of_the_table() -> None:
    failed = Model(
        name="bad", path=None, reason="RuntimeError: first\nsecond\n\nAt:\n  model.py(3): initialize"
    )
    other = Model(name="other", path=None, reason="no config")

    assert model_status_table([failed, other]).splitlines() == [
        "+-------+---------+----------------------------------+",
        "| Model | Version | Status                           |",
        "+-------+---------+----------------------------------+",
        "| bad   | -       | UNAVAILABLE: RuntimeError: first |",
        "|       |         | second                           |",
        "|       |         |                                  |",
        "|       |         | At:                              |",
        "|       |         |   model.py(3): initialize        |",
        "| other | -       | UNAVAILABLE: no config           |",
        "+-------+---------+----------------------------------+",
    ]
