"""The report a user reads (report.md), on hand-made raw results and on the CPU demo's real ones: the verdict
card's word and Δ with its interval, arrows that never contradict their Δ, unreliable cells that say why,
mean ITL not counted twice, pairing by round index, failures listed. Every number is recomputed here."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from suite.analysis import load_run
from suite.document import STYLES, fmt
from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.records import PlanRecord, Stretch, new_manifest
from suite.report import build_report, render_html, render_markdown
from suite.stats import DETAIL, HEADLINE
from suite.store import RunStore, atomic_write_json
from tests.test_report_html import build_run_dir

MATRIX = """\
name: rep
model: {id: some/model}
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0"}
serve:
  - {isl: 64, osl: 16, concurrency: [2, 4], num_prompts: 8}
repeats: %(repeats)d
order: %(order)s
"""
LATENCIES = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")]


def raw(tput: float, lat: float | dict[str, float], completed: int = 8) -> dict:
    lats = lat if isinstance(lat, dict) else dict.fromkeys(LATENCIES, lat)
    return lats | {"output_throughput": tput, "completed": completed, "failed": 0, "duration": 1.0,
                   "latencies": [0.5] * completed}


def make_run(tmp_path: Path, values, *, order: str = "blocked", repeats: int = 3, fail_job: str | None = None,
             skip: frozenset[tuple[str, str]] = frozenset(), matrix_text: str = MATRIX, where=None) -> Path:
    """A run directory written through the store. ``values(arm, concurrency, repeat) -> (tput, latency)``;
    ``skip``: (arm, job key) never measured (a lost repeat); ``fail_job``: the patched arm's job that failed;
    ``where(arm, concurrency, repeat) -> HostIdentity``: the machine each job's record names (None: none)."""
    matrix = parse_matrix(matrix_text % {"repeats": repeats, "order": order})
    plan = build_plan(matrix)
    store = RunStore.create(tmp_path, matrix.name)
    store.write_manifest(new_manifest("m.yaml", matrix.model_dump(mode="json"), PlanRecord.of(plan)))
    for job in plan.jobs:
        if (job.arm, job.key) in skip:
            continue
        if job.key == fail_job and job.arm == "patched":
            store.write_record(job, "failed", error="boom: server died")
            continue
        tput, lat = values(job.arm, job.params.concurrency, job.repeat)
        atomic_write_json(store.result_path(job), raw(tput, lat))
        store.write_record(job, "ok", **({"where": where(job.arm, job.params.concurrency, job.repeat)} if where else {}))
    return store.root


def scaled(base: list[float], cand: list[float]):
    """Throughput per repeat; every latency moves the other way (100 / throughput)."""
    def values(arm: str, conc: int, r: int):
        t = (base if arm == "baseline" else cand)[r]
        return t, 100.0 / t
    return values


def gm(xs: list[float]) -> float:
    return math.exp(statistics.fmean(map(math.log, xs)))


# ---------------------------------------------------------------------------------------- parsing what users read

NUM = r"-?[\d,]*\.?\d+"
MOVE = re.compile(rf"({NUM}) → ({NUM}) \(([+-]\d+(?:\.\d+)?)%")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def arrow_rows(text: str) -> list[tuple[float, float, float]]:
    """Every ``before → after (Δ%`` in the text, and every Before | After | Δ% row of a statistics table."""
    rows = [(_num(a), _num(b), float(d)) for a, b, d in MOVE.findall(text)]
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(NUM, cells[1]) and re.fullmatch(NUM, cells[2]) \
                and re.fullmatch(r"[+-]\d+\.\d%", cells[3]):
            rows.append((_num(cells[1]), _num(cells[2]), float(cells[3][:-1])))
    return rows


def card_of(text: str, title: str = "") -> str:
    """One card of the Verdict section (the first, or the one whose title starts with ``title``): its first line,
    its per-point table and its lines, up to the next card or the legend."""
    verdict = text.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    cards = re.split(r"\n(?=- \*\*)|\n\n(?=[A-Z])", verdict)
    return next(c.strip("\n") for c in cards if c.lstrip("\n").startswith("- **" + title))


def assert_arrows_agree(text: str) -> int:
    """No before → after may point one way while its Δ points the other (rounded displays may tie)."""
    rows = arrow_rows(text)
    for before, after, delta in rows:
        if before == after or round(delta, 1) == 0:
            continue
        assert (after > before) == (delta > 0), (before, after, delta)
    return len(rows)


# ------------------------------------------------------------------------------------------------- tests


def test_clear_improvement_card_and_cells_match_raw(tmp_path):
    base, cand = [100, 101, 99], [120, 121, 119]
    root = make_run(tmp_path, scaled(base, cand))
    text = build_report(root).read_text()
    assert "- **patched vs baseline: IMPROVEMENT** — better at c2, c4 · composite +" in text
    # before → after: the geometric means of the repeats, Δ their ratio, the interval printed beside it
    delta = (gm(cand) / gm(base) - 1) * 100
    row = next(line for line in text.splitlines() if line.startswith("| 64 | 16 | 2 | 8 |"))
    assert f"| {fmt(gm(base))} → {fmt(gm(cand))} ({delta:+.1f}% [" in row and "]) ▲ |" in row
    assert "| 24/24 | 0/0 |" in row  # completed/failed summed over repeats, baseline/patched
    run = load_run(root)
    assert len(run.points) == 2 and [len(v) for v in run.points["isl64-osl16-c2-n8"].reps.values()] == [3, 3]
    assert assert_arrows_agree(text) >= 2 * len(HEADLINE) + 2 * len(DETAIL)


def test_each_repeats_measured_duration_is_shown_and_a_timed_point_says_its_time(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [100, 100, 100]))
    for r, d in enumerate((0.8, 1.0, 1.3)):  # the baseline's repeats at concurrency 2 measured 0.8, 1.0, 1.3 s
        f = root / "baseline" / "serve" / "isl64-osl16-c2-n8" / f"rep-{r}.json"
        f.write_text(json.dumps(json.loads(f.read_text()) | {"duration": d}))
    row = next(line for line in build_report(root).read_text().splitlines() if line.startswith("| 64 | 16 | 2 | 8 |"))
    assert row.endswith("| 0.8–1.3 / 1.0 | 24/24 | 0/0 |"), row
    timed = MATRIX.replace("num_prompts: 8}", "num_prompts: 2.5s}")
    root = make_run(tmp_path / "timed", scaled([100, 101, 99], [100, 100, 100]), matrix_text=timed)
    text = build_report(root).read_text()
    assert any(line.startswith("| 64 | 16 | 2 | 2.5 s |") for line in text.splitlines()), text


def test_regression_card_has_interval_mde_rounds_and_where(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [80, 81, 79]))
    text = build_report(root).read_text()
    card = card_of(text)
    first = card.splitlines()[0]
    m = re.fullmatch(r"- \*\*patched vs baseline: REGRESSION\*\* — worse at c2, c4 · composite (-\d+\.\d)% "
                     r"\[(-\d+\.\d), (-\d+\.\d)\]", first)
    assert m, first
    est, lo, hi = map(float, m.groups())
    assert lo < est < hi < 0
    assert "3 rounds paired by round index" in card and "smallest change it could detect: ±" in card
    # where it changed: each point's row, its first metric and the others confirmed there
    assert ("| c2 | 100.00 → 80.00 | -20.0% [-22.6, -17.3] | worse (Mean TTFT +25.0%, Mean TPOT +25.0%, Mean E2E "
            "latency +25.0%) |") in card
    # the other cells, Holm among themselves: how many, and where (their numbers once, in Statistics per point)
    (s,) = load_run(root).summaries
    assert len(s.regressions) == 24
    others = re.search(r"the other cells \(.*?\): (\d+) worse \((c2: Median TTFT, .*?); c4: (.*?)\), 0 better", card)
    assert others and int(others[1]) == 24 - 8, card  # 24 worse, 8 of them the tested ones (4 metrics, 2 points)
    assert others[2].count(", ") == others[3].count(", ") == 7  # the other eight metrics at each point
    assert "Median TTFT -" not in card and "Median TTFT +" not in card
    assert "1.00 → 1.25 (+25.0% [" in text  # mean TTFT went up: worse
    assert "POSSIBLE" not in text
    assert_arrows_agree(text)


def test_noise_is_inconclusive_with_the_change_it_could_detect(tmp_path):
    root = make_run(tmp_path, scaled([100, 130, 80], [110, 85, 125]))
    text = build_report(root).read_text()
    assert "**patched vs baseline: INCONCLUSIVE**" in text and "could detect" in text
    rows = [line for line in text.split("## Serving")[1].split("## Metrics")[0].splitlines() if line.startswith("| 64")]
    assert len(rows) == 2 and not any("▲" in r or "▼" in r for r in rows)
    assert_arrows_agree(text)


def test_tight_equal_arms_are_equivalent(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99.5], [100.2, 100.9, 99.6]))
    text = build_report(root).read_text()
    assert "**patched vs baseline: EQUIVALENT**" in text and "inside ±5 %" in text


def test_mixed_when_one_metric_is_confirmed_better_and_another_worse(tmp_path):
    def values(arm: str, conc: int, r: int):
        if arm == "baseline":
            jitter = (1.0, 1.01, 0.99, 1.005, 0.995, 1.0)[r]
            return 100 * jitter, 10.0 * jitter
        jitter = (0.995, 1.0, 1.01, 0.99, 1.005, 1.0)[r]
        lat = dict.fromkeys(LATENCIES, 10.0 * jitter) | {k: 14.0 * jitter for k in LATENCIES if "tpot" in k}
        return 140 * jitter, lat
    root = make_run(tmp_path, values, repeats=6)
    text = build_report(root).read_text()
    assert "**patched vs baseline: MIXED**" in text
    assert "| c2 | 100.00 → 140.0 | +40.0% [+35.6, +44.5] | better and worse (Output throughput better +40.0%, Mean TPOT worse +40.0%) |" in text


def test_every_verdict_word_has_its_own_style_in_html(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [80, 81, 79]))
    page = render_html(load_run(root))
    assert "class='card ov-regression'" in page
    style = page.split("<style>")[1].split("</style>")[0]
    for key in STYLES:
        assert f".card.ov-{key}{{border-left-color:" in style, key
        assert f"td.v-{key},th.v-{key}{{background:" in style, key


def test_unreliable_cell_says_why_and_shows_no_absurd_interval(tmp_path):
    # two repeats a factor 30 apart: an interval spanning more than ×/÷ 2 is not shown as numbers
    root = make_run(tmp_path, scaled([100, 3000, 100], [100, 100, 3000]))
    text = build_report(root).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 64 | 16 | 2 | 8 |"))
    assert "? unreliable: " in row and "too wide to show" in row
    for lo, hi in re.findall(r"\[([+-]\d+\.\d), ([+-]\d+\.\d)\]", text):
        assert -100 < float(lo) and float(hi) < 1e4  # no interval like +13,885,244 %
    assert_arrows_agree(text)


def test_mean_itl_is_not_counted_twice(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [80, 81, 79]))
    run = load_run(root)
    assert "mean_itl_ms" not in HEADLINE and "mean_itl_ms" not in DETAIL
    assert "median_itl_ms" in DETAIL and "p99_itl_ms" in DETAIL
    (s,) = run.summaries
    assert sum(s.counts.values()) == 2 * len(DETAIL) == 24
    text = render_markdown(run)
    stats = text.split("## Statistics per point")[1]
    assert "| Median ITL (ms) |" in stats and "| P99 ITL (ms) |" in stats and "| Mean ITL" not in stats


def test_pairing_by_round_index_drops_a_lost_round_from_both_sides(tmp_path):
    """ABBA: round 1 of the candidate is lost at one point. Pairing by list position would pair the
    candidate's round 2 with the baseline's round 1; by round index round 1 is dropped from both sides."""
    base = [100, 200, 100, 200]  # alternating sessions: only pairing by round cancels this
    cand = [110, 220, 110, 220]
    root = make_run(tmp_path, scaled(base, cand), order="abba", repeats=4,
                    skip=frozenset({("patched", "serve/isl64-osl16-c2-n8/rep-1")}))
    run = load_run(root)
    (s,) = run.summaries
    cell = s.cells[("isl64-osl16-c2-n8", "output_throughput")]
    assert cell.rounds == (0, 2, 3) and cell.dropped == ((1, "patched"),)
    assert cell.before == pytest.approx(gm([100, 100, 200])) and cell.after == pytest.approx(gm([110, 110, 220]))
    assert cell.delta_pct == pytest.approx(10.0)
    # the composite pairs rounds by index too: every round scores +10 % (log ratio), so no spread -> said so
    assert s.evaluation is not None and s.evaluation.composite.estimate_pct == pytest.approx(10.0)
    text = render_markdown(run)
    assert "Unpaired rounds dropped from both sides: round 1 (no patched value)" in text
    assert_arrows_agree(text)


def test_a_lost_block_takes_its_round_out_of_the_cell_and_is_named_by_its_round(tmp_path):
    """together: all, 2 rounds of 2 blocks: the candidate's block 3 is lost at one point. The block is dropped
    from both sides, and with it round 1 (a round is scored on all its blocks or not at all, in every cell as in
    the primary test: round 1 is not scored on block 2 alone against a whole round 0); the report and the cell's
    own notes name it "round 1, block 1, rep-3": "round 3" of a two-round run would send a reader to a round that
    does not exist."""
    matrix = MATRIX.replace("order: %(order)s", "order: %(order)s\ntogether: all\nblocks: 2")
    base = [100, 200, 100, 300]
    cand = [110, 220, 110, 330]
    root = make_run(tmp_path, scaled(base, cand), order="abba", repeats=2, matrix_text=matrix,
                    skip=frozenset({("patched", "serve/isl64-osl16-c2-n8/rep-3")}))
    run = load_run(root)
    (s,) = run.summaries
    cell = s.cells[("isl64-osl16-c2-n8", "output_throughput")]
    assert cell.rounds == (0,) and cell.dropped == ((3, "patched"),)
    assert cell.before == pytest.approx(gm([100, 200])) and cell.delta_pct == pytest.approx(10.0)
    assert s.cells[("isl64-osl16-c4-n8", "output_throughput")].rounds == (0, 1)  # the other point keeps both
    assert cell.notes == ["round 1, block 1, rep-3: no patched value, dropped from both sides"]
    text = render_markdown(run)
    assert ("Unpaired blocks dropped from both sides, each with its round (a round is scored on all its blocks or "
            "not at all, in every cell as in the primary test): round 1, block 1, rep-3 (no patched value)") in text
    assert "round 3" not in text


def test_a_run_resumed_on_another_machine_keeps_each_stretch(tmp_path):
    """Two stretches on two machines (a GPU run resumed after its machine went): the run's start stays the first
    stretch's, its end is the last's, its running time is the two stretches' sum without the gap between
    them, and the report's provenance names each stretch's time, machine and jobs."""
    store = RunStore.open(make_run(tmp_path, scaled([100] * 3, [110] * 3)))
    store.update_manifest(stretches=[])  # make_run's own manifest has none
    first = Stretch(started="2026-12-04T03:21:28+00:00", hostname="gpu-a", jobs=80)
    store.begin_stretch(first)
    store.end_stretch("2026-12-04T03:30:30+00:00")
    second = Stretch(started="2026-12-04T05:59:45+00:00", hostname="gpu-b", jobs=40,
                     boot_id="00021aac-5c1e-4f0e-9a51-3c7f1d2e8b90")
    store.begin_stretch(second)
    m = store.end_stretch("2026-12-04T06:09:05+00:00")
    assert (m.started, m.finished) == ("2026-12-04T03:21:28+00:00", "2026-12-04T06:09:05+00:00")
    assert m.running_seconds() == 542 + 560
    assert [s.hostname for s in m.stretches] == ["gpu-a", "gpu-b"]
    text = render_markdown(load_run(store.root))
    assert ("ran in 2 stretches (resumed): 2026-12-04T03:21:28+00:00 to 2026-12-04T03:30:30+00:00 on gpu-a, 80 "
            "jobs to run; 2026-12-04T05:59:45+00:00 to 2026-12-04T06:09:05+00:00 on gpu-b (boot 00021aac), 40 jobs "
            "to run") in text  # host names repeat: the boot tells two machines apart
    # a stretch that never ended (kill -9) leaves the running time unknown, not counted across the gap
    m = store.begin_stretch(Stretch.begin(0))
    assert m.running_seconds() is None and m.started == "2026-12-04T03:21:28+00:00"


def test_plan_command_prices_rounds_at_the_run_s_own_running_time(tmp_path, capsys):
    """`suite plan MATRIX --from RUN --target-mde 2%`: rounds needed from the earlier run's round scores, and
    the wall time at that run's seconds per round, counted over its stretches (a gap between two machines is
    not running time)."""
    from suite.cli import main

    root = make_run(tmp_path, scaled([100, 200, 100], [110, 205, 104]))
    store = RunStore.open(root)
    for start, end in (("2026-12-04T03:00:00+00:00", "2026-12-04T03:05:00+00:00"),
                       ("2026-12-04T06:00:00+00:00", "2026-12-04T06:10:00+00:00")):
        store.begin_stretch(Stretch(started=start, hostname="h", jobs=6))
        store.end_stretch(end)
    matrix = tmp_path / "rep.yaml"
    matrix.write_text(MATRIX % {"repeats": 3, "order": "blocked"})
    assert main(["plan", str(matrix), "--from", str(root), "--target-mde", "2%"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "patched" in line]
    cols = [c.strip() for c in row.strip("│ ").split("│")]
    assert cols[:2] == ["patched", "3"] and cols[2].endswith("%")
    needed = int(cols[3])
    assert cols[4] == f"{needed * 900 / 3 / 60:.0f} min"  # 15 min over 3 rounds, not 3 h 10 min


def test_an_unfinished_run_says_whether_its_process_still_runs(tmp_path):
    """A manifest that says `running` with jobs missing: the report tells a live run (its `suite` process on this
    host) from one killed without closing its manifest, and says it cannot tell for a run from another host or
    boot: 2026-12-05's H100 run, read here, said "its process 803 on this host is gone" because both machines
    were named vm."""
    import socket
    import subprocess
    import sys

    from suite.records import boot_id

    store = RunStore.open(make_run(tmp_path, scaled([100] * 3, [110] * 3), skip=frozenset(
        {("patched", "serve/isl64-osl16-c2-n8/rep-2")})))

    def intro_with(stretch: Stretch) -> str:
        store.update_manifest(status="running", stretches=[stretch],
                              job_counts={"ok": 11, "failed": 0, "missing": 1})
        return render_markdown(load_run(store.root)).split("## Verdict")[0]

    here, boot = socket.gethostname(), boot_id()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "suite", "run"])
    try:
        text = intro_with(Stretch(started="2026-12-04T06:00:00+00:00", hostname=here, boot_id=boot, pid=live.pid,
                                  jobs=12))
        assert f"still running (process {live.pid} on this host)" in text
    finally:
        live.kill()
        live.wait()
    text = intro_with(Stretch(started="2026-12-04T06:00:00+00:00", hostname=here, boot_id=boot, pid=live.pid,
                              jobs=12))
    assert f"stopped without closing its manifest (its process {live.pid} on this host is gone" in text
    assert "`suite run --resume` runs the rest" in text
    lost = "the run has not finished, or stopped without closing its manifest (a lost machine, a kill)"
    for host, boot_of in (("a-gpu-host", boot), (here, "another-boot"), (here, None)):
        text = intro_with(Stretch(started="2026-12-04T06:00:00+00:00", hostname=host, boot_id=boot_of, pid=live.pid,
                                  jobs=12))
        assert lost in text and "on this host" not in text, (host, boot_of)


def test_together_all_findings_say_which_round_and_block(tmp_path):
    """Under together: all a per-repeat finding is about one block and a check across rounds about one
    round: the Every finding table's Where column says which ("round 1, block 1, rep-3"), never a bare 3
    that a reader would take for a round."""
    matrix = MATRIX.replace("order: %(order)s", "order: %(order)s\ntogether: all\nblocks: 2")
    root = make_run(tmp_path, scaled([100, 200, 100, 300], [110, 220, 110, 330]), order="abba", repeats=2,
                    matrix_text=matrix)
    result = root / "patched" / "serve" / "isl64-osl16-c2-n8" / "rep-3.json"
    raw_ = json.loads(result.read_text())
    result.write_text(json.dumps(raw_ | {"ttfts": [0.9, 0.9] + [0.1] * 6}))  # the first wave stalled
    text = render_markdown(load_run(root))
    assert ("| warning | slow-request | patched | isl64-osl16-c2-n8 | round 1, block 1, rep-3 | round 1, block 1, rep-3: the first 2 "
            "of 8 requests (the first wave at concurrency 2) waited") in text
    assert "| Severity | Check | Arm | Point | Where | Finding |" in text


def test_failed_job_is_listed_never_hidden(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]), fail_job="serve/isl64-osl16-c4-n8/rep-1")
    text = build_report(root).read_text()
    assert "## Failed jobs" in text
    assert "| patched | serve/isl64-osl16-c4-n8/rep-1 | failed | boom: server died |" in text
    assert "| 3/2 |" in text  # the point still reports, with 2 repeats


def test_report_is_a_pure_function_of_the_files(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]))
    first = build_report(root).read_text()
    html = (root / "report.html").read_text()
    assert build_report(root).read_text() == first
    assert (root / "report.html").read_text() == html


def test_missing_arm_results_show_as_missing(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]))
    for f in (root / "patched" / "serve" / "isl64-osl16-c4-n8").glob("rep-*.json"):
        if not f.name.endswith(".job.json"):
            f.unlink()
    text = build_report(root).read_text()
    assert "| 64 | 16 | 4 | 8 | missing |" in text


@pytest.mark.parametrize("scale", [None, 0.1, 0.9, 1.6])
def test_demo_results_never_contradict_themselves(tmp_path, scale):
    """The CPU demo's real `vllm bench serve` results (tests/data/report_run), as they are and with the
    candidate made slower or faster: the text users read."""
    run_dir = build_run_dir(tmp_path / "r", scale={"patched": scale} if scale else None)
    text = build_report(run_dir).read_text()
    assert assert_arrows_agree(text) > 0
    assert "POSSIBLE" not in text and "NO SIGNIFICANT CHANGE" not in text
    word = re.search(r"\*\*patched vs baseline: ([A-Z ]+)\*\* — .*?composite ([+-]\d+\.\d)% [\[(]", text)
    assert word, text.split("## Verdict")[1][:400]
    assert word.group(1) in ("REGRESSION", "IMPROVEMENT", "EQUIVALENT", "MIXED", "INCONCLUSIVE")
    if scale == 0.1:
        assert word.group(1) == "REGRESSION" and float(word.group(2)) < -50
    # the demo's coalesced token streams are named, and those repeats are left out of the token timings
    assert "## Data quality" in text and "coalesced-stream" in text
    # every Δ% with an interval sits inside it
    for d, lo, hi in re.findall(r"\(([+-]\d+\.\d)% \[([+-]\d+\.\d), ([+-]\d+\.\d)\]\)", text):
        assert float(lo) <= float(d) <= float(hi)


def test_data_quality_sits_under_the_verdict_and_a_spoiled_repeat_is_left_out(tmp_path):
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]))
    store = RunStore(root)
    (job,) = [r.job for r in load_run(root).records
              if r.job.arm == "patched" and r.job.key == "serve/isl64-osl16-c2-n8/rep-1"]
    atomic_write_json(store.result_path(job), raw(121, 100 / 121, completed=6) | {"failed": 2})
    text = build_report(root).read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Verdict", "## Data quality"]
    quality = text.split("## Data quality")[1].split("\n## ")[0]
    assert "| unreliable | failed-requests | patched | 1 | isl64-osl16-c2-n8 |" in quality
    # the repeat is left out of its cells (2 candidate repeats remain) and of the primary test, and both say so
    run = load_run(root)
    (s,) = run.summaries
    cell = s.cells[("isl64-osl16-c2-n8", "output_throughput")]
    assert cell.n == (3, 2) and cell.left_out == (("patched", 1, "failed-requests"),)
    assert cell.after == pytest.approx(gm([120, 119]))
    assert any("isl64-osl16-c2-n8 round 1 output_throughput" in x for x in s.left_out)
    assert "left out of the test by data-quality checks" in text
    assert "Left out by data-quality checks (for the metrics they spoil): patched round 1 (failed-requests)" in text


def test_the_report_does_not_import_the_runtime_or_the_runner():
    import subprocess
    import sys

    code = ("import sys, suite.report, suite.history, suite.commands.compare, suite.commands.report; "
            "print(sorted(m for m in sys.modules if m.startswith(('suite.runtime', 'suite.runner'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_declared_test_and_the_look_a_sequential_run_stopped_at(tmp_path):
    from suite.analysis import verdict_spec

    root = make_run(tmp_path, scaled([100, 101, 99, 100], [90, 91, 89, 90]), order="abba", repeats=4)
    run = load_run(root)
    spec = verdict_spec(run)
    assert (spec.max_rounds, spec.looks) == (4, (4,))  # fixed repeats: a fixed design, never an early look
    (s,) = run.summaries
    assert s.evaluation.composite.n_rounds == 4 and s.overall == "REGRESSION"
    # a matrix's verdict block keeps its margin; under repeats: auto its looks too, and the report evaluates
    # the rounds up to where the run stopped, at that look
    store = RunStore(root)
    matrix = store.manifest().matrix.model_dump(mode="json", exclude_unset=True)
    store.update_manifest(matrix=matrix | {"verdict": {"target_pct": 2.0}})
    assert verdict_spec(load_run(root)).target_pct == 2.0 and verdict_spec(load_run(root)).looks == (4,)
    store.update_manifest(matrix=matrix | {"repeats": "auto", "verdict": {"looks": [2, 4, 8]}},
                          sequential={"stop_after": 4, "why": "every candidate decided at look 2"})
    run = load_run(root)
    assert verdict_spec(run).looks == (2, 4, 8)
    (s,) = run.summaries
    c = s.evaluation.composite
    assert (c.n_rounds, c.look, c.n_looks) == (4, 2, 3)
    text = render_markdown(run)
    assert "repeated" in text and "look 2 of 3" in text


CORRECTNESS_ONLY = MATRIX.replace('  patched: {vllm: "0.32.0"}\n', '''  patched: {vllm: "0.32.0"}
  wrong: {vllm: "0.32.0", serving: false}
''') + "accuracy: {dataset: synthetic, lm_eval_args: [--tasks, gsm8k, --limit, \"4\"], equivalence_prompts: 3}\n"


def test_a_correctness_only_arm_reads_output_changed_and_has_no_serving_rows(tmp_path):
    from tests.test_accuracy_summary import write_arm, write_eq

    matrix = parse_matrix(CORRECTNESS_ONLY % {"repeats": 3, "order": "blocked"})
    plan = build_plan(matrix)
    store = RunStore.create(tmp_path, matrix.name)
    store.write_manifest(new_manifest("m.yaml", matrix.model_dump(mode="json"), PlanRecord.of(plan)))
    outputs = {"baseline": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "patched": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
               "wrong": [[1, 2, 0], [0, 5, 6], [7, 8, 9]]}
    for job in plan.jobs:
        path = store.result_path(job)
        if job.kind == "serve":
            tput, lat = scaled([100, 101, 99], [100, 100, 100])(job.arm, job.params.concurrency, job.repeat)
            atomic_write_json(path, raw(tput, lat))
        elif job.kind == "equivalence":
            path.parent.mkdir(parents=True, exist_ok=True)
            write_eq(path, outputs[job.arm])
        else:  # accuracy: nobody right; the wrong gate's responses differ on two questions
            changed = {0: "so it is 7", 1: "so it is 9"} if job.arm == "wrong" else None
            write_arm(path, [0] * 4, responses=changed)  # lm-eval's output directory
        store.write_record(job, "ok")
    assert {j.kind for j in plan.jobs if j.arm == "wrong"} == {"equivalence", "accuracy"}
    text = build_report(store.root).read_text()
    card = next(line for line in text.splitlines() if line.startswith("- **wrong vs baseline"))
    assert card == "- **wrong vs baseline: OUTPUT CHANGED** — greedy outputs differ from the baseline's in 2 of 3 prompts"
    assert "no speed verdict: a correctness-only arm (serving: false)" in text
    assert "### baseline → patched" in text and "### baseline → wrong" not in text  # no rows of "missing"
    assert "isl64-osl16-c2-n8: baseline → wrong" not in text
    assert "responses changed on 2/4 questions" in text


def test_the_card_points_at_session_findings_of_its_arms(tmp_path):
    # the baseline's throughput climbs 8 % a round (a drifting machine): the drift check names it, and the
    # card of the candidate compared with it says so beside the verdict
    root = make_run(tmp_path, scaled([100, 108, 117, 126, 136], [100, 101, 99, 100, 101]), repeats=5)
    text = build_report(root).read_text()
    card = card_of(text)
    assert "- data quality: drift (baseline) — the rounds may not be independent draws; see Data quality" in card
    quiet = make_run(tmp_path / "quiet", scaled([100, 101, 99, 100, 101], [100, 101, 99, 100, 101]), repeats=5)
    assert "data quality:" not in card_of(build_report(quiet).read_text())


AA_MATRIX = MATRIX + "aa: true\n"


def aa_values(aa_shift: float):
    """The A/A arm is the baseline again (within 1 %), shifted by aa_shift; the candidate 20 % slower."""
    noise = {"baseline": (100, 112, 95, 104), "baseline.aa": (101, 111, 95.5, 103), "patched": (80, 91, 74, 85)}

    def values(arm: str, conc: int, r: int):
        t = noise[arm][r] * (aa_shift if arm == "baseline.aa" else 1.0)
        return t, 100.0 / t
    return values


def test_one_round_cannot_pass_the_aa_control(tmp_path):
    """Seen on the H200: one round, two identical arms 34 % apart; with no interval the control is untested,
    never PASSED."""
    root = make_run(tmp_path, aa_values(1.5), order="abba", repeats=1, matrix_text=AA_MATRIX)
    run = load_run(root)
    assert run.control is not None and run.control.control_word == "CONTROL UNTESTED"
    text = build_report(root).read_text()
    assert "CONTROL UNTESTED" in text and "CONTROL PASSED" not in text
    assert "not tested: the test needs at least two rounds" in text


def test_the_aa_control_passes_for_two_identical_arms_and_is_never_pooled_with_itself(tmp_path):
    root = make_run(tmp_path, aa_values(1.0), order="abba", repeats=4, matrix_text=AA_MATRIX)
    run = load_run(root)
    assert [s.candidate for s in run.summaries] == ["patched"]  # the A/A arm is no candidate
    ctrl = run.control
    assert ctrl is not None and ctrl.candidate == "baseline.aa" and ctrl.control_word == "CONTROL PASSED"
    assert ctrl.evaluation is not None and ctrl.evaluation.composite.pooled is False
    assert run.summaries[0].evaluation.composite.pooled is False  # nor with the candidate, unless asked
    pooled = make_run(tmp_path / "pooled", aa_values(1.0), order="abba", repeats=4,
                      matrix_text=AA_MATRIX + "verdict: {pool_aa: true}\n")
    assert load_run(pooled).summaries[0].evaluation.composite.pooled is True  # verdict.pool_aa: true
    text = build_report(root).read_text()
    assert text.startswith("# rep: baseline vs patched\n")  # the control is no compared arm
    assert "- **A/A control: baseline.aa vs baseline: CONTROL PASSED** — equal at every point · composite " in text
    assert "A/A control failed" not in text
    assert "class='card ov-control-passed'" in render_html(run)


def test_a_passed_aa_control_calls_its_own_significant_cells_false_alarms(tmp_path):
    """A fresh `make demo` (2026-12-05, an AMD EPYC box): CONTROL PASSED, and under it "▼ worse: c1 P99 E2E latency
    +17.0 %" with nothing said. Two identical arms' significant cell is a false alarm by construction; the card
    says so, and that a candidate's lone cell can be one too."""
    noise = {"baseline": (100, 112, 95, 104), "baseline.aa": (101, 111, 95.5, 103), "patched": (80, 91, 74, 85)}

    def values(arm: str, conc: int, r: int):
        t = noise[arm][r]
        lats = dict.fromkeys(LATENCIES, 100.0 / t)
        if arm == "baseline.aa" and conc == 2:  # one cell outside the composite, 17 % worse in every round
            lats["p99_e2el_ms"] = 117.0 / t
        return t, lats

    root = make_run(tmp_path, values, order="abba", repeats=4, matrix_text=AA_MATRIX)
    run = load_run(root)
    assert run.control is not None and run.control.control_word == "CONTROL PASSED"
    assert [(c.point, c.metric) for c in run.control.regressions] == [("isl64-osl16-c2-n8", "p99_e2el_ms")]
    card = card_of(build_report(root).read_text(), "A/A control: ")
    assert "1 worse (c2: P99 E2E latency), 0 better" in card
    assert "1 of its cells significant between two identical arms (above): false alarms of the cells" in card
    quiet = make_run(tmp_path / "quiet", aa_values(1.0), order="abba", repeats=4, matrix_text=AA_MATRIX)
    assert "significant between two identical arms" not in build_report(quiet).read_text()


def test_a_failed_aa_control_is_named_on_every_candidate_card(tmp_path):
    root = make_run(tmp_path, aa_values(1.2), order="abba", repeats=4, matrix_text=AA_MATRIX)
    run = load_run(root)
    assert run.control is not None and run.control.overall == "IMPROVEMENT"
    assert run.control.control_word == "CONTROL FAILED"
    text = build_report(root).read_text()
    verdict = text.split("## Verdict")[1].split("\n## ")[0]
    assert "- **A/A control: baseline.aa vs baseline: CONTROL FAILED** — better at c2, c4 · composite +" in verdict
    est = run.control.evaluation.composite.estimate_pct
    cand_card = verdict.split("- **patched vs baseline:")[1].split("- **A/A control: ")[0]
    assert f"**A/A control failed**: two identical arms differed by {est:+.1f}% [" in cand_card
    assert verdict.count("**A/A control failed**") == 1  # on the candidate's card, not on the control's own


def test_a_serve_result_reads_its_metrics_by_name_finite_numbers_only():
    """`vllm bench serve` writes its metrics as keys of their own (and "inf" for a closed-loop rate):
    ``metric`` gives a finite number or None, ``number`` any number (the statistics refuse inf and NaN aloud)."""
    from suite.stages.serve.read import ServeResult

    r = ServeResult.model_validate({"completed": 8, "request_rate": "inf", "mean_tpot_ms": 4, "p99_itl_ms": True,
                                    "median_ttft_ms": "12", "std_e2el_ms": math.inf, "label": None})
    assert r.metric("completed") == 8.0 and r.metric("mean_tpot_ms") == 4.0
    assert r.request_rate == math.inf and r.metric("request_rate") is None and r.number("request_rate") == math.inf
    for key in ("p99_itl_ms", "median_ttft_ms", "std_e2el_ms", "label", "mean_e2el_ms", "latencies"):
        assert r.metric(key) is None, key
    assert r.number("std_e2el_ms") == math.inf and r.number("p99_itl_ms") is None
    with pytest.raises(ValueError, match="latencies"):
        ServeResult.model_validate({"latencies": "x"})


def test_unreadable_serve_results_are_named_and_only_their_rounds_left_out(tmp_path):
    """A result that is missing, not JSON, or not the tool's shape (a list; a field of the wrong type) is
    named with the reason, never skipped without a word; the point keeps its other rounds, by round index."""
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]), order="abba")
    serve = Path(root) / "patched" / "serve" / "isl64-osl16-c2-n8"
    (serve / "rep-0.json").unlink()
    (serve / "rep-1.json").write_text("[1, 2]")
    (Path(root) / "baseline" / "serve" / "isl64-osl16-c4-n8" / "rep-2.json").write_text('{"failed": "some"}')
    run = load_run(root)
    assert [(u.path, u.error) for u in run.serve.unreadable] == [
        ("baseline/serve/isl64-osl16-c4-n8/rep-2.json", "failed: Input should be a valid integer, unable to parse "
         "string as an integer"),
        ("patched/serve/isl64-osl16-c2-n8/rep-0.json", "No such file or directory"),
        ("patched/serve/isl64-osl16-c2-n8/rep-1.json", "(top level): Input should be a valid dictionary or "
         "instance of ServeResult")]
    assert {arm: list(r) for arm, r in run.points["isl64-osl16-c2-n8"].reps.items()} == {
        "baseline": [0, 1, 2], "patched": [2]}
    assert {arm: list(r) for arm, r in run.points["isl64-osl16-c4-n8"].reps.items()} == {
        "baseline": [0, 1], "patched": [0, 1, 2]}
    text = build_report(root).read_text()
    section = text[text.index("## Serving (`vllm bench serve`): before → after"):]
    assert section.index("3 stored results of jobs that ended ok could not be read") < section.index("| ISL |")
    assert "`patched/serve/isl64-osl16-c2-n8/rep-0.json`: No such file or directory" in section
    row = next(line for line in text.splitlines() if line.startswith("| 64 | 16 | 4 | 8 |"))
    assert "| 16/24 | 0/0 |" in row  # completed: baseline's two readable rounds, patched's three


def test_a_run_whose_serve_results_are_all_unreadable_does_not_read_as_offline_only(tmp_path):
    """Every serve result gone: the verdict card says none could be read (not "offline stages only"), and the
    serving section is the warning naming them."""
    root = make_run(tmp_path, scaled([100, 101, 99], [120, 121, 119]), order="abba")
    for path in Path(root).glob("*/serve/*/rep-*.json"):
        if not path.name.endswith(".job.json"):
            path.unlink()
    text = build_report(root).read_text()
    verdict = text.split("## Verdict")[1].split("\n## ")[0]
    assert "no serving result could be read (the serving section names the files)" in verdict
    assert "offline stages only" not in verdict and "this matrix measures no serving points" not in verdict
    assert "12 stored results of jobs that ended ok could not be read" in text


def test_a_correctness_only_arms_server_start_is_paid_once_not_a_round(tmp_path):
    """`suite plan`'s wall time splits a run into what it pays once and what a round costs: a correctness-only arm
    (`serving: false`) starts its one server once a run, whatever the rounds, so its start counts as once (it was
    spread over the rounds: the demo's wrong gate, 43 s, priced every round)."""
    from suite.run_facts import one_time_seconds

    matrix = MATRIX.replace("  patched:", "  wrong: {vllm: \"0.32.0\", serving: false}\n  patched:") + \
        "accuracy: {lm_eval_args: [--limit, \"4\"]}\n"
    root = make_run(tmp_path, scaled([100] * 3, [110] * 3), matrix_text=matrix)
    store = RunStore.open(root)
    run = load_run(root)
    before = one_time_seconds(run)
    (session,) = {r.job.session for r in run.records if r.job.arm == "wrong"}
    for arm, s, healthy in (("wrong", session, 43.0), ("baseline", 0, 30.0)):
        atomic_write_json(store.server_record_path(arm, s), {"arm": arm, "session": s, "healthy_after_s": healthy})
    assert one_time_seconds(load_run(root)) == pytest.approx(before + 43.0)  # the serving arm's start is a round's


def test_a_trade_off_reads_mixed_names_its_points_and_checks_them_against_the_matrix(tmp_path, capsys):
    """Through `suite report`: 12 % faster at concurrency 2, 10 % slower at 4, ABBA rounds paired. The composite
    over both nets out near 0; the word is MIXED, the headline says where, the card's first lines are one row per
    point with its own Δ and word, and `verdict.expect` (c2 better, c4 flat) is checked: c4 moved where nothing
    should."""
    from suite.cli import main

    text = MATRIX + ("verdict:\n  metrics: [mean_tpot_ms]\n  target_pct: 2\n  expect:\n"
                     "    isl64-osl16-c2-n8: better\n    others: flat\n")
    wobble = {"baseline": (1.0, 1.004, 0.997, 1.002), "patched": (0.998, 1.001, 1.003, 0.999)}

    def values(arm: str, conc: int, r: int):
        speed = wobble[arm][r] * ((1.12 if conc == 2 else 1 / 1.10) if arm == "patched" else 1.0)
        return 100 * speed, 10.0 / speed

    root = make_run(tmp_path, values, order="abba", repeats=4, matrix_text=text)
    assert main(["report", str(root)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # the terminal: the word and where, then the report's path
    assert "patched vs baseline: MIXED — better at c2; worse at c4 · composite " in said
    assert said.index("MIXED") < said.index("report: ")
    report = (root / "report.md").read_text()
    card = card_of(report)
    first, rows = card.splitlines()[0], [ln.strip() for ln in card.splitlines() if ln.strip().startswith("| c")]
    assert first.startswith("- **patched vs baseline: MIXED** — better at c2; worse at c4 · composite "), first
    assert rows[0].startswith("| c2 | 9.99 → 8.93 | -10.7% [") and "| better | better: as expected |" in rows[0]
    assert rows[1].startswith("| c4 | 9.99 → 11.00 | +10.1% [") and "| worse | flat: moved where nothing should |" in rows[1]
    assert card.index("| Point | Mean TPOT (ms) | Δ % | Says | Expected |") < card.index("4 rounds paired")
    run = load_run(root)
    (s,) = run.summaries
    assert [h.confirmed for h in s.evaluation.cells] == ["IMPROVEMENT", "REGRESSION"]
    # the serving table's marks for the tested cells are the family's, so the card and the tables agree
    assert s.cells[("isl64-osl16-c2-n8", "mean_tpot_ms")].verdict.value == "better"
    assert s.cells[("isl64-osl16-c4-n8", "mean_tpot_ms")].verdict.value == "worse"
