"""The start-up tables: models (a load error of several lines stays inside its column), options
and backends, drawn as Triton draws them."""

from __future__ import annotations

import inspect

from coreserve.ensemble._backend import EnsembleBackend
from coreserve.repository import Model
from coreserve.repository.manager import ControlMode
from coreserve.server.options import ServerOptions
from coreserve.server.status_table import backends_table, model_status_table, options_table
from coreserve.version import __version__


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


def test_the_options_table_says_the_options_in_tritons_names() -> None:
    options = ServerOptions(
        ["/models", "s3://bucket/more"],
        server_id="edge",
        model_control_mode=ControlMode.EXPLICIT,
        auto_complete_config=False,
        rate_limit="execution_count",
        strict_readiness=False,
        exit_timeout_secs=12.5,
    )
    table = options_table(options, ["classification", "sequence"], cache_enabled=True)
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in table.splitlines()
        if line.startswith("|")
    ]
    assert rows == [
        ["Option", "Value"],
        ["server_id", "edge"],
        ["server_version", __version__],
        ["server_extensions", "classification sequence"],
        ["model_repository_path[0]", "/models"],
        ["model_repository_path[1]", "s3://bucket/more"],
        ["model_control_mode", "MODE_EXPLICIT"],
        ["strict_model_config", "1"],
        ["model_config_name", ""],
        ["rate_limit", "EXEC_COUNT"],
        ["strict_readiness", "0"],
        ["exit_timeout", "12.5"],
        ["cache_enabled", "1"],
    ]


def test_the_backends_table_names_each_plugins_file_and_its_settings() -> None:
    options = ServerOptions(["/models"], backend_config={"ensemble": {"note": "5"}, "other": {"x": "1"}})
    table = backends_table([EnsembleBackend()], options)
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in table.splitlines()
        if line.startswith("|")
    ]
    assert rows == [
        ["Backend", "Path", "Config"],
        [
            "ensemble",
            inspect.getfile(EnsembleBackend),
            '{"cmdline":{"auto-complete-config":"true","note":"5"}}',
        ],
    ]
