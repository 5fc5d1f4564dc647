"""report.html: a `Document` as one self-contained page: inline CSS, inline SVG charts, no script, nothing
fetched (a Content-Security-Policy of ``default-src 'none'`` keeps the browser from trying).

Inline markdown of the document's text is rendered by markdown-it-py (CommonMark, raw HTML off, so any
``<`` in the text is escaped). Charts are drawn by pygal as SVG and cleaned by an xml filter (``add_xml_filter``): its
config ``<script>`` and comments are dropped, its random chart id is replaced by the chart's key (so the
page is a pure function of the run), and every point gets a ``<title>`` (the browser's own tooltip: median,
min, max, n). Every style key of `suite.document.STYLES` has a CSS rule (cards ``ov-*``, cells ``v-*``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pygal
from markdown_it import MarkdownIt
from pygal.style import Style

from suite.document import (
    MAX_STRENGTH,
    Block,
    BulletList,
    Card,
    Cell,
    Chart,
    Code,
    Document,
    Frontier,
    Note,
    Paragraph,
    Section,
    Table,
)

SERIES_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#b279a2", "#f2a93b", "#17becf")
# per style key: the colour of its card border / word and of a tinted cell
STYLE_RGB = {
    "regression": (215, 48, 39), "improvement": (26, 152, 80), "equivalent": (66, 112, 170),
    "mixed": (232, 118, 22), "inconclusive": (214, 158, 0), "no-data": (130, 130, 130),
    "output-changed": (215, 48, 39), "output-identical": (70, 110, 180),
    "control-passed": (66, 112, 170), "control-failed": (215, 48, 39), "control-untested": (130, 130, 130),
    "better": (26, 152, 80), "worse": (215, 48, 39), "not-significant": (120, 120, 120),
    "unreliable": (214, 158, 0), "missing": (160, 160, 160),
}
CHART_W, CHART_H = 320, 250

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def inline(text: str) -> str:
    """Inline markdown of the document (bold, code, escapes) as HTML; a newline becomes a line break."""
    return "<br>".join(_md.renderInline(line) for line in text.split("\n"))


# ---------------------------------------------------------------------------------------------- charts


def _svg_filter(key: str) -> Callable[[Any], Any]:
    """pygal xml filter: no script, no comments, a stable id, a native tooltip per point."""
    new_id = "chart-" + re.sub(r"[^A-Za-z0-9_-]+", "-", key)

    def local(tag: Any) -> str:
        return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""

    def apply(root: Any) -> Any:
        old_id = root.get("id") or ""
        root.set("id", new_id)
        for parent in list(root.iter()):
            for child in list(parent):
                if callable(child.tag) or local(child.tag) == "script":  # comments (lxml and ElementTree)
                    parent.remove(child)
                elif local(child.tag) == "style" and old_id and child.text:
                    child.text = child.text.replace(old_id, new_id)
                elif local(child.tag) == "g" and "dots" in (child.get("class") or "").split():
                    label = next((d.text for d in child if local(d.tag) == "desc"
                                  and d.get("class") == "label"), None)
                    if label:
                        ns = child.tag[: child.tag.index("}") + 1] if child.tag.startswith("{") else ""
                        title = child.makeelement(f"{ns}title", {})
                        title.text = label
                        child.insert(0, title)
        return root

    return apply


def _style() -> Style:
    """The charts' one look (pygal's Style)."""
    return Style(background="#ffffff", plot_background="#ffffff", colors=SERIES_COLORS, ci_colors=SERIES_COLORS,
                  font_family='system-ui, "DejaVu Sans", sans-serif', title_font_size=13, label_font_size=10,
                  major_label_font_size=10, legend_font_size=11, tooltip_font_size=11, opacity=".9",
                  stroke_width="2", guide_stroke_color="#e3e7ee", major_guide_stroke_color="#cfd5df",
                  guide_stroke_dasharray="3,3", major_guide_stroke_dasharray="3,3")


def _inline(svg: str) -> str:
    """pygal's SVG for inline HTML: the parser puts <svg> in the SVG namespace itself, the declarations go."""
    head, rest = svg.split(">", 1)
    return re.sub(r'\s+xmlns(?::\w+)?="[^"]*"', "", head) + ">" + rest


def chart_svg(chart: Chart) -> str:
    """One chart as inline SVG: per series the median line, min–max whiskers, a tooltip per point. An empty
    slot on either side of the x axis keeps the first and last points (and their whiskers) off the frame; the
    y range covers the whiskers with a margin."""
    style = _style()
    lows = [v for s in chart.series for v in s.low if v is not None]
    highs = [v for s in chart.series for v in s.high if v is not None]
    lo, hi = (min(lows), max(highs)) if lows and highs else (0.0, 1.0)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
    better = "higher is better" if chart.higher_is_better else "lower is better"
    c = pygal.Line(width=CHART_W, height=CHART_H, explicit_size=True, style=style, js=[],
                   disable_xml_declaration=True, title=chart.title, x_title=chart.x_label,
                   y_title=f"{chart.unit}, {better}", legend_at_bottom=True,
                   legend_at_bottom_columns=max(1, len(chart.series)), dots_size=3, truncate_label=-1,
                   range=(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad), include_x_axis=False,
                   margin=6, spacing=8, classes=["pygal-chart", "chart"])
    c.add_xml_filter(_svg_filter(chart.key))
    c.x_labels = ["", *chart.xs, ""]
    for s in chart.series:
        values: list[dict[str, Any] | None] = [None]
        for x, m, lo_, hi_, n in zip(chart.xs, s.median, s.low, s.high, s.n, strict=True):
            if m is None:
                values.append(None)
                continue
            values.append({"value": m, "ci": {"low": lo_, "high": hi_},
                           "label": f"{s.name} @ {chart.x_label} {x}: median {m:,.4g} {chart.unit} "
                                    f"(min {lo_:,.4g}, max {hi_:,.4g}, n={n})"})
        c.add(s.name, [*values, None])
    return _inline(c.render(is_unicode=True))


def frontier_svg(f: Frontier) -> str:
    """Output throughput against tokens a second per user as inline SVG: per arm a line through its points in the
    order of their x, each labelled by its concurrency, its min–max and Δ in the tooltip."""
    style = _style()
    c = pygal.XY(width=CHART_W, height=CHART_H, explicit_size=True, style=style, js=[], disable_xml_declaration=True,
                 title=f.title, x_title=f.x_label, y_title=f.y_label, legend_at_bottom=True,
                 legend_at_bottom_columns=max(1, len(f.series)), dots_size=3, truncate_label=-1, margin=6, spacing=8,
                 classes=["pygal-chart", "frontier"])
    c.add_xml_filter(_svg_filter(f.key))
    for s in f.series:
        c.add(s.name, [{"value": (q.x, q.y), "label": f"{s.name} {q.label}: {q.y:,.4g} at {q.x:,.4g} per user "
                        f"(min–max {q.y_low:,.4g}–{q.y_high:,.4g} and {q.x_low:,.4g}–{q.x_high:,.4g})"
                        + (f"; {q.tip}" if q.tip else "")}
                       for q in sorted(s.points, key=lambda q: q.x)])
    return _inline(c.render(is_unicode=True))


# ---------------------------------------------------------------------------------------------- blocks


def _cell(c: Cell, tag: str, align: str) -> str:
    classes = []
    if c.style:
        classes.append(f"v-{c.style}")
        if c.strength:
            classes.append(f"s{c.strength}")
    cls = f' class="{" ".join(classes)}"' if classes else ""
    tip = f' title="{esc(c.tip)}"' if c.tip else ""
    return f'<{tag}{cls}{tip} style="text-align:{align}">{inline(c.text)}</{tag}>'


def table(t: Table) -> str:
    head = "".join(f'<th style="text-align:{t.column_align(i)}">{inline(h)}</th>' for i, h in enumerate(t.headers))
    rows = "".join("<tr>" + "".join(_cell(c, "td", t.column_align(i)) for i, c in enumerate(row)) + "</tr>"
                   for row in t.rows)
    caption = f"<caption>{inline(t.caption)}</caption>" if t.caption else ""
    name = f" {esc(t.name)}" if t.name else ""
    return (f'<div class="scroll"><table class="doc{name}">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def card(c: Card) -> str:
    facts = "".join(f"<div class='fact'>{inline(x)}</div>" for x in (c.rounds, c.mde) if x)
    lines = "".join(f"<li>{inline(x)}</li>" for x in c.lines)
    correct = "".join(f"<li>{inline(x)}</li>" for x in c.correctness)
    return (f"<div class='card ov-{esc(c.style)}'><div class='cand'>{inline(c.title)}</div>"
            f"<div class='overall'>{esc(c.word)}</div><div class='headline'>{inline(c.headline)}</div>"
            + (table(c.points) if c.points is not None else "") + facts
            + (f"<ul class='lines'>{lines}</ul>" if lines else "")
            + (f"<div class='sub'>Correctness</div><ul class='correct'>{correct}</ul>" if correct else "")
            + "</div>")


def blocks(items: list[Block]) -> str:
    out: list[str] = []
    i = 0
    while i < len(items):
        b = items[i]
        if isinstance(b, Chart | Card):
            kind = type(b)
            j = i
            while j < len(items) and isinstance(items[j], kind):
                j += 1
            group = items[i:j]
            if kind is Chart:
                out.append("<div class='charts'>" + "".join(chart_svg(c) for c in group if isinstance(c, Chart))
                           + "</div>")
            else:
                out.append("<div class='cards'>" + "".join(card(c) for c in group if isinstance(c, Card)) + "</div>")
            i = j
            continue
        if isinstance(b, Frontier):
            out.append("<div class='charts'>" + frontier_svg(b) + "</div>")
        elif isinstance(b, Section):
            out.append(section(b))
        elif isinstance(b, Paragraph):
            out.append(f"<p>{inline(b.text)}</p>")
        elif isinstance(b, Note):
            out.append(f"<p class='note sev-{esc(b.severity)}'>{inline(b.text)}</p>")
        elif isinstance(b, BulletList):
            out.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b.items) + "</ul>")
        elif isinstance(b, Table):
            out.append(table(b))
        elif isinstance(b, Code):
            pre = f"<pre>{esc(b.text)}</pre>"
            out.append(f"<details><summary>{inline(b.title)}</summary>{pre}</details>" if b.title else pre)
        else:
            raise TypeError(f"not a document block: {b!r}")
        i += 1
    return "\n".join(out)


def section(s: Section) -> str:
    level = max(2, min(6, s.level))
    ident = f" id='{esc(s.anchor)}'" if s.anchor else ""
    body = blocks(s.blocks)
    if s.collapsed:
        return f"<details{ident}><summary>{inline(s.title)}</summary>{body}</details>"
    return f"<section{ident}><h{level}>{inline(s.title)}</h{level}>{body}</section>"


# ------------------------------------------------------------------------------------------------ page


def _css() -> str:
    rules = []
    for key, (r, g, b) in STYLE_RGB.items():
        rules.append(f".card.ov-{key}{{border-left-color:rgb({r},{g},{b})}}"
                     f".card.ov-{key} .overall{{color:rgb({int(r * .85)},{int(g * .85)},{int(b * .85)})}}")
        rules.append(f"td.v-{key},th.v-{key}{{background:rgba({r},{g},{b},.10)}}")
        for k in range(1, MAX_STRENGTH + 1):
            alpha = 0.10 + 0.60 * k / MAX_STRENGTH
            ink = ";color:#fff" if alpha > 0.55 else ""
            rules.append(f"td.v-{key}.s{k}{{background:rgba({r},{g},{b},{alpha:.2f}){ink}}}")
    return BASE_CSS + "\n".join(rules) + "\n"


BASE_CSS = """
:root{--fg:#1d2430;--muted:#5d6778;--line:#d9dee7;--bg:#fff;--soft:#f5f7fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg)}
main{max-width:1480px;margin:0 auto;padding:20px 28px 40px}
header h1{font-size:22px;margin:0 0 6px}
header p,header ul{margin:2px 0;color:var(--muted)}
h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;border-bottom:2px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px}
h4{font-size:14px;margin:12px 0 4px}
nav{margin:10px 0 0;display:flex;gap:14px;flex-wrap:wrap;font-size:13px}
nav a{color:#2f5d9a;text-decoration:none}
code{font:12px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;background:var(--soft);padding:1px 4px;border-radius:3px}
pre{font:12px/1.35 ui-monospace,"DejaVu Sans Mono",monospace;background:var(--soft);padding:10px;overflow:auto;
max-height:420px}
.cards{display:flex;flex-wrap:wrap;gap:14px}
.card{border:1px solid var(--line);border-left:8px solid #888;border-radius:6px;padding:12px 16px;min-width:380px;
flex:1 1 380px;background:var(--soft)}
.cand{font-weight:600}
.overall{font-size:22px;font-weight:700;margin:4px 0}
.headline{font-size:16px;margin:2px 0 6px}
.fact{color:var(--muted);font-size:13px}
.card ul{margin:6px 0 0;padding-left:18px;font-size:13px}
.card .sub{margin-top:8px;font-weight:600;font-size:13px}
.note{margin:6px 0;padding:6px 12px;border-left:4px solid var(--line);background:var(--soft)}
.note.sev-warning,.note.sev-unreliable{border-left-color:rgb(214,158,0);background:#fff8e6}
.note.sev-error{border-left-color:rgb(215,48,39);background:#fdecea}
table{border-collapse:collapse;margin:6px 0 12px;font-variant-numeric:tabular-nums}
th,td{border:1px solid var(--line);padding:4px 8px;vertical-align:top}
thead th{background:var(--soft);font-weight:600}
caption{caption-side:top;text-align:left;color:var(--muted);padding:2px 0}
td.v-missing{color:#999;background:repeating-linear-gradient(45deg,#fff,#fff 4px,#f0f0f0 4px,#f0f0f0 8px)}
table.heat td{min-width:64px;font-size:12px}
table.heat thead th{font-size:11px;vertical-align:bottom}
table.heat tbody td:first-child{white-space:nowrap}
.charts{display:flex;flex-wrap:wrap;gap:10px}
svg.chart{border:1px solid var(--line);border-radius:4px;background:#fff}
.scroll{overflow-x:auto}
details{margin:4px 0}
summary{cursor:pointer;font-weight:600;padding:3px 0}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{details{display:block}.scroll{overflow:visible}}
"""
CSS = _css()
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render(doc: Document) -> str:
    nav = "".join(f"<a href='#{esc(s.anchor)}'>{inline(s.title)}</a>" for s in doc.sections if s.anchor)
    header = (f"<header><h1>{inline(doc.title)}</h1>{blocks(list(doc.intro))}"
              + (f"<nav>{nav}</nav>" if nav else "") + "</header>")
    body = "\n".join(section(s) for s in doc.sections)
    footer = f"<footer>{inline(doc.footer)}</footer>" if doc.footer else ""
    title = re.sub(r"[`*]", "", doc.title)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>\n"
            f"{header}\n{body}\n{footer}\n</main></body></html>\n")

