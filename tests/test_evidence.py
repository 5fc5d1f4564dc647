"""Real GPU runs stay part of CI as data: every stored run under docs/evidence/ (its run directory as collected
on the GPU host, less the reports, in raw.tar.xz; the reports `suite report` wrote beside it) regenerates,
through the CLI, into exactly the reports committed beside it. A change to the statistics or the report that
would alter what a stored H200 run says shows up here as a diff."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from suite.cli import main
from tests.conftest import REPO, load_script

EVIDENCE = REPO / "docs" / "evidence"
unpack = load_script(REPO / "scripts" / "evidence_reports.py", "evidence_reports").unpack
RUNS = sorted(p for p in EVIDENCE.iterdir() if (p / "raw.tar.xz").is_file()) if EVIDENCE.is_dir() else []


def test_there_is_gpu_evidence():
    assert RUNS, "docs/evidence/ holds no stored run"
    hosts = {run.name for run in RUNS if "h200" in run.name}
    assert hosts, "no stored H200 run"


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_stored_run_regenerates_its_report(run, tmp_path):
    copy = unpack(run, tmp_path / run.name)  # the report names its run by the directory's name
    assert (copy / "manifest.json").is_file() and not (copy / "report.md").exists()
    assert main(["report", str(copy)]) == 0
    for name in ("report.md", "report.html"):
        assert (copy / name).read_text() == (run / name).read_text(), (
            f"{run.name}/{name} no longer matches its raw files: regenerate it (unpack raw.tar.xz, `suite report`) "
            "and say why")


def test_a_report_made_from_inside_its_run_directory_names_the_run(tmp_path, monkeypatch):
    """`suite report .` (2026-12-05, the H100 run read where it was unpacked) wrote "run: ``": the name of '.'."""
    copy = unpack(EVIDENCE / "h200-abba-20261203", tmp_path / "h200-abba-20261203")
    monkeypatch.chdir(copy)
    assert main(["report", "."]) == 0
    text = (copy / "report.md").read_text()
    assert "- run: `h200-abba-20261203`, status" in text and "raw files in `h200-abba-20261203`;" in text


def test_a_candidate_decided_at_a_look_keeps_that_look(tmp_path):
    """The second H200 run: the runner's look after two rounds decided ll-bf16 (EQUIVALENT) and went on for
    slowed-gate; the report keeps ll-bf16's test at that look, not re-testing it on the rounds after it, and
    tests slowed-gate on every round it has (its round 3 was never measured)."""
    from suite.analysis import load_run

    run = load_run(unpack(EVIDENCE / "h200-gemma4-settle-20261201", tmp_path))
    by_arm = {s.candidate: s for s in run.summaries}
    ll, slowed = by_arm["ll-bf16"], by_arm["slowed-gate"]
    assert run.manifest.sequential.looks[0].outcomes["ll-bf16"] == "EQUIVALENT"
    # the runner's look (the composite alone, before the per-point family) stopped it; at that look the family
    # finds no point within the margin: INCONCLUSIVE, each point undecided
    assert ll.decided_after == 2 and ll.overall == "INCONCLUSIVE"
    assert ll.evaluation.composite.n_rounds == 2 and ll.evaluation.composite.look == 1
    assert slowed.decided_after is None and slowed.evaluation.composite.n_rounds == 3


def test_the_third_h200_run_decides_both_candidates_from_the_raw_json(tmp_path):
    """The run with quiet_s: 8 (docs/gpu-h200.md): ll-bf16 IMPROVEMENT at the runner's look after two rounds,
    the slowed gate REGRESSION on its three complete rounds, the A/A control passed; each composite equals the
    mean over rounds of the per-round geometric mean of baseline/candidate mean TPOT at the declared points."""
    import json
    import math

    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-gemma4-quiet8-20261202", tmp_path / "q8")
    run = load_run(root)
    by_arm = {s.candidate: s for s in run.summaries}
    ll, slowed, control = by_arm["ll-bf16"], by_arm["slowed-gate"], run.control
    assert run.manifest.sequential.looks[0].outcomes == {"ll-bf16": "IMPROVEMENT", "slowed-gate": "INCONCLUSIVE"}
    # two rounds (1 df): the composite at its 70 % share of alpha no longer excludes 0 (it read IMPROVEMENT alone)
    assert (ll.overall, ll.decided_after, ll.evaluation.composite.n_rounds) == ("INCONCLUSIVE", 2, 2)
    assert (slowed.overall, slowed.evaluation.composite.n_rounds) == ("REGRESSION", 3)
    # three rounds, between the looks after 2 and 4: tested at the first look's boundary, and the card says so
    assert slowed.evaluation.composite.look == 1
    report = (EVIDENCE / "h200-gemma4-quiet8-20261202" / "report.md").read_text()
    assert "look 1 of 2 (O'Brien–Fleming): 3 rounds at that look's boundary (the run ended before the look after 4)" in report
    # the control: equal at c16, c1 and c8 too loosely measured for the 1 % margin (the composite alone read EQUIVALENT)
    assert control is not None and control.overall == "INCONCLUSIVE" and control.control_word == "CONTROL PASSED"
    points = run.matrix.verdict.points

    def tpot(arm: str, point: str, r: int) -> float:
        return json.loads((root / arm / "serve" / point / f"rep-{r}.json").read_text())["mean_tpot_ms"]

    for summary, rounds in ((ll, range(2)), (slowed, range(3))):
        scores = [sum(math.log(tpot("baseline", p, r) / tpot(summary.candidate, p, r)) for p in points) / len(points)
                  for r in rounds]
        expected = (math.exp(sum(scores) / len(scores)) - 1) * 100
        assert summary.evaluation.composite.estimate_pct == pytest.approx(expected, abs=0.05), summary.candidate


def report_with_verdict(tmp_path: Path, **verdict) -> tuple[Path, str]:
    """The first complete H200 run, its matrix's verdict block changed as given, and `suite report` on it."""
    import json

    run = unpack(EVIDENCE / "h200-gemma4-20261201", tmp_path / "h200-gemma4-20261201")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["matrix"]["verdict"].update(verdict)
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["report", str(run)]) == 0
    return run, (run / "report.md").read_text()


def test_declared_points_feed_the_composite_through_the_cli(tmp_path):
    """verdict.points on the first complete H200 run: only c1, c8 and c16 (where ll-bf16 can act: M <= 16)
    feed the composite; `suite report` tests that composite, and its value is the mean of the per-round
    scores computed here from the raw JSON."""
    import json
    import math
    import re

    points = ("isl128-osl64-c1-n16", "isl128-osl64-c8-n64", "isl128-osl64-c16-n128")
    run, report = report_with_verdict(tmp_path, points=list(points))
    assert ("composite of Mean TPOT, geometric mean over the 3 declared points (isl128-osl64-c1-n16, "
            "isl128-osl64-c8-n64, isl128-osl64-c16-n128; the others are shown, not tested)") in report

    def tpot(arm: str, point: str, r: int) -> float:
        return json.loads((run / arm / "serve" / point / f"rep-{r}.json").read_text())["mean_tpot_ms"]

    scores = [sum(-math.log(tpot("ll-bf16", p, r) / tpot("baseline", p, r)) for p in points) / len(points)
              for r in range(4)]
    expected = math.expm1(sum(scores) / 4) * 100
    shown = re.search(r"\*\*ll-bf16 vs baseline: [A-Z]+\*\* — .*?composite ([+-][0-9.]+)%", report)
    assert shown is not None and float(shown.group(1)) == pytest.approx(expected, abs=0.05)
    # the fourth point, where ll-bf16 cannot act, no longer dilutes it: over all four the composite read +1.6 %
    assert expected > 1.6


def test_a_verdict_on_a_percentile_through_the_cli(tmp_path):
    """P90 TPOT (a metric of the registry the client asks vLLM for) as the primary metric: the card names it
    and its composite is the mean per-round log ratio of the raw p90_tpot_ms over the four points."""
    import json
    import math
    import re

    run, report = report_with_verdict(tmp_path, metrics=["p90_tpot_ms"])
    assert "composite of P90 TPOT" in report
    points = sorted(p.name for p in (run / "baseline" / "serve").glob("isl*") if p.is_dir())
    assert len(points) == 4, points

    def p90(arm: str, point: str, r: int) -> float:
        return json.loads((run / arm / "serve" / point / f"rep-{r}.json").read_text())["p90_tpot_ms"]

    scores = [sum(-math.log(p90("ll-bf16", p, r) / p90("baseline", p, r)) for p in points) / len(points)
              for r in range(4)]
    shown = re.search(r"\*\*ll-bf16 vs baseline: [A-Z]+\*\* — .*?composite ([+-][0-9.]+)%", report)
    assert shown is not None and float(shown.group(1)) == pytest.approx(math.expm1(sum(scores) / 4) * 100, abs=0.05)


def test_a_verdict_on_the_peak_output_throughput_through_the_cli(tmp_path):
    """A metric added to the registry (suite.stats: vLLM's max_output_tokens_per_s, its busiest second of output
    tokens; the one place a metric is declared) is at once a primary metric a matrix may name: the card names it
    and its composite is the mean per-round log ratio of the raw values over the four points, higher better."""
    import json
    import math
    import re

    run, report = report_with_verdict(tmp_path, metrics=["max_output_tokens_per_s"])
    assert "composite of Peak output throughput" in report
    points = sorted(p.name for p in (run / "baseline" / "serve").glob("isl*") if p.is_dir())

    def peak(arm: str, point: str, r: int) -> float:
        return json.loads((run / arm / "serve" / point / f"rep-{r}.json").read_text())["max_output_tokens_per_s"]

    scores = [sum(math.log(peak("ll-bf16", p, r) / peak("baseline", p, r)) for p in points) / len(points)
              for r in range(4)]
    shown = re.search(r"\*\*ll-bf16 vs baseline: [A-Z]+\*\* — .*?composite ([+-][0-9.]+)%", report)
    assert shown is not None and float(shown.group(1)) == pytest.approx(math.expm1(sum(scores) / 4) * 100, abs=0.05)


def test_a_slow_round_is_named_and_only_on_the_cards_whose_test_read_it(tmp_path):
    """The third H200 run's ll-bf16 round 3 decoded 8.6 % slower at c1 than its other rounds; its end-of-session
    repeat was never measured, so only the round-outlier check can see it. The Data quality box names it; the
    ll-bf16 card does not (its test stopped after rounds 0-1), and no card names baseline's unsteady round 3
    unless its test used round 3 (the A/A control's four rounds)."""
    from suite.analysis import load_run
    from suite.report import build_report

    root = unpack(EVIDENCE / "h200-gemma4-quiet8-20261202", tmp_path / "h200-gemma4-quiet8-20261202")
    run = load_run(root)
    outliers = [(f.arm, f.point, f.round) for f in run.findings if f.check == "round-outlier"]
    assert outliers == [("ll-bf16", "isl128-osl64-c1-n16", 3)]
    build_report(root)
    verdict = (root / "report.md").read_text().split("## Verdict")[1].split("## Data quality")[0]
    cards = {c.split(" vs ")[0].strip("* "): c for c in verdict.split("\n- ") if " vs baseline" in c}
    assert "round-outlier" not in verdict  # ll-bf16's test read rounds 0 and 1 only
    assert "session-drift (baseline round 3)" in cards["A/A control: baseline.aa"]
    assert "session-drift" not in cards["ll-bf16"] and "session-drift" not in cards["slowed-gate"]


def test_a_stored_result_that_cannot_be_read_is_named_not_dropped(tmp_path):
    """The first H200 layer run with one process's result cut short and another's rows of the wrong type, and
    the probe run with every probe result gone: the layer section keeps the seven readable processes and says
    which two files it left out and why; the probe section is a warning alone, not missing without a word."""
    layer = unpack(EVIDENCE / "h200-layer-20261202", tmp_path / "layer")
    (layer / "ll-bf16" / "layer" / "layer0" / "rep-1.json").write_text('{"results": [')
    bad_rows = layer / "slowed-gate" / "layer" / "layer0" / "rep-2.json"
    bad_rows.write_text(bad_rows.read_text().replace('"median_us": ', '"median_us": "x", "_": ', 1))
    assert main(["report", str(layer)]) == 0
    text = (layer / "report.md").read_text()
    warning = next(line for line in text.splitlines() if "could not be read" in line)
    assert "2 stored results" in warning
    assert "`ll-bf16/layer/layer0/rep-1.json`: not JSON" in warning
    assert "`slowed-gate/layer/layer0/rep-2.json`: results.0.median_us: Input should be a valid number" in warning
    across = next(line for line in text.splitlines() if line.startswith("| 1 |") and "(3)" in line)
    assert "| 194.38 (2) |" in across  # ll-bf16: its two readable processes
    assert across.count("(2)") == 2, across  # the readable processes are all still there
    assert text.index("could not be read") < text.index("| T |")  # the warning comes before the tables

    probe = unpack(EVIDENCE / "h200-probe-20261201", tmp_path / "probe")
    for path in probe.glob("*/probe/gate-paths/rep-0.json"):
        path.unlink()
    assert main(["report", str(probe)]) == 0
    text = (probe / "report.md").read_text()
    head = text.index("## Gate paths (probe)")
    assert "could not be read" in text[head:head + 600] and "No such file or directory" in text[head:head + 600]


def test_seed_000s_first_table_is_decided_across_six_processes(tmp_path):
    """The layer run with six processes per arm (2026-12-03): every T's row of the table across processes is
    'better' for ll-bf16, and the T = 1 row's Δ is the geometric means' ratio of the raw per-process medians,
    recomputed here from the stored JSON (not from the report's own code)."""
    run = EVIDENCE / "h200-layer-decide-20261203"
    root = unpack(run, tmp_path / run.name)
    medians: dict[str, list[float]] = {}
    for arm in ("baseline", "ll-bf16"):
        for rep in range(6):
            rows = json.loads((root / arm / "layer" / "layer0" / f"rep-{rep}.json").read_text())["results"]
            medians.setdefault(arm, []).append(next(r["median_us"] for r in rows if r["m"] == 1))

    def gmean(xs: list[float]) -> float:
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    base, cand = gmean(medians["baseline"]), gmean(medians["ll-bf16"])
    text = (run / "report.md").read_text()
    across = [line for line in text.splitlines() if line.startswith("| ") and "(6) |" in line]
    assert len(across) == 4 and all("better: 95% interval excludes 0" in line for line in across), across
    t1 = across[0]
    assert f"| {base:.2f} (6) | {cand:.2f} (6) | {100 * (cand / base - 1):.1f}% [" in t1, t1
    # every paired round went the same way: the change, not the drift of the baseline's processes over the run
    assert all(c < b for b, c in zip(medians["baseline"], medians["ll-bf16"], strict=True))


def test_a_serve_result_that_cannot_be_read_is_named_not_dropped(tmp_path):
    """The third H200 run with one serve result cut short and another's ``latencies`` of the wrong type: the
    serving section says which two files it left out and why before its tables, and the report still shows
    every other round (slowed-gate's c8 point sums the requests of its three readable rounds; its round 2 is
    dropped from both sides of the paired cells)."""
    root = unpack(EVIDENCE / "h200-gemma4-quiet8-20261202", tmp_path / "h200-gemma4-quiet8-20261202")
    (root / "slowed-gate" / "serve" / "isl128-osl64-c8-n64" / "rep-2.json").write_text('{"completed": ')
    wrong = root / "ll-bf16" / "serve" / "isl128-osl64-c16-n128" / "rep-1.json"
    wrong.write_text(json.dumps(json.loads(wrong.read_text()) | {"latencies": "x"}))
    assert main(["report", str(root)]) == 0
    text = (root / "report.md").read_text()
    head = text.index("## Serving (`vllm bench serve`): before → after")
    warning = next(line for line in text.splitlines() if "could not be read" in line)
    assert "2 stored results of jobs that ended ok could not be read" in warning
    assert "`slowed-gate/serve/isl128-osl64-c8-n64/rep-2.json`: not JSON" in warning
    assert "`ll-bf16/serve/isl128-osl64-c16-n128/rep-1.json`: latencies: Input should be a valid list" in warning
    assert head < text.index(warning) < text.index("| ISL | OSL | Conc |", head)  # in the section, before its tables
    assert text.count("could not be read") == 1
    slowed = text[text.index("### baseline → slowed-gate", head):]
    assert "| 128 | 64 | 8 | 64 |" in slowed and "| 256/192 | 0/0 |" in slowed.split("\n| 128 | 64 | 8 |")[1].split("\n")[0]
    ll = text[text.index("### baseline → ll-bf16", head):]
    assert "| 512/384 | 0/0 |" in ll.split("\n| 128 | 64 | 16 |")[1].split("\n")[0]
    stats = text[text.index("### isl128-osl64-c8-n64: baseline → slowed-gate"):]
    stats = stats[:stats.index("\n### ", 1)]
    assert "| 3/3 |" in stats and "round 2 (no slowed-gate value)" in stats


def test_a_latency_result_that_cannot_be_read_is_named_not_dropped(tmp_path):
    """The stages run with ll-bf16's one latency result holding a negative latency: the latency section names
    the file and why before its table, and keeps baseline's numbers beside a missing ll-bf16 cell."""
    root = unpack(EVIDENCE / "h200-stages-20261202", tmp_path / "h200-stages-20261202")
    bad = root / "ll-bf16" / "latency" / "in128-out64-bs1" / "rep-0.json"
    result = json.loads(bad.read_text())
    bad.write_text(json.dumps(result | {"latencies": [-1.0, *result["latencies"][1:]]}))
    assert main(["report", str(root)]) == 0
    text = (root / "report.md").read_text()
    head = text.index("## End-to-end latency (`vllm bench latency`)")
    warning = next(line for line in text.splitlines() if "could not be read" in line)
    assert "1 stored result of jobs that ended ok could not be read" in warning
    assert "`ll-bf16/latency/in128-out64-bs1/rep-0.json`: latencies.0: Input should be greater than 0" in warning
    assert head < text.index(warning) < text.index("| Batch size |", head)
    row = next(line for line in text[head:].splitlines() if line.startswith("| 1 | 128 / 64 |"))
    assert "| 314.80 (307.83–326.49) | missing |" in row


def test_one_server_at_a_time_decides_seed_000_at_the_first_look_too(tmp_path):
    """The H200 run of gemma4-h200-abba.yaml (docs/gpu-h200.md): stock vs ll-bf16 one server at a time, the
    side-by-side run's flags, points and test. ll-bf16 IMPROVEMENT at the look after two rounds, as side by side;
    the composite is the mean over rounds of the per-round geometric mean of baseline/candidate mean TPOT over
    the three points, and both rounds moved the same way at every point."""
    import json
    import math

    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-abba-20261203", tmp_path / "abba")
    run = load_run(root)
    (ll,) = run.summaries
    assert run.manifest.sequential.looks[0].outcomes == {"ll-bf16": "IMPROVEMENT"}
    assert (ll.overall, ll.decided_after, ll.evaluation.composite.n_rounds) == ("IMPROVEMENT", 2, 2)
    points = sorted(p.name for p in (root / "baseline" / "serve").iterdir() if p.name.startswith("isl"))
    assert len(points) == 3

    def tpot(arm: str, point: str, r: int) -> float:
        return json.loads((root / arm / "serve" / point / f"rep-{r}.json").read_text())["mean_tpot_ms"]

    per_round = [[math.log(tpot("baseline", p, r) / tpot("ll-bf16", p, r)) for p in points] for r in range(2)]
    assert all(x > 0 for row in per_round for x in row)  # ll-bf16 faster at every point in both rounds
    scores = [sum(row) / len(row) for row in per_round]
    expected = (math.exp(sum(scores) / len(scores)) - 1) * 100
    assert ll.evaluation.composite.estimate_pct == pytest.approx(expected, abs=0.05)
    assert 1.5 < expected < 2.5


def test_the_h100_run_is_undecided_because_its_two_machines_disagree(tmp_path):
    """The H100 run of gemma4-h100-abba.yaml (docs/gpu-h200.md, 2026-12-05): rounds 0-1 on one machine, rounds 2-3
    on another (resumed). INCONCLUSIVE after the last look; the composite is the four round scores' mean. On the
    second machine ll-bf16 is ~2.6 % faster at c1 at both ends of both sessions (the H200's and the layer's size);
    on the first it is no faster at the sessions' ends."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h100-abba-20261205", tmp_path / "h100")
    run = load_run(root)
    (ll,) = run.summaries
    assert run.manifest.host.cpu_count == 16 and run.manifest.status == "complete"
    assert len(run.manifest.stretches) == 2
    looks = run.manifest.sequential.looks  # the look after 2 twice: recorded before a resumed look replaced its own
    assert [(lk.rounds, lk.outcomes) for lk in looks] == [(r, {"ll-bf16": "INCONCLUSIVE"}) for r in (2, 2, 4)]
    assert (ll.overall, ll.evaluation.composite.n_rounds) == ("INCONCLUSIVE", 4)

    points = sorted(p.name for p in (root / "baseline" / "serve").iterdir() if p.name.startswith("isl"))
    scores = [sum(math.log(_tpot(root, "baseline", p, r) / _tpot(root, "ll-bf16", p, r)) for p in points)
              / len(points) for r in range(4)]
    assert [round(100 * math.expm1(x), 1) for x in scores] == [-1.6, 2.9, 2.1, 2.0]
    assert ll.evaluation.composite.estimate_pct == pytest.approx(100 * math.expm1(sum(scores) / 4), abs=0.05)
    c1 = "isl128-osl64-c1-n16"
    assert _tpot(root, "baseline", c1, 1) / _tpot(root, "baseline", c1, "1-drift") > 1.05  # the slow first point
    at_end = [_tpot(root, "ll-bf16", c1, f"{r}-drift") / _tpot(root, "baseline", c1, f"{r}-drift") - 1
              for r in range(4)]
    assert all(0 <= d < 0.01 for d in at_end[:2])  # machine 1: no gain
    assert all(-0.03 < d < -0.02 for d in at_end[2:])  # machine 2: seed 000's size
    assert all(-0.03 < _tpot(root, "ll-bf16", c1, r) / _tpot(root, "baseline", c1, r) - 1 < -0.02 for r in (2, 3))


def test_a_third_h100_runs_ll_bf16_gemm_in_its_graphs_and_gains(tmp_path):
    """The probe on a third H100 (2026-12-05, gemma4-h200-probe.yaml as it is): ll-bf16's decode buckets M = 1-16
    were captured with the dispatch to ll_bf16_gemm (startup counts in the raw JSON), the stock arm's ran the
    frozen graph with no gate call at all; its one c1 point reads ll-bf16 ~2.6 % faster, the second machine's size
    (docs/gpu-h200.md: the first machine is the odd one of three)."""
    run = EVIDENCE / "h100-probe-20261205"
    rundir = unpack(run, tmp_path / run.name)
    paths = {arm: json.loads((rundir / arm / "probe" / "gate-paths" / "rep-0.json").read_text())
             for arm in ("baseline", "ll-bf16")}
    captured = {c["bucket"]: c["path"] for c in paths["ll-bf16"]["startup_counts"] if c["kind"] == "outside"}
    assert {b: captured[b].rsplit(" > ", 1)[1] for b in ("1", "2-4", "5-8", "9-16")} == dict.fromkeys(
        ("1", "2-4", "5-8", "9-16"), "ll_bf16_gemm")
    assert not [c for c in paths["baseline"]["startup_counts"] + paths["baseline"]["counts"] if c["kind"] != "steps"]
    c1 = "isl128-osl64-c1-n16"
    ratio = _tpot(rundir, "ll-bf16", c1, 0) / _tpot(rundir, "baseline", c1, 0) - 1
    assert -0.03 < ratio < -0.02
    text = (run / "report.md").read_text()
    assert "NVIDIA H100 80GB HBM3" in text and f"4.82 → 4.70 ({100 * ratio:.1f}%)" in text
    assert "output throughput +2.2% (geometric mean over 1 point)" in text  # one point, not "1 points"


def test_a_fourth_h100_runs_abba_start_to_end_and_confirms_seed_000(tmp_path):
    """gemma4-h100-abba.yaml as it is, on one H100 from start to end (2026-12-06; the 2026-12-05 run was split over
    two machines that disagreed): INCONCLUSIVE at the look after 2 rounds (one degree of freedom), IMPROVEMENT at
    the last look after 4, every round's score +2.0 to +2.3 % (recomputed from the raw JSON); the same machine's
    probe (next session's call) captured ll_bf16_gemm in the decode buckets M = 1-16 and read c1 ~2.7 % faster."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h100-abba-one-machine-20261206", tmp_path / "abba")
    run = load_run(root)
    (ll,) = run.summaries
    assert run.manifest.status == "complete" and len(run.manifest.stretches) == 1
    looks = run.manifest.sequential.looks
    assert [(lk.rounds, lk.outcomes["ll-bf16"]) for lk in looks] == [(2, "INCONCLUSIVE"), (4, "IMPROVEMENT")]
    points = sorted(p.name for p in (root / "baseline" / "serve").iterdir() if p.name.startswith("isl"))
    scores = [sum(math.log(_tpot(root, "baseline", p, r) / _tpot(root, "ll-bf16", p, r)) for p in points)
              / len(points) for r in range(4)]
    assert all(0.020 < math.expm1(x) < 0.023 for x in scores), scores
    assert ll.evaluation.composite.estimate_pct == pytest.approx(100 * math.expm1(sum(scores) / 4), abs=0.05)
    assert ll.overall == "IMPROVEMENT" and ll.evaluation.composite.rci_low_pct > 1.5
    text = (EVIDENCE / "h100-abba-one-machine-20261206" / "report.md").read_text()
    assert "1 × NVIDIA H100 80GB HBM3, in all 32 jobs" in text

    probe = unpack(EVIDENCE / "h100-probe-20261206", tmp_path / "probe")
    paths = json.loads((probe / "ll-bf16" / "probe" / "gate-paths" / "rep-0.json").read_text())
    captured = {c["bucket"]: c["path"] for c in paths["startup_counts"] if c["kind"] == "outside"}
    assert {b: captured[b].rsplit(" > ", 1)[1] for b in ("1", "2-4", "5-8", "9-16")} == dict.fromkeys(
        ("1", "2-4", "5-8", "9-16"), "ll_bf16_gemm")
    c1 = "isl128-osl64-c1-n16"
    assert -0.03 < _tpot(probe, "ll-bf16", c1, 0) / _tpot(probe, "baseline", c1, 0) - 1 < -0.02


def test_the_h100s_decoder_layer_gains_what_seed_000_claims(tmp_path):
    """The layer stage on the second H100 (2026-12-05, gemma4-h200-layer-decide.yaml as it is): every T's row
    across six processes per arm reads 'better' for ll-bf16; at T = 1 the Δ is about seed 000's -3.85 µs a
    layer, recomputed from the raw per-process medians; the device is named as an H100."""
    run = EVIDENCE / "h100-layer-decide-20261205"
    root = unpack(run, tmp_path / run.name)
    medians = {arm: [next(r["median_us"] for r in json.loads(
        (root / arm / "layer" / "layer0" / f"rep-{rep}.json").read_text())["results"] if r["m"] == 1)
        for rep in range(6)] for arm in ("baseline", "ll-bf16")}
    base, cand = (math.exp(statistics.fmean(map(math.log, medians[a]))) for a in ("baseline", "ll-bf16"))
    assert -4.5 < cand - base < -3.5
    text = (run / "report.md").read_text()
    across = [line for line in text.splitlines() if line.startswith("| ") and "(6) |" in line]
    assert len(across) == 4 and all("better: 95% interval excludes 0" in line for line in across), across
    assert f"| {base:.2f} (6) | {cand:.2f} (6) | {100 * (cand / base - 1):.1f}% [" in across[0]
    assert "Device: NVIDIA H100 80GB HBM3." in text


def test_interleaved_on_the_h200_decides_seed_000_on_three_restart_sets(tmp_path):
    """The H200 run of gemma4-h200-interleaved.yaml (docs/gpu-h200.md): both servers alive at once, three blocks
    a round, stopped by hand after three sets (the stretch's end). The look after two sets was
    INCONCLUSIVE (one degree of freedom); the report's test on the three complete sets decides IMPROVEMENT. Each
    set's score is the mean over points of the log ratio of the medians of its blocks (the round is the
    unit), recomputed here from the raw JSON."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-interleaved-20261203", tmp_path / "interleaved")
    run = load_run(root)
    (ll,) = run.summaries
    (look,) = run.manifest.sequential.looks
    assert (look.rounds, look.outcomes, look.decided) == (2, {"ll-bf16": "INCONCLUSIVE"}, {"ll-bf16": False})
    assert (ll.overall, ll.evaluation.composite.n_rounds) == ("IMPROVEMENT", 3)
    points = sorted(p.name for p in (root / "baseline" / "serve").iterdir() if p.name.startswith("isl"))
    assert len(points) == 3

    scores = _set_scores(root, "baseline", "ll-bf16", 3)
    assert all(0.019 < x < 0.021 for x in scores)  # every set ~2 % better: sets agree to 0.05 point
    expected = (math.exp(sum(scores) / 3) - 1) * 100
    assert ll.evaluation.composite.estimate_pct == pytest.approx(expected, abs=0.05)


def test_an_interleaved_aa_on_the_h200_reads_equivalent_while_both_servers_move_together(tmp_path):
    """The H200 run of gemma4-h200-interleaved-aa.yaml (docs/gpu-h200.md): two identical stock servers alive at
    once, three blocks a round, looks after 3 and 4 sets; sets 0-1 on one machine, sets 2-3 on another
    (`--resume`). Recomputed from the raw JSON: between rounds both servers' TPOT moved by 1.4-2.3 %
    together, while inside each set the pair agreed to 0.5 %: what a sequential design would read as noise, the
    pairing by set removes. No position bias: the test reads EQUIVALENT within +-1 % at its last look, and one
    block slow just after a cold start (stock-again, set 2, c1: +6 %) is left out by its set's median."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-interleaved-aa-20261204", tmp_path / "h200-interleaved-aa-20261204")
    run = load_run(root)
    (aa,) = run.summaries
    assert run.manifest.status == "complete" and run.manifest.job_counts.ok == 80
    assert (aa.overall, aa.evaluation.composite.n_rounds) == ("EQUIVALENT", 4)
    points = sorted(p.name for p in (root / "baseline" / "serve").iterdir() if p.name.startswith("isl"))
    assert len(points) == 3

    def tpot(arm: str, point: str, block: int) -> float:
        return _tpot(root, arm, point, block)

    def set_mean(arm: str, point: str, s: int) -> float:
        return statistics.median(math.log(tpot(arm, point, b)) for b in range(3 * s, 3 * s + 3))

    scores = _set_scores(root, "baseline", "stock-again", 4)
    assert all(abs(x) < 0.002 for x in scores)  # the pair agrees inside each set
    for arm in ("baseline", "stock-again"):  # both moved 1.4-2.3 % from one round to the next
        assert all(0.01 < set_mean(arm, p, 1) - set_mean(arm, p, 0) < 0.03 for p in points)
    # the one slow block: stock-again's first c1 request train after set 2's cold start
    c1 = "isl128-osl64-c1-n16"
    assert tpot("stock-again", c1, 6) / tpot("baseline", c1, 6) > 1.05
    assert all(abs(tpot("stock-again", c1, b) / tpot("baseline", c1, b) - 1) < 0.01 for b in range(12) if b != 6)
    expected = (math.exp(sum(scores) / 4) - 1) * 100
    assert aa.evaluation.composite.estimate_pct == pytest.approx(expected, abs=0.01)
    report = (EVIDENCE / "h200-interleaved-aa-20261204" / "report.md").read_text()
    assert "**stock-again vs baseline: EQUIVALENT** — equal at every point · composite -0.0% [-0.3, +0.3]" in report
    # by the geometric mean of the blocks (the rule before), the slow block moved set 2 by half a point
    assert _set_scores(root, "baseline", "stock-again", 4, rule="mean")[2] < -0.004 < scores[2]
    # TTFT's wide intervals at c8/c16 come from three repeats whose whole first wave waited 5-7x the median,
    # in both arms: named, each of them and no other repeat
    slow = sorted((f.arm, f.point, f.round) for f in run.findings if f.check == "slow-request")
    assert slow == [("baseline", "isl128-osl64-c8-n64", 2), ("stock-again", "isl128-osl64-c16-n128", 0),
                    ("stock-again", "isl128-osl64-c16-n128", 5)]
    assert ("round 0, block 0, rep-0: the first 16 of 128 requests (the first wave at concurrency 16) waited ≥ 4× the median for "
            "their first token (slowest 971 ms, median 141 ms)") in report
    # the slow c1 block after set 2's cold start is named, and it is the run's only block off its set
    blocks = [(f.arm, f.point, f.round) for f in run.findings if f.check == "block-outlier"]
    assert blocks == [("stock-again", c1, 6)]
    # a drift repeat is named by its round and block, not as "round 11" of a four-set run
    assert "Drift check stock-again round 3, block 2, rep-11, the point again at the session's end" in report


def _tpot(root: Path, arm: str, point: str, rep: int | str) -> float:
    """Mean TPOT of one stored serving repeat (``rep``: the block, or e.g. ``"6-drift"``), from its raw JSON."""
    return json.loads((root / arm / "serve" / point / f"rep-{rep}.json").read_text())["mean_tpot_ms"]


def _set_scores(root: Path, a: str, b: str, sets: int, skip: frozenset[int] = frozenset(),
                rule: str = "median") -> list[float]:
    """Each round's score from the raw JSON: the mean over points of log(a's TPOT / b's TPOT), each arm's
    blocks at a point (three a set, those in ``skip`` left out) combined by their median in log, as the verdict
    combines them (``rule="mean"``: their geometric mean, the rule before 2026-12-04)."""
    points = sorted(p.name for p in (root / a / "serve").iterdir() if p.name.startswith("isl"))
    combine = statistics.median if rule == "median" else statistics.fmean

    def score(s: int) -> float:
        blocks = [k for k in range(3 * s, 3 * s + 3) if k not in skip]
        return sum(combine([math.log(_tpot(root, a, p, k)) for k in blocks])
                   - combine([math.log(_tpot(root, b, p, k)) for k in blocks])
                   for p in points) / len(points)

    return [score(s) for s in range(sets)]


def test_the_h200_interleaved_runs_with_blocks_in_random_order(tmp_path):
    """Seed 000 and its A/A on the H200 again (2026-12-04, docs/gpu-h200.md), each block's points now in a random
    order of its own (the plan recorded it; the records kept it), looks after 3 and 4 sets. Seed 000 decided at
    the first look (IMPROVEMENT +1.8 % then, +2.2 % by the median of the blocks now), c1 -3.0 % as by hand; the
    A/A stayed INCONCLUSIVE after 4 sets. Both were wider than the first pair: in each run, in two of the later
    sets one block of one point ran ~5 % slow on the arm measured first (named by block-outlier and
    session-drift; the set's median now leaves such a block out), and in the A/A the first set's two servers
    sat 2.2 % apart in every block and point (a start offset, which only more sets average)."""
    from suite.analysis import load_run

    c8, c16 = "isl128-osl64-c8-n64", "isl128-osl64-c16-n128"
    root = unpack(EVIDENCE / "h200-interleaved-blocks-20261204", tmp_path / "h200-interleaved-blocks-20261204")
    run = load_run(root)
    (ll,) = run.summaries
    (look,) = run.manifest.sequential.looks
    assert (look.rounds, look.outcomes, ll.overall, ll.decided_after) == (3, {"ll-bf16": "IMPROVEMENT"}, "IMPROVEMENT", 3)
    orders = {}  # each block's points in the order the plan gave them, the same on both arms
    for j in run.plan.jobs:
        kind, point, rep = j.key.split("/")
        if rep.removeprefix("rep-").isdigit():
            orders.setdefault((j.arm, int(rep[4:])), []).append(point)
    assert all(orders[("baseline", k)] == orders[("ll-bf16", k)] for k in range(9))
    assert len({tuple(orders[("baseline", k)]) for k in range(9)}) > 2
    scores = _set_scores(root, "baseline", "ll-bf16", 3)
    assert ll.evaluation.composite.estimate_pct == pytest.approx((math.exp(sum(scores) / 3) - 1) * 100, abs=0.01)
    slow = sorted((f.arm, f.point, f.round) for f in run.findings if f.check == "block-outlier")
    assert slow == [("ll-bf16", c16, 6), ("ll-bf16", c8, 3)]
    assert sorted((f.arm, f.point, f.round) for f in run.findings if f.check == "session-drift") == slow
    # by the geometric mean of the blocks (the rule the run was measured under) the two slow blocks spread the
    # sets 0.66 point, and 0.38 without them; the median leaves them out by itself: 0.33
    mean = _set_scores(root, "baseline", "ll-bf16", 3, rule="mean")
    clean = _set_scores(root, "baseline", "ll-bf16", 3, skip=frozenset({3, 6}), rule="mean")
    assert max(mean) - min(mean) > 0.006 and max(clean) - min(clean) < 0.004 and max(scores) - min(scores) < 0.004
    report = (EVIDENCE / "h200-interleaved-blocks-20261204" / "report.md").read_text()
    assert "**ll-bf16 vs baseline: IMPROVEMENT** — better at c1, c8, c16 · composite +2.2% [+1.4, +3.0]" in report
    assert "| c1 | 3.98 → 3.86 | -3.0% [-5.5, -0.4] | better |" in report
    assert "3 blocks of every point per round (each block's points in a random order of its own" in report
    assert "round 2, block 0, rep-6: Mean TPOT 5.45 ms at the point's first measurement" in report

    root = unpack(EVIDENCE / "h200-interleaved-aa-blocks-20261204", tmp_path / "h200-interleaved-aa-blocks-20261204")
    run = load_run(root)
    (aa,) = run.summaries
    assert run.manifest.status == "complete" and run.manifest.job_counts.ok == 80
    assert [(lk.rounds, lk.outcomes["stock-again"]) for lk in run.manifest.sequential.looks] == [
        (3, "INCONCLUSIVE"), (4, "INCONCLUSIVE")]
    assert (aa.overall, aa.evaluation.composite.n_rounds) == ("INCONCLUSIVE", 4)
    scores = _set_scores(root, "baseline", "stock-again", 4)
    assert aa.evaluation.composite.estimate_pct == pytest.approx((math.exp(sum(scores) / 4) - 1) * 100, abs=0.01)
    first = _set_scores(root, "baseline", "stock-again", 1)
    assert all(0.015 < _set_scores(root, "baseline", "stock-again", 1, skip=frozenset({0, 1, 2} - {k}))[0] < 0.03
               for k in range(3)) and 0.02 < first[0] < 0.025  # set 0: 2.2 % apart in every block
    assert all(abs(x) < 0.008 for x in scores[1:])
    slow = sorted((f.arm, f.point, f.round) for f in run.findings if f.check == "block-outlier")
    assert slow == [("stock-again", c16, 6), ("stock-again", c8, 9)]
    report = (EVIDENCE / "h200-interleaved-aa-blocks-20261204" / "report.md").read_text()
    assert "**stock-again vs baseline: INCONCLUSIVE** — undecided at c1, c8, c16 · composite +0.5% [-1.8, +2.8]" in report


def test_a_settle_does_not_shorten_the_h200s_slow_first_minute(tmp_path):
    """Seed 000 interleaved with a 30 s settle after the 8 s quiet (2026-12-04, docs/gpu-h200.md): the arm measured
    first in a set loaded its first point's shape in ~2 s chunks until 30 s after both servers answered, each
    chunk's mean TPOT kept in the job record. The machine was taken back in set 3 (72 of 80 jobs). In set 2 the
    ll-bf16 server was slow from its first chunk to its first measured block, all at one level ~4.5 % above its
    later blocks: load does not end that state, so the settle is not in the matrices. The look after 3 sets read
    INCONCLUSIVE: set 0's servers sat ~2 points apart from the later sets' (a start offset)."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-interleaved-settle-20261204", tmp_path / "h200-interleaved-settle-20261204")
    run = load_run(root)
    assert run.manifest.status == "running" and run.manifest.job_counts.ok == 72
    assert [(lk.rounds, lk.outcomes["ll-bf16"]) for lk in run.manifest.sequential.looks] == [(3, "INCONCLUSIVE")]
    settles = {}  # (arm, concurrency, block) -> the settle chunks' mean TPOT, from the job records
    for f in root.glob("*/serve/*/rep-*.job.json"):
        record = json.loads(f.read_text())
        if (chunks := ((record.get("warmup") or {}).get("settle") or {}).get("chunks")):
            job = record["job"]
            settles[(job["arm"], job["params"]["concurrency"], job["repeat"])] = [c["mean_tpot_ms"] for c in chunks]
    assert sorted(settles) == [("ll-bf16", 8, 3), ("ll-bf16", 16, 6), ("ll-bf16", 16, 9)]

    def tpot(arm: str, point: str, rep: str) -> float:
        return _tpot(root, arm, point, rep)

    c16 = "isl128-osl64-c16-n128"
    later = [tpot("ll-bf16", c16, r) for r in ("7", "8", "6-drift")]
    slow = settles[("ll-bf16", 16, 6)]
    assert len(slow) == 9 and min(slow) / max(later) > 1.04 and max(slow) / min(slow) < 1.01
    assert tpot("ll-bf16", c16, "6") / max(later) > 1.04  # and its first measured block too
    normal = settles[("ll-bf16", 16, 9)]  # set 3's settle ran at its server's level
    assert abs(sum(normal) / len(normal) / tpot("ll-bf16", c16, "10") - 1) < 0.01
    scores = _set_scores(root, "baseline", "ll-bf16", 3)
    assert scores[0] > 0.035 and all(0.017 < x < 0.022 for x in scores[1:])
    report = (EVIDENCE / "h200-interleaved-settle-20261204" / "report.md").read_text()
    assert "**ll-bf16 vs baseline: INCONCLUSIVE** — undecided at c1, c8, c16 · composite +2.7% [-2.8, +8.4]" in report
    # the card shows the values its test ran on, so the set off the others is there to see
    assert "each round's score: round 0 +4.0%, round 1 +2.0%, round 2 +1.9%" in report
    assert "settle: a session's first point measured 30 s or more after its servers answered" in report


def test_a_cold_first_set_sits_apart_and_a_precompiled_one_does_not(tmp_path):
    """Two A/As on the H200 (2026-12-04, docs/gpu-h200.md). Without precompile (the machine was lost in set 1, 29
    of 120 jobs): set 0's two servers, both compiling cold, sat 2-3.4 % apart in every block and point, and set
    1's (warm) within 0.2 % — the third cold first set with such an offset, never a warm one. With precompile
    (every arm's server started once and stopped before set 0): set 0 started warm and its servers agree like
    every later set's, and the A/A read EQUIVALENT at the first look (3 sets)."""
    from suite.analysis import load_run

    points = ("isl128-osl64-c1-n16", "isl128-osl64-c8-n64", "isl128-osl64-c16-n128")
    root = unpack(EVIDENCE / "h200-interleaved-aa6-20261204", tmp_path / "aa6")
    run = load_run(root)
    assert run.manifest.status == "running" and run.manifest.job_counts.ok == 29
    cold = [_tpot(root, "baseline", p, k) / _tpot(root, "stock-again", p, k) for p in points for k in range(3)]
    assert all(0.965 < r < 0.983 for r in cold)  # baseline 1.7-3.5 % faster, every block, every point
    warm = [_tpot(root, "baseline", p, 3) / _tpot(root, "stock-again", p, 3) for p in points]
    assert all(abs(r - 1) < 0.002 for r in warm)
    report = (EVIDENCE / "h200-interleaved-aa6-20261204" / "report.md").read_text()
    assert "status **running** (jobs ok 29, failed 0, missing 91)" in report
    assert "dropped: round 1: incomplete" in report  # the set the machine was lost in

    root = unpack(EVIDENCE / "h200-interleaved-aa-precompile-20261204", tmp_path / "precompile")
    run = load_run(root)
    (aa,) = run.summaries
    assert run.manifest.status == "complete" and run.manifest.job_counts.ok == 60
    assert [(lk.rounds, lk.outcomes["stock-again"]) for lk in run.manifest.sequential.looks] == [(3, "EQUIVALENT")]
    for arm in ("baseline", "stock-again"):  # the precompile server: cold, stopped before set 0 began
        pre = json.loads((root / arm / "precompile.json").read_text())
        first = json.loads((root / arm / "server-0.json").read_text())
        assert pre["healthy_after_s"] > 150 and first["healthy_after_s"] < 120
        assert "saved AOT compiled function" in (root / arm / "precompile.log").read_text()
        assert "Directly load AOT compilation" in (root / arm / "server-0.log").read_text()
    scores = _set_scores(root, "baseline", "stock-again", 3)
    assert all(0 < x < 0.006 for x in scores)  # set 0 like the others
    assert aa.evaluation.composite.estimate_pct == pytest.approx((math.exp(sum(scores) / 3) - 1) * 100, abs=0.01)
    report = (EVIDENCE / "h200-interleaved-aa-precompile-20261204" / "report.md").read_text()
    # equal within the margin at c8 and c16; c1 too loosely measured for it: not EQUIVALENT (the composite alone was)
    assert ("**stock-again vs baseline: INCONCLUSIVE** — equal at c8, c16; undecided at c1 · composite +0.3% "
            "[-0.2, +0.8]") in report
    assert "each round's score: round 0 +0.3%, round 1 +0.2%, round 2 +0.4%" in report
    assert "precompile: every serving arm's server started once before the first session" in report


def test_seed_000s_precompiled_first_set_reads_like_the_warm_sets_of_earlier_runs(tmp_path):
    """Seed 000 with precompile on the H200 (2026-12-04 21:30 UTC; the machine was lost in set 1, 20 of 80 jobs):
    set 0 started from the caches the precompile servers wrote, and read c1 -3.0 %, c8 -1.9 %, c16 -1.6 % (TPOT,
    the blocks' median), a set score of +2.2 %: where the earlier runs' warm sets lay (+1.9 to +2.2 %), not where
    the settle run's cold set 0 did (+4.0 %). One set is no test: the report says the first look is planned after
    three, and does not call its one set final."""
    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h200-interleaved-precompile-20261204", tmp_path / "precompile-000")
    run = load_run(root)
    assert run.manifest.status == "running" and run.manifest.job_counts.ok == 20
    for arm in ("baseline", "ll-bf16"):
        pre = json.loads((root / arm / "precompile.json").read_text())
        first = json.loads((root / arm / "server-0.json").read_text())
        assert pre["healthy_after_s"] > 150 and first["healthy_after_s"] < 120
        assert "Directly load AOT compilation" in (root / arm / "server-0.log").read_text()
    c1 = [_tpot(root, "ll-bf16", "isl128-osl64-c1-n16", k) / _tpot(root, "baseline", "isl128-osl64-c1-n16", k)
          for k in (0, 1, 2, "0-drift")]
    assert all(0.967 < r < 0.972 for r in c1)  # -2.9 to -3.2 % in every block and at the set's end
    (score,) = _set_scores(root, "ll-bf16", "baseline", 1)
    assert -0.023 < score < -0.020  # ll-bf16 2.0-2.3 % faster: the warm sets' level
    report = (EVIDENCE / "h200-interleaved-precompile-20261204" / "report.md").read_text()
    assert "**ll-bf16 vs baseline: INCONCLUSIVE** — undecided at c1, c8, c16 · composite +2.2% (no interval)" in report
    assert "1 round: no interval; look 1 of 2 is planned after 3 rounds" in report
    # the design line says what the first look will use, not an interval it has
    assert "  - planned: repeated 98.5 % interval, look 1 of 2 (O'Brien–Fleming); better is +" in report
    assert "final: no more rounds" not in report
    assert "round 0, block 2, rep-2: Mean TPOT 5.46 ms, +4.9%" in report  # the one block off its set, named
    aa6 = (EVIDENCE / "h200-interleaved-aa6-20261204" / "report.md").read_text()
    assert "1 round: no interval; the test (fixed design) is planned after 6 rounds" in aa6


def test_seed_000_precompiled_decides_at_its_first_look_on_the_h200(tmp_path, capsys):
    """Seed 000 with precompile on one H200 to its verdict (2026-12-05 19:49-20:01 UTC, 60 of 80 jobs): the look
    after three sets decides IMPROVEMENT +2.2 %, each set +2.1 to +2.2 %, c1 TPOT -3.0 % (the hand run's figure,
    FACTS §12). The set scores are recomputed from the raw JSON; `suite plan` from it prices the next run at the
    matrix's first look (3 sets), never at fewer than a run of that matrix can decide on, and shows an SD under
    1 % with two decimals (it printed "0.0 %" and "2" rounds before)."""
    from suite.analysis import load_run

    name = "h200-interleaved-precompile-20261205"
    root = unpack(EVIDENCE / name, tmp_path / name)
    run = load_run(root)
    (ll,) = run.summaries
    (look,) = run.manifest.sequential.looks
    assert (look.rounds, look.outcomes, look.decided) == (3, {"ll-bf16": "IMPROVEMENT"}, {"ll-bf16": True})
    assert run.manifest.status == "complete" and run.manifest.job_counts.ok == 60
    assert (ll.overall, ll.evaluation.composite.n_rounds) == ("IMPROVEMENT", 3)
    scores = _set_scores(root, "baseline", "ll-bf16", 3)
    assert all(0.020 < x < 0.023 for x in scores)
    assert ll.evaluation.composite.estimate_pct == pytest.approx((math.exp(sum(scores) / 3) - 1) * 100, abs=0.05)
    c1 = [_tpot(root, "ll-bf16", "isl128-osl64-c1-n16", k) / _tpot(root, "baseline", "isl128-osl64-c1-n16", k)
          for k in range(9)]
    assert all(0.965 < r < 0.975 for r in c1)  # -2.5 to -3.5 % in each of the nine blocks
    for arm in ("baseline", "ll-bf16"):
        assert "Directly load AOT compilation" in (root / arm / "server-0.log").read_text()
    report = (EVIDENCE / name / "report.md").read_text()
    assert "**ll-bf16 vs baseline: IMPROVEMENT** — better at c1, c8, c16 · composite +2.2% [+2.0, +2.4]" in report
    assert "1 × NVIDIA H200, in all 60 jobs" in report

    assert main(["plan", str(EVIDENCE.parent.parent / "matrices" / "gemma4-h200-interleaved.yaml"),
                 "--from", str(root)]) == 0
    out = capsys.readouterr().out
    assert "looks after 3, 4 rounds" in " ".join(out.split())
    (row,) = [line for line in out.splitlines() if line.startswith("│ ll-bf16")]
    cols = [c.strip() for c in row.strip("│ ").split("│")]
    sd = 100 * math.expm1(statistics.stdev(scores))
    assert cols[1:4] == ["3", f"{sd:.2f} %", "3"]
    # the wall time split: the precompile's 174 s once (both servers started together: the slower), the rest
    # of the run's running time over its three sets
    once = max(json.loads((root / a / "precompile.json").read_text())["healthy_after_s"] for a in ("baseline", "ll-bf16"))
    per_set = (run.manifest.running_seconds() - once) / 3
    assert f"wall time: {once / 60:.1f} min once (precompile, correctness and probe jobs, correctness-only servers) + {per_set / 60:.1f} min a " \
           "round" in " ".join(out.split())
    assert cols[4] == f"{(once + 3 * per_set) / 60:.0f} min"


def test_a_run_cut_after_two_of_four_sets_says_so_in_its_report(tmp_path):
    """The same A/A as the first machine left it (sets 0-1 measured, the manifest still `running`, no look
    taken): the report says the run did not finish and that its test is short of the first look (3 sets),
    rather than claiming that look; it offers no "rounds would detect" already run."""
    root = unpack(EVIDENCE / "h200-interleaved-aa-20261204", tmp_path / "cut")
    for f in root.glob("*/serve/*/rep-*"):
        if int(f.name.split(".")[0].split("-")[1]) >= 6:  # blocks 6-11: rounds 2 and 3
            f.unlink()
    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(status="running", finished=None, sequential=None,
                    job_counts={"ok": 40, "failed": 0, "missing": 40})
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert main(["report", str(root)]) == 0
    report = (root / "report.md").read_text()
    assert "status **running** (jobs ok 40, failed 0, missing 40) — the run has not finished" in report
    # the two sets' medians agree within 0.1 %, but two sets (1 df) cannot put each point inside +-1 % at the
    # first look's stricter boundary: INCONCLUSIVE (the composite alone read EQUIVALENT), and the report says
    # the test ran short of that look
    assert "**stock-again vs baseline: INCONCLUSIVE** — undecided at c1, c8, c16 · composite -0.1% [-1.5, +1.4]" in report
    assert "2 rounds, short of look 1 of 2, planned after 3; tested at that look's boundary" in report
    assert "Drift check stock-again round 1, block 2, rep-5, the point again at the session's end" in report
    assert "Drift check stock-again round 2" not in report


def test_seed_000s_latency_row_is_read_across_engine_starts(tmp_path):
    """The H200 run of gemma4-h200-latency.yaml (2026-12-04): `vllm bench latency` at batch 1, 128 in / 64 out,
    three engine starts per arm. The row's Δ% and its interval are recomputed here from the raw per-iteration
    latencies (each start's geometric mean, paired by round, t on 2 df): -2.0 % [-6.7, +3.0], no verdict, because
    the three starts' ratios spread from -0.2 to -4.0 %."""
    run = EVIDENCE / "h200-latency-20261204"
    root = unpack(run, tmp_path / run.name)

    def start_mean(arm: str, rep: int) -> float:
        lat = json.loads((root / arm / "latency" / "in128-out64-bs1" / f"rep-{rep}.json").read_text())["latencies"]
        assert len(lat) == 10
        return math.exp(sum(math.log(x) for x in lat) / len(lat))

    logs = [math.log(start_mean("ll-bf16", r) / start_mean("baseline", r)) for r in range(3)]
    assert all(x < 0 for x in logs)  # ll-bf16 faster in every round, by very different amounts
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 df)
    lo, est, hi = (100 * (math.exp(v) - 1) for v in (mean - half, mean, mean + half))
    row = next(line for line in (run / "report.md").read_text().splitlines() if line.startswith("| 1 | 128 / 64 |"))
    assert f"| {est:.1f}% [{lo:.1f}, +{hi:.1f}] | 3 | 30/30 | not significant: 95% interval includes 0" in row, row
    assert "**ll-bf16 vs baseline: NO SERVING TEST**" in (run / "report.md").read_text()
    # the history index stores the card's word (it stored NO DATA for a run whose tables hold verdicts)
    from suite.cli import main
    from suite.history import list_runs

    assert main(["history", "--runs", str(tmp_path), "--scan"]) == 0
    (row,) = list_runs(tmp_path / "history.sqlite")
    assert [(v.candidate, v.overall) for v in row.verdicts] == [("ll-bf16", "NO SERVING TEST")]
    # the header gives each round's arm order as the records' start times have it
    started = {(arm, rep): json.loads((root / arm / "latency" / "in128-out64-bs1" / f"rep-{rep}.job.json").read_text())
               ["started"] for arm in ("baseline", "ll-bf16") for rep in range(3)}
    order = "; ".join(" → ".join(sorted(("baseline", "ll-bf16"), key=lambda a, r=r: started[(a, r)])) for r in range(3))
    assert order == "baseline → ll-bf16; ll-bf16 → baseline; ll-bf16 → baseline"
    assert f"offline stages: 3 rounds, each arm once a round, in the order {order}" in (run / "report.md").read_text()


def test_the_card_opens_with_each_points_own_word_and_numbers(tmp_path):
    """The H200 interleaved run of the ll-bf16 dispatch: the card's first lines are the per-point table a PR
    pastes, each row the point's mean TPOT before → after (the cells' geometric means), Δ % with the interval of
    the test that decided the point, and its word; every number from the run's own family test."""
    from suite.analysis import load_run
    from suite.report_verdict import point_labels
    from suite.stats import fmt_interval, fmt_pct
    from suite.verdict import Outcome
    from suite.verdict_family import PointWord

    name = "h200-interleaved-precompile-20261205"
    run = load_run(unpack(EVIDENCE / name, tmp_path / name))
    (s,) = run.summaries
    ev = s.evaluation
    assert ev.outcome == Outcome.IMPROVEMENT and set(ev.point_words().values()) == {PointWord.BETTER}
    text = (EVIDENCE / name / "report.md").read_text()
    assert "**ll-bf16 vs baseline: IMPROVEMENT** — better at c1, c8, c16 · composite +2.2%" in text
    labels = point_labels(run)
    for point, (h,) in ev.points.items():
        cell = s.cells[(point, "mean_tpot_ms")]
        r = h.shown
        assert r.delta_pct < 0 and cell.after < cell.before  # TPOT down: the metric's own direction
        row = (f"| {labels[point]} | {cell.before:.2f} → {cell.after:.2f} | {fmt_pct(r.delta_pct)} "
               f"{fmt_interval(*r.own_interval_pct)} | better |")
        assert row in text, row
    # the table sits above everything else of the card
    card = text.split("## Verdict", 1)[1]
    assert card.index("| Point | Mean TPOT (ms) | Δ % | Says |") < card.index("rounds of servers alive")


def test_a_slowdown_whose_ttft_alone_read_better_is_inconclusive_not_an_improvement(tmp_path):
    """The CPU run (2026-12-06) where a 150 us gate slowdown read IMPROVEMENT: the composite's interval held 0,
    and Mean TTFT's own test over the points on three rounds (2 df) once decided the word. In the family
    (the composite and every metric at every point, family-wise alpha) nothing is confirmed: INCONCLUSIVE, every
    point undecided with the change it could have detected."""
    from suite.analysis import load_run
    from suite.verdict import Outcome
    from suite.verdict_family import PointWord

    name = "cpu-sensitivity-150us-improvement-20261206"
    run = load_run(unpack(EVIDENCE / name, tmp_path / name))
    (s,) = run.summaries
    ev = s.evaluation
    assert ev.composite.rci_low_pct < 0 < ev.composite.rci_high_pct and not ev.confirmed
    assert ev.outcome == Outcome.INCONCLUSIVE == s.word
    assert set(ev.point_words().values()) == {PointWord.UNDECIDED}
    text = (EVIDENCE / name / "report.md").read_text()
    assert "**gate-150us vs baseline: INCONCLUSIVE** — undecided at 128/32 c1, 128/32 c4, 256/16 c8" in text


def test_a_run_resumed_on_another_gpu_model_says_so_in_its_report(tmp_path):
    """The H100 run resumed on a second machine (2026-12-05) was an H100 both times; had the second been an H200
    (`nvidia-h200` may lend either), nothing in the report said so. Each job's nvidia-smi record now carries the
    GPU's name, and the report names the GPUs, in bold when the jobs differ."""
    root = unpack(EVIDENCE / "h100-abba-20261205", tmp_path / "h100")
    for rec in root.glob("*/serve/*/*.job.json"):
        data = json.loads(rec.read_text())
        name = "NVIDIA H100 80GB HBM3" if int(rec.name.split("-")[1].split(".")[0]) < 2 else "NVIDIA H200"
        for state in data["device"]["before"]:
            state["name"] = name
        rec.write_text(json.dumps(data))
    assert main(["report", str(root)]) == 0
    text = (root / "report.md").read_text()
    assert ("- **GPUs differ between jobs** (nvidia-smi before each job): 1 × NVIDIA H100 80GB HBM3 in 16 jobs; "
            "1 × NVIDIA H200 in 16 jobs: the run mixes GPU models") in text


def test_plan_tells_a_restart_sets_own_offset_from_its_blocks_noise(tmp_path, capsys):
    """`suite plan` from an interleaved run says where its noise is: the H200 A/A whose set 0 held a 2.2 % start
    offset in every block has a set part (F on 3 and 8 df); the precompiled A/A's sets spread no more than
    their blocks (2026-12-04); the numbers are the block scores' one-way analysis, recomputed here by scipy."""
    from scipy.stats import f_oneway

    from suite.analysis import block_scores, load_run, verdict_spec

    lines = {}
    for name, matrix in (("h200-interleaved-aa-blocks-20261204", "gemma4-h200-interleaved-aa.yaml"),
                         ("h200-interleaved-aa-precompile-20261204", "gemma4-h200-interleaved-aa-precompile.yaml")):
        root = unpack(EVIDENCE / name, tmp_path / name)
        assert main(["plan", str(EVIDENCE.parent.parent / "matrices" / matrix), "--from", str(root)]) == 0
        lines[name] = " ".join(capsys.readouterr().out.split())
        run = load_run(root)
        expected = f_oneway(*block_scores(run, "stock-again", verdict_spec(run)).values())
        assert f"F = {expected.statistic:.2f}" in lines[name] and f"p = {expected.pvalue:.2g};" in lines[name]
    assert ("stock-again: its blocks spread 0.62 % inside a round, a round's own part 1.29 % (F = 13.99 on 3 "
            "and 8 degrees of freedom, p = 0.0015; 4 rounds of 3 blocks). The rounds carry offsets of their own"
            ) in lines["h200-interleaved-aa-blocks-20261204"]
    assert "a round's own part 0.00 %" in lines["h200-interleaved-aa-precompile-20261204"]
    assert "No sign of a round's own part: the rounds spread as their 3 blocks predict" in lines[
        "h200-interleaved-aa-precompile-20261204"]


def test_a_cards_unreliable_cells_point_at_their_reasons():
    """An unreliable cell is either left out by a data-quality finding or has an interval too wide to show; the
    Data quality box counts only the first kind, so a card that said "13 unreliable" beside a box that lists none
    sent the reader to the wrong place (2026-12-05, the demo's "1 unreliable" beside "0 unreliable finding(s)").
    The card now points at Statistics per point, which gives each cell's reason."""
    report = (EVIDENCE / "h200-abba-20261203" / "report.md").read_text()
    assert "13 of all 36 unreliable (each one's reason: Statistics per point)" in report
    reasons = [line for line in report.split("## Statistics per point")[1].splitlines() if "| unreliable:" in line]
    assert len(reasons) == 13 and all("too wide to show" in line for line in reasons)
    clean = (EVIDENCE / "h200-interleaved-20261203" / "report.md").read_text()
    assert "the other cells (every metric at every point, 33 of 36;" in clean and "unreliable (each" not in clean


def test_plan_counts_a_stretch_without_its_end_to_its_last_job(tmp_path, capsys):
    """The H100 run's first stretch has no recorded end (its machine was lost with the run going): `suite plan`
    printed a bare "n/a" for its wall time. It now counts that stretch to the last job record written before
    the next stretch began, and says so; a run with nothing paid once (ABBA, no precompile) prices rounds
    alone."""
    from datetime import datetime

    from suite.analysis import load_run

    root = unpack(EVIDENCE / "h100-abba-20261205", tmp_path / "h100")
    run = load_run(root)
    first, second = run.manifest.stretches
    assert first.finished is None and second.finished is not None
    last = max(r.written for r in run.records if r.written < second.started)
    seconds = ((datetime.fromisoformat(last) - datetime.fromisoformat(first.started))
               + (datetime.fromisoformat(second.finished) - datetime.fromisoformat(second.started))).total_seconds()
    assert main(["plan", str(EVIDENCE.parent.parent / "matrices" / "gemma4-h100-abba.yaml"), "--from", str(root)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"wall time: {seconds / 4 / 60:.1f} min a round, as this run spent them (1 stretch(es) with no recorded "
            "end counted to their last job)") in out
    report = (EVIDENCE / "h100-abba-20261205" / "report.md").read_text()
    assert f"{first.started} to — (no end recorded; its last job ended {last}) on vm, 32 jobs to run" in report
    root = unpack(EVIDENCE / "h200-abba-20261203", tmp_path / "h200")
    assert main(["plan", str(EVIDENCE.parent.parent / "matrices" / "gemma4-h200-abba.yaml"), "--from", str(root)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "min a round, as this run spent them" in out and "once" not in out


def test_a_trade_off_on_the_h100_reads_mixed_and_names_its_points(tmp_path):
    """gemma4-h100-tradeoff.yaml as it is, on one H100 (2026-12-07, three ABBA rounds, ~15 min): the ll-bf16
    router-GEMM dispatch with a 6 us gate delay from 8 tokens a call on. The card reads MIXED, better at c1 and
    worse at c8 and c16, as the matrix expects; each point's Δ is recomputed here from the raw JSON (the paired
    rounds' mean log ratio of mean TPOT), and every record names the machine: one H100, by its UUID."""
    run = EVIDENCE / "h100-tradeoff-20261207"
    root = unpack(run, tmp_path / run.name)
    text = (run / "report.md").read_text()
    assert "- **tradeoff vs baseline: MIXED** — better at c1; worse at c8, c16 · composite" in text
    points = {"c1": "isl128-osl64-c1-n16", "c8": "isl128-osl64-c8-n64", "c16": "isl128-osl64-c16-n128"}
    words = {"c1": "better", "c8": "worse", "c16": "worse"}
    for label, point in points.items():
        ratios = [_tpot(root, "tradeoff", point, r) / _tpot(root, "baseline", point, r) for r in range(3)]
        delta = 100 * math.expm1(statistics.fmean(map(math.log, ratios)))
        row = next(line for line in text.splitlines() if line.startswith(f"  | {label} |"))
        assert f"| {delta:+.1f}% [" in row and f"| {words[label]} | {words[label]}: as expected |" in row, row
    assert abs(delta) > 1.5  # c16: a change the size the router gate makes, not noise
    records = [json.loads(p.read_text()) for p in root.glob("*/serve/*/rep-*.job.json")]
    assert len(records) == 24
    assert {r["where"]["gpus"][0]["uuid"] for r in records} == {"GPU-3f245557-c394-167e-c69a-a398dba16265"}
    assert "where it ran: vm · 1 × NVIDIA H100 80GB HBM3 (GPU-3f245557)" in text


def test_what_leaves_the_machine_agrees_with_the_report(tmp_path):
    """summary.md (the pull request's paste), results.json and results.csv of the stored H100 trade-off, made by
    `suite report` from the raw files: the same words, points and numbers as report.md, the environment named."""
    run = EVIDENCE / "h100-tradeoff-20261207"
    root = unpack(run, tmp_path / run.name)
    assert main(["report", str(root)]) == 0
    report, summary = (root / "report.md").read_text(), (root / "summary.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("  | c")]
    assert len(table) == 3 and all(line in summary.splitlines() for line in table)
    assert "- **tradeoff vs baseline: MIXED** — better at c1; worse at c8, c16 · composite" in summary
    assert ("Environment: 1 × NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA/ROCm 13.0; baseline: vLLM 0.26.0; "
            "tradeoff: vLLM 0.26.0 + ll-bf16-router-gemm-dispatch, synthetic-gate-delay; suite") in summary
    assert "Reproduce: `suite run matrices/gemma4-h100-tradeoff.yaml`" in summary
    assert len(summary) < len(report) / 5
    results = json.loads((root / "results.json").read_text())
    assert results["schema_version"] == 1 and results["status"] == "complete"
    (cand,) = results["candidates"]
    assert (cand["word"], cand["where"]) == ("MIXED", "better at c1; worse at c8, c16")
    words = {p["point"]: (p["word"], p["as_expected"]) for p in cand["points"]}
    assert words == {"isl128-osl64-c1-n16": ("better", True), "isl128-osl64-c8-n64": ("worse", True),
                     "isl128-osl64-c16-n128": ("worse", True)}
    c8 = next(p for p in cand["points"] if p["point"] == "isl128-osl64-c8-n64")
    ratios = [_tpot(root, "tradeoff", c8["point"], r) / _tpot(root, "baseline", c8["point"], r) for r in range(3)]
    assert c8["delta_pct"] == pytest.approx(100 * math.expm1(statistics.fmean(map(math.log, ratios))), abs=1e-6)
    rows = (root / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + len(cand["cells"]) == 1 + 36
    assert results["environment"]["machines"] == ["vm · 1 × NVIDIA H100 80GB HBM3 (GPU-3f245557)"]


def test_the_pareto_view_draws_each_arms_points_from_the_raw_json(tmp_path):
    """Throughput against interactivity (report.html draws it; report.md lists its points): per arm and
    concurrency the median over rounds of output tokens/s and of 1000 / mean TPOT, recomputed from the raw JSON
    of the stored H100 trade-off: c1 right of the baseline (faster per user), c8 and c16 left of it."""
    run = EVIDENCE / "h100-tradeoff-20261207"
    root = unpack(run, tmp_path / run.name)
    text = (run / "report.md").read_text().split("## Throughput against interactivity", 1)[1].split("\n## ", 1)[0]
    x = {}
    for arm in ("baseline", "tradeoff"):
        for conc, point in (("1", "isl128-osl64-c1-n16"), ("8", "isl128-osl64-c8-n64"), ("16", "isl128-osl64-c16-n128")):
            raws = [json.loads((root / arm / "serve" / point / f"rep-{r}.json").read_text()) for r in range(3)]
            user = statistics.median(1000 / r["mean_tpot_ms"] for r in raws)
            tput = statistics.median(r["output_throughput"] for r in raws)
            assert f"| {arm} | c{conc} | {user:,.4g} | {tput:,.4g} |" in text, (arm, conc, user, tput)
            x[(arm, conc)] = user
    assert x[("tradeoff", "1")] > x[("baseline", "1")] and x[("tradeoff", "8")] < x[("baseline", "8")]
    assert 'id="frontier-isl128-osl64' in (run / "report.html").read_text() or "frontier-isl128-osl64" in (
        run / "report.html").read_text()
