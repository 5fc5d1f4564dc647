"""Rounds at once on groups of GPUs (runtime.gpus, a list of groups): the matrix's rules, the plan's sets and waves,
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
    runtime = f"  gpus: {groups}\n{extra}"
    return parse_matrix(BASE.format(kind=kind, runtime=runtime, looks=looks), "m.yaml")


@pytest.mark.parametrize(("groups", "looks", "extra", "message"), [
    ('["0", "0,1"]', "4, 6", "", "runtime.gpus: GPU 0 is in two groups"),
    ('["0", "x"]', "4, 6", "", "'x' is not a comma list of GPU indices"),
    ('[]', "4, 6", "", "runtime.gpus: an empty list of GPU groups"),
    ('[0, 1]', "4, 6", "", 'runtime.gpus: write each group in quotes, e.g. ["0"]'),
    ('["0", "1"]', "3, 6", "", "runtime.gpus: 2 groups run 2 rounds at a time, so a look can come only after a "
     "whole wave: verdict.looks must be multiples of 2 (not 3), e.g. [4, 6]"),
])
def test_a_matrix_with_gpu_groups_that_cannot_run_says_why_at_its_line(groups, looks, extra, message):
    with pytest.raises(MatrixError) as err:
        matrix(groups, looks, extra=extra)
    assert message in str(err.value) and "m.yaml:5:" in str(err.value)


def test_gpu_groups_need_every_server_of_a_round_together():
    text = BASE.format(kind="local", runtime='  gpus: ["0", "1"]\n', looks="4, 6").replace(
        "order: abba\ntogether: all", "order: abba").replace("blocks: 2\n", "")
    with pytest.raises(MatrixError, match=r'm.yaml:5: runtime.gpus: a list of GPU groups runs rounds at once, each '
                                          r'on its group, only with together: all; for every server on the same GPUs '
                                          r'write one string, e.g. gpus: "0,1"'):
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
    text = BASE.format(kind="local", runtime=f"  gpus: {groups}\n  cross_groups: true\n{extra}", looks=looks)
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
    for gpus in ("", '  gpus: "0,1"\n', '  gpus: ["0,1"]\n'):  # no groups: none, a string, a list of one group
        with pytest.raises(MatrixError, match=r'm.yaml:\d: runtime.cross_groups: crosses the serving arms over GPU '
                                              r'groups: give runtime.gpus as a list of one group per serving arm'):
            parse_matrix(BASE.format(kind="local", runtime=f"{gpus}  cross_groups: true\n", looks="4, 6"), "m.yaml")


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
        m = matrix(kind="docker", extra=f"  vendor: {vendor}\n")
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
    # a container of no round (a tool's): every GPU, as runtime.gpus left out gives
    spec = DockerRuntime(matrix(kind="docker", extra="  vendor: cuda\n"), tmp_path / "cache").server_spec(
        env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "base"), log_path=run / "base" / "s.log",
        port=8000, redact=[])
    assert spec.container.cli_argv()[spec.container.cli_argv().index("--gpus") + 1] == "all"


def test_the_budget_counts_a_wave_as_one_stretch_of_time(tmp_path: Path):
    """A wave of two sets took 100 s: the next look (2 sets later) is one more wave, not two."""
    spec = VerdictSpec(looks=(4, 6))
    for per_batch, stops in ((2, False), (1, True)):
        seq = SequentialRun(spec, budget_s=250.0, control_arm=None)
        seq.started = time.monotonic() - 100.0
        assert seq.after_round(tmp_path, 2, 2, per_batch=per_batch) is None
        assert (seq.stop_after == 2) is stops  # 100 s so far + one 100 s wave fits 250 s; two would not


@pytest.mark.parametrize(("gpus", "groups", "every", "cuda", "rocm"), [
    ("", None, None, "all", None),  # left out: local as inherited, a container every GPU
    ('  gpus: "0,1"\n', None, "0,1", '"device=0,1"', "0,1"),  # a string: every server on these GPUs
    ('  gpus: ["0,1"]\n', None, "0,1", '"device=0,1"', "0,1"),  # a list of one group: that string
    ('  gpus: ["0", "1"]\n', ["0", "1"], None, "all", None),  # groups: each round's servers on its group
])
def test_the_three_forms_of_runtime_gpus_plan_and_serve_as_the_three_fields_did(tmp_path, monkeypatch, gpus, groups,
                                                                                every, cuda, rocm):
    """runtime.gpus replaced runtime.gpus (local), runtime.docker.gpus and runtime.gpu_groups: the same design (the
    manifest's, and the one a stored run's matrix reads back, old field or new), the same sessions' GPUs, the
    same server environment and container flags as each old field gave."""
    from suite.design import Design
    from suite.records import MatrixRecord

    monkeypatch.setattr("suite.runtime.local.vllm_command", lambda: ["vllm"])
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # what a local server inherits when runtime.gpus is left out
    local = parse_matrix(BASE.format(kind="local", runtime=gpus, looks="4, 6"), "m.yaml")
    plan = build_plan(local)
    assert plan.design == Design(order="abba", together=2, all_together=True, blocks=2, looks=(4, 6),
                                 sets_at_once=2 if groups else 1, gpu_groups=groups)
    old = local.model_dump(mode="json")  # a run stored before: runtime.gpu_groups beside a string runtime.gpus
    old["runtime"] = {**old["runtime"], "gpus": every, "gpu_groups": groups}
    for dump in (local.model_dump(mode="json"), old):
        assert MatrixRecord.model_validate(dump).design("abba") == plan.design
    sessions = {(s.arm, s.round): s.gpus for s in plan.sessions if s.needs_server}
    assert sessions == {(a, r): groups[r % 2] if groups else None for a in ("base", "cand") for r in range(6)}
    run = tmp_path / "runs" / "20260101T000000Z-x"
    (run / "base").mkdir(parents=True)
    env = ArmEnv(arm="base", vllm_version="0.26.0", image="suite-vllm:test")
    session = next(s for s in plan.sessions if s.arm == "base" and s.round == 1)
    seen = LocalRuntime(local, tmp_path / ".cache", host="cuda").server_spec(
        env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "base"), log_path=run / "s.log", port=1,
        redact=[], gpus=session.gpus).env.get("CUDA_VISIBLE_DEVICES")
    assert seen == (groups[1] if groups else every or "7")
    for vendor, want in (("cuda", cuda), ("rocm", rocm)):
        m = parse_matrix(BASE.format(kind="docker", runtime=f"{gpus}  vendor: {vendor}\n", looks="4, 6"),
                         "m.yaml")
        assert build_plan(m).design == plan.design
        argv = DockerRuntime(m, tmp_path / "cache").server_spec(
            env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "base"), log_path=run / "s.log",
            port=8000, redact=[], gpus=session.gpus).container.cli_argv()
        if vendor == "cuda":
            assert argv[argv.index("--gpus") + 1] == (f'"device={groups[1]}"' if groups else want)
        else:
            hip = [a for a in argv if a.startswith("HIP_VISIBLE_DEVICES=")]
            assert hip == ([f"HIP_VISIBLE_DEVICES={groups[1]}"] if groups else [f"HIP_VISIBLE_DEVICES={want}"] if want
                           else [])
