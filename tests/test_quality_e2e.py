"""End to end through the CLI: a planted server defect is named in the report's Data quality box.

Two arms of the installed vLLM on the tiny MoE: `baseline`, and `bursty`, whose server runs with vLLM's own
`--stream-interval 64` so that each stream sends the first token and then the rest in one chunk (a chunked
stream: `vllm bench serve` then times gaps between chunks, so ITL measures nothing; TTFT, TPOT and E2E latency
stay right). The persistent client serves every point. The report must name the defect for `bursty` only
and leave out only the metrics it spoils.
"""

from __future__ import annotations

import json

import pytest

from suite.stages.serve.checks import CHUNK_SHARE
from tests.conftest import run_matrix_once, tiny_cpu_matrix

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {vllm: "0.32.0"}
  bursty: {vllm: "0.32.0", serve_args: [--stream-interval, "64"]}
serve:
  - {isl: 64, osl: 24, concurrency: [1, 4], num_prompts: 2x}
"""
POINTS = ("isl64-osl24-c1-n2", "isl64-osl24-c4-n8")


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory, tiny_model):
    _, run_dir, proc = run_matrix_once(tmp_path_factory.mktemp("quality"),
                                       tiny_cpu_matrix("e2e-quality", tiny_model, BODY))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_the_persistent_client_ran_every_point_of_each_session(quality_run):
    for arm in ("baseline", "bursty"):
        for point in POINTS:
            rec = json.loads((quality_run / arm / "serve" / point / "rep-0.job.json").read_text())
            assert rec["status"] == "ok"
            assert rec["client"]["mode"] == "persistent" and rec["client"]["fallback_reason"] is None
    # one worker process per run served all four points: one handshake, four answered points
    log = (quality_run / "client" / "client-persistent.log").read_text()
    assert log.count("] point ") >= 4 and log.count("ok in ") == 4 + log.count("warm-up")


def test_the_planted_chunking_is_named_for_its_arm_only(quality_run):
    report = (quality_run / "report.md").read_text()
    quality = report.split("## Data quality")[1].split("\n## ")[0]
    assert "| unreliable | chunked-stream | bursty | 2 | isl64-osl24-c1-n2, isl64-osl24-c4-n8 |" in quality
    rows = [line for line in quality.splitlines() if line.startswith("| unreliable") or line.startswith("| warning")]
    assert rows and not any("| baseline |" in line for line in rows), rows
    # the raw JSON agrees: bursty's requests got their 23 tokens after the first in one or two chunks
    for point in POINTS:
        bursty = json.loads((quality_run / "bursty" / "serve" / point / "rep-0.json").read_text())
        assert all(len(gaps) <= 2 for gaps in bursty["itls"]), bursty["itls"]
        # baseline streams token by token; on a busy 2-core box vLLM's API server may merge a request's pending
        # outputs now and then (CI saw it under the uni executor), but never so that a request reads as chunked
        base = json.loads((quality_run / "baseline" / "serve" / point / "rep-0.json").read_text())
        assert all(len(gaps) >= CHUNK_SHARE * 23 for gaps in base["itls"]), base["itls"]


def test_only_the_spoiled_metric_is_left_out(quality_run):
    report = (quality_run / "report.md").read_text()
    stats = report.split("## Statistics per point")[1]
    for point in POINTS:
        block = stats.split(f"### {point}: baseline → bursty")[1].split("\n### ")[0]
        rows = {line.split("|")[1].strip(): line for line in block.splitlines() if line.startswith("| ")}
        for metric in ("Median ITL (ms)", "P99 ITL (ms)"):
            assert "every bursty repeat is unreliable (chunked-stream)" in rows[metric], rows[metric]
        for metric in ("Output throughput (tok/s)", "Mean TTFT (ms)", "Mean TPOT (ms)", "Mean E2E latency (ms)"):
            assert "chunked-stream" not in rows[metric], rows[metric]
    assert "Left out by data-quality checks (for the metrics they spoil): bursty round 0 (chunked-stream)" in report
