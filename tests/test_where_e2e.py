"""A run resumed on another machine, for real: `suite run` under one host name (a UTS namespace, ``unshare
--uts``), stopped after the first arm of round 1, then `--resume` under another host name.

1. Without ``--allow-other-host`` the resume is refused before anything starts, naming both machines.
2. With it, the missing jobs run; every job record, server record and stretch names its machine; the round whose
   arms ran on the two machines is not paired (an ``other-host`` finding leaves the change's repeat out), and
   the card says the run ran on two machines, with the rounds of each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from suite.matrix_load import load_matrix
from suite.plan import build_plan
from tests.conftest import REPO, processes_mentioning, tiny_cpu_matrix, wait_for
from tests.test_report import card_of

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [synthetic-gate-delay], env: {SUITE_GATE_DELAY_US: "20"}}
serve:
  - {isl: 32, osl: 8, concurrency: 1, num_prompts: 2}
repeats: 2
order: abba
"""
POINT = "isl32-osl8-c1-n2"


def as_host(name: str, args: list[str]) -> list[str]:
    """`suite ARGS` in a UTS namespace of its own whose host name is ``name`` (the same process: exec)."""
    return ["unshare", "--uts", "--", "sh", "-c", f'hostname {name} && exec "$@"', "sh",
            sys.executable, "-m", "suite", *args]


def record(run_dir: Path, arm: str, rep: int) -> dict | None:
    path = run_dir / arm / "serve" / POINT / f"rep-{rep}.job.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


@pytest.fixture(scope="module")
def moved(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("where")
    matrix = base / "m.yaml"
    matrix.write_text(tiny_cpu_matrix("where-moved", tiny_model, BODY))
    order = [(s.arm, s.index) for s in build_plan(load_matrix(matrix)).sessions]
    first_of_round_1 = order[2][0]  # ABBA: round 1's first arm
    env = dict(os.environ, COLUMNS="200")
    log = base / "stretch1.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(as_host("host-a", ["run", str(matrix), "--out", str(base / "runs")]), cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run_dir = wait_for("run directory", lambda: next((base / "runs").glob("*"), None)
                           if (base / "runs").is_dir() else None, proc, log, 120)
        wait_for(f"{first_of_round_1}'s round 1", lambda: (r := record(run_dir, first_of_round_1, 1)) and r["status"]
                 == "ok", proc, log, 900)
        proc.send_signal(signal.SIGTERM)  # the machine goes: round 1's second arm never runs here
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def resume(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(as_host("host-b", ["run", str(matrix), "--resume", str(run_dir), *extra]), cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=900)

    stretches_before = len(json.loads((run_dir / "manifest.json").read_text())["stretches"])
    refused = resume()
    stretches_after_refusal = len(json.loads((run_dir / "manifest.json").read_text())["stretches"])
    allowed = resume("--allow-other-host")
    return {"run_dir": run_dir, "order": order, "stretch1": proc.returncode, "log": log.read_text(errors="replace"),
            "refused": refused, "allowed": allowed, "stretches": (stretches_before, stretches_after_refusal)}


def test_a_resume_on_another_machine_is_refused_before_anything_starts(moved):
    assert moved["stretch1"] == 130, moved["log"][-3000:]
    refused = moved["refused"]
    text = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert "began on another machine (host name 'host-a' there, 'host-b' here)" in text, text[-3000:]
    assert "pass --allow-other-host" in text
    assert moved["stretches"] == (1, 1)  # nothing ran: no stretch was begun


def test_with_allow_other_host_every_record_names_its_machine(moved):
    allowed, run_dir, order = moved["allowed"], moved["run_dir"], moved["order"]
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    flat = " ".join(allowed.stdout.split())  # the console wraps long lines
    assert "--allow-other-host: rounds whose arms ran on different machines will not be paired" in flat
    hosts = {(arm, rep): record(run_dir, arm, rep)["where"]["hostname"] for arm, rep in order}
    last = order[3]  # round 1's second arm: the only job the resume ran
    assert hosts == {key: "host-b" if key == last else "host-a" for key in order}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [s["where"]["hostname"] for s in manifest["stretches"]] == ["host-a", "host-b"]
    assert manifest["status"] == "complete"
    servers = {json.loads(p.read_text())["where"]["hostname"] for p in run_dir.glob(f"{last[0]}/server-1*.json")}
    assert servers == {"host-b"}  # the server that measured it started there


def test_the_split_round_is_not_paired_and_the_card_names_both_machines(moved):
    run_dir = moved["run_dir"]
    report = (run_dir / "report.md").read_text()
    card = card_of(report)
    assert "**ran on 2 machines**: host-a (rounds 0, 1); host-b (round 1)" in card, card
    assert "1 round paired by round index" in card, card  # round 1 is gone from the pairing
    quality = report.split("## Data quality", 1)[1]
    assert "| unreliable | other-host | patched |" in quality
    assert "round 1: ran on host-" in quality and "not paired" in quality
    assert "ran on 2 machines" in (run_dir / "report.html").read_text()
    assert processes_mentioning(str(run_dir)) == []
