"""report.html: one self-contained page (inline CSS + inline SVG, no script, nothing fetched) rendered from
the same `RunData` and the same statistics as report.md.

Top to bottom: verdict per candidate; before → after tables; for each ISL/OSL each headline metric against
concurrency for every arm (median line, min–max band of the repeats); a Δ% heatmap over points × metrics
coloured by verdict; the sections other stages add to report.md (accuracy, latency, kernel, profile),
converted from their markdown; statistics per point; failed jobs; provenance.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.report import (  # noqa: F401  (CandidateSummary, summarize_candidates: re-exported for callers)
    DETAIL,
    EXTRA_SECTIONS,
    HEADLINE,
    CandidateSummary,
    PointResults,
    RunData,
    _load_extra_sections,
    compare_point,
    drift_checks,
    fmt,
    fmt_pct,
    load_run,
    metric_values,
    noise_floors,
    self_checks,
    summarize_candidates,
)
from suite.stats import METRICS, Comparison, Verdict
from suite.store import atomic_write_text

ARM_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#b279a2", "#f2a93b", "#17becf")
VERDICT_RGB = {Verdict.BETTER: (26, 152, 80), Verdict.WORSE: (215, 48, 39),
               Verdict.NOT_SIGNIFICANT: (120, 120, 120), Verdict.UNRELIABLE: (230, 171, 2)}
VERDICT_MARK = {Verdict.BETTER: "▲", Verdict.WORSE: "▼", Verdict.NOT_SIGNIFICANT: "·", Verdict.UNRELIABLE: "?"}
HEAT_FULL_PCT = 20.0  # |Δ| at which a heatmap cell reaches full colour


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------------------------------- verdicts


# ---------------------------------------------------------------------------------------- markdown


_INLINE = [
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])"), r"<em>\1</em>"),
]


def md_inline(text: str) -> str:
    """Inline markdown (code spans, bold, italic) of one line, HTML-escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{esc(part[1:-1])}</code>")
            continue
        s = esc(part)
        for pattern, repl in _INLINE:
            s = pattern.sub(repl, s)
        out.append(s)
    return "".join(out)


def _table_cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def markdown_to_html(text: str, heading_offset: int = 0) -> str:
    """The markdown the report sections use: headings, pipe tables, bullet lists, fenced code, paragraphs."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    sep = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
        elif stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre>" + esc("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
        elif m := re.match(r"^(#{1,6})\s+(.*)$", stripped):
            level = min(6, len(m.group(1)) + heading_offset)
            out.append(f"<h{level}>{md_inline(m.group(2))}</h{level}>")
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and sep.match(lines[i + 1]):
            head = _table_cells(stripped)
            align = ["right" if c.endswith(":") and not c.startswith(":") else "center" if c.startswith(":")
                     and c.endswith(":") else "left" for c in _table_cells(lines[i + 1])]

            def td(k: int, c: str, tag: str = "td", align: list[str] = align) -> str:
                a = align[k] if k < len(align) else "left"
                return f"<{tag} style='text-align:{a}'>{md_inline(c)}</{tag}>"

            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_table_cells(lines[j]))
                j += 1
            out.append('<table class="md"><thead><tr>' + "".join(td(k, c, "th") for k, c in enumerate(head))
                       + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(td(k, c) for k, c in enumerate(r)) + "</tr>" for r in rows)
                       + "</tbody></table>")
            i = j
        elif stripped.startswith(">"):
            quote = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quote.append(lines[i].strip()[1:].strip())
                i += 1
            out.append(f"<blockquote>{md_inline(' '.join(quote))}</blockquote>")
        elif re.match(r"^[-*]\s+", stripped):
            items = []
            while i < len(lines) and re.match(r"^\s*[-*]\s+", lines[i]):
                item = re.sub(r"^\s*[-*]\s+", "", lines[i])
                i += 1
                while i < len(lines) and lines[i].startswith("  ") and lines[i].strip() \
                        and not re.match(r"^\s*[-*]\s+", lines[i]):
                    item += " " + lines[i].strip()
                    i += 1
                items.append(f"<li>{md_inline(item)}</li>")
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = [stripped]
            i += 1
            while i < len(lines) and lines[i].strip() and not re.match(r"^(#|\||```|>|[-*]\s)", lines[i].strip()):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{md_inline(' '.join(para))}</p>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- charts


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        span = abs(lo) * 0.1 or 1.0
        lo, hi = lo - span, hi + span
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _tick_label(v: float) -> str:
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


@dataclass
class Series:
    arm: str
    color: str
    xs: list[int]  # concurrency values
    med: list[float]
    lo: list[float]
    hi: list[float]
    n: list[int]


def metric_chart(title: str, unit: str, series: list[Series], higher_is_better: bool) -> str:
    """One small SVG: x = concurrency (evenly spaced), y = metric; median line, min–max band and bars."""
    w, h = 318, 210
    ml, mr, mt, mb = 52, 12, 26, 34
    xs = sorted({x for s in series for x in s.xs})
    values = [v for s in series for v in s.lo + s.hi]
    if not xs or not values:
        return ""
    ticks = nice_ticks(min(values), max(values))
    y0, y1 = ticks[0], ticks[-1]
    if y1 == y0:
        y1 = y0 + 1

    def px(x: int, k: int = 0) -> float:
        i = xs.index(x)
        base = ml + (w - ml - mr) * ((i + 0.5) / len(xs))
        return base + (k - (len(series) - 1) / 2) * 5  # small offset per arm so bars do not overlap

    def py(v: float) -> float:
        return mt + (h - mt - mb) * (1 - (v - y0) / (y1 - y0))

    better = "higher is better" if higher_is_better else "lower is better"
    parts = [f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
             f'aria-label="{esc(title)} against concurrency">',
             f'<text x="{ml}" y="15" class="ct">{esc(title)} <tspan class="cu">({esc(unit)}, {better})</tspan></text>']
    for t in ticks:
        y = py(t)
        parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{ml - 5}" y="{y + 3.5:.1f}" class="yt">{_tick_label(t)}</text>')
    for x in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{h - mb + 15}" class="xt">{x}</text>')
    parts.append(f'<text x="{(ml + w - mr) / 2:.1f}" y="{h - 4}" class="xl">concurrency</text>')
    parts.append(f'<line x1="{ml}" x2="{ml}" y1="{mt}" y2="{h - mb}" class="axis"/>'
                 f'<line x1="{ml}" x2="{w - mr}" y1="{h - mb}" y2="{h - mb}" class="axis"/>')
    for k, s in enumerate(series):
        pts = list(zip(s.xs, s.med, s.lo, s.hi, s.n, strict=True))
        if len(pts) >= 2:
            band = [f"{px(x, k):.1f},{py(hi):.1f}" for x, _, _, hi, _ in pts]
            band += [f"{px(x, k):.1f},{py(lo):.1f}" for x, _, lo, _, _ in reversed(pts)]
            parts.append(f'<polygon points="{" ".join(band)}" fill="{s.color}" class="band"/>')
            line = " ".join(f"{px(x, k):.1f},{py(m):.1f}" for x, m, _, _, _ in pts)
            parts.append(f'<polyline points="{line}" stroke="{s.color}" class="line"/>')
        for x, m, lo, hi, n in pts:
            cx = px(x, k)
            parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{py(lo):.1f}" y2="{py(hi):.1f}" '
                         f'stroke="{s.color}" class="bar"/>')
            parts.append(f'<circle cx="{cx:.1f}" cy="{py(m):.1f}" r="3.5" fill="{s.color}">'
                         f'<title>{esc(s.arm)} @ concurrency {x}: median {fmt(m)} {esc(unit)} '
                         f'(min {fmt(lo)}, max {fmt(hi)}, n={n})</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def chart_series(run: RunData, points: list[PointResults], key: str) -> list[Series]:
    out = []
    for k, arm in enumerate(run.arms):
        xs, med, lo, hi, n = [], [], [], [], []
        for p in points:
            vals = metric_values(p.reps.get(arm, []), key)
            if not vals:
                continue
            xs.append(int(p.params["concurrency"]))
            med.append(statistics.median(vals))
            lo.append(min(vals))
            hi.append(max(vals))
            n.append(len(vals))
        if xs:
            out.append(Series(arm, ARM_COLORS[k % len(ARM_COLORS)], xs, med, lo, hi, n))
    return out


# ---------------------------------------------------------------------------------------- sections


def _verdict_style(c: Comparison | None) -> str:
    if c is None:
        return ' class="v-missing"'
    r, g, b = VERDICT_RGB[c.verdict]
    if c.verdict in (Verdict.BETTER, Verdict.WORSE):
        alpha = 0.18 + 0.62 * min(1.0, abs(c.delta_pct or 0) / HEAT_FULL_PCT)
    else:
        alpha = 0.12
    ink = ";color:#fff" if alpha > 0.55 else ""
    return f' class="v-{c.verdict.name.lower()}" style="background:rgba({r},{g},{b},{alpha:.2f}){ink}"'


def _tip(c: Comparison) -> str:
    ci = (f"95% interval [{fmt_pct(c.ci_low_pct)}, {fmt_pct(c.ci_high_pct)}]"
          if c.ci_low_pct is not None else "no interval")
    return f"{c.verdict.value}: {c.reason}; {ci}; n={c.baseline.n}/{c.candidate.n}"


def section_header(run: RunData) -> str:
    m = run.manifest
    matrix = m.get("matrix", {})
    counts = m.get("job_counts", {})
    status = m.get("status", "unknown")
    jobs = (f" · jobs ok {counts.get('ok', 0)}, failed {counts.get('failed', 0)}, missing {counts.get('missing', 0)}"
            if counts else "")
    desc = f"<p class='desc'>{esc(matrix['description'])}</p>" if matrix.get("description") else ""
    return (f"<header><h1>{esc(matrix.get('name', run.root.name))}: {esc(' vs '.join(run.arms))}</h1>{desc}"
            f"<p class='meta'>run <code>{esc(run.root.name)}</code> · status <b class='st-{esc(status)}'>"
            f"{esc(status)}</b>{jobs} · model <code>{esc(matrix.get('model', {}).get('id'))}</code> · "
            f"runtime {esc(m.get('runtime', 'local'))} · order {esc(m.get('plan', {}).get('order'))} · "
            f"repeats {esc(matrix.get('repeats', 1))} · baseline <b>{esc(run.baseline)}</b></p></header>")


def section_verdict(run: RunData, summaries: list[CandidateSummary]) -> str:
    if not run.points:
        return "<section id='verdict'><h2>Verdict</h2><p>No serving results.</p></section>"
    cards = []
    for s in summaries:
        total = sum(s.counts.values()) or 1
        bar = "".join(
            f'<span class="seg" style="width:{100 * s.counts[v] / total:.2f}%;background:rgb{VERDICT_RGB[v]}" '
            f'title="{s.counts[v]} {v.value}"></span>' for v in Verdict if s.counts[v])
        geo = fmt_pct(s.geomean_throughput_pct)
        regress = ""
        if s.regressions:
            items = "".join(f"<li>{esc(p)} · {esc(METRICS[k].label)} {fmt_pct(c.delta_pct)} "
                            f"({esc(c.reason)})</li>" for p, k, c in s.regressions[:12])
            more = f"<li>… {len(s.regressions) - 12} more</li>" if len(s.regressions) > 12 else ""
            regress = f"<ul class='regress'>{items}{more}</ul>"
        cls = s.overall.split()[0].lower()
        cards.append(
            f"<div class='card ov-{cls}'><div class='cand'>{esc(s.candidate)} <span>vs {esc(s.baseline)}</span></div>"
            f"<div class='overall'>{esc(s.overall)}</div>"
            f"<div class='geo'>output throughput (geometric mean over {s.points} points): <b>{geo}</b></div>"
            f"<div class='stack'>{bar}</div>"
            f"<div class='counts'>{s.counts[Verdict.BETTER]} better · {s.counts[Verdict.WORSE]} worse · "
            f"{s.counts[Verdict.NOT_SIGNIFICANT]} not significant · {s.counts[Verdict.UNRELIABLE]} unreliable "
            f"<span class='muted'>(point × metric cells)</span></div>{regress}</div>")
    legend = ("<p class='legend'>▲ significantly better · ▼ significantly worse · · not significant · "
              "? unreliable (one repeat, no spread or too noisy). Significant only when the 95% interval excludes 0 "
              "and |Δ| exceeds the A/A noise floor when one was measured.</p>")
    return f"<section id='verdict'><h2>Verdict</h2><div class='cards'>{''.join(cards)}</div>{legend}</section>"


def section_tables(run: RunData, floors: dict[str, float]) -> str:
    if not run.points:
        return ""
    out = ["<section id='serving'><h2>Serving: before → after</h2>",
           "<p class='muted'>Median over repeats, baseline → candidate, Δ% = ratio of geometric means; "
           "hover a cell for its interval and reason.</p>"]
    for cand in run.candidates:
        out.append(f"<h3>{esc(run.baseline)} → {esc(cand)}</h3><table class='ba'><thead><tr>"
                   "<th>ISL</th><th>OSL</th><th>Conc</th><th>Prompts</th>"
                   + "".join(f"<th>{esc(METRICS[k].label)}<br><span class='cu'>{esc(METRICS[k].unit)}</span></th>"
                             for k in HEADLINE)
                   + "<th>Completed</th><th>Failed</th></tr></thead><tbody>")
        for p in run.points.values():
            pr = p.params
            cells = []
            for k in HEADLINE:
                c = compare_point(run, p, cand, k, floors)
                if c is None:
                    cells.append("<td class='v-missing'>missing</td>")
                    continue
                cells.append(f"<td{_verdict_style(c)} title='{esc(_tip(c))}'>{fmt(c.baseline.median)} → "
                             f"<b>{fmt(c.candidate.median)}</b><br><span class='d'>{fmt_pct(c.delta_pct)} "
                             f"{VERDICT_MARK[c.verdict]}</span></td>")
            done = "/".join(str(sum(r.get("completed", 0) for r in p.reps.get(a, []))) for a in (run.baseline, cand))
            fail = "/".join(str(sum(r.get("failed", 0) for r in p.reps.get(a, []))) for a in (run.baseline, cand))
            out.append(f"<tr><td>{pr['isl']}</td><td>{pr['osl']}</td><td>{pr['concurrency']}</td>"
                       f"<td>{pr['num_prompts']}</td>{''.join(cells)}<td>{done}</td><td>{fail}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    return "\n".join(out)


def section_charts(run: RunData) -> str:
    if not run.points:
        return ""
    groups: dict[tuple[int, int], list[PointResults]] = {}
    for p in run.points.values():
        groups.setdefault((p.params["isl"], p.params["osl"]), []).append(p)
    legend = "".join(f"<span class='key'><i style='background:{ARM_COLORS[k % len(ARM_COLORS)]}'></i>{esc(a)}</span>"
                     for k, a in enumerate(run.arms))
    out = ["<section id='charts'><h2>Metrics against concurrency</h2>",
           f"<p class='muted'>Line: median over repeats; band and bars: min–max of the repeats. {legend}</p>"]
    for (isl, osl), pts in groups.items():
        pts = sorted(pts, key=lambda p: p.params["concurrency"])
        charts = [metric_chart(METRICS[k].label, METRICS[k].unit, chart_series(run, pts, k),
                               METRICS[k].higher_is_better) for k in HEADLINE]
        out.append(f"<h3>ISL {isl} / OSL {osl}</h3><div class='charts'>{''.join(c for c in charts if c)}</div>")
    out.append("</section>")
    return "\n".join(out)


def section_heatmap(run: RunData, floors: dict[str, float]) -> str:
    if not run.points or not run.candidates:
        return ""
    out = ["<section id='heatmap'><h2>Δ% heatmap</h2>",
           f"<p class='muted'>Candidate vs {esc(run.baseline)} per point and metric. Green: significantly better, "
           f"red: significantly worse (stronger with larger |Δ|, full at {HEAT_FULL_PCT:g}%), grey: not significant, "
           "amber: unreliable, blank: missing.</p>"]
    for cand in run.candidates:
        out.append(f"<h3>{esc(cand)}</h3><div class='scroll'><table class='heat'><thead><tr><th>Point</th>"
                   + "".join(f"<th>{esc(METRICS[k].label)}</th>" for k in DETAIL)
                   + "</tr></thead><tbody>")
        for p in run.points.values():
            pr = p.params
            row = [f"<th>ISL {pr['isl']} · OSL {pr['osl']} · c{pr['concurrency']}</th>"]
            for k in DETAIL:
                c = compare_point(run, p, cand, k, floors)
                if c is None:
                    row.append("<td class='v-missing'></td>")
                else:
                    row.append(f"<td{_verdict_style(c)} title='{esc(METRICS[k].label)}: {esc(_tip(c))}'>"
                               f"{fmt_pct(c.delta_pct)}{VERDICT_MARK[c.verdict] if c.significant else ''}</td>")
            out.append("<tr>" + "".join(row) + "</tr>")
        out.append("</tbody></table></div>")
    out.append("</section>")
    return "\n".join(out)


def section_extra(run: RunData) -> str:
    """The sections other stages add to report.md (accuracy, latency, kernel, profile, probe)."""
    _load_extra_sections()
    out = []
    for name, fn in EXTRA_SECTIONS:
        text = fn(run)
        if not text:
            continue
        anchor = name.rsplit(".", 1)[-1].replace("_", "-")
        heading = re.search(r"^#+\s+(.+)$", text, re.M)
        label = (heading.group(1).split(":")[0].strip("*` ") if heading else anchor)[:32]
        out.append(f"<section id='{esc(anchor)}' class='extra' data-label='{esc(label)}'>"
                   f"{markdown_to_html(text)}</section>")
    return "\n".join(out)


def section_details(run: RunData, floors: dict[str, float]) -> str:
    if not run.points:
        return ""
    out = ["<section id='details'><h2>Statistics per point</h2>",
           "<p class='muted'>95% t interval on the log ratio (Welch; paired per round under ABBA). MDE: the "
           "smallest |Δ| these repeats could detect with 80% power.</p>"]
    if floors:
        out.append("<p>A/A noise floor: " + ", ".join(f"{esc(METRICS[k].label)} {v:.2f}%" for k, v in floors.items())
                   + "</p>")
    for cand in run.candidates:
        for p in run.points.values():
            rows = []
            for key in DETAIL:
                c = compare_point(run, p, cand, key, floors)
                label = f"{esc(METRICS[key].label)} <span class='cu'>{esc(METRICS[key].unit)}</span>"
                if c is None:
                    rows.append(f"<tr><td>{label}</td><td colspan='8' class='v-missing'>missing</td></tr>")
                    continue
                ci = f"[{fmt_pct(c.ci_low_pct)}, {fmt_pct(c.ci_high_pct)}]" if c.ci_low_pct is not None else "—"
                pv = f"{c.p_value:.3g}" if c.p_value is not None else "—"
                mde = fmt_pct(c.min_detectable_effect_pct) if c.min_detectable_effect_pct is not None else "—"
                rows.append(f"<tr><td>{label}</td><td>{fmt(c.baseline.median)}</td><td>{fmt(c.candidate.median)}</td>"
                            f"<td{_verdict_style(c)}>{fmt_pct(c.delta_pct)}</td><td>{ci}</td><td>{pv}</td>"
                            f"<td>{mde}</td><td>{c.baseline.n}/{c.candidate.n}</td>"
                            f"<td>{esc(c.verdict.value)}: {esc(c.reason)}</td></tr>")
            notes = [f"Self-check {esc(a)}: {esc('; '.join(n))}" for a in (run.baseline, cand)
                     if (n := self_checks(p, a))]
            notes += [esc(line) for line in drift_checks(p)]
            note_html = "".join(f"<p class='note'>{n}</p>" for n in notes)
            out.append(f"<details><summary>{esc(p.point)}: {esc(run.baseline)} → {esc(cand)}</summary>"
                       "<table class='st'><thead><tr><th>Metric</th><th>Before</th><th>After</th><th>Δ%</th>"
                       "<th>95% interval</th><th>p</th><th>MDE</th><th>n</th><th>Verdict</th></tr></thead><tbody>"
                       + "".join(rows) + f"</tbody></table>{note_html}</details>")
    out.append("</section>")
    return "\n".join(out)


def section_failures(run: RunData) -> str:
    failed = [r for r in run.records if r.get("status") != "ok"]
    if not failed:
        return ""
    rows = []
    for r in failed:
        job = r["job"]
        err = (r.get("error") or "").splitlines()[0][:300] if r.get("error") else ""
        died = " (server died)" if r.get("server_died") else ""
        rows.append(f"<tr><td>{esc(job['arm'])}</td><td>{esc(job['kind'])}/{esc(job['point'])}/rep-{job['repeat']}"
                    f"</td><td>{esc(r.get('status'))}</td><td>{esc(err)}{died}</td></tr>")
    return ("<section id='failures'><h2>Failed jobs</h2><table class='st'><thead><tr><th>Arm</th><th>Job</th>"
            "<th>Status</th><th>Error</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")


def _kv_rows(d: dict[str, Any]) -> str:
    return "".join(f"<tr><th>{esc(k)}</th><td>{esc(v if not isinstance(v, dict | list) else json.dumps(v))}</td></tr>"
                   for k, v in d.items())


def section_provenance(run: RunData) -> str:
    m = run.manifest
    rows = []
    for arm, info in m.get("arms", {}).items():
        patches = "<br>".join(
            f"{'reverse ' if p.get('reverse') else ''}<b>{esc(p.get('name'))}</b> <code>{esc(p.get('sha256'))}</code>"
            for p in info.get("patches", [])) or "none"
        known = {"vllm_version", "image", "patches", "env"}
        extra = {k: v for k, v in info.items() if k not in known and v not in (None, "", [], {})}
        env = ", ".join(f"{esc(k)}={esc(v)}" for k, v in (info.get("env") or {}).items()) or "—"
        rows.append(f"<tr><td><b>{esc(arm)}</b></td><td>{esc(info.get('vllm_version'))}</td>"
                    f"<td>{esc(info.get('image') or '—')}</td><td>{patches}</td><td><code>{env}</code></td>"
                    f"<td>{esc(json.dumps(extra)) if extra else '—'}</td></tr>")
    run_info = {"run": run.root.name, "suite": m.get("suite_version"), "created": m.get("created"),
                "finished": m.get("finished", "—"), "matrix file": m.get("matrix_path")}
    if m.get("compare"):
        run_info["compared"] = m["compare"]
    host = m.get("host", {})
    gpus = m.get("gpus") or host.get("gpus")
    matrix_json = esc(json.dumps(m.get("matrix", {}), indent=2, sort_keys=True))
    return ("<section id='provenance'><h2>Provenance</h2><div class='prov'>"
            f"<table class='kv'><tbody>{_kv_rows(run_info)}</tbody></table>"
            f"<table class='kv'><tbody>{_kv_rows(host)}"
            + (f"<tr><th>GPUs</th><td>{esc(json.dumps(gpus))}</td></tr>" if gpus and "gpus" not in host else "")
            + "</tbody></table></div>"
            "<table class='st'><thead><tr><th>Arm</th><th>vLLM</th><th>Image</th><th>Patches (sha256)</th>"
            "<th>Env</th><th>Other</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            f"<details><summary>Resolved matrix</summary><pre>{matrix_json}</pre></details></section>")


CSS = """
:root{--fg:#1d2430;--muted:#5d6778;--line:#d9dee7;--bg:#fff;--soft:#f5f7fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg)}
main{max-width:1480px;margin:0 auto;padding:20px 28px 40px}
header h1{font-size:22px;margin:0 0 6px}
h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;border-bottom:2px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px}
.desc{margin:0 0 6px;color:var(--muted);max-width:1100px}
.meta{margin:0;color:var(--muted)}
nav{margin:10px 0 0;display:flex;gap:14px;flex-wrap:wrap;font-size:13px}
nav a{color:#2f5d9a;text-decoration:none}
code{font:12px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;background:var(--soft);padding:1px 4px;border-radius:3px}
pre{font:12px/1.35 ui-monospace,"DejaVu Sans Mono",monospace;background:var(--soft);padding:10px;overflow:auto;
max-height:420px}
.muted,.cu{color:var(--muted);font-weight:normal}
.cu{font-size:11px}
.cards{display:flex;flex-wrap:wrap;gap:14px}
.card{border:1px solid var(--line);border-left:6px solid #888;border-radius:6px;padding:12px 16px;min-width:380px;
flex:1 1 380px;background:var(--soft)}
.card.ov-regression{border-left-color:rgb(215,48,39)}
.card.ov-improvement{border-left-color:rgb(26,152,80)}
.card.ov-inconclusive{border-left-color:rgb(230,171,2)}
.cand{font-weight:600}.cand span{color:var(--muted);font-weight:normal}
.overall{font-size:22px;font-weight:700;margin:4px 0}
.ov-regression .overall{color:rgb(190,35,30)}.ov-improvement .overall{color:rgb(20,130,65)}
.ov-inconclusive .overall{color:rgb(170,120,0)}
.stack{display:flex;height:12px;border-radius:3px;overflow:hidden;margin:8px 0 4px;background:#e8ebf0}
.seg{display:block;height:100%}
.regress{margin:6px 0 0;padding-left:18px;color:rgb(160,30,25);font-size:13px}
.legend{font-size:12px;color:var(--muted)}
table{border-collapse:collapse;margin:6px 0 12px;font-variant-numeric:tabular-nums}
th,td{border:1px solid var(--line);padding:4px 8px;text-align:right;vertical-align:top}
thead th{background:var(--soft);text-align:center;font-weight:600}
td:first-child,tbody th{text-align:left}
table.ba td .d{font-size:12px}
td.v-missing{color:#999;background:repeating-linear-gradient(45deg,#fff,#fff 4px,#f0f0f0 4px,#f0f0f0 8px)}
.charts{display:flex;flex-wrap:wrap;gap:10px}
svg.chart{border:1px solid var(--line);border-radius:4px;background:#fff}
svg .ct{font-size:12px;font-weight:600;fill:var(--fg)}
svg .cu{font-size:10px;fill:var(--muted)}
svg .yt{font-size:10px;fill:var(--muted);text-anchor:end}
svg .xt{font-size:10px;fill:var(--muted);text-anchor:middle}
svg .xl{font-size:10px;fill:var(--muted);text-anchor:middle}
svg .grid{stroke:#eceff4;stroke-width:1}
svg .axis{stroke:#9aa3b2;stroke-width:1}
svg .band{opacity:.16;stroke:none}
svg .line{fill:none;stroke-width:2}
svg .bar{stroke-width:1.5;opacity:.7}
.key{display:inline-flex;align-items:center;gap:4px;margin-left:12px;color:var(--fg)}
.key i{display:inline-block;width:14px;height:4px;border-radius:2px}
.scroll{overflow-x:auto}
table.heat td{min-width:64px;text-align:center;font-size:12px}
table.heat thead th{font-size:11px;width:72px;vertical-align:bottom}
table.heat tbody th{white-space:nowrap;font-weight:normal}
details{margin:4px 0}
summary{cursor:pointer;font-weight:600;padding:3px 0}
.note{margin:2px 0 8px;color:rgb(150,90,0);font-size:13px}
blockquote{margin:8px 0;padding:6px 12px;border-left:4px solid rgb(230,171,2);background:#fff8e6}
.prov{display:flex;gap:16px;flex-wrap:wrap}
table.kv th{text-align:left;background:var(--soft);font-weight:600}
table.kv td{text-align:left;max-width:700px;word-break:break-word}
#provenance td{text-align:left}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{details{display:block}.scroll{overflow:visible}}
"""


def render_html(run: RunData) -> str:
    floors = noise_floors(run)
    summaries = summarize_candidates(run, floors)
    matrix = run.manifest.get("matrix", {})
    extra = section_extra(run)
    body = [section_header(run)]
    nav = [("verdict", "Verdict"), ("serving", "Before → after"), ("charts", "Charts"), ("heatmap", "Δ% heatmap")]
    nav += [(a, html.unescape(t)) for a, t in re.findall(r"<section id='([^']+)' class='extra' data-label='([^']*)'>",
                                                          extra)]
    nav += [("details", "Statistics"), ("provenance", "Provenance")]
    body.append("<nav>" + "".join(f"<a href='#{esc(a)}'>{esc(t)}</a>" for a, t in nav) + "</nav>")
    body += [section_verdict(run, summaries), section_tables(run, floors), section_charts(run),
             section_heatmap(run, floors), extra, section_details(run, floors), section_failures(run),
             section_provenance(run)]
    title = f"{matrix.get('name', run.root.name)}: {' vs '.join(run.arms)}"
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>\n"
            + "\n".join(b for b in body if b)
            + f"\n<footer>Generated by suite {esc(run.manifest.get('suite_version', ''))} from the raw files in "
              f"<code>{esc(run.root.name)}</code>; report.md holds the same numbers.</footer>"
            + "\n</main></body></html>\n")


def build_html(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    try:
        run = load_run(run_dir)
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise SuiteError(f"{run_dir}: cannot read the run: {exc}") from None
    path = run_dir / "report.html"
    atomic_write_text(path, render_html(run))
    return path
