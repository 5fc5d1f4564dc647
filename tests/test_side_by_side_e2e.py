"""End to end through the CLI: `together: 2` on the tiny MoE (CPU), two real `vllm serve` at once.

One module-scoped run: two arms (the installed vLLM and the synthetic-gate-delay overlay), two rounds, each
round one time window of both arms (a together: k that holds every serving arm is together: all). Checks what
the mode promises: both servers of a window healthy before either's first job, their jobs taking turns (each
turn one job of each arm, in a seeded order per turn), the rounds paired as under plain ABBA, the report
saying how the run was ordered, and no process left behind.

The run takes the CUDA host's path (SUITE_HOST=cuda, an `nvidia-smi` on PATH that reports one GPU's state
and no process holding it), as on the H200: no CPU-only settings, the GPU-memory check at every stop, and
the GPU's clocks and P-state recorded around every job.
"""

from __future__ import annotations

import json
import os
import textwrap
from datetime import datetime

import pytest

from tests.conftest import processes_mentioning, run_suite, tiny_cpu_matrix

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [synthetic-gate-delay], env: {SUITE_GATE_DELAY_US: "20"}}
serve:
  - {isl: 64, osl: 16, concurrency: [1, 2], num_prompts: 2x, bench_args: [--num-warmups, "1"]}
repeats: 2
order: abba
together: 2
order_seed: 3
quiet_s: 3
"""


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


SMI = """\
#!/bin/sh
case "$1" in
  --query-gpu=index,pstate,*) echo "0, P0, 1980, 3201, 512.25, 41, 97, 101375, NVIDIA H200" ;;
  --query-gpu=clocks_event_reasons.active) echo "0x0000000000000000" ;;
  --query-gpu=*) echo "0, NVIDIA H200, 143771" ;;
esac
"""


@pytest.fixture(scope="module")
def sbs_run(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("sbs")
    (base / "bin").mkdir()
    (base / "bin" / "nvidia-smi").write_text(textwrap.dedent(SMI))
    (base / "bin" / "nvidia-smi").chmod(0o755)
    matrix = base / "m.yaml"
    matrix.write_text(tiny_cpu_matrix("sbs", tiny_model, BODY, max_num_seqs=2))
    env = {"SUITE_HOST": "cuda", "PATH": f"{base / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = run_suite("run", str(matrix), "--out", str(base / "runs"), env=env, timeout=1800)
    runs = sorted(p for p in (base / "runs").iterdir() if p.is_dir())
    assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return matrix, runs[0], proc


def test_run_completes_with_every_job(sbs_run):
    _, run_dir, proc = sbs_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 8 ok, 0 failed, 0 missing" in proc.stdout
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"


def test_a_windows_servers_are_up_together_and_their_jobs_take_turns(sbs_run):
    _, run_dir, _ = sbs_run
    for window, session in ((0, 0), (1, 1)):
        servers = {arm: json.loads((run_dir / arm / f"server-{session}.json").read_text())
                   for arm in ("baseline", "patched")}
        assert {s["window"] for s in servers.values()} == {window}
        assert servers["baseline"]["port"] != servers["patched"]["port"]
        jobs = []
        for arm in servers:
            for rec in (run_dir / arm / "serve").glob(f"*/rep-{session}.job.json"):
                # (written when the job ends: its mtime orders the jobs; "started" has whole seconds only)
                jobs.append((rec.stat().st_mtime, _t(json.loads(rec.read_text())["started"]), arm))
        jobs.sort()
        assert len(jobs) == 4
        healthy = [_t(s["started"]) + s["healthy_after_s"] for s in servers.values()]
        assert max(healthy) <= min(start for _, start, _ in jobs) + 1  # both up before the first job
        starts = [_t(s["started"]) for s in servers.values()]
        assert abs(starts[0] - starts[1]) < min(s["healthy_after_s"] for s in servers.values())  # started together
        arms = [arm for _, _, arm in jobs]
        assert arms[0] != arms[1] and arms[2] != arms[3]  # each turn: one job of each arm


def test_each_window_is_quiet_before_its_first_measured_point(sbs_run):
    """quiet_s: 3: no request reaches a window's servers for 3 s after both answered; then the first session
    warms each shape (recorded with its first serving job) before its first measured request."""
    _, run_dir, _ = sbs_run
    for session in (0, 1):
        servers = [json.loads((run_dir / arm / f"server-{session}.json").read_text()) for arm in ("baseline", "patched")]
        ready = max(_t(s["started"]) + s["healthy_after_s"] for s in servers)
        firsts = []
        for arm in ("baseline", "patched"):
            for rec in (run_dir / arm / "serve").glob(f"*/rep-{session}.job.json"):
                job = json.loads(rec.read_text())
                if "warmup" in job:
                    firsts.append((rec.stat().st_mtime, job))
        assert len(firsts) == 2  # one warm-up per session
        (_, first), _ = sorted(firsts, key=lambda f: f[0])
        # whole-second stamps: "started" and the servers' ready time are each up to 1 s early
        assert _t(first["started"]) >= ready + 3 - 1  # the quiet: no job began before it ended
        assert first["warmup"]["shapes"] and first["warmup"].get("settle") is None
    report = (run_dir / "report.md").read_text()
    assert "quiet: no request until 3 s after the servers answered" in report and "settle:" not in report


def test_report_states_how_the_servers_ran_together(sbs_run):
    _, run_dir, _ = sbs_run
    report = (run_dir / "report.md").read_text()
    assert ("order: abba, together: all: every serving arm's server alive at once, a fresh start per round, 1 block "
            "of every point per round") in report
    assert "paired by round" in report or "paired" in report


def test_no_process_is_left(sbs_run):
    _, run_dir, _ = sbs_run
    assert processes_mentioning(str(run_dir)) == []


def test_the_gpu_state_is_recorded_around_every_job(sbs_run):
    _, run_dir, _ = sbs_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["arms"]["baseline"]["host"] == "cuda"
    records = list(run_dir.glob("*/serve/*/rep-*.job.json"))
    assert len(records) == 8
    for rec in records:
        device = json.loads(rec.read_text())["device"]
        for when in ("before", "after"):
            (gpu,) = device[when]
            assert gpu["pstate"] == "P0" and gpu["clocks.mem"] == "3201" and gpu["clock_event_reasons"] == "0x0000000000000000"
            assert gpu["name"] == "NVIDIA H200"
    # the report says what the jobs ran on
    assert "- GPUs (nvidia-smi before each job): 1 × NVIDIA H200, in all 8 jobs that recorded them" in (
        run_dir / "report.md").read_text()
