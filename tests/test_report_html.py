"""report.html: rendered from a run directory built out of real `vllm bench serve` results (tests/data): one
self-contained file (inline CSS and SVG, no script, no URL), the same document as report.md, a CSS rule for
every verdict style, pygal charts made deterministic; then loaded in real headless Chromium through the
DevTools protocol (--remote-debugging-pipe): no console errors, no exceptions, no request leaves file://, the
DOM holds the cards, tables and charts, the screenshot is not blank.

Chromium: `apt-get install -y chromium` (Debian); the browser tests skip when it is missing, except under CI
(or SUITE_REQUIRE_BROWSER=1), where a missing browser fails them.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from suite.analysis import load_run
from suite.document import STYLES, Card, Chart, Document, Note, Paragraph, Section, Series, literal
from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.records import PlanRecord, new_manifest
from suite.render import html as html_render
from suite.render import markdown as md_render
from suite.report import build_document, build_report, render_html
from suite.stats import DETAIL, HEADLINE, METRICS, Verdict
from suite.store import RunStore, atomic_write_json

DATA = Path(__file__).parent / "data" / "report_run"
SCALE_JITTER = (1.0, 1.01, 1 / 1.01)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
REQUIRE = bool(os.environ.get("CI")) or os.environ.get("SUITE_REQUIRE_BROWSER") == "1"
needs_browser = pytest.mark.skipif(CHROMIUM is None and not REQUIRE, reason="chromium not installed")


# ---------------------------------------------------------------------------------------- the run fixture


def build_run_dir(dest: Path, *, scale: dict[str, float] | None = None, drop: set[str] = frozenset()) -> Path:
    """A run directory as `suite run` writes it: manifest + job records via suite.store, raw results from
    tests/data (real `vllm bench serve` JSON of the CPU demo, per-request text arrays stripped).

    ``scale``: multiply the arm's output throughput (and divide its latencies) to make a known change, with a
    1 % round-to-round jitter whose geometric mean over the three rounds is 1 (a constant factor would leave
    the rounds' paired scores no spread at all, which no real run has); ``drop``: arms whose records are
    written as failed (to show failures are listed)."""
    matrix = load_matrix(DATA / "matrix.yaml")
    plan = build_plan(matrix)
    store = RunStore(dest)
    dest.mkdir(parents=True)
    store.write_manifest(new_manifest("tests/data/report_run/matrix.yaml", matrix.model_dump(mode="json"), PlanRecord.of(plan)))
    arms_info = json.loads((DATA / "arms.json").read_text())
    counts = {"ok": 0, "failed": 0, "missing": 0}
    for job in plan.jobs:
        raw = json.loads((DATA / job.arm / job.point / f"rep-{job.repeat}.json").read_text())
        if job.arm in drop:
            store.write_record(job, "failed", error="server exited with code 1 during the benchmark")
            counts["failed"] += 1
            continue
        factor = (scale or {}).get(job.arm)
        if factor:
            factor *= SCALE_JITTER[job.repeat % len(SCALE_JITTER)]
            for key, value in list(raw.items()):
                if isinstance(value, float) and key.endswith("_ms"):
                    raw[key] = value / factor
                elif key in ("output_throughput", "total_token_throughput", "request_throughput"):
                    raw[key] = value * factor
        atomic_write_json(store.result_path(job), raw)
        store.write_record(job, "ok", command=["vllm", "bench", "serve"], duration_s=raw["duration"])
        counts["ok"] += 1
    store.update_manifest(arms=arms_info, runtime="local", status="complete" if not drop else "incomplete",
                          finished="2026-11-29T19:00:00+00:00", job_counts=counts)
    return dest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return build_run_dir(tmp_path / "20261129T184709Z-smoke-cpu")


# ---------------------------------------------------------------------------------------- the browser


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, user_data: Path, timeout: float = 30.0):
        self.timeout = timeout
        to_chrome_r, self._to_chrome_w = os.pipe()
        self._from_chrome_r, from_chrome_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends must be fds 3 and 4 (dup2 makes them inheritable)
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.close(a)
            os.close(b)

        self.proc = subprocess.Popen(
            [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
             "--hide-scrollbars", f"--user-data-dir={user_data}", "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no DevTools message from chromium")
            ready, _, _ = select.select([self._from_chrome_r], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome_w)
        os.close(self._from_chrome_r)


def load_page(url: str, user_data: Path, width: int = 1400) -> dict[str, Any]:
    """Open ``url``; return console/exception/log errors, non-local requests, DOM facts and a screenshot."""
    b = Browser(user_data)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            b.send(f"{domain}.enable", session=s)
        b.send("Emulation.setDeviceMetricsOverride",
               {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=s)
        b.send("Page.navigate", {"url": url}, session=s)
        b.wait_event("Page.loadEventFired")
        facts = b.send("Runtime.evaluate", {"returnByValue": True, "expression": """({
            title: document.title,
            h2: [...document.querySelectorAll('h2')].map(e => e.textContent),
            tables: document.querySelectorAll('table').length,
            heatCells: document.querySelectorAll('table.heat td').length,
            charts: document.querySelectorAll('svg.chart').length,
            lines: document.querySelectorAll('svg.chart path.line.nofill').length,
            whiskers: document.querySelectorAll('svg.chart g.ci path').length,
            tooltips: document.querySelectorAll('svg.chart g.dots > title').length,
            overall: [...document.querySelectorAll('.card .overall')].map(e => e.textContent),
            cardBorder: (e => e ? getComputedStyle(e).borderLeftColor : '')(document.querySelector('.card')),
            text: document.body.innerText,
            height: document.documentElement.scrollHeight,
            scripts: document.scripts.length,
        })"""}, session=s)["result"]["value"]
        height = min(int(facts["height"]), 16000)
        shot = b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                 "clip": {"x": 0, "y": 0, "width": width, "height": height,
                                                          "scale": 1}}, session=s)
        b.send("Runtime.evaluate", {"expression": "1"}, session=s)  # flush pending console/log events
        errors = []
        requests = []
        for ev in b.events:
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("exception", {}).get("description")
                              or p["exceptionDetails"].get("text"))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text"))
            elif method == "Network.requestWillBeSent":
                requests.append(p["request"]["url"])
        return {"facts": facts, "png": base64.b64decode(shot["data"]), "errors": errors,
                "external": [u for u in requests if not u.startswith(("file:", "data:", "about:"))]}
    finally:
        b.close()


def pixel_stats(png: bytes) -> tuple[float, int, tuple[int, int]]:
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(png)).convert("RGB")
    stdev = sum(ImageStat.Stat(img).stddev) / 3
    colors = img.getcolors(maxcolors=1 << 20)
    return stdev, len(colors) if colors else 1 << 20, img.size


# ---------------------------------------------------------------------------------------- tests


def test_html_is_one_self_contained_file(run_dir: Path) -> None:
    page = render_html(load_run(run_dir))
    assert page.startswith("<!DOCTYPE html>")
    for needle in ("Verdict", "Data quality", "before → after", "Metrics against concurrency", "Δ% heat map",
                   "Statistics per point", "Provenance", "ISL 128 / OSL 32", "ISL 256 / OSL 16",
                   "synthetic-gate-delay", "Output throughput"):
        assert needle in page, needle
    # nothing is fetched: no URL at all (not even an xmlns), no script, a CSP that forbids loads
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<!--" not in page
    assert "default-src 'none'" in page
    # the charts: inline <svg>, one per headline metric per ISL/OSL group, a native tooltip per point
    assert page.count("<svg ") == 2 * len(HEADLINE) + 2 and page.count('class="pygal-chart chart"') == 8
    assert page.count('class="pygal-chart frontier"') == 2  # throughput against interactivity, one per ISL/OSL
    assert "<title>baseline @ concurrency 4: median" in page and "<title>patched @ concurrency 8: median" in page
    # the heat map: points × metrics
    heat = page.split("<table class=\"doc heat\">")[1].split("</table>")[0]
    assert heat.count("<td") == 3 * (1 + len(DETAIL))


def test_markdown_and_html_draw_the_same_document(run_dir: Path) -> None:
    """Every table cell of the document shows up in both files (the two no longer walk the data apart)."""
    run = load_run(run_dir)
    doc = build_document(run)
    md, page = md_render.render(doc), html_render.render(doc)
    cells = []

    def walk(blocks: list) -> None:
        for b in blocks:
            if isinstance(b, Section):
                walk(b.blocks)
            elif hasattr(b, "rows"):
                cells.extend(c.text for row in b.rows for c in row)
    for sec in doc.sections:
        walk(sec.blocks)
    assert len(cells) > 200
    for text in {c for c in cells if c and "`" not in c and "*" not in c and "\\" not in c}:
        shown = text.replace("\n", "<br>")
        assert shown.replace("|", "\\|") in md, text
        assert html_render.esc(text).split("\n")[0] in page, text


def test_every_verdict_style_has_a_css_rule() -> None:
    css = html_render.CSS
    for key in STYLES:
        assert f".card.ov-{key}{{" in css and f"td.v-{key},th.v-{key}{{" in css, key
        for k in range(1, 5):
            assert f"td.v-{key}.s{k}{{" in css
    # a card of each word gets its class; the word stays readable text
    for word in ("REGRESSION", "IMPROVEMENT", "EQUIVALENT", "MIXED", "INCONCLUSIVE", "NO DATA"):
        style = word.lower().replace(" ", "-")
        page = html_render.render(Document("t", [], [Section("Verdict", 2, [Card("a vs b", word, style, "x")])]))
        assert f"class='card ov-{style}'" in page and f"<div class='overall'>{word}</div>" in page


def test_verdicts_follow_the_statistics(tmp_path: Path) -> None:
    """The demo's real repeats are noisy (2 shared CPU cores): unchanged, the primary test cannot call a
    change. Made 10x slower, the candidate is a REGRESSION, and cells only ever move the worse way."""
    same = load_run(build_run_dir(tmp_path / "same"))
    (s,) = same.summaries
    assert s.candidate == "patched" and s.baseline == "baseline"
    assert sum(s.counts.values()) == 3 * len(DETAIL)
    assert s.counts[Verdict.WORSE] == s.counts[Verdict.BETTER] == 0
    assert s.overall in ("INCONCLUSIVE", "EQUIVALENT")
    slow = load_run(build_run_dir(tmp_path / "slow", scale={"patched": 0.1}))
    (w,) = slow.summaries
    assert w.overall == "REGRESSION" and w.counts[Verdict.BETTER] == 0
    assert w.evaluation.composite.rci_high_pct < 0
    assert w.geomean_throughput_pct == pytest.approx(((1 + s.geomean_throughput_pct / 100) * 0.1 - 1) * 100, rel=0.01)
    for c in w.regressions:
        assert (c.delta_pct < 0) == METRICS[c.metric].higher_is_better and c.interval is not None
    page = render_html(slow)
    assert "class='card ov-regression'" in page


def test_failures_and_no_data_are_shown(tmp_path: Path) -> None:
    run_dir = build_run_dir(tmp_path / "r", drop={"patched"})
    page = render_html(load_run(run_dir))
    assert "<h2>Failed jobs</h2>" in page and "server exited with code 1" in page
    assert "class='card ov-no-data'" in page  # the candidate has no results: said, not hidden
    assert "<a href='#failures'>Failed jobs</a>" in page  # listed in the page's navigation


def test_inline_markdown_is_rendered_by_markdown_it_and_outside_text_stays_text() -> None:
    doc = Document("T", [], [Section("S", 2, [
        Paragraph("some **bold** and `a|b` and " + literal("<b>x</b> *y* __init__ ll_bf16")),
        Note("**careful**: quoted", "warning")], anchor="s")])
    page = html_render.render(doc)
    assert "<strong>bold</strong>" in page and "<code>a|b</code>" in page
    assert "&lt;b&gt;x&lt;/b&gt; *y* __init__ ll_bf16" in page
    assert "<p class='note sev-warning'><strong>careful</strong>: quoted</p>" in page
    md = md_render.render(doc)
    assert "> **careful**: quoted" in md and "ll_bf16" in md


def test_charts_are_deterministic_with_lxml_and_elementtree() -> None:
    """pygal builds with lxml when it is installed, else xml.etree: the clean-up filter works on both."""
    import pygal.etree

    chart = Chart("k1", "Output throughput", "tok/s", "concurrency", ["1", "4"],
                  [Series("a", [1.0, 3.0], [0.5, 2.0], [1.5, 4.0], [3, 3]), Series("b", [2.0, None], [1.0, None],
                                                                                      [2.5, None], [2, 0])], True)
    was_lxml = pygal.etree.etree.lxml
    try:
        for switch in (pygal.etree.etree.to_etree, pygal.etree.etree.to_lxml):
            if switch is pygal.etree.etree.to_lxml and pygal.etree.etree._lxml_etree is None:
                continue
            switch()
            svg = html_render.chart_svg(chart)
            assert svg == html_render.chart_svg(chart)
            assert svg.startswith('<svg id="chart-k1"') and "<script" not in svg and "<!--" not in svg
            assert "http" not in svg and "<title>a @ concurrency 4: median 3 tok/s (min 2, max 4, n=3)</title>" in svg
    finally:
        (pygal.etree.etree.to_lxml if was_lxml else pygal.etree.etree.to_etree)()


@needs_browser
def test_report_html_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    build_report(run_dir)
    path = run_dir / "report.html"
    assert path.stat().st_size > 10_000
    got = load_page(path.as_uri(), tmp_path / "profile")
    shots = os.environ.get("SUITE_SCREENSHOT_DIR")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        (Path(shots) / "report.png").write_bytes(got["png"])
    assert got["errors"] == []
    assert got["external"] == []
    f = got["facts"]
    assert f["title"].startswith("smoke-cpu: baseline vs patched")
    for h in ("Verdict", "Data quality", "Serving (vllm bench serve): before → after", "Metrics against concurrency",
              "Δ% heat map", "Statistics per point", "Provenance"):
        assert h in f["h2"], f["h2"]
    assert f["charts"] == 8 and f["lines"] >= 8 and f["whiskers"] >= 8 and f["tooltips"] >= 8
    assert f["heatCells"] == 3 * (1 + len(DETAIL))
    assert f["tables"] >= 5 and f["scripts"] == 0
    assert f["overall"] and f["overall"][0] in ("EQUIVALENT", "INCONCLUSIVE", "IMPROVEMENT", "REGRESSION", "MIXED")
    assert f["cardBorder"] != "rgb(136, 136, 136)"  # the card is styled by its verdict class
    stdev, colors, size = pixel_stats(got["png"])
    assert size[0] == 1400 and size[1] > 1500
    assert stdev > 20 and colors > 200, (stdev, colors)


@needs_browser
def test_browser_check_catches_errors_and_blank_pages(tmp_path: Path) -> None:
    """The checks above can fail: a script error, a console error and a remote request are all seen, and a
    blank page fails the pixel test."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><img src='http://192.0.2.1/x.png'>"
                   "<script>console.error('from console'); undefined_fn();</script></body></html>")
    got = load_page(bad.as_uri(), tmp_path / "p1")
    assert any("from console" in e for e in got["errors"])
    assert any("undefined_fn" in e for e in got["errors"])
    assert got["external"] == ["http://192.0.2.1/x.png"]
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    stdev, colors, _ = pixel_stats(load_page(blank.as_uri(), tmp_path / "p2")["png"])
    assert stdev < 1 and colors < 5
