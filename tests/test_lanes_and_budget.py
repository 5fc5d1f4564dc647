"""The test suite's own plumbing, run for real: small pytest sessions of test files under the project's plugins
(tests/lanes.py, tests/budget.py), with pytest-xdist as `make test` starts it and without.

- The lanes: every server-bound test (e2e, docker, slurm) runs in one worker, in collection order with the
  Docker modules last, never two at once; the other tests run in the other worker meanwhile, an image build
  (docker_build) last among them.
- A worker's environment: the controller's terminal size (none here), not execnet's COLUMNS=80.
- The budget: the summary gives the suite's wall time and its slowest set-ups (a module's shared fixture shows
  in its first test's set-up) and warns once the suite passes the budget; a budget that is no number is refused.
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

XDIST = ("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
INI = """\
[pytest]
markers =
    e2e: server-bound
    docker: server-bound
    slurm: server-bound
    docker_build: an image build
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
MODULE = """\
import time
import pytest
from eventlog import log

pytestmark = [{marks}]

@pytest.fixture(scope="module")
def shared_run():
    time.sleep({setup_s})
    return "run"

@pytest.mark.parametrize("i", range({n}))
def test_{name}(shared_run, i):
    t0 = time.time()
    time.sleep({call_s})
    log("{name}-%d" % i, t0)
"""
# alphabetical order puts a unit module first, the build second and the Docker module before the e2e one: the
# server lane must still lead with the Docker module last in it, and the build must come last in the other lane
FILES = {
    "test_a_unit.py": dict(marks="", name="a", setup_s=0, n=4, call_s=0.2),
    "test_b_build.py": dict(marks="pytest.mark.docker, pytest.mark.docker_build", name="build", setup_s=0, n=1,
                            call_s=0.2),
    "test_c_docker.py": dict(marks="pytest.mark.docker", name="c", setup_s=0.1, n=3, call_s=0.4),
    "test_d_unit.py": dict(marks="", name="d", setup_s=0, n=4, call_s=0.2),
    "test_e_e2e.py": dict(marks="pytest.mark.e2e", name="e", setup_s=1.5, n=3, call_s=0.4),
}
SERVER_ORDER = ["e-0", "e-1", "e-2", "c-0", "c-1", "c-2"]


def session(base: Path, *args: str, budget_min: str | None = None) -> tuple[subprocess.CompletedProcess, list]:
    base.mkdir(parents=True, exist_ok=True)
    (base / "pytest.ini").write_text(INI)
    (base / "conftest.py").write_text(CONFTEST)
    (base / "eventlog.py").write_text(LOG)
    for name, fields in FILES.items():
        (base / name).write_text(MODULE.format(**fields))
    env = {k: v for k, v in os.environ.items() if k not in ("SUITE_TEST_BUDGET_MIN", "COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(base)])
    if budget_min is not None:
        env["SUITE_TEST_BUDGET_MIN"] = budget_min
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=base, env=env,
                          capture_output=True, text=True, timeout=300)
    events_file = base / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    return proc, sorted(events, key=lambda e: e["start"])


@pytest.fixture(scope="module")
def lanes(tmp_path_factory):
    """Two workers, as `make test` runs them, under a budget of 0.001 min (so the warning must show)."""
    return session(tmp_path_factory.mktemp("lanes"), *XDIST, budget_min="0.001")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One process, the default budget."""
    return session(tmp_path_factory.mktemp("plain"))


def test_server_bound_tests_run_in_one_worker_in_order_while_the_rest_run_beside_them(lanes):
    proc, events = lanes
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    servers = [e for e in events if e["test"][0] in "ce"]
    others = [e for e in events if e["test"][0] not in "ce"]
    assert len(servers) == 6 and len(others) == 9
    assert len({e["worker"] for e in servers}) == 1  # one lane
    assert [e["test"] for e in servers] == SERVER_ORDER  # one after another, the Docker module last
    assert all(a["end"] <= b["start"] for a, b in zip(servers, servers[1:], strict=False))  # never two at once
    lane_start, lane_end = servers[0]["start"], servers[-1]["end"]
    beside = [e for e in others if e["worker"] != servers[0]["worker"] and e["start"] < lane_end
              and e["end"] > lane_start]
    assert beside, (servers, others)  # the other tests ran in the other worker while the server lane ran
    # the image build came last among the other tests: every one of them had started before it
    assert others[-1]["test"] == "build-0"
    # a worker's environment is the controller's: no terminal width of execnet's own (80) to wrap the CLI's tables
    assert {e["columns"] for e in events} == {None}


def test_without_xdist_the_server_bound_tests_lead_and_the_build_comes_last(plain):
    proc, events = plain
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    order = [e["test"] for e in events]
    assert order[:6] == SERVER_ORDER and order[-1] == "build-0" and len(order) == 15


def test_the_summary_gives_wall_time_and_the_slowest_set_ups_and_warns_past_the_budget(lanes, plain):
    out = lanes[0].stdout
    assert re.search(r"suite wall time: \d+\.\d min \(\d+ s\); budget 0.001 min", out), out
    slowest = out.split("slowest set-ups:")[1].splitlines()[1:11]
    first = re.match(r"\s+(\d+\.\d) s  (\S+)", slowest[0])
    assert first and first.group(2) == "test_e_e2e.py::test_e[0]@servers" and float(first.group(1)) >= 1.4
    assert "WARNING: the test suite took" in out and "past its 0.001-minute budget" in out
    calm = plain[0].stdout
    assert "suite wall time" in calm and "budget 60 min" in calm and "WARNING" not in calm


def test_a_budget_that_is_no_number_is_a_usage_error(tmp_path):
    proc, events = session(tmp_path, budget_min="an hour")
    assert proc.returncode == 4 and not events  # pytest's usage error, before any test
    assert "SUITE_TEST_BUDGET_MIN='an hour': give the budget in minutes" in proc.stdout + proc.stderr
