"""A pytest plugin that fails the run when a test skips for a reason not on an allow-list.

Where $CORESERVE_ALLOWED_SKIPS names a file (`.ci/run` names `.ci/allowed-skips`), each of its
lines that is neither blank nor a comment is a prefix that a skip's reason may start with. A skip
whose reason starts with none of them is listed at the end of the run, which then fails: in CI, a
test that skips because something failed to install is a failure, not a pass. Without the
variable, skips are reported as usual and nothing else changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ALLOWLIST_VARIABLE = "CORESERVE_ALLOWED_SKIPS"


def read_allowlist(path: Path) -> tuple[str, ...]:
    """The reason prefixes an allow-list file holds."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skipped report gives, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


class SkipAllowlist:
    """Collects the skips whose reason the allow-list does not allow, and fails the run on them."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.prefixes = read_allowlist(source)
        self.refused: list[tuple[str, str]] = []

    def _check(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            if not reason.startswith(self.prefixes):
                self.refused.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check(report)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.refused:
            return
        terminalreporter.section("skips off the allow-list", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(self.refused)} test(s) skipped for a reason {self.source} does not allow:"
        )
        for nodeid, reason in self.refused:
            terminalreporter.line(f"{nodeid}: {reason}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.refused and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    named = os.environ.get(ALLOWLIST_VARIABLE)
    if not named:
        return
    if not Path(named).is_file():
        raise pytest.UsageError(f"${ALLOWLIST_VARIABLE} names {named}, which is not a file")
    config.pluginmanager.register(SkipAllowlist(Path(named)), "skip-allowlist")
