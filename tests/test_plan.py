from __future__ import annotations

import pytest

from suite.design import round_order
from suite.matrix_load import parse_matrix
from suite.plan import build_plan, format_plan
from tests.conftest import REPO

BASE = """\
name: t
model: {id: some/model}
arms:
  A: {vllm: "0.32.0"}
  B: {vllm: "0.32.0", patches: [x]}
serve:
  - {isl: 64, osl: 16, concurrency: [1, 2], num_prompts: 4}
"""


def plan_of(extra: str = ""):
    return build_plan(parse_matrix(BASE + extra))


def test_blocked_one_server_per_arm_repeats_inside():
    plan = plan_of("repeats: 2\n")
    assert [(s.arm, s.index) for s in plan.sessions] == [("A", 0), ("B", 0)]
    keys = [j.key for j in plan.sessions[0].jobs]
    assert keys == ["serve/isl64-osl16-c1-n4/rep-0", "serve/isl64-osl16-c2-n4/rep-0",
                    "serve/isl64-osl16-c1-n4/rep-1", "serve/isl64-osl16-c2-n4/rep-1"]


def test_abba_runs_every_round_with_fresh_servers_in_a_seeded_random_order():
    plan = plan_of("repeats: 4\norder: abba\n")
    rounds = [[s.arm for s in plan.sessions if s.jobs[0].repeat == r] for r in range(4)]
    assert all(sorted(order) == ["A", "B"] for order in rounds)  # one fresh server per arm per round
    assert [s.index for s in plan.sessions if s.arm == "A"] == [0, 1, 2, 3]
    assert plan_of("repeats: 4\norder: abba\n").sessions == plan.sessions  # seeded: the same plan every time
    assert {j.repeat for j in plan.sessions[2].jobs} == {1}


def test_abba_orders_are_fresh_permutations_per_round_from_the_order_seed():
    """A fixed order or rotation lines up with periodic drift (docs/statistics.md): every round draws its own
    order; another order_seed draws other orders; the job hashes do not depend on the order (a run resumes)."""

    arms = ["A", "A.aa", "C", "B"]
    orders = [tuple(round_order(arms, r, seed=0)) for r in range(40)]
    assert all(sorted(o) == sorted(arms) for o in orders)
    assert len(set(orders)) > 10  # not a cycle of a few orders
    firsts = {o[0] for o in orders} | {o[-1] for o in orders}
    assert firsts == set(arms)  # every arm comes first and last at some round
    assert [tuple(round_order(arms, r, seed=1)) for r in range(40)] != orders
    extra = 'aa: true\norder: abba\nrepeats: 4\n'
    matrix = BASE.replace("  B: {", "  C: {vllm: \"0.32.0\", patches: [y]}\n  B: {") + extra
    a, b = build_plan(parse_matrix(matrix)), build_plan(parse_matrix(matrix + "order_seed: 3\n"))
    assert [s.arm for s in a.sessions] != [s.arm for s in b.sessions]
    assert {(j.arm, j.key, j.hash) for j in a.jobs} == {(j.arm, j.key, j.hash) for j in b.jobs}
    rounds = [[s.arm for s in a.sessions if s.jobs[0].repeat == r] for r in range(4)]
    assert rounds == [round_order(["A", "A.aa", "C", "B"], r, 0) for r in range(4)]


def test_a_correctness_only_arm_runs_once_first_and_the_serving_arms_in_random_order():
    matrix = BASE.replace("  B: {", "  W: {vllm: \"0.32.0\", patches: [y], serving: false}\n  C: {vllm: \"0.32.0\"}\n  B: {")
    plan = build_plan(parse_matrix(matrix + "order: abba\nrepeats: 4\naccuracy: {lm_eval_args: [--limit, \"10\"]}\n"))
    assert (plan.sessions[0].arm, len([s for s in plan.sessions if s.arm == "W"])) == ("W", 1)
    rounds = [[s.arm for s in plan.sessions[1:] if s.jobs[0].repeat == r] for r in range(4)]
    assert all(sorted(order) == ["A", "B", "C"] for order in rounds)


def test_aa_arm_and_drift_check():
    plan = plan_of("aa: true\ndrift_check: true\n")
    assert list(plan.arms) == ["A", "A.aa", "B"]
    assert plan.arms["A.aa"] == plan.arms["A"]
    last = plan.sessions[0].jobs[-1]
    assert last.tag == "drift" and last.point == "isl64-osl16-c1-n4"


def test_aa_alternate_runs_the_control_in_even_rounds_only():
    """`aa: alternate`: the A/A arm's sessions in rounds 0, 2, 4 only; every other arm's sessions, their order
    within each round and every job's hash are those of `aa: true` (the A/A arm simply left out of odd rounds),
    under ABBA, side by side and blocked."""
    for extra in ("order: abba\nrepeats: 6\n", "order: abba\nrepeats: 6\ntogether: 2\n"):
        every, alt = plan_of("aa: true\n" + extra), plan_of("aa: alternate\n" + extra)
        rounds = {r: [s.arm for s in alt.sessions if s.jobs[0].repeat == r] for r in range(6)}
        assert all(("A.aa" in arms) == (r % 2 == 0) for r, arms in rounds.items()), rounds
        for r in range(6):
            full = [s.arm for s in every.sessions if s.jobs[0].repeat == r]
            assert rounds[r] == [a for a in full if r % 2 == 0 or a != "A.aa"]
        assert {(j.arm, j.key, j.hash) for j in alt.jobs} < {(j.arm, j.key, j.hash) for j in every.jobs}
        assert len(alt.sessions) == len(every.sessions) - 3
    blocked = plan_of("aa: alternate\nrepeats: 4\n")
    aa = next(s for s in blocked.sessions if s.arm == "A.aa")
    assert sorted({j.repeat for j in aa.jobs}) == [0, 2]
    assert sorted({j.repeat for s in blocked.sessions if s.arm == "A" for j in s.jobs}) == [0, 1, 2, 3]


def test_job_hash_is_stable_and_follows_the_arm():
    a, b = plan_of(), plan_of()
    assert [j.hash for j in a.jobs] == [j.hash for j in b.jobs]
    changed = build_plan(parse_matrix(BASE.replace("patches: [x]", "patches: [y]")))
    ha = {(j.arm, j.key): j.hash for j in a.jobs}
    hc = {(j.arm, j.key): j.hash for j in changed.jobs}
    assert all(ha[k] == hc[k] for k in ha if k[0] == "A")
    assert all(ha[k] != hc[k] for k in ha if k[0] == "B")


def test_accuracy_jobs_follow_serving_in_the_first_session():
    plan = plan_of("repeats: 2\norder: abba\naccuracy: {lm_eval_args: [--limit, \"10\"]}\n")
    kinds = [j.kind for j in plan.sessions[0].jobs]
    assert kinds == ["serve", "serve", "equivalence", "accuracy"]
    assert all(j.kind == "serve" for j in plan.sessions[2].jobs)


def test_format_plan_lists_every_job():
    plan = plan_of("repeats: 2\n")
    text = format_plan(plan)
    assert "2 sessions, 8 jobs, order blocked" in text and "  design: blocked: one server per arm for the whole run" in text
    assert "design: abba, together: all (every serving arm's server of a round started at once, 2 blocks of every " \
        "point)" in format_plan(plan_of("repeats: 2\norder: abba\ntogether: all\nblocks: 2\n"))
    assert "arm B: vLLM 0.32.0; patches: x" in text
    assert text.count("serve/isl64") == 8


def test_side_by_side_puts_each_round_in_seeded_random_windows():
    extra = "aa: true\norder: abba\nrepeats: 6\ntogether: 2\norder_seed: 7\n"
    matrix = BASE.replace("  B: {", "  C: {vllm: \"0.32.0\", patches: [y]}\n  B: {") + extra
    plan = build_plan(parse_matrix(matrix))
    assert plan == build_plan(parse_matrix(matrix))  # seeded: the same plan on every machine and run
    windows: dict[int, list[tuple[str, int]]] = {}
    for s in plan.sessions:
        windows.setdefault(s.window, []).append((s.arm, s.jobs[0].repeat))
    assert sorted(windows) == list(range(12)) and all(len(w) == 2 for w in windows.values())
    for r in range(6):  # every arm once per round, its round's two windows next to each other
        in_round = [w for w, members in windows.items() if {rep for _, rep in members} == {r}]
        assert len(in_round) == 2 and in_round[1] == in_round[0] + 1
        assert sorted(arm for w in in_round for arm, _ in windows[w]) == ["A", "A.aa", "B", "C"]
    orders = {tuple(arm for w in sorted(windows) for arm, rep in windows[w] if rep == r) for r in range(6)}
    assert len(orders) > 3  # a fresh order per round, not a fixed rotation
    other = build_plan(parse_matrix(matrix.replace("order_seed: 7", "order_seed: 8")))
    assert [s.arm for s in other.sessions] != [s.arm for s in plan.sessions]
    assert {j.hash for j in other.jobs} == {j.hash for j in plan.jobs}  # the order is not part of what a job is
    assert "window 0" in format_plan(plan)
    assert all(s.window is None for s in plan_of("order: abba\nrepeats: 2\n").sessions)


def test_dry_run_lines_are_shell_quoted(tmp_path):
    """A user copies the dry run's command lines into a shell: an argument or env value is one quoted word,
    never a command substitution that runs."""
    from suite.runner import dry_run

    matrix = tmp_path / "m.yaml"
    matrix.write_text(BASE.replace("patches: [x]", "patches: [synthetic-gate-delay]").replace(
        "serve:", 'serve_args: [--compilation-config, \'{"a": "$(touch x)"}\']\nenv: {NOTE: "$(touch y)"}\nserve:'))
    text = dry_run(matrix)
    server = next(line for line in text.splitlines() if "[A] server:" in line)
    assert "--compilation-config '{\"a\": \"$(touch x)\"}'" in server
    assert "NOTE='$(touch y)'" in server
    assert "[isl64-osl16-c1-n4] client: vllm bench serve" in text


def test_every_job_kind_has_its_place_in_the_kinds_table():
    """Each stage package declares its kinds twice, in its own package: spec.py (what the plan knows) and
    stage.py (how a job runs and reads). suite.stages.kinds (job order) and suite.stages.registry (report order)
    each list every stage package, and a package's two halves name the same kinds, so a stage left out of
    one list, or a kind declared in one half only, fails here, not in a run. The Job model's kind literal and
    params union are derived from the kinds."""
    from pathlib import Path
    from typing import get_args

    import pydantic

    from suite.plan import KINDS, PARAMS, Job, JobKind, JobParams
    from suite.stages import kinds, registry
    from suite.stages.latency.spec import LatencyParams
    from suite.stages.probe.spec import ProbeParams
    from suite.stages.registry import STAGES

    def package(module) -> str:
        return module.__name__.split(".")[-2]

    on_disk = {p.parent.name for p in (Path(registry.__file__).parent).glob("*/__init__.py")}
    assert sorted(map(package, kinds.SPECS)) == sorted(map(package, registry.STAGES_BY_PACKAGE)) == sorted(on_disk)
    halves = {package(m): [s.kind for s in m.STAGES] for m in registry.STAGES_BY_PACKAGE}
    assert {package(m): [k.kind for k in m.KINDS] for m in kinds.SPECS} == halves
    assert len(KINDS) == sum(len(m.KINDS) for m in kinds.SPECS)  # no kind declared by two packages
    assert len(STAGES) == len(KINDS) and all(STAGES[k].kind == k for k in KINDS)
    assert get_args(JobKind) == tuple(KINDS)
    assert set(KINDS) == set(STAGES)
    assert set(get_args(JobParams)) == {spec.params for spec in KINDS.values()}
    assert PARAMS == {kind: spec.params for kind, spec in KINDS.items()}

    fields = dict(arm="A", session=0, point="p", hash="0" * 16)
    assert Job(kind="probe", params={}, **fields).params == ProbeParams()
    with pytest.raises(pydantic.ValidationError, match="kind"):  # a kind not in KINDS
        Job(kind="nope", params={}, **fields)
    latency = LatencyParams(input_len=8, output_len=4, batch_size=1, num_iters_warmup=1, num_iters=2)
    with pytest.raises(pydantic.ValidationError, match="a probe job takes ProbeParams, not LatencyParams"):
        Job(kind="probe", params=latency, **fields)  # another kind's params
    with pytest.raises(pydantic.ValidationError):  # another kind's params, as a mapping (a record read back)
        Job(kind="probe", params=latency.model_dump(), **fields)


def test_repeats_run_every_offline_job_once_per_arm_per_round_in_a_random_order():
    """Each `vllm bench latency` job is an engine start: `repeats` puts the starts in rounds, as it does the
    serving points, each round every arm once, the arms in a fresh random order (their own stream, not the
    serving rounds'); under repeats: auto, as many rounds as the first look."""
    extra = ("latency:\n  - {input_len: 8, output_len: 4, batch_size: [1, 4],\n"
             "     bench_args: [--num-iters-warmup, '1', --num-iters, '2']}\n"
             "kernel: {m: [1], bench_args: [--trace-m, '8']}\n")
    once = plan_of(extra)
    offline = [s for s in once.sessions if not s.needs_server]
    assert [(s.arm, s.index) for s in offline] == [("A", 1), ("B", 1)]  # as before: one session per arm

    plan = plan_of(extra + "repeats: 6\n")
    offline = [s for s in plan.sessions if not s.needs_server]
    assert len(offline) == 12 and all(not s.needs_server for s in plan.sessions[2:])  # after the servers
    auto = plan_of(extra + "repeats: auto\norder: abba\nverdict: {looks: [3, 5]}\n")
    assert {j.repeat for j in auto.jobs if j.kind == "latency"} == {0, 1, 2}  # the first look's three rounds
    rounds = [[s.arm for s in offline[2 * r:2 * r + 2]] for r in range(6)]
    assert all(sorted(order) == ["A", "B"] for order in rounds) and len({tuple(o) for o in rounds}) == 2
    for r, (first, second) in enumerate(zip(offline[::2], offline[1::2], strict=True)):
        assert {j.repeat for j in first.jobs + second.jobs} == {r}
        assert [j.key for j in first.jobs] == [f"latency/in8-out4-bs1/rep-{r}", f"latency/in8-out4-bs4/rep-{r}",
                                               f"kernel/gate/rep-{r}"]
    # the same job in another round hashes alike (the params, not the round): round 0 is the single run's job
    hashes = {(j.arm, j.point): set() for j in plan.jobs if j.kind == "latency"}
    for j in plan.jobs:
        if j.kind == "latency":
            hashes[(j.arm, j.point)].add(j.hash)
    assert all(len(h) == 1 for h in hashes.values())
    assert [j.key for s in once.sessions for j in s.jobs if j.kind == "latency"][0] == "latency/in8-out4-bs1/rep-0"


def block_points(plan, block: int) -> list[str]:
    """The points of one block in the order its first session measures them."""
    session = next(s for s in plan.sessions if any(j.repeat == block for j in s.jobs))
    return [j.point for j in session.jobs if j.repeat == block and not j.tag]


def test_interleaved_blocks_take_their_points_in_a_fresh_order_each():
    """A fixed order inside every block put concurrency 1 after concurrency 8 in all but the first block, where
    every server's first 0.4-0.7 s ran at half speed: each block now draws its own seeded order of the points, the
    same for every arm (the arms take turns job by job, so a turn is one point on every arm); the drift repeat
    measures the session's first point again."""
    four = BASE.replace("[1, 2]", "[1, 2, 4, 8]") + "repeats: 3\norder: abba\ntogether: all\nblocks: 4\ndrift_check: true\n"
    plan = build_plan(parse_matrix(four))
    orders = {tuple(block_points(plan, b)) for b in range(12)}
    assert len(orders) > 3 and all(sorted(o) == sorted(next(iter(orders))) for o in orders)
    assert build_plan(parse_matrix(four)).sessions == plan.sessions  # seeded: the same plan every time
    assert build_plan(parse_matrix(four + "order_seed: 1\n")).sessions != plan.sessions
    for s in plan.sessions:
        measured = [j for j in s.jobs if not j.tag]
        for b in {j.repeat for j in measured}:
            assert [j.point for j in measured if j.repeat == b] == block_points(plan, b)
        assert s.jobs[-1].tag == "drift" and (s.jobs[-1].point, s.jobs[-1].repeat) == (
            measured[0].point, measured[0].repeat)
    abba = build_plan(parse_matrix(four.replace("order: abba\ntogether: all\nblocks: 4", "order: abba")))
    assert [j.point for j in abba.sessions[0].jobs if not j.tag] == [f"isl64-osl16-c{c}-n4" for c in (1, 2, 4, 8)]


def test_together_all_one_window_of_every_arm_per_round_holding_its_blocks():
    """`together: all`: a window per round holding a session of every serving arm, in the round's seeded random
    order; each session measures the round's blocks (job repeat = the block over the run), block by block; the
    session's round is the round, so looks count rounds, not blocks. aa: alternate keeps the A/A arm out of odd
    rounds; the job hashes are those of one-at-a-time ABBA's jobs. A together: k that holds every serving arm is
    together: all."""
    from suite.sequential import planned_rounds, session_round

    plan = plan_of("repeats: 3\norder: abba\ntogether: all\nblocks: 2\naa: alternate\n")
    assert plan.order == "abba" and plan.design.all_together and plan.design.blocks == 2
    assert plan_of("repeats: 3\norder: abba\ntogether: 3\nblocks: 2\naa: alternate\n").sessions == plan.sessions
    for r in range(3):
        window = [s for s in plan.sessions if s.window == r]
        want = ["A", "A.aa", "B"] if r % 2 == 0 else ["A", "B"]
        assert sorted(s.arm for s in window) == want
        assert [s.arm for s in window] == [a for a in round_order(["A", "A.aa", "B"], r) if a in want]
        for s in window:
            assert session_round(s) == r
            assert [j.repeat for j in s.jobs] == [2 * r] * 2 + [2 * r + 1] * 2  # block by block
            for b in (2 * r, 2 * r + 1):  # every point once a block, in the block's order, the same on every arm
                assert [j.point for j in s.jobs if j.repeat == b] == block_points(plan, b)
    assert planned_rounds(plan) == [0, 1, 2]
    abba = {(j.arm, j.point): j.hash for j in plan_of("repeats: 3\norder: abba\naa: alternate\n").jobs}
    assert all(abba[(j.arm, j.point)] == j.hash for j in plan.jobs)


@pytest.mark.parametrize("path", sorted((REPO / "matrices").glob("*.yaml")), ids=lambda p: p.name)
def test_the_design_is_computed_once_and_an_old_runs_record_implies_the_same(path, monkeypatch):
    """The plan's Design is what the manifest records; a run recorded before it carried one gets the same design
    from its matrix record, so old and new runs are read alike."""
    from suite.matrix_load import load_matrix
    from suite.plan import design_of
    from suite.records import MatrixRecord, PlanRecord

    monkeypatch.setenv("SUITE_VLLM_VERSION", "0.33.0")
    m = load_matrix(path)
    plan = build_plan(m)
    assert plan.design == design_of(m) and PlanRecord.of(plan).design == plan.design
    assert MatrixRecord.model_validate(m.model_dump(mode="json")).design(m.order) == plan.design
    assert plan.design.unit == "round"
