"""The reliability tier's summary: runs, violations and recovery times of every scenario (`make soak`)."""

from __future__ import annotations

import pytest

from tests.support.soak import SOAK, report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = report()
    if lines:
        terminalreporter.section("reliability" + (" soak" if SOAK else ""))
        for line in lines:
            terminalreporter.write_line(line)
