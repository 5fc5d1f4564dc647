"""End to end through the CLI: rounds at once on GPU groups (runtime.gpus, a list), real `vllm serve`
processes on the tiny MoE. On a CPU host the groups select no device (tests/test_gpu_groups.py pins the
variables a GPU host's servers get); what runs here for real is the scheduling: the two sets of a wave run at
the same time, each with its own servers, bench client and compile cache, the look comes after the whole
wave, the report says where each set ran, and a Ctrl-C in the middle of a wave stops every set's servers.
Crossed groups (runtime.cross_groups): one set at a time, each arm on its own group, swapped every set.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time

import pytest

from tests.conftest import (
    processes_mentioning,
    run_matrix_once,
    run_suite,
    start_suite_in_group,
    tiny_cpu_matrix,
    wait_for,
)

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {vllm: "0.32.0"}
  slowed: {vllm: "0.32.0", patches: [synthetic-gate-delay], env: {SUITE_GATE_DELAY_US: "3000"}}
serve:
  - {isl: 64, osl: 16, concurrency: [1, 2], num_prompts: 1s, bench_args: [--num-warmups, "1"]}
repeats: auto
order: abba
together: all
order_seed: 1
precompile: true
verdict: {metrics: [mean_tpot_ms], looks: [2]}
"""


def groups_matrix(name: str, model, precompile: bool = True) -> str:
    text = tiny_cpu_matrix(name, model, BODY, max_num_seqs=2).replace(
        "runtime: {kind: local, startup_timeout_s: 600}",
        'runtime: {kind: local, startup_timeout_s: 600, gpus: ["0", "1"]}')
    return text if precompile else text.replace("precompile: true\n", "")


@pytest.fixture(scope="module")
def groups_run(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("gpu-groups")
    return run_matrix_once(base, groups_matrix("groups", tiny_model, precompile=False))


def _stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_the_dry_run_shows_each_sets_wave_and_gpus(groups_run):
    matrix, _, _ = groups_run
    out = run_suite("run", str(matrix), "--dry-run").stdout
    assert "session baseline#0 (server, 2 jobs, window 0, wave 0 on GPUs 0)" in out
    assert "session slowed#1 (server, 2 jobs, window 1, wave 0 on GPUs 1)" in out


def test_both_sets_of_the_wave_run_at_once_each_on_its_group(groups_run):
    _, run_dir, proc = groups_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 8 ok, 0 failed, 0 missing" in proc.stdout  # 2 sets x 1 block x 2 points x 2 arms
    assert "look after 2 rounds: slowed " in proc.stdout  # one look, after the wave of both sets
    starts = {}
    for arm in ("baseline", "slowed"):
        for session in (0, 1):
            rec = json.loads((run_dir / arm / f"server-{session}.json").read_text())
            assert rec["window"] == session and rec["gpus"] == str(session)
            starts[(arm, session)] = _stamp(rec["started"]), rec["healthy_after_s"]
    # the four servers were started together: each set's servers started before the other set's answered
    first_healthy = min(t + h for t, h in starts.values())
    assert all(t < first_healthy for t, _ in starts.values()), starts
    # the jobs of the two sets overlap in time
    spans = {}
    for s in (0, 1):
        recs = [json.loads(p.read_text()) for arm in ("baseline", "slowed")
                for p in (run_dir / arm / "serve").glob(f"*/rep-{s}.job.json")]
        spans[s] = (min(_stamp(r["started"]) for r in recs), max(_stamp(r["started"]) + r["seconds"] for r in recs))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans


def test_each_group_has_its_own_compile_cache_and_bench_client(groups_run):
    _, run_dir, _ = groups_run
    for arm in ("baseline", "slowed"):
        assert (run_dir / arm / "cache").is_dir() and (run_dir / arm / "cache-group-1").is_dir()
    logs = sorted(p.name for p in (run_dir / "client").glob("client-*.log"))
    assert logs == ["client-persistent-group-1.log", "client-persistent.log"]


def test_the_report_says_where_each_set_ran(groups_run):
    _, run_dir, _ = groups_run
    md = (run_dir / "report.md").read_text()
    assert ("2 rounds at a time, each on its own GPU group, both arms of a round on the same group (round r on "
            "group r mod 2; 0: GPUs 0; 1: GPUs 1)") in md
    assert "each round's score: round 0 " in md and ", round 1 " in md


def test_no_process_is_left(groups_run):
    _, run_dir, _ = groups_run
    assert processes_mentioning(str(run_dir)) == []


@pytest.fixture(scope="module")
def crossed_run(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("gpu-cross")
    # two sets, one crossing, as a fixed design (repeats: 2): a sequential design's first look would need 4 sets
    text = groups_matrix("crossed", tiny_model).replace('gpus: ["0", "1"]}',
                                                        'gpus: ["0", "1"], cross_groups: true}').replace(
        "repeats: auto\n", "repeats: 2\n")
    assert "cross_groups: true" in text and "repeats: 2\n" in text
    return run_matrix_once(base, text)


def test_crossed_groups_run_one_set_at_a_time_each_arm_on_its_own_group_swapped_every_set(crossed_run):
    """runtime.cross_groups (a model that cannot fit twice on a group): set 0 baseline on group 0 and slowed on
    group 1, round 1 the other way round; the sets one after the other; each (arm, group) precompiled, one set's
    layout at a time, all stopped before set 0 and nothing measured (the precompile's run through the CLI: the
    sets-at-once run above goes without it, tests/test_gpu_groups.py pins its one window of four); a cache per
    (arm, group), one bench client; the report says how the arms crossed."""
    matrix, run_dir, proc = crossed_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 8 ok, 0 failed, 0 missing" in proc.stdout
    dry = run_suite("run", str(matrix), "--dry-run").stdout
    assert "session slowed#0 (server, 2 jobs, window 0, on GPUs 1)" in dry
    assert "session slowed#1 (server, 2 jobs, window 1, on GPUs 0)" in dry
    recs = {(arm, s): json.loads((run_dir / arm / f"server-{s}.json").read_text())
            for arm in ("baseline", "slowed") for s in (0, 1)}
    assert [recs[("baseline", s)]["gpus"] for s in (0, 1)] == ["0", "1"]
    assert [recs[("slowed", s)]["gpus"] for s in (0, 1)] == ["1", "0"]
    set0_end = max(_stamp(r["started"]) + r["seconds"] for arm in ("baseline", "slowed")
                   for r in (json.loads(p.read_text()) for p in (run_dir / arm / "serve").glob("*/rep-0.job.json")))
    assert all(_stamp(recs[(arm, 1)]["started"]) > set0_end for arm in ("baseline", "slowed"))  # one set at a time
    windows = [ln for ln in proc.stdout.splitlines() if ln.startswith("precompile: ") and " + " in ln]
    assert [sorted(w.split(":")[1].strip().split(" + ")) for w in windows] == [  # each in its set's arm order
        ["baseline (GPUs 0)", "slowed (GPUs 1)"], ["baseline (GPUs 1)", "slowed (GPUs 0)"]]
    pre = {(arm, g): json.loads((run_dir / arm / log).read_text()) for arm in ("baseline", "slowed")
           for g, log in ((0, "precompile.json"), (1, "precompile-group-1.json"))}
    assert {k: r["gpus"] for k, r in pre.items()} == {(a, g): str(g) for a in ("baseline", "slowed") for g in (0, 1)}
    first_done = max(_stamp(pre[k]["started"]) + pre[k]["healthy_after_s"] for k in (("baseline", 0), ("slowed", 1)))
    assert all(_stamp(pre[k]["started"]) >= first_done for k in (("baseline", 1), ("slowed", 0)))
    set0 = min(_stamp(r["started"]) for r in recs.values())
    assert all(_stamp(r["started"]) + r["healthy_after_s"] < set0 for r in pre.values())
    for arm in ("baseline", "slowed"):
        for log in ("precompile.log", "precompile-group-1.log"):
            assert "Application startup complete" in (run_dir / arm / log).read_text()
    assert not list(run_dir.glob("*/serve/*/rep-*-precompile*"))  # nothing measured
    for arm in ("baseline", "slowed"):
        assert (run_dir / arm / "cache").is_dir() and (run_dir / arm / "cache-group-1").is_dir()
    assert sorted(p.name for p in (run_dir / "client").glob("client-*.log")) == ["client-persistent.log"]
    md = (run_dir / "report.md").read_text()
    assert ("each serving arm on a GPU group of its own, the groups crossed over from round to round (round r: the "
            "i-th serving arm on group (i + r) mod 2; 0: GPUs 0; 1: GPUs 1): a group's own speed enters each round's score "
            "with its layout, and the test takes it out") in md
    # two sets, one per layout: nothing is left to test on once the layouts are taken out, and the card says so
    assert "crossed over 2 GPU layouts: the mean of the layouts' means, the spread within layouts (2 rounds, 0 " in md
    assert "2 rounds in 2 of the 2 GPU layouts: no interval once the GPU layouts' difference is taken out" in md
    assert "each round's score: round 0 " in md and ", round 1 " in md
    assert "precompile: every serving arm's server started once before the first session of each stretch" in md
    assert processes_mentioning(str(run_dir)) == []


def test_ctrl_c_during_a_wave_stops_every_sets_servers(tmp_path, tiny_model):
    """SIGINT to the run while its two sets' four servers start: the run ends as interrupted, nothing of
    either set is left running."""
    matrix = tmp_path / "m.yaml"
    matrix.write_text(groups_matrix("groups-stop", tiny_model, precompile=False))
    log = tmp_path / "suite.log"
    proc = start_suite_in_group(["run", str(matrix), "--out", str(tmp_path / "runs")], log,
                                {**os.environ, "COLUMNS": "200"})
    try:
        def both_sets_launched():  # the second group's servers have logs
            runs = list((tmp_path / "runs").glob("*-groups-stop"))
            return runs[0] if runs and all((runs[0] / a / "server-1.log").is_file() for a in ("baseline", "slowed")) \
                else None

        run_dir = wait_for("both sets' servers launched", both_sets_launched, proc, log, 300)
        time.sleep(3)  # the servers are up and loading
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", log.read_text(errors="replace")[-3000:]
    deadline = time.monotonic() + 30
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(run_dir)) == []
