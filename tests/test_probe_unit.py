"""Gate probe: buckets, counter merge, verdicts, report lines, and vLLM's own discovery of the plugin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from suite.analysis import load_run
from suite.plan import Job
from suite.records import SCHEMA_VERSION, Manifest
from suite.render.markdown import section as markdown_section
from suite.stages.probe.plugin import BUCKET_LABELS, bucket
from suite.stages.probe.read import FROZEN, NOT_EXERCISED
from suite.stages.probe.run import (
    PLUGIN_NAME,
    diff_counts,
    install_probe_site,
    merge_counts,
    merge_processes,
    request_plan,
    summarize,
)
from suite.stages.probe.summary import section
from suite.store import RunStore, atomic_write_json

TIER6 = "F.linear (tier 6: ReplicatedLinear) > dispatch_unquantized_gemm->cpu_unquantized_gemm"


@pytest.mark.parametrize(("m", "label"), [(0, "1"), (1, "1"), (2, "2-4"), (4, "2-4"), (5, "5-8"), (8, "5-8"),
                                          (9, "9-16"), (16, "9-16"), (17, "17-32"), (32, "17-32"),
                                          (33, "33-128"), (128, "33-128"), (129, ">128"), (8192, ">128")])
def test_bucket_edges(m, label):
    assert bucket(m) == label


def test_bucket_labels_in_order():
    assert BUCKET_LABELS == ("1", "2-4", "5-8", "9-16", "17-32", "33-128", ">128")


def c(kind, b, path, n):
    return {"kind": kind, "bucket": b, "path": path, "count": n}


def test_diff_and_merge_take_only_what_the_requests_added_over_all_processes():
    before = {"11": {"counts": [c("steps", ">128", "", 1), c("gate", ">128", TIER6, 2)]},
              "12": {"counts": []}}
    after = {"11": {"counts": [c("steps", ">128", "", 1), c("gate", ">128", TIER6, 2), c("steps", "1", "", 5),
                               c("gate", "1", TIER6, 10)], "gates": [{"prefix": "g0"}], "present_ops": ["a"]},
             "12": {"counts": [c("steps", "1", "", 3), c("gate", "1", TIER6, 6)], "present_ops": ["b"]},
             "13": {"counts": [c("outside", "2-4", "torch.ops.vllm.x", 4)]}}  # first seen after the requests
    assert diff_counts(before["11"]["counts"], after["11"]["counts"]) == [c("steps", "1", "", 5),
                                                                         c("gate", "1", TIER6, 10)]
    merged = merge_processes(before, after)
    assert merged["counts"] == [c("gate", "1", TIER6, 16), c("outside", "2-4", "torch.ops.vllm.x", 4),
                                c("steps", "1", "", 8)]
    assert merged["startup_counts"] == merge_counts([before["11"]["counts"]])
    assert merged["present_ops"] == ["a", "b"]
    b = merged["buckets"]
    assert b["1"] == {"steps": 8, "forward_calls": 16, "paths": {TIER6: 16}, "outside": {},
                      "verdict": "eager (GateLinear.forward ran)"}
    assert b["2-4"]["verdict"] == "custom op only" and b["2-4"]["outside"] == {"torch.ops.vllm.x": 4}
    assert b[">128"]["verdict"] == NOT_EXERCISED  # only startup steps there


def test_steps_without_a_forward_call_are_a_frozen_compiled_graph():
    s = summarize([c("steps", "2-4", "", 7), c("outside", "2-4", "torch.ops.vllm.suite_gate_delay", 14)])
    assert s["2-4"]["verdict"] == FROZEN and s["2-4"]["forward_calls"] == 0
    assert s["1"]["verdict"] == NOT_EXERCISED


def test_request_plan_stays_within_max_num_seqs_and_model_len():
    plan = request_plan(8, 512)
    assert [b.concurrency for b in plan] == [1, 1, 1, 1, 2, 4, 8]
    assert [b.prompt_len for b in plan[:4]] == [12, 24, 100, 200]
    assert max(b.concurrency for b in request_plan(None, 4096)) == 32
    assert [b.concurrency for b in request_plan(6, 4096)][4:] == [2, 4, 6]
    assert all(b.prompt_len + b.max_tokens <= 64 for b in request_plan(8, 64))


def _result(arm, counts, ops, allow_ll="False"):
    gates = [{"prefix": f"model.layers.{i}.gate", "allow_ll_bf16_gemm": allow_ll, "weight_dtype": "bfloat16",
              "out_dtype": "None"} for i in range(2)]
    return {"arm": arm, "processes": [{"pid": 1, "platform": "CpuPlatform", "gates": gates, "present_ops": ops,
                                       "errors": []}],
            "present_ops": ops, "counts": counts, "buckets": summarize(counts)}


def _run(tmp_path, results):
    """A run directory written through the store: manifest, probe results and their job records."""
    store = RunStore(tmp_path)
    store.write_manifest(Manifest.model_validate({"schema_version": SCHEMA_VERSION,
                          "plan": {"arms": list(results) or ["a"], "baseline": "baseline"}}))
    for arm, result in results.items():
        job = Job(kind="probe", arm=arm, session=0, point="gate-paths", hash="h")
        atomic_write_json(store.result_path(job), result)
        store.write_record(job, "ok")
    return load_run(tmp_path)


def report_text(run) -> str:
    found = section(run)
    return markdown_section(found) if found is not None else ""


def test_report_says_when_the_patched_fast_path_never_ran(tmp_path):
    base_ops = ["fp32_router_gemm_dispatch", "rocm_bf16x3_router_gemm_dispatch"]
    counts = [c("steps", "1", "", 4), c("gate", "1", TIER6, 8)]
    text = report_text(_run(tmp_path, {
        "baseline": _result("baseline", counts, base_ops),
        "patched": _result("patched", counts, [*base_ops, "ll_bf16_router_gemm_dispatch"])}))
    assert "| M | baseline | patched |" in text
    assert f"| 1 | `{TIER6}` ×8 (4 steps) | `{TIER6}` ×8 (4 steps) |" in text
    assert "Gate paths are the same in `baseline` and `patched` in every bucket." in text
    assert ("**⚠ `patched`: its fast path never ran**: `torch.ops.vllm.ll_bf16_router_gemm_dispatch` is "
            "registered in that arm but was called 0 times") in text
    assert "no specialized tier eligible (every `allow_*` is False)" in text
    assert "| 2-4 |" not in text  # buckets no arm exercised are left out


def test_report_shows_differences_and_frozen_buckets(tmp_path):
    op = "torch.ops.vllm.ll_bf16_router_gemm_dispatch"
    text = report_text(_run(tmp_path, {
        "baseline": _result("baseline", [c("steps", "1", "", 4)], []),
        "patched": _result("patched", [c("steps", "1", "", 4), c("outside", "1", f"{op} > ll_bf16_gemm", 8)],
                           ["ll_bf16_router_gemm_dispatch"], allow_ll="True")}))
    assert "**Gate paths differ** between `baseline` and `patched` in buckets 1." in text
    assert f"`patched`: `{op}` ran 8 times (buckets 1)." in text
    assert f"- `baseline`: buckets 1 ran as a {FROZEN}" in text
    assert "eligible: `allow_ll_bf16_gemm on 2/2`" in text
    assert "never ran" not in text


def test_no_probe_results_no_section(tmp_path):
    assert section(_run(tmp_path, {})) is None


def test_vllm_discovers_the_plugin_from_the_site_dir_and_honours_vllm_plugins(tmp_path):
    """vLLM's own loader (plugins/__init__.py) finds the entry point through importlib.metadata on
    PYTHONPATH; VLLM_PLUGINS, when set, is an allowlist."""
    site = install_probe_site(tmp_path / "site")
    code = ("import os\nfrom vllm.plugins import load_plugins_by_group\n"
            "print(sorted(load_plugins_by_group('vllm.general_plugins')))\n"
            "os.environ['VLLM_PLUGINS'] = 'something_else'\n"
            "print(sorted(load_plugins_by_group('vllm.general_plugins')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SUITE_GATE_PROBE_DIR")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert PLUGIN_NAME in first
    assert PLUGIN_NAME not in second


def test_replayed_cuda_graphs_show_what_their_capture_ran(tmp_path):
    """On a GPU, decode steps replay CUDA graphs: no Python runs, so the run-time counters see no gate call in
    either arm. What the graphs hold is what the gate ran while the server captured them (startup_counts):
    the patched arm's op there, nothing in the stock arm's (its GEMM is inside the compiled graph)."""
    op = "torch.ops.vllm.ll_bf16_router_gemm_dispatch"
    patched = _result("patched", [c("steps", "1", "", 6), c("steps", "17-32", "", 5)],
                      ["ll_bf16_router_gemm_dispatch"], allow_ll="True")
    patched["startup_counts"] = [c("outside", "1", f"{op} > ll_bf16_gemm", 120),
                                 c("outside", "17-32", f"{op} > torch.mm(out_dtype=float32)", 270)]
    base = _result("baseline", [c("steps", "1", "", 5), c("steps", "17-32", "", 5)], [])
    base["startup_counts"] = [c("steps", "1", "", 4)]
    text = report_text(_run(tmp_path, {"baseline": base, "patched": patched}))
    assert (f"| 1 | {FROZEN} (5 steps) | replayed graph, captured at startup with `{op} > ll_bf16_gemm` ×120 "
            "(6 steps) |") in text
    assert "**Gate paths differ** between `baseline` and `patched` in buckets 1, 17-32." in text
    assert f"`patched`: `{op}` is inside the CUDA graphs its decode steps replayed (captured at startup; " \
           "buckets 1, 17-32)." in text
    assert f"- `patched`: buckets 1 replayed CUDA graphs captured with `{op} > ll_bf16_gemm`" in text
    assert f"- `baseline`: buckets 1, 17-32 ran as a {FROZEN}" in text
    assert "`patched`: buckets" not in text.split("ran as a")[0].split("\n")[-1]  # the patched arm is not frozen
    assert "never ran" not in text
