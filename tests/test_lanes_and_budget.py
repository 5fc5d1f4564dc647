"""The test suite's own plumbing, run for real: a pytest session of small test files under the project's
plugins (tests/lanes.py, tests/budget.py) with pytest-xdist as `make test` starts it.

- The lanes: every server-bound test (e2e, docker, slurm) runs in one worker, in collection order with the
  Docker modules last, never two at once; the other tests run in the other worker meanwhile.
- A worker's environment: the controller's terminal size (none here), not execnet's COLUMNS=80.
- The budget: the summary gives the suite's wall time and its slowest set-ups (a module's shared fixture shows
  in its first test's set-up) and warns once the suite passes the budget.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("xdist")

INI = """\
[pytest]
markers =
    e2e: server-bound
    docker: server-bound
    slurm: server-bound
"""
CONFTEST = 'pytest_plugins = ["tests.budget", "tests.lanes"]\n'
LOG = """\
import json, os, time
from pathlib import Path

def log(name, t0):
    with open(Path(__file__).parent / "events.jsonl", "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                            "start": t0, "end": time.time(), "columns": os.environ.get("COLUMNS")}) + "\\n")
"""
SERVER_MODULE = """\
import time
import pytest
from eventlog import log

pytestmark = pytest.mark.{mark}

@pytest.fixture(scope="module")
def shared_run():
    time.sleep({setup_s})
    return "run"

@pytest.mark.parametrize("i", range(3))
def test_server_{name}(shared_run, i):
    t0 = time.time()
    time.sleep(0.4)
    log("{name}-%d" % i, t0)
"""
UNIT_MODULE = """\
import time
import pytest
from eventlog import log

@pytest.mark.parametrize("i", range(4))
def test_unit_{name}(i):
    t0 = time.time()
    time.sleep(0.2)
    log("{name}-%d" % i, t0)
"""


def session(tmp_path: Path, *args: str, budget_min: str | None = None) -> tuple[subprocess.CompletedProcess, list]:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "eventlog.py").write_text(LOG)
    # alphabetical order puts a unit module first and the Docker module before the e2e one: the server lane must
    # still lead, with the Docker module last in it
    (tmp_path / "test_a_unit.py").write_text(UNIT_MODULE.format(name="a"))
    (tmp_path / "test_b_docker.py").write_text(SERVER_MODULE.format(mark="docker", name="b", setup_s=0.1))
    (tmp_path / "test_c_unit.py").write_text(UNIT_MODULE.format(name="c"))
    (tmp_path / "test_d_e2e.py").write_text(SERVER_MODULE.format(mark="e2e", name="d", setup_s=1.5))
    env = {k: v for k, v in os.environ.items() if k not in ("SUITE_TEST_BUDGET_MIN", "COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    if budget_min is not None:
        env["SUITE_TEST_BUDGET_MIN"] = budget_min
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    events_file = tmp_path / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    return proc, events


def test_server_bound_tests_run_in_one_worker_in_order_while_the_rest_run_beside_them(tmp_path):
    proc, events = session(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    servers = [e for e in events if e["test"][0] in "bd"]
    units = [e for e in events if e["test"][0] in "ac"]
    assert len(servers) == 6 and len(units) == 8
    assert len({e["worker"] for e in servers}) == 1  # one lane
    ordered = sorted(servers, key=lambda e: e["start"])
    assert [e["test"] for e in ordered] == ["d-0", "d-1", "d-2", "b-0", "b-1", "b-2"]  # one after another, Docker last
    assert all(a["end"] <= b["start"] for a, b in zip(ordered, ordered[1:], strict=False))  # never two at once
    lane_start, lane_end = ordered[0]["start"], ordered[-1]["end"]
    beside = [e for e in units if e["worker"] != servers[0]["worker"] and e["start"] < lane_end
              and e["end"] > lane_start]
    assert beside, (servers, units)  # the unit tests ran in the other worker while the server lane ran
    # a worker's environment is the controller's: no terminal width of execnet's own (80) to wrap the CLI's tables
    assert {e["columns"] for e in events} == {None}


def test_without_xdist_the_server_bound_tests_lead_and_every_test_runs(tmp_path):
    proc, events = session(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    order = [e["test"] for e in sorted(events, key=lambda e: e["start"])]
    assert order[:6] == ["d-0", "d-1", "d-2", "b-0", "b-1", "b-2"] and len(order) == 14


def test_the_summary_gives_wall_time_and_the_slowest_set_ups_and_warns_past_the_budget(tmp_path):
    proc, _ = session(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", budget_min="0.001")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"suite wall time: \d+\.\d min \(\d+ s\); budget 0.001 min", out), out
    slowest = out.split("slowest set-ups:")[1].splitlines()[1:11]
    first = re.match(r"\s+(\d+\.\d) s  (\S+)", slowest[0])
    assert first and first.group(2) == "test_d_e2e.py::test_server_d[0]@servers" and float(first.group(1)) >= 1.4
    assert "WARNING: the test suite took" in out and "past its 0.001-minute budget" in out

    (tmp_path / "events.jsonl").unlink()
    calm, _ = session(tmp_path)
    assert calm.returncode == 0 and "suite wall time" in calm.stdout and "WARNING" not in calm.stdout


def test_a_budget_that_is_no_number_is_a_usage_error(tmp_path):
    proc, _ = session(tmp_path, budget_min="an hour")
    assert proc.returncode == 4  # pytest's usage error
    assert "SUITE_TEST_BUDGET_MIN='an hour': give the budget in minutes" in proc.stdout + proc.stderr
