"""The test suite's time budget, printed where CI shows it: the suite's wall time, the ten slowest set-ups (a
module's shared run is paid in its first test's set-up) and a warning line once the suite passes its budget.

CI's limit is 90 minutes for the whole `.ci/run` (system packages, the venv and this suite); a suite past 60
minutes leaves too little room for a slower box or one more end-to-end module, so its author sees it first.
``SUITE_TEST_BUDGET_MIN`` sets another budget (minutes, a float). Reports from pytest-xdist workers reach the
controller's hooks too, so the figures cover every worker.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import pytest

BUDGET_ENV = "SUITE_TEST_BUDGET_MIN"
DEFAULT_BUDGET_MIN = 60.0
SLOWEST = 10


def budget_minutes() -> float:
    raw = os.environ.get(BUDGET_ENV, "")
    if not raw:
        return DEFAULT_BUDGET_MIN
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{BUDGET_ENV}={raw!r}: give the budget in minutes (a number)") from None
    if value < 0:
        raise pytest.UsageError(f"{BUDGET_ENV}={raw!r}: the budget cannot be negative")
    return value


@dataclass
class Budget:
    minutes: float
    started: float = field(default_factory=time.monotonic)
    setups: dict[str, float] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "setup":
            self.setups[report.nodeid] = report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        wall = time.monotonic() - self.started
        tr = terminalreporter
        tr.section("time budget")
        tr.write_line(f"suite wall time: {wall / 60:.1f} min ({wall:.0f} s); budget {self.minutes:g} min")
        slow = sorted(self.setups.items(), key=lambda kv: kv[1], reverse=True)[:SLOWEST]
        if slow:
            tr.write_line(f"the {len(slow)} slowest set-ups:")
            for nodeid, seconds in slow:
                tr.write_line(f"  {seconds:7.1f} s  {nodeid}")
        if wall > self.minutes * 60:
            tr.write_line(f"WARNING: the test suite took {wall / 60:.1f} min, past its {self.minutes:g}-minute budget "
                          f"(CI stops at 90 min for the whole run): make the slowest set-ups above cheaper "
                          "before adding more", yellow=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    # the controller (or a run without xdist), not an xdist worker; nothing to time in a collection alone
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        config.pluginmanager.register(Budget(budget_minutes()), "suite-time-budget")
