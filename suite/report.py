"""The report: recomputed from the raw files of a run directory only, written as report.md.

Serving: for each candidate arm against the baseline, per point, before -> after (Δ%) for throughput and the
latency metrics, with the interval and verdict from suite.stats; self-checks per point; failed jobs are
listed, never hidden. Other stages (accuracy, kernel, ...) add their sections when their files exist.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.plan import AA_SUFFIX
from suite.stats import METRICS, Comparison, Verdict, compare_metric, geometric_mean_ratio, noise_floor_pct
from suite.store import RunStore, atomic_write_text, read_json

HEADLINE = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
DETAIL = ("output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
          "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms",
          "p99_e2el_ms")
MARK = {Verdict.BETTER: "▲", Verdict.WORSE: "▼", Verdict.NOT_SIGNIFICANT: "·", Verdict.UNRELIABLE: "?"}


@dataclass
class PointResults:
    point: str
    params: dict[str, Any]
    reps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # arm -> raw results (repeat order)
    drift: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> raw result of the drift repeat


@dataclass
class RunData:
    root: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    points: dict[str, PointResults]

    @property
    def arms(self) -> list[str]:
        return list(self.manifest.get("plan", {}).get("arms") or self.manifest.get("arms", {}))

    @property
    def baseline(self) -> str:
        return self.manifest.get("plan", {}).get("baseline") or self.arms[0]

    @property
    def candidates(self) -> list[str]:
        return [a for a in self.arms if a != self.baseline and not a.endswith(AA_SUFFIX)]

    @property
    def aa_arm(self) -> str | None:
        name = self.baseline + AA_SUFFIX
        return name if name in self.arms else None


def load_run(run_dir: Path) -> RunData:
    store = RunStore.open(run_dir)
    records = store.records()
    points: dict[str, PointResults] = {}
    for rec in sorted(records, key=lambda r: (r["job"]["point"], r["job"]["repeat"])):
        job = rec["job"]
        if job["kind"] != "serve" or rec.get("status") != "ok":
            continue
        suffix = f"-{job['tag']}" if job["tag"] else ""
        raw = run_dir / job["arm"] / "serve" / job["point"] / f"rep-{job['repeat']}{suffix}.json"
        if not raw.is_file():
            continue
        pr = points.setdefault(job["point"], PointResults(job["point"], job["params"]))
        if job["tag"] == "drift":
            pr.drift[job["arm"]] = read_json(raw)
        else:
            pr.reps.setdefault(job["arm"], []).append(read_json(raw))
    ordered = dict(sorted(points.items(), key=lambda kv: (kv[1].params["isl"], kv[1].params["osl"],
                                                          kv[1].params["concurrency"])))
    return RunData(root=run_dir, manifest=store.manifest(), records=records, points=ordered)


# ---------------------------------------------------------------------------------------- numbers


def fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def metric_values(results: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in results if r.get(key) is not None]


def noise_floors(run: RunData) -> dict[str, float]:
    """Per metric: the A/A floor from baseline vs baseline.aa across all points (empty without A/A)."""
    aa = run.aa_arm
    if aa is None:
        return {}
    floors: dict[str, float] = {}
    for key in DETAIL:
        pairs = [(metric_values(p.reps[run.baseline], key), metric_values(p.reps[aa], key))
                 for p in run.points.values() if run.baseline in p.reps and aa in p.reps]
        pairs = [(b, c) for b, c in pairs if b and c and min(b + c) > 0]
        if pairs:
            floors[key] = noise_floor_pct(pairs)
    return floors


def compare_point(run: RunData, point: PointResults, cand: str, key: str,
                  floors: dict[str, float]) -> Comparison | None:
    base_vals = metric_values(point.reps.get(run.baseline, []), key)
    cand_vals = metric_values(point.reps.get(cand, []), key)
    if not base_vals or not cand_vals:
        return None
    paired = run.manifest.get("plan", {}).get("order") == "abba" and len(base_vals) == len(cand_vals)
    return compare_metric(key, base_vals, cand_vals, noise_floor_pct=floors.get(key), paired=paired)


def cell(c: Comparison | None) -> str:
    if c is None:
        return "missing"
    return f"{fmt(c.baseline.median)} → {fmt(c.candidate.median)} ({fmt_pct(c.delta_pct)}) {MARK[c.verdict]}"


def self_checks(point: PointResults, arm: str) -> list[str]:
    notes = []
    conc = point.params["concurrency"]
    n = point.params["num_prompts"]
    for r in point.reps.get(arm, []):
        if r.get("failed"):
            notes.append(f"{r['failed']} failed requests")
        if r.get("completed", n) < n:
            notes.append(f"completed {r.get('completed')}/{n}")
        lat, dur = r.get("latencies"), r.get("duration")
        if lat and dur:
            achieved = sum(lat) / dur
            requested = min(conc, n)
            if achieved < 0.8 * requested:
                notes.append(f"achieved concurrency {achieved:.1f} < requested {requested} (client-bound?)")
    if n < 2 * conc:
        notes.append(f"few requests ({n}) for concurrency {conc}")
    return sorted(set(notes))


def drift_checks(point: PointResults) -> list[str]:
    """Per arm: output throughput of the drift repeat (end of session) against the median of the repeats."""
    lines = []
    for arm, raw in point.drift.items():
        reps = metric_values(point.reps.get(arm, []), "output_throughput")
        if reps and raw.get("output_throughput"):
            mid = statistics.median(reps)
            lines.append(f"Drift check {arm}: output throughput at the end of the session "
                         f"{fmt(raw['output_throughput'])} vs {fmt(mid)} ({(raw['output_throughput'] / mid - 1) * 100:+.1f}%)")
    return lines


# ---------------------------------------------------------------------------------------- sections


def section_header(run: RunData) -> str:
    m = run.manifest
    matrix = m.get("matrix", {})
    counts = m.get("job_counts", {})
    lines = [f"# {matrix.get('name', run.root.name)}: {' vs '.join(run.arms)}", ""]
    if matrix.get("description"):
        lines += [matrix["description"], ""]
    lines += [
        f"- run: `{run.root.name}`, status **{m.get('status', 'unknown')}**"
        + (f" (jobs ok {counts.get('ok', 0)}, failed {counts.get('failed', 0)}, missing {counts.get('missing', 0)})"
           if counts else ""),
        f"- model: `{matrix.get('model', {}).get('id')}`; runtime: {m.get('runtime', 'local')}; "
        f"order: {m.get('plan', {}).get('order')}; repeats: {matrix.get('repeats', 1)}",
        f"- baseline: **{run.baseline}**; candidates: {', '.join(run.candidates) or '(none)'}",
        *(["- order **blocked**: each arm ran on its own server at its own time, so machine drift between arms is "
            "not cancelled and the interval covers within-server noise only; use `order: abba` for verdicts"]
          if m.get("plan", {}).get("order") == "blocked" and matrix.get("repeats", 1) > 1 else []),
        "- cells: median over repeats before → after (Δ% = ratio of geometric means); "
        "▲ significantly better, ▼ significantly worse, · not significant, ? unreliable (see Statistics)",
        "",
    ]
    return "\n".join(lines)


@dataclass
class CandidateSummary:
    """What a reader wants first: one word per candidate, the throughput geomean and the cell counts."""

    candidate: str
    baseline: str
    overall: str
    counts: dict[Verdict, int]
    geomean_throughput_pct: float | None
    points: int
    regressions: list[tuple[str, str, Comparison]] = field(default_factory=list)  # (point, metric, comparison)
    improvements: list[tuple[str, str, Comparison]] = field(default_factory=list)
    family_alpha: float = 0.05


def holm_survivors(cells: list[tuple[str, str, Comparison]], alpha: float) -> set[tuple[str, str]]:
    """Holm-Bonferroni over every tested cell of one candidate: which significant cells stay significant when
    the family-wise error rate over all points x metrics is held at alpha (many cells at 5% each would
    otherwise produce "significant" cells by chance)."""
    tested = sorted((c.p_value, point, key) for point, key, c in cells if c.p_value is not None)
    survivors: set[tuple[str, str]] = set()
    for i, (p, point, key) in enumerate(tested):
        if p > alpha / (len(tested) - i):
            break
        survivors.add((point, key))
    return survivors


def summarize_candidates(run: RunData, floors: dict[str, float] | None = None,
                         alpha: float = 0.05) -> list[CandidateSummary]:
    """Per candidate: cell counts over every point x DETAIL metric, and the overall verdict: REGRESSION /
    IMPROVEMENT only for headline cells (throughput, mean TTFT/TPOT/E2EL) that are significant on their own AND
    survive the Holm correction over all of the candidate's headline cells."""
    floors = noise_floors(run) if floors is None else floors
    out = []
    for cand in run.candidates:
        counts = dict.fromkeys(Verdict, 0)
        ratios: list[float] = []
        cells: list[tuple[str, str, Comparison]] = []
        for p in run.points.values():
            for key in DETAIL:
                c = compare_point(run, p, cand, key, floors)
                if c is None:
                    continue
                counts[c.verdict] += 1
                cells.append((p.point, key, c))
                if key == "output_throughput" and c.ratio:
                    ratios.append(c.ratio)
        # the overall verdict: headline cells only (mean/median/p99 of one latency are one finding, not three)
        keep = holm_survivors([cell for cell in cells if cell[1] in HEADLINE], alpha)
        worse = [(p, k, c) for p, k, c in cells if c.verdict is Verdict.WORSE and (p, k) in keep]
        better = [(p, k, c) for p, k, c in cells if c.verdict is Verdict.BETTER and (p, k) in keep]
        total = sum(counts.values())
        headline = [c for _, k, c in cells if k in HEADLINE]
        raw_worse = sum(c.verdict is Verdict.WORSE for c in headline)
        raw_better = sum(c.verdict is Verdict.BETTER for c in headline)
        overall = ("REGRESSION" if worse else "IMPROVEMENT" if better
                   else "NO DATA" if total == 0
                   else f"POSSIBLE REGRESSION ({raw_worse} headline cells worse; none survives Holm)"
                   if raw_worse and not raw_better
                   else f"POSSIBLE IMPROVEMENT ({raw_better} headline cells better; none survives Holm)"
                   if raw_better and not raw_worse
                   else "INCONCLUSIVE" if counts[Verdict.UNRELIABLE] == total
                   else "NO SIGNIFICANT CHANGE")
        geo = (geometric_mean_ratio(ratios) - 1) * 100 if ratios else None
        out.append(CandidateSummary(cand, run.baseline, overall, counts, geo, len(ratios), worse, better, alpha))
    return out


def section_verdict(run: RunData, floors: dict[str, float]) -> str:
    lines = ["## Verdict", ""]
    if not run.points:
        return "\n".join(lines + ["No serving results.", ""])
    for s in summarize_candidates(run, floors):
        geo = fmt_pct(s.geomean_throughput_pct) if s.geomean_throughput_pct is not None else "n/a"
        lines.append(
            f"- **{s.candidate} vs {s.baseline}: {s.overall}** — geometric-mean output throughput {geo} over "
            f"{s.points} points; metric×point cells: {s.counts[Verdict.BETTER]} better, {s.counts[Verdict.WORSE]} "
            f"worse, {s.counts[Verdict.NOT_SIGNIFICANT]} not significant, {s.counts[Verdict.UNRELIABLE]} unreliable; "
            f"headline cells significant after Holm correction (family-wise α {s.family_alpha:g}): "
            f"{len(s.improvements)} better, {len(s.regressions)} worse")
        for point, key, c in s.regressions[:8]:
            lines.append(f"  - worse: {point} {METRICS[key].label} {fmt_pct(c.delta_pct)} (p={c.p_value:.2g})")
    return "\n".join(lines + [""])


def section_serving(run: RunData, floors: dict[str, float]) -> str:
    if not run.points:
        return ""
    out = ["## Serving (`vllm bench serve`)", ""]
    for cand in run.candidates:
        out += [f"### {run.baseline} → {cand}", "",
                "| ISL | OSL | Conc | Prompts | " + " | ".join(METRICS[k].label + f" ({METRICS[k].unit})"
                                                         for k in HEADLINE) + " | Completed | Failed |",
                "|" + "---|" * (6 + len(HEADLINE))]
        for p in run.points.values():
            pr = p.params
            comps = [cell(compare_point(run, p, cand, k, floors)) for k in HEADLINE]
            done = "/".join(str(sum(r.get("completed", 0) for r in p.reps.get(a, []))) for a in (run.baseline, cand))
            fail = "/".join(str(sum(r.get("failed", 0) for r in p.reps.get(a, []))) for a in (run.baseline, cand))
            out.append(f"| {pr['isl']} | {pr['osl']} | {pr['concurrency']} | {pr['num_prompts']} | "
                       + " | ".join(comps) + f" | {done} | {fail} |")
        out.append("")
    return "\n".join(out)


def section_details(run: RunData, floors: dict[str, float]) -> str:
    if not run.points:
        return ""
    out = ["## Statistics per point", "",
           "Interval: 95% t interval on the log ratio (Welch; paired per round under ABBA). Significant only "
           "when it excludes 0 and |Δ| exceeds the A/A noise floor (when measured). MDE: the smallest |Δ| "
           "these repeats could detect with 80% power.", ""]
    if floors:
        out += ["A/A noise floor (baseline vs itself): "
                + ", ".join(f"{METRICS[k].label} {v:.2f}%" for k, v in floors.items()), ""]
    for cand in run.candidates:
        for p in run.points.values():
            out += [f"### {p.point}: {run.baseline} → {cand}", "",
                    "| Metric | Before | After | Δ% | 95% interval | p | MDE | n | Verdict |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for key in DETAIL:
                c = compare_point(run, p, cand, key, floors)
                if c is None:
                    out.append(f"| {METRICS[key].label} | missing | missing | | | | | | missing |")
                    continue
                ci = (f"[{fmt_pct(c.ci_low_pct)}, {fmt_pct(c.ci_high_pct)}]" if c.ci_low_pct is not None else "—")
                pv = f"{c.p_value:.3g}" if c.p_value is not None else "—"
                mde = fmt_pct(c.min_detectable_effect_pct) if c.min_detectable_effect_pct is not None else "—"
                out.append(f"| {METRICS[key].label} ({METRICS[key].unit}) | {fmt(c.baseline.median)} | "
                           f"{fmt(c.candidate.median)} | {fmt_pct(c.delta_pct)} | {ci} | {pv} | {mde} | "
                           f"{c.baseline.n}/{c.candidate.n} | {c.verdict.value}: {c.reason} |")
            checks = {a: self_checks(p, a) for a in (run.baseline, cand)}
            for arm, notes in checks.items():
                if notes:
                    out.append(f"\nSelf-check {arm}: " + "; ".join(notes))
            out += [f"\n{line}" for line in drift_checks(p)]
            out.append("")
    return "\n".join(out)


def section_failures(run: RunData) -> str:
    failed = [r for r in run.records if r.get("status") != "ok"]
    if not failed:
        return ""
    out = ["## Failed jobs", "", "| Arm | Job | Error |", "|---|---|---|"]
    for r in failed:
        job = r["job"]
        err = (r.get("error") or "").splitlines()[0][:200].replace("|", "\\|")
        died = " (server died)" if r.get("server_died") else ""
        out.append(f"| {job['arm']} | {job['kind']}/{job['point']}/rep-{job['repeat']} | {err}{died} |")
    return "\n".join(out + [""])


def section_provenance(run: RunData) -> str:
    m = run.manifest
    host = m.get("host", {})
    out = ["## Provenance", "",
           f"- suite {m.get('suite_version')}; created {m.get('created')}; finished {m.get('finished', '—')}",
           f"- host {host.get('hostname')}: {host.get('platform')}, {host.get('cpu_count')} CPUs, "
           f"Python {host.get('python')}"]
    for arm, info in m.get("arms", {}).items():
        patches = ", ".join(f"{'-' if p.get('reverse') else ''}{p['name']} ({p['sha256'][:12]})"
                            for p in info.get("patches", [])) or "none"
        image = f"; image {info['image']}" if info.get("image") else ""
        out.append(f"- arm **{arm}**: vLLM {info.get('vllm_version')}{image}; patches: {patches}")
    return "\n".join(out + [""])


Section = Callable[[RunData], str]
EXTRA_SECTIONS: list[tuple[str, Section]] = []  # (name, fn) added by stage modules


def register_section(name: str, fn: Section) -> None:
    if all(n != name for n, _ in EXTRA_SECTIONS):
        EXTRA_SECTIONS.append((name, fn))


def _load_extra_sections() -> None:
    import importlib

    for module in ("suite.stages.probe.summary", "suite.stages.accuracy.summary", "suite.stages.kernel.summary", "suite.stages.latency.summary",
                   "suite.stages.profile.summary", "suite.runtime.slurm.cluster"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, "report_section", None)
        if fn is not None:
            register_section(module, fn)


def render(run: RunData) -> str:
    floors = noise_floors(run)
    parts = [section_header(run), section_verdict(run, floors), section_serving(run, floors)]
    _load_extra_sections()
    for _, fn in EXTRA_SECTIONS:
        text = fn(run)
        if text:
            parts.append(text)
    parts += [section_details(run, floors), section_failures(run), section_provenance(run)]
    return "\n".join(p for p in parts if p).rstrip() + "\n"


def build_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    try:
        run = load_run(run_dir)
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise SuiteError(f"{run_dir}: cannot read the run: {exc}") from None
    path = run_dir / "report.md"
    atomic_write_text(path, render(run))
    from suite.report_html import build_html

    build_html(run_dir)
    return path
