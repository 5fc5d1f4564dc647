"""report.md: a `Document` as GitHub-flavoured markdown.

Text in the document is already inline markdown, so it is written as it is; table cells get their pipes
escaped and line breaks as ``<br>``. A chart cannot be drawn in markdown: consecutive charts become one line
naming them (report.html holds them). Verdict cards become a bullet with the word in bold and the card's
lines nested below, so ``**patched vs baseline: REGRESSION**`` stays greppable.
"""

from __future__ import annotations

from suite.document import (
    Block,
    BulletList,
    Card,
    Chart,
    Code,
    Document,
    Frontier,
    Note,
    Paragraph,
    Section,
    Table,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def table(t: Table) -> str:
    rule = {"left": "---", "right": "--:", "center": ":-:"}
    lines = []
    if t.caption:
        lines += [t.caption, ""]
    lines.append("| " + " | ".join(_cell(h) for h in t.headers) + " |")
    lines.append("|" + "|".join(rule[t.column_align(i)] for i in range(len(t.headers))) + "|")
    lines += ["| " + " | ".join(_cell(c.text) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def card(c: Card) -> str:
    lines = [f"- **{c.title}: {c.word}** — {c.headline}"]
    if c.points is not None:  # inside the list item: indented, with a blank line either side
        lines += ["", *("  " + ln if ln else "" for ln in table(c.points).splitlines()), ""]
    facts = [x for x in (c.rounds, c.mde) if x]
    if facts:
        lines.append("  - " + "; ".join(facts))
    lines += [f"  - {line}" for line in c.lines]
    lines += [f"  - correctness: {line}" for line in c.correctness]
    return "\n".join(lines)


def _charts(charts: list[Chart]) -> str:
    names = ", ".join(f"{c.title} ({c.unit})" for c in charts)
    return f"Charts in report.html: {names}, against {charts[0].x_label}."


def _frontier(f: Frontier) -> str:
    """The chart report.html draws, as the table of its points (median over repeats)."""
    rows = [f"| {s.name} | {q.label} | {q.x:,.4g} | {q.y:,.4g} |" for s in f.series for q in s.points]
    return "\n".join([f"{f.title} (drawn in report.html):", "", f"| Arm | Point | {f.x_label} | {f.y_label} |",
                      "|---|---|--:|--:|", *rows])


def blocks(items: list[Block]) -> list[str]:
    """Markdown chunks (to be joined by blank lines) of a list of blocks."""
    out: list[str] = []
    i = 0
    while i < len(items):
        b = items[i]
        if isinstance(b, Chart):
            j = i
            while j < len(items) and isinstance(items[j], Chart):
                j += 1
            out.append(_charts([c for c in items[i:j] if isinstance(c, Chart)]))
            i = j
            continue
        if isinstance(b, Card):
            j = i
            while j < len(items) and isinstance(items[j], Card):
                j += 1
            out.append("\n".join(card(c) for c in items[i:j] if isinstance(c, Card)))
            i = j
            continue
        if isinstance(b, Frontier):
            out.append(_frontier(b))
        elif isinstance(b, Section):
            out.append(section(b))
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Note):
            out.append(b.text if b.severity == "info" else "> " + b.text.replace("\n", "\n> "))
        elif isinstance(b, BulletList):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            out.append(table(b))
        elif isinstance(b, Code):
            fence = "````" if "```" in b.text else "```"
            out.append((f"{b.title}\n\n" if b.title else "") + f"{fence}\n{b.text.rstrip()}\n{fence}")
        else:
            raise TypeError(f"not a document block: {b!r}")
        i += 1
    return out


def section(s: Section) -> str:
    head = "#" * max(1, min(6, s.level)) + " " + s.title
    return "\n\n".join([head, *blocks(s.blocks)])


def render(doc: Document) -> str:
    parts = [f"# {doc.title}", *blocks(list(doc.intro)), *(section(s) for s in doc.sections)]
    if doc.footer:
        parts.append(doc.footer)
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"
