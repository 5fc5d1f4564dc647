"""End to end through the CLI: `together: all` on the tiny MoE (CPU), real `vllm serve` processes.

One module-scoped run: the installed vLLM against a 3 ms-per-gate-call slowdown (synthetic-gate-delay), two
rounds of two blocks each, rounds until decided with one look after both sets. Checks what the order
promises: each set a fresh start of every arm holding all the set's blocks, the arms taking turns in a fresh
seeded order per turn, each block's points in the plan's order, one prompt count per set and point for both
arms (points sized by time), the verdict's unit the round (its score the geometric mean of its
paired blocks, recomputed here from the raw JSON), the report saying so, and no process left behind.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import processes_mentioning, run_matrix_once, tiny_cpu_matrix

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
blocks: 2
order_seed: 1
verdict: {metrics: [mean_tpot_ms], looks: [2]}
cooldown_s: 3
"""
POINTS = ("isl64-osl16-c1-t1s", "isl64-osl16-c2-t1s")


@pytest.fixture(scope="module")
def il_run(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("interleaved")
    return run_matrix_once(base, tiny_cpu_matrix("il", tiny_model, BODY, max_num_seqs=2))


def test_the_dry_run_shows_restart_sets_of_blocks(il_run):
    from tests.conftest import run_suite

    matrix, _, _ = il_run
    out = run_suite("run", str(matrix), "--dry-run").stdout
    assert "order abba" in out and "cooldown: 3 s with no server alive before each round after the first" in out
    assert "window 0, round 0: 2 blocks, rep-0 to rep-1" in out and "window 1, round 1: 2 blocks, rep-2 to rep-3" in out


def test_run_completes_with_every_job(il_run):
    _, run_dir, proc = il_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 16 ok, 0 failed, 0 missing" in proc.stdout  # 2 sets x 2 blocks x 2 points x 2 arms
    assert "look after 2 rounds: slowed " in proc.stdout  # after two rounds, not two blocks


def test_each_restart_set_is_a_fresh_start_of_every_arm_holding_all_its_blocks(il_run):
    _, run_dir, _ = il_run
    jobs = [json.loads(f.read_text())["job"] for arm in ("baseline", "slowed")
            for f in (run_dir / arm / "serve").glob("*/rep-*.job.json")]
    assert len(jobs) == 16
    for s in (0, 1):
        for arm in ("baseline", "slowed"):
            assert json.loads((run_dir / arm / f"server-{s}.json").read_text())["healthy_after_s"] > 0
            mine = [j for j in jobs if j["arm"] == arm and j["repeat"] // 2 == s]
            assert {j["session"] for j in mine} == {s}  # the set's blocks ran in the set's own server
            assert sorted((j["repeat"], j["point"]) for j in mine) == sorted(
                (b, p) for b in (2 * s, 2 * s + 1) for p in POINTS)


def test_both_arms_of_a_set_serve_one_prompt_count_per_point(il_run):
    """Points sized by time: the first arm to measure a point in a set sizes it (set 0: from its warm-up; set 1:
    from set 0's measured rates), the other arm serves the same count, in each of the set's blocks."""
    _, run_dir, _ = il_run
    recs = [json.loads(f.read_text()) for arm in ("baseline", "slowed")
            for f in (run_dir / arm / "serve").glob("*/rep-*.job.json")]
    for s in (0, 1):
        for point in POINTS:
            mine = [r for r in recs if r["job"]["point"] == point and r["job"]["repeat"] // 2 == s]
            assert len(mine) == 4 and {r["job"]["arm"] for r in mine} == {"baseline", "slowed"}
            sizes = {json.dumps(r["sized"], sort_keys=True) for r in mine}
            assert len(sizes) == 1, sizes
            size = mine[0]["sized"]
            assert size["round"] == s and size["prompts"] >= 2 * int(point.split("-c")[1].split("-")[0])
            assert ("session's warm-up" if s == 0 else "round 0's runs of the point") in size["basis"]
            for r in mine:  # what the bench client was asked for and what it served
                assert r["command"][r["command"].index("--num-prompts") + 1] == str(size["prompts"])
                raw = json.loads((run_dir / r["job"]["arm"] / "serve" / point / f"rep-{r['job']['repeat']}.json")
                                 .read_text())
                assert raw["completed"] == size["prompts"]


def test_each_block_measures_its_points_in_the_plans_order(il_run):
    """The blocks' point orders come from the plan (a fresh seeded order per block); the run kept them."""
    from suite.matrix_load import load_matrix
    from suite.plan import build_plan

    matrix, run_dir, _ = il_run
    plan = build_plan(load_matrix(matrix))
    for arm in ("baseline", "slowed"):
        planned = [(j.repeat, j.point) for s in plan.sessions if s.arm == arm for j in s.jobs if not j.tag]
        recs = [json.loads(f.read_text()) for f in (run_dir / arm / "serve").glob("*/rep-*.job.json")]
        ran = [(r["job"]["repeat"], r["job"]["point"]) for r in sorted(recs, key=lambda r: (r["started"], r["written"]))]
        assert ran == planned


def test_the_arms_of_an_interleaved_window_take_turns_in_a_fresh_random_order():
    """Each turn holds one job of every arm of the window; under together: all the order is drawn per turn from
    the seed (so both arms go first in some turns), under together: k it is mirrored."""
    from types import SimpleNamespace

    from suite.design import Design
    from suite.sessions import _turn_order

    lives = [SimpleNamespace(session=SimpleNamespace(arm=a, window=3)) for a in ("baseline", "slowed", "x")]
    ctx = SimpleNamespace(plan=SimpleNamespace(design=Design(order="abba", all_together=True, order_seed=1)))
    turns = [[live.session.arm for live in _turn_order(ctx, lives, t)] for t in range(12)]
    assert all(sorted(t) == ["baseline", "slowed", "x"] for t in turns)
    assert {t[0] for t in turns} == {"baseline", "slowed", "x"}
    assert turns == [[live.session.arm for live in _turn_order(ctx, lives, t)] for t in range(12)]  # seeded
    ctx.plan.design = Design(order="abba", together=2)
    assert [live.session.arm for live in _turn_order(ctx, lives, 1)] == ["x", "slowed", "baseline"]


def test_the_verdict_scores_each_restart_set_from_its_blocks(il_run):
    from suite.analysis import load_run

    _, run_dir, _ = il_run
    run = load_run(run_dir)
    (s,) = run.summaries
    assert s.evaluation.composite.n_rounds == 2  # two rounds, not four blocks

    def tpot(arm: str, point: str, block: int) -> float:
        return json.loads((run_dir / arm / "serve" / point / f"rep-{block}.json").read_text())["mean_tpot_ms"]

    sets = [sum(math.log(tpot("baseline", p, b) / tpot("slowed", p, b)) for p in POINTS for b in (2 * r, 2 * r + 1))
            / (2 * len(POINTS)) for r in (0, 1)]
    expected = (math.exp(sum(sets) / 2) - 1) * 100
    assert s.evaluation.composite.estimate_pct == pytest.approx(expected, abs=0.05)


def test_report_states_the_interleaved_order(il_run):
    _, run_dir, _ = il_run
    md = (run_dir / "report.md").read_text()
    assert ("order: abba, together: all: every serving arm's server alive at once, a fresh start per round, 2 blocks "
            "of every point per round") in md
    assert "2 rounds of servers alive at once, each the geometric mean of its 2 blocks, paired by round" in md
    assert ("paired per round (together: all: each round the median of its blocks both arms have; of two, their "
            "geometric mean)") in md
    # the card lists the two set scores its test ran on, recomputed here from the raw JSON (composite of the
    # matrix's metric, mean TPOT: each point's two blocks by their geometric mean, better is +)
    def tpot(arm: str, point: str, block: int) -> float:
        return json.loads((run_dir / arm / "serve" / point / f"rep-{block}.json").read_text())["mean_tpot_ms"]

    sets = [sum(math.log(tpot("baseline", p, b) / tpot("slowed", p, b)) for p in POINTS for b in (2 * r, 2 * r + 1))
            / (2 * len(POINTS)) for r in (0, 1)]
    assert f"each round's score: round 0 {100 * math.expm1(sets[0]):+.1f}%, round 1 {100 * math.expm1(sets[1]):+.1f}%" in md


def test_no_process_is_left(il_run):
    _, run_dir, _ = il_run
    assert processes_mentioning(str(run_dir)) == []


def test_the_cooldown_leaves_the_host_without_a_server_between_rounds(il_run):
    """`cooldown_s: 3`: between round 0's servers' stop and round 1's start, 3 s with no server alive (said on
    the terminal; the gap between the two rounds' jobs holds the servers' stop, the cooldown and the start)."""
    import datetime as dt

    _, run_dir, proc = il_run
    assert proc.stdout.count("cooldown: 3 s with no server alive before round 1") == 1, proc.stdout[-3000:]
    recs = [json.loads(f.read_text()) for arm in ("baseline", "slowed")
            for f in (run_dir / arm / "serve").glob("*/rep-*.job.json")]

    def at(rec: dict) -> float:
        return dt.datetime.fromisoformat(rec["started"]).timestamp()

    last_of_0 = max(at(r) + r["seconds"] for r in recs if r["job"]["repeat"] // 2 == 0)
    first_of_1 = min(at(r) for r in recs if r["job"]["repeat"] // 2 == 1)
    healthy = max(json.loads((run_dir / arm / "server-1.json").read_text())["healthy_after_s"]
                  for arm in ("baseline", "slowed"))
    assert first_of_1 - last_of_0 >= 3 + healthy
    assert json.loads((run_dir / "manifest.json").read_text())["plan"]["design"]["cooldown_s"] == 3
