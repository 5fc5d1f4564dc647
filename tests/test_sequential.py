"""Rounds until decided: looks on stored rounds, the stop when all are decided, the time budget."""

from __future__ import annotations

import pytest

import suite.sequential as sequential
from suite.sequential import SequentialRun, evaluate_look
from suite.verdict import VerdictSpec
from tests.test_report_html import build_run_dir

SPEC = VerdictSpec(looks=(2, 4))


def test_a_look_evaluates_every_candidate_on_the_stored_rounds(tmp_path):
    run = build_run_dir(tmp_path / "run", scale={"patched": 0.5})  # real demo rounds, patched halved
    look = evaluate_look(run, SPEC, rounds=2, final=False)
    assert look.rounds == 2 and set(look.outcomes) == {"patched"}
    assert not look.decided["patched"]  # 2 rounds of this noisy CPU data cannot decide at an interim look
    final = evaluate_look(run, VerdictSpec(looks=(3,)), rounds=3, final=True)
    assert final.decided["patched"] and final.outcomes["patched"] in ("REGRESSION", "INCONCLUSIVE")
    assert final.reasons["patched"].startswith("-")  # the estimate says the candidate got slower


def test_budget_stops_at_the_last_look_that_fits(tmp_path, monkeypatch):
    run = build_run_dir(tmp_path / "run")  # no change: undecided at the first look
    clock = [0.0]
    monkeypatch.setattr(sequential.time, "monotonic", lambda: clock[0])

    roomy = SequentialRun(spec=SPEC, budget_s=900.0)
    clock[0] = 400.0  # round 1 also ran the one-time jobs
    assert roomy.after_round(run, 1, 1) is None  # not a look
    clock[0] = 550.0  # round 2 took 150 s: two more fit (550 + 300 < 900)
    roomy.after_round(run, 2, 2)
    assert roomy.stop_after is None and len(roomy.looks) == 1

    tight = SequentialRun(spec=SPEC, budget_s=800.0)
    clock[0] = 0.0
    tight.started = 0.0
    clock[0] = 400.0
    tight.after_round(run, 1, 1)
    clock[0] = 550.0  # 550 + 2 x 150 > 800: the look at 2 is the last one that fits, and it is final
    look = tight.after_round(run, 2, 2)
    assert tight.stop_after == 2 and "budget" in tight.why and look.final
    assert not tight.needed(2) and tight.needed(1) and tight.needed(None)
    assert SequentialRun.resume(SPEC, None, tight.record()).stop_after == 2


def test_the_first_rounds_one_time_jobs_are_not_expected_again(tmp_path, monkeypatch):
    """The demo side by side on this box (2026-12-02): round 1 took 8.4 min of a 16 min budget, 2.6 min of it
    lm-eval and greedy equivalence of five arms, which no later round runs. Counting them again stopped the run
    after one round with no look; left out, round 2 fits (8.4 + 5.8 < 16)."""
    run = build_run_dir(tmp_path / "run")
    clock = [0.0]
    monkeypatch.setattr(sequential.time, "monotonic", lambda: clock[0])
    counted_twice = SequentialRun(spec=SPEC, budget_s=960.0)
    counted_twice.started = 0.0
    clock[0] = 505.0
    assert counted_twice.after_round(run, 1, 1) is None and counted_twice.stop_after == 1
    left_out = SequentialRun(spec=SPEC, budget_s=960.0)
    left_out.started = 0.0
    assert left_out.after_round(run, 1, 1, one_time_s=155.5) is None and left_out.stop_after is None
    assert left_out.needed(1)


def test_budget_stops_before_a_look_it_cannot_reach(tmp_path, monkeypatch):
    """A GPU stretch: the first round takes most of the budget, so the first look (after 2) cannot be
    reached: the run stops after round 1 instead of running past its budget (seen on the H200: a round of
    four 30-layer server starts is ~14 min against a 19 min budget)."""
    run = build_run_dir(tmp_path / "run")
    clock = [0.0]
    monkeypatch.setattr(sequential.time, "monotonic", lambda: clock[0])
    seq = SequentialRun(spec=SPEC, budget_s=600.0)
    seq.started = 0.0
    clock[0] = 400.0  # 400 + 400 > 600: round 2 would end after the budget
    assert seq.after_round(run, 1, 1) is None
    assert seq.stop_after == 1 and "before the next look (after 2 rounds)" in seq.why and not seq.looks
    assert not seq.needed(1) and seq.needed(0)
    assert seq.record().stop_after == 1


def test_a_correctness_only_arm_does_not_hold_the_run_to_its_last_look(tmp_path):
    from tests.test_report import MATRIX, make_run, scaled
    text = MATRIX.replace('  patched: {vllm: "0.32.0"}',
                          '  patched: {vllm: "0.32.0"}\n  wrong: {vllm: "0.32.0", serving: false}')
    root = make_run(tmp_path, scaled([100, 102, 99, 101], [70, 71, 69.5, 70.5]), order="abba", repeats=4,
                    matrix_text=text)
    seq = SequentialRun(spec=VerdictSpec(looks=(4, 8)), budget_s=None)
    look = seq.after_round(root, 4, 4)
    assert set(look.outcomes) == {"patched"} and look.outcomes["patched"] == "REGRESSION"
    assert seq.stop_after == 4 and "every candidate decided" in seq.why


def test_a_look_records_the_aa_control_but_never_waits_for_it(tmp_path):
    from tests.test_report import AA_MATRIX, aa_values, make_run
    root = make_run(tmp_path, aa_values(1.2), order="abba", repeats=4, matrix_text=AA_MATRIX)
    # Pocock's first boundary: every point of the 20 % slower candidate is confirmed at the look after 4 rounds
    seq = SequentialRun(spec=VerdictSpec(looks=(4, 8), spending="pocock"), budget_s=None)
    look = seq.after_round(root, 4, 4)
    assert set(look.outcomes) == {"patched"} and look.control == "IMPROVEMENT"  # a false alarm, recorded
    assert seq.stop_after == 4 and seq.record().looks[0].control == "IMPROVEMENT"


def test_the_last_look_says_it_is_the_last_not_that_every_candidate_decided(tmp_path):
    """At the last look every test is final (INCONCLUSIVE counts as decided): the stop is the design's end."""
    from tests.test_report import MATRIX, make_run, scaled
    root = make_run(tmp_path, scaled([100, 102, 99, 101], [101, 100, 102, 99]), order="abba", repeats=4,
                    matrix_text=MATRIX)
    seq = SequentialRun(spec=VerdictSpec(looks=(2, 4)), budget_s=None)
    assert seq.after_round(root, 2, 2).final is False and seq.stop_after is None
    look = seq.after_round(root, 4, 4)
    assert look.final and look.outcomes["patched"] == "EQUIVALENT"  # decided, and still the design's end
    assert seq.stop_after == 4 and seq.why == "last look of the design (after 4 rounds)"


def test_the_look_line_says_whether_the_control_raised_a_false_alarm():
    from suite.records import LookRecord
    from suite.runner import look_line

    seq = SequentialRun(spec=VerdictSpec(looks=(2, 4)), budget_s=None)
    look = LookRecord(rounds=2, outcomes={"ll-bf16": "IMPROVEMENT", "slowed-gate": "INCONCLUSIVE"},
                      decided={"ll-bf16": True, "slowed-gate": False}, control="INCONCLUSIVE")
    assert look_line(look, seq) == ("look after 2 rounds: ll-bf16 IMPROVEMENT, slowed-gate INCONCLUSIVE; "
                                    "A/A control: no false alarm (INCONCLUSIVE)")
    alarm = look.model_copy(update={"control": "REGRESSION"})
    seq.stop_after, seq.why = 2, "every candidate decided at look 1 of 2"
    assert look_line(alarm, seq).endswith("A/A control: FALSE ALARM (REGRESSION); stopping: every candidate "
                                          "decided at look 1 of 2")


def test_one_time_seconds_are_the_rounds_correctness_jobs(tmp_path):
    """Through the demo's real plan and the runner's own batches: the correctness-only arm's session is a batch
    of no round (the runner counts its whole wall time as one-time); of round 0's batch, the accuracy and
    equivalence jobs (placed once, at a session's end) are the one-time seconds, the serving points, which every
    round repeats, are not."""
    from types import SimpleNamespace

    from suite import REPO_ROOT
    from suite.matrix_load import load_matrix
    from suite.plan import build_plan
    from suite.runner import batches, one_time_seconds
    from suite.store import RunStore

    plan = build_plan(load_matrix(REPO_ROOT / "matrices" / "smoke-cpu.yaml"))
    store = RunStore.create(tmp_path, plan.matrix)
    first, round0 = batches([(s, list(s.jobs)) for s in plan.sessions], by_round=True)[:2]
    assert [s.arm for s, _ in first] == ["wrong-gate"] and sequential.session_round(first[0][0]) is None
    assert {sequential.session_round(s) for s, _ in round0} == {0}
    for _, jobs in round0:
        for job in jobs:
            store.write_record(job, "ok", seconds=100.0 if job.kind == "serve" else 7.0)
    once = [j.kind for _, jobs in round0 for j in jobs if j.kind != "serve"]
    assert sorted(once) == ["accuracy"] * 4 + ["equivalence"] * 4  # baseline, its A/A copy, two candidates
    assert one_time_seconds(SimpleNamespace(store=store), round0) == 7.0 * 8


def test_aa_alternate_through_the_cli(tmp_path, capsys):
    """`aa: alternate` from the matrix to the report, through the CLI: the dry run lists the A/A arm's sessions in
    rounds 0 and 2 only; a run of that plan (written through the store) reports the control tested on those two
    rounds (the rounds it has), PASSED for two identical arms, and the candidate's test on all four rounds."""
    from suite.analysis import load_run
    from suite.cli import main
    from tests.test_report import AA_MATRIX, aa_values, make_run

    text = AA_MATRIX.replace("aa: true", "aa: alternate") % {"repeats": 4, "order": "abba"}
    (tmp_path / "m.yaml").write_text(text)
    assert main(["run", str(tmp_path / "m.yaml"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    sessions, arm = {}, None
    for line in printed.splitlines():
        if line.strip().startswith("session "):
            arm = line.split()[1].split("#")[0]
        elif arm and line.startswith("    serve/"):
            sessions.setdefault(arm, set()).add(int(line.rsplit("rep-", 1)[1]))
    assert sessions["baseline.aa"] == {0, 2} and sessions["baseline"] == sessions["patched"] == {0, 1, 2, 3}, printed
    root = make_run(tmp_path / "run", aa_values(1.0), order="abba", repeats=4,
                    matrix_text=AA_MATRIX.replace("aa: true", "aa: alternate"))
    run = load_run(root)
    assert sorted(r for p in run.points.values() for r in p.reps["baseline.aa"]) == [0, 0, 2, 2]
    assert run.control is not None and run.control.control_word == "CONTROL PASSED"
    assert run.control.evaluation is not None and run.control.evaluation.composite.rounds == (0, 2)
    assert run.summaries[0].evaluation is not None and run.summaries[0].evaluation.composite.rounds == (0, 1, 2, 3)
    assert main(["report", str(root)]) == 0
    report = (root / "report.md").read_text()
    assert "- **A/A control: baseline.aa vs baseline: CONTROL PASSED**" in report
    assert "(the baseline started again in rounds 0, 2 (aa: alternate))" in report


# ------------------------------------------------------------------------------- the A/A control's own stop


def _look(rounds: int, cand: str, cand_decided: bool, control: str | None, control_decided: bool | None,
          final: bool = False):
    from suite.records import LookRecord
    return LookRecord(rounds=rounds, outcomes={"patched": cand}, decided={"patched": cand_decided}, final=final,
                      control=control, control_decided=control_decided)


def _session(arm: str, rnd: int | None):
    from suite.plan import Session
    return Session(arm=arm, index=0, needs_server=rnd is not None, jobs=[], round=rnd)


def test_the_control_stops_at_the_first_look_that_decides_its_own_test():
    """Constructed looks of a 2/4/6/8 design: the control equivalent at look 1 is decided there (its sessions of
    rounds 2 on are not needed, the other arms' are), keeps that outcome at the later looks without being tested
    again, and never stops the run: the candidate does, at look 3."""
    seq = SequentialRun(spec=VerdictSpec(looks=(2, 4, 6, 8)), budget_s=None, control_arm="baseline.aa")
    assert seq.needed_session(_session("baseline.aa", 5))
    seq.take_look(_look(2, "INCONCLUSIVE", False, "EQUIVALENT", True))
    assert seq.control_after == 2 and seq.stop_after is None
    assert seq.needed_session(_session("baseline.aa", 1)) and not seq.needed_session(_session("baseline.aa", 2))
    assert seq.needed_session(_session("baseline", 2)) and seq.needed_session(_session("patched", 7))
    assert seq.needed_session(_session("baseline.aa", None))  # an offline session has no round to skip
    later = seq.take_look(_look(4, "INCONCLUSIVE", False, None, None))  # the runner does not test it again
    assert later.control == "EQUIVALENT" and later.control_decided and seq.control_after == 2
    seq.take_look(_look(6, "REGRESSION", True, None, None))
    assert seq.stop_after == 6 and seq.why == "every candidate decided at look 3 of 4" and seq.control_after == 2
    assert not seq.needed_session(_session("patched", 6)) and seq.needed_session(_session("patched", 5))
    stored = seq.record()
    assert stored.control_after == 2 and [lk.control for lk in stored.looks] == ["EQUIVALENT"] * 3
    resumed = SequentialRun.resume(seq.spec, None, stored, control_arm="baseline.aa")
    assert resumed.control_after == 2 and not resumed.needed_session(_session("baseline.aa", 3))
    # a resumed run looks again at the rounds it has: one look per round count, the newer one
    again = resumed.take_look(_look(6, "REGRESSION", True, None, None))
    assert [lk.rounds for lk in resumed.record().looks] == [2, 4, 6] and resumed.record().looks[-1] is again


def test_a_failed_control_stops_too_and_an_undecided_one_waits_for_the_runs_stop():
    spec = VerdictSpec(looks=(2, 4, 6, 8))
    failed = SequentialRun(spec=spec, budget_s=None, control_arm="baseline.aa")
    failed.take_look(_look(2, "INCONCLUSIVE", False, "REGRESSION", False))  # not decided: no stop
    assert failed.control_after is None and failed.needed_session(_session("baseline.aa", 2))
    failed.take_look(_look(4, "INCONCLUSIVE", False, "REGRESSION", True))
    assert failed.control_after == 4 and not failed.needed_session(_session("baseline.aa", 4))
    # every candidate decided while the control is not: the run stops; the report tests the control there, final
    waits = SequentialRun(spec=spec, budget_s=None, control_arm="baseline.aa")
    waits.take_look(_look(2, "IMPROVEMENT", True, "INCONCLUSIVE", False))
    assert waits.stop_after == 2 and waits.control_after is None and waits.record().control_after is None
    # no A/A arm: nothing to stop
    plain = SequentialRun(spec=spec, budget_s=None)
    plain.take_look(_look(2, "INCONCLUSIVE", False, None, None))
    assert plain.control_after is None and plain.needed_session(_session("baseline", 3))


def test_a_look_on_stored_rounds_says_whether_the_control_is_decided(tmp_path):
    """Through the report's own analysis: an A/A arm within 1 % of the baseline over 4 rounds is equivalent at
    the design's last look (decided); two rounds at an interim look of 2/4/6/8 are not."""
    from tests.test_report import AA_MATRIX, aa_values, make_run
    root = make_run(tmp_path, aa_values(1.0), order="abba", repeats=4, matrix_text=AA_MATRIX)
    early = evaluate_look(root, VerdictSpec(looks=(2, 4, 6, 8)), rounds=2, final=False)
    assert early.control == "INCONCLUSIVE" and early.control_decided is False
    last = evaluate_look(root, VerdictSpec(looks=(2, 4)), rounds=4, final=True)
    assert last.control == "EQUIVALENT" and last.control_decided is True
    assert evaluate_look(root, SPEC, rounds=4, final=True, control=False).control is None


CONTROL_MATRIX = """\
name: ctrl
model: {id: some/model}
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0"}
serve:
  - {isl: 64, osl: 16, concurrency: 2, num_prompts: 8}
repeats: auto
verdict: {looks: [2, 4, 6]}
"""


def _served(tmp_path, monkeypatch, extra: str):
    """`suite run` through the CLI on the real runner (prepare, execute, its looks and batches, the here
    scheduler's windows), with the servers left out: each session's jobs write their results through the store
    (the A/A arm the baseline's value to 0.001 %, so its own test is equivalent at the first look; the candidate
    ±10 % from round to round, undecided until the last look). Returns the run directory and the (arm, round)
    of every session the runner ran, and which sessions it ran side by side."""
    import suite.runner as runner
    import suite.sessions as sessions
    from suite.cli import main
    from suite.runtime.base import ArmEnv, RuntimeBase
    from suite.store import RunStore, atomic_write_json
    from tests.test_report import raw

    class FakeRuntime(RuntimeBase):  # prepares arms without an overlay; the base's preflight and arm_info
        kind = "local"

        def prepare_arm(self, arm, spec):
            return ArmEnv(arm=arm, vllm_version=spec.vllm)

    ran, windows = [], []
    level = {"baseline": [100, 112, 95, 104, 99, 108, 101, 97, 103, 110, 96, 105],
             "patched": [88, 115, 93, 111, 90, 109, 94, 113, 91, 112, 89, 110]}

    def fake_session(ctx, session, pending, advance):
        ran.append((session.arm, sequential.session_round(session)))
        rnd = sequential.session_round(session)
        for job in pending:
            t = level["baseline" if session.arm == "baseline.aa" else session.arm][job.repeat]
            t *= 1.00001 if session.arm == "baseline.aa" and rnd % 4 in (1, 2) else 1.0
            atomic_write_json(ctx.store.result_path(job), raw(t, 100.0 / t))
            ctx.store.write_record(job, "ok", seconds=1.0)
            advance(job)

    def fake_window(ctx, items, advance):
        windows.append(sorted(s.arm for s, p in items if p))
        for s, p in items:
            fake_session(ctx, s, p, advance)

    monkeypatch.setattr(runner, "make_runtime", lambda matrix, cache_root: FakeRuntime())
    monkeypatch.setattr(sessions, "run_session", fake_session)
    monkeypatch.setattr(sessions, "run_window", fake_window)
    (tmp_path / "m.yaml").write_text(CONTROL_MATRIX + extra)
    assert main(["run", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "runs")]) == 0
    (root,) = (tmp_path / "runs").glob("*-ctrl")
    assert RunStore.open(root).manifest().job_counts.all_ok  # the control's skipped sessions are not missing
    return root, ran, windows


@pytest.mark.parametrize("design, aa_rounds, windows", [
    ("order: abba\naa: true\n", [0, 1], None),
    ("order: abba\naa: alternate\n", [0, 2], None),  # one A/A round at look 1 (untested), two at look 2
    ("order: abba\naa: true\ntogether: 3\n", [0, 1], [3, 3, 2, 2, 2, 2]),  # later windows run without it
    ("order: abba\naa: true\ntogether: 2\n", [0, 1], None),
    ("order: abba\ntogether: all\nblocks: 2\naa: true\n", [0, 1], [3, 3, 2, 2, 2, 2]),
])
def test_the_runner_skips_the_sessions_of_a_decided_control(tmp_path, monkeypatch, design, aa_rounds, windows):
    from suite.analysis import load_run

    root, ran, seen = _served(tmp_path, monkeypatch, design)
    run = load_run(root)
    seq = run.manifest.sequential
    assert sorted(r for a, r in ran if a == "baseline.aa") == aa_rounds, ran
    for arm in ("baseline", "patched"):  # the other arms run every round to the run's stop (the last look)
        assert sorted(r for a, r in ran if a == arm) == list(range(6)), ran
    assert seq.stop_after == 6 and seq.looks[-1].final
    if windows is not None:
        assert [len(w) for w in seen] == windows, seen
    # the run's look k; under aa: alternate the control's own design has looks at 2 and 3 of its rounds (0, 2, 4)
    k, after, its, own = (2, 4, "0, 2", "1 of 2") if "alternate" in design else (1, 2, "0, 1", "1 of 3")
    assert seq.control_after == after and seq.looks[k - 1].control == "EQUIVALENT" and seq.looks[k - 1].control_decided
    assert [lk.control for lk in seq.looks] == ["INCONCLUSIVE"] * (k - 1) + ["EQUIVALENT"] * (4 - k)
    assert not any(lk.control_decided for lk in seq.looks[:k - 1])
    assert run.control is not None and run.control.control_word == "CONTROL PASSED"
    c = run.control.evaluation.composite
    assert f"{c.look} of {c.n_looks}" == own and run.control.decided_after == after
    report = (root / "report.md").read_text()
    unit = "rounds"  # one unit in every design
    assert (f"its own sequential test decided at its look {own}, after {after} {unit} of the run (the A/A arm's "
            f"{unit} {its}): the A/A arm's sessions of later {unit} were not run") in report
    assert "(2.7–5.8 % of runs of the default design with the control's own sequential stop, simulated" in report
    assert ("started again in rounds 0, 2 (aa: alternate)" if "alternate" in design
            else f"started again in every {unit.removesuffix('s')}") in report
