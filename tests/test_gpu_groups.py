"""Rounds at once on groups of GPUs (runtime.gpu_groups): the matrix's rules, the plan's sets and waves,
each set's server on its group (local: CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES; docker: the container's
GPUs), a cache per group, the runner's batches one wave at a time and the budget counted per wave.

The command lines a GPU host would run are pinned here; the scheduling itself runs for real on the CPU in
tests/test_gpu_groups_e2e.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.runner import batches
from suite.runtime.base import ArmEnv
from suite.runtime.docker.runtime import DockerRuntime
from suite.runtime.local import LocalRuntime
from suite.sequential import SequentialRun
from suite.store import ArmDirs
from suite.verdict import VerdictSpec

BASE = """\
name: groups
model: {{id: some/model}}
runtime:
  kind: {kind}
{runtime}arms:
  base: {{vllm: "0.26.0"}}
  cand: {{vllm: "0.26.0", patches: [ll-bf16-router-gemm-dispatch]}}
serve:
  - {{isl: 8, osl: 4, concurrency: [1, 2], num_prompts: 4}}
repeats: auto
order: abba
together: all
blocks: 2
verdict: {{looks: [{looks}]}}
serve_args: [--max-model-len, "256"]
"""


def matrix(groups: str = '["0", "1"]', looks: str = "4, 6", kind: str = "local", extra: str = ""):
    runtime = f"  gpu_groups: {groups}\n{extra}"
    return parse_matrix(BASE.format(kind=kind, runtime=runtime, looks=looks), "m.yaml")


@pytest.mark.parametrize(("groups", "looks", "extra", "message"), [
    ('["0", "0,1"]', "4, 6", "", "runtime.gpu_groups: GPU 0 is in two groups"),
    ('["0", "x"]', "4, 6", "", "'x' is not a comma list of GPU indices"),
    ('["0"]', "4, 6", "", "at least 2 items"),
    ('["0", "1"]', "3, 6", "", "must be multiples of 2 (not 3), e.g. [4, 6]"),
    ('["0", "1"]', "4, 6", '  gpus: "0"\n', "give either runtime.gpus"),
])
def test_a_matrix_with_gpu_groups_that_cannot_run_says_why_at_its_line(groups, looks, extra, message):
    with pytest.raises(MatrixError) as err:
        matrix(groups, looks, extra=extra)
    assert message in str(err.value) and "m.yaml:5:" in str(err.value)


def test_gpu_groups_need_every_server_of_a_round_together():
    text = BASE.format(kind="local", runtime='  gpu_groups: ["0", "1"]\n', looks="4, 6").replace(
        "order: abba\ntogether: all", "order: abba").replace("blocks: 2\n", "")
    with pytest.raises(MatrixError, match="rounds run at once on groups of GPUs only with together: all"):
        parse_matrix(text, "m.yaml")


def test_each_restart_set_runs_on_its_group_and_the_sets_of_a_wave_together():
    plan = build_plan(matrix())
    assert plan.design.sets_at_once == 2
    sets = {(s.arm, s.round): s.gpus for s in plan.sessions}
    for r in range(6):  # set r on group r mod 2, both arms of the set on the same group
        assert sets[("base", r)] == sets[("cand", r)] == ("0" if r % 2 == 0 else "1")
    assert [plan.wave_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    by_set = {s.round: s for s in plan.sessions if s.arm == "base"}
    assert [plan.group_of_session(by_set[r]) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert {plan.group_of(j) for j in by_set[3].jobs} == {1}
    # the runner's units of work under repeats: auto: the correctness arm alone, then one wave at a time
    todo = [(s, list(s.jobs)) for s in plan.sessions]
    units = [sorted({s.round for s, _ in b if s.round is not None}) for b in batches(todo, True, plan)]
    assert units == [[0, 1], [2, 3], [4, 5]]
    # without groups nothing changes: one round a batch, no GPUs named
    plain = build_plan(parse_matrix(BASE.format(kind="local", runtime="", looks="3, 6"), "m.yaml"))
    assert plain.design.sets_at_once == 1 and {s.gpus for s in plain.sessions} == {None}
    todo = [(s, list(s.jobs)) for s in plain.sessions]
    assert len(batches(todo, True, plain)) == 6


def crossed(groups: str = '["0", "1"]', looks: str = "4, 6", extra: str = "", body: str = ""):
    text = BASE.format(kind="local", runtime=f"  gpu_groups: {groups}\n  cross_groups: true\n{extra}", looks=looks)
    if body.startswith("repeats:"):  # a fixed number of sets in place of repeats: auto
        return parse_matrix(text.replace("repeats: auto\n", body), "m.yaml")
    return parse_matrix(text.replace("repeats: auto", body + "repeats: auto"), "m.yaml")


@pytest.mark.parametrize(("groups", "looks", "body", "message", "line"), [
    ('["0", "1", "2"]', "4, 6", "", "each of the 2 serving arms (the A/A arm included) needs a GPU group of its own "
     "in every round: give 2 groups, not 3", 6),
    ('["0", "1"]', "4, 6", "aa: true\n", "give 3 groups, not 2", 6),
    ('["0", "1"]', "5, 6", "", "the arms cross over the 2 groups every 2 rounds, so a look comes only after "
     "whole crossings (a GPU's own speed then cancels): verdict.looks must be multiples "
     "of 2 (not 5)", 5),
    ('["0", "1"]', "2, 6", "", "the test takes the 2 GPU layouts' difference out, which leaves no degree of "
     "freedom after 2 sets: the first look must come after 4 sets or more (verdict.looks, e.g. [4, 6])", 6),
    ('["0", "1"]', "4, 6", "repeats: 3\n", "repeats must be a multiple of 2 (not 3)", 6),
])
def test_crossed_groups_that_cannot_balance_say_why_at_their_line(groups, looks, body, message, line):
    with pytest.raises(MatrixError) as err:
        crossed(groups, looks, body=body)
    assert message in str(err.value) and f"m.yaml:{line}:" in str(err.value)
    with pytest.raises(MatrixError, match="m.yaml:5: runtime.cross_groups: crosses the arms over "
                                          "runtime.gpu_groups; give the groups"):
        parse_matrix(BASE.format(kind="local", runtime="  cross_groups: true\n", looks="4, 6"), "m.yaml")


def test_crossed_groups_put_each_arm_on_its_own_group_and_swap_them_every_set():
    """runtime.cross_groups: one set at a time; in set r the i-th serving arm on group (i + r) mod N, so every
    arm is on every group once per N sets; each (arm, group) keeps its own cache; one bench client for the run
    (no lanes); the precompile starts the first N sets' layouts one after another (a group holds one server)."""
    from suite.sessions import precompile_windows

    plan = build_plan(crossed())
    assert plan.design.sets_at_once == 1 and plan.design.cross_groups
    sets = {(s.arm, s.round): s.gpus for s in plan.sessions}
    for r in range(6):
        assert (sets[("base", r)], sets[("cand", r)]) == (("0", "1") if r % 2 == 0 else ("1", "0"))
    by = {(s.arm, s.round): s for s in plan.sessions}
    assert [plan.group_of_session(by[("cand", r)]) for r in range(4)] == [1, 0, 1, 0]
    assert {plan.group_of(j) for j in by[("cand", 1)].jobs} == {0}  # its server's cache: cand's on group 0
    assert {plan.lane_of(j) for s in plan.sessions for j in s.jobs} == {None}  # the run's one client
    todo = [(s, list(s.jobs)) for s in plan.sessions]
    assert [sorted({s.round for s, _ in b}) for b in batches(todo, True, plan)] == [[r] for r in range(6)]
    windows = precompile_windows(plan, todo)
    assert [sorted((arm, g) for (arm, g), _ in w) for w in windows] == [
        [("base", 0), ("cand", 1)], [("base", 1), ("cand", 0)]]
    assert [{s.round for _, s in w} for w in windows] == [{0}, {1}]
    # resumed after set 0: set 1 and set 2 bring the pairs left, each in its own window
    later = [(s, jobs) for s, jobs in todo if s.round is None or s.round >= 1]
    assert [sorted((arm, g) for (arm, g), _ in w) for w in precompile_windows(plan, later)] == [
        [("base", 1), ("cand", 0)], [("base", 0), ("cand", 1)]]
    # the same groups not crossed: both arms of a set on one group, every pair in one window
    together = build_plan(matrix())
    (w,) = precompile_windows(together, [(s, list(s.jobs)) for s in together.sessions])
    assert sorted(k for k, _ in w) == [("base", 0), ("base", 1), ("cand", 0), ("cand", 1)]


def test_the_dry_run_names_each_crossed_servers_gpus():
    from suite.plan import format_plan

    text = format_plan(build_plan(crossed()))
    assert "session base#0 (server, 4 jobs, window 0, round 0: 2 blocks, rep-0 to rep-1, on GPUs 0)" in text
    assert "session cand#1 (server, 4 jobs, window 1, round 1: 2 blocks, rep-2 to rep-3, on GPUs 0)" in text
    assert "wave" not in text


def test_a_local_server_sees_its_sets_gpus_and_its_groups_own_cache(tmp_path, monkeypatch):
    monkeypatch.setattr("suite.runtime.local.vllm_command", lambda: ["vllm"])
    run = tmp_path / "runs" / "r"
    env = ArmEnv(arm="base", vllm_version="0.26.0")
    seen = {}
    for host in ("cuda", "rocm", "cpu"):
        rt = LocalRuntime(matrix(), tmp_path / ".cache", host=host)
        spec = rt.server_spec(env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "base", 1),
                              log_path=run / "s.log", port=1, redact=[], gpus="1")
        seen[host] = {k: spec.env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
        assert spec.env["VLLM_CACHE_ROOT"] == str((run / "base" / "cache-group-1" / "vllm").resolve())
    assert seen["cuda"]["CUDA_VISIBLE_DEVICES"] == "1" and seen["rocm"]["HIP_VISIBLE_DEVICES"] == "1"
    assert seen["cpu"]["CUDA_VISIBLE_DEVICES"] is None and seen["cpu"]["HIP_VISIBLE_DEVICES"] is None
    assert ArmDirs.in_run(run, "base", 0) == ArmDirs.in_run(run, "base")  # the first group: the arm's cache


def test_a_docker_server_gets_its_sets_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    run = tmp_path / "runs" / "20260101T000000Z-x"
    (run / "base").mkdir(parents=True)
    env = ArmEnv(arm="base", vllm_version="0.26.0", image="suite-vllm:test")
    for vendor in ("cuda", "rocm"):
        m = matrix(kind="docker", extra=f"  docker: {{vendor: {vendor}}}\n")
        spec = DockerRuntime(m, tmp_path / "cache").server_spec(
            env, argv_tail=["m", "--port", "8000"], extra_env={}, dirs=ArmDirs.in_run(run, "base", 1),
            log_path=run / "base" / "server-0.log", port=8000, redact=[], gpus="2,3")
        argv = spec.container.cli_argv()
        if vendor == "cuda":
            assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
            (req,) = spec.container.sdk_kwargs({})["device_requests"]
            assert req["DeviceIDs"] == ["2", "3"]
        else:
            assert "-e HIP_VISIBLE_DEVICES=2,3" in " ".join(argv) and "/dev/kfd" in argv
        assert f"VLLM_CACHE_ROOT={(run / 'base' / 'cache-group-1').resolve()}/vllm" in " ".join(argv)
    with pytest.raises(MatrixError, match="leave runtime.docker.gpus at 'all'"):
        matrix(kind="docker", extra='  docker: {vendor: cuda, gpus: "0"}\n')


def test_the_budget_counts_a_wave_as_one_stretch_of_time(tmp_path: Path):
    """A wave of two sets took 100 s: the next look (2 sets later) is one more wave, not two."""
    spec = VerdictSpec(looks=(4, 6))
    for per_batch, stops in ((2, False), (1, True)):
        seq = SequentialRun(spec, budget_s=250.0, control_arm=None)
        seq.started = time.monotonic() - 100.0
        assert seq.after_round(tmp_path, 2, 2, per_batch=per_batch) is None
        assert (seq.stop_after == 2) is stops  # 100 s so far + one 100 s wave fits 250 s; two would not
