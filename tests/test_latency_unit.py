"""suite.stages.latency.run without running vLLM: the command line, engine-argument filtering, spread and the
report table (arithmetic checked against values computed here)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from suite.analysis import load_run
from suite.errors import SuiteError
from suite.render.markdown import section as markdown_section
from suite.stages.latency.read import quantile
from suite.stages.latency.run import (
    PROMPT_ID_BOUND,
    check_vocab,
    engine_flags,
    latency_command,
    split_engine_args,
)
from suite.stages.latency.spec import LatencyParams
from suite.stages.latency.summary import section
from suite.store import atomic_write_json


@pytest.fixture(scope="module")
def flags() -> set[str]:
    return engine_flags()


def test_engine_flags_come_from_the_installed_vllm(flags):
    for flag in ("--dtype", "--enforce-eager", "--max-num-seqs", "--kv-cache-memory-bytes", "-tp"):
        assert flag in flags
    for server_only in ("--port", "--host", "--api-key", "--uvicorn-log-level"):
        assert server_only not in flags


def test_engine_flags_read_an_overlay_first(tmp_path):
    src = tmp_path / "vllm" / "engine"
    src.mkdir(parents=True)
    (src / "arg_utils.py").write_text('p.add_argument("--dtype")\np.add_argument("--only-in-overlay", "-x")\n')
    assert engine_flags(tmp_path) == {"--dtype", "--only-in-overlay", "-x"}


def test_split_keeps_engine_args_and_drops_server_args(flags):
    args = ["--dtype", "bfloat16", "--max-num-seqs", "4", "--enforce-eager", "--port", "8000",
            "--api-key", "k", "--uvicorn-log-level", "warning", "--max-model-len", "99",
            "--kv-cache-memory-bytes=1000000", "--no-enable-prefix-caching", "--seed", "-1",
            "--compilation-config.mode", "0", "--max_num_batched_tokens", "64", "-tp", "1"]
    kept, dropped = split_engine_args(args, flags)
    assert kept == ["--dtype", "bfloat16", "--max-num-seqs", "4", "--enforce-eager",
                    "--kv-cache-memory-bytes=1000000", "--no-enable-prefix-caching", "--seed", "-1",
                    "--compilation-config.mode", "0", "--max_num_batched_tokens", "64", "-tp", "1"]
    # server-only flags and the ones the suite sets itself (--max-model-len comes from the matrix's model)
    assert dropped == ["--port", "8000", "--api-key", "k", "--uvicorn-log-level", "warning", "--max-model-len", "99"]


def test_command_has_vllms_own_flags():
    cmd = latency_command(vllm="vllm", model="m", tokenizer="t", max_model_len=1024,
                          params=LatencyParams(input_len=32, output_len=8, batch_size=4, num_iters_warmup=1,
                                               num_iters=3),
                          engine_args=["--dtype", "bfloat16"], output_json=Path("/x/out.json"))
    assert cmd[:3] == ["vllm", "bench", "latency"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert pairs["--input-len"] == "32" and pairs["--output-len"] == "8" and pairs["--batch-size"] == "4"
    assert pairs["--num-iters-warmup"] == "1" and pairs["--num-iters"] == "3"
    assert pairs["--max-model-len"] == "1024" and pairs["--dtype"] == "bfloat16"
    assert cmd[-2:] == ["--output-json", "/x/out.json"]


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], [0.1, 0.7, 0.3, 0.9]])
@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_quantile_matches_numpy(values, q):
    assert quantile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))


def _job(arm: str, bs: int, repeat: int = 0) -> dict:
    return {"kind": "latency", "arm": arm, "session": repeat, "point": f"in32-out8-bs{bs}", "repeat": repeat,
            "tag": "",
            "params": {"input_len": 32, "output_len": 8, "batch_size": bs, "num_iters_warmup": 1, "num_iters": 5},
            "hash": "x"}


def _gm(values: list[float]) -> float:
    return statistics.geometric_mean(values)


def test_report_section_table(tmp_path):
    """A run directory in the store's layout with the tool's JSON shape; the row must carry these numbers."""
    lat = {("base", 1): [0.100, 0.102, 0.098, 0.101, 0.099], ("slow", 1): [0.150, 0.149, 0.152, 0.151, 0.150],
           ("base", 4): [0.200, 0.210, 0.190, 0.205, 0.195]}  # bs 4 of "slow" failed
    for (arm, bs), values in lat.items():
        job = _job(arm, bs)
        d = tmp_path / arm / "latency" / job["point"]
        atomic_write_json(d / "rep-0.json", {"latencies": values, "avg_latency": statistics.mean(values)})
        atomic_write_json(d / "rep-0.job.json", {"schema_version": 1, "job": job, "status": "ok", "hash": "x"})
    job = _job("slow", 4)
    atomic_write_json(tmp_path / "slow" / "latency" / job["point"] / "rep-0.job.json",
                      {"schema_version": 1, "job": job, "status": "failed", "hash": "x", "error": "boom"})
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "plan": {"arms": ["base", "slow"], "baseline": "base"}}))
    found = section(load_run(tmp_path))
    assert found is not None
    text = markdown_section(found)
    assert "### base → slow" in text and "one process" in text
    row1 = next(line for line in text.splitlines() if line.startswith("| 1 | 32 / 8 |"))
    base = [v * 1000 for v in lat[("base", 1)]]
    slow = [v * 1000 for v in lat[("slow", 1)]]
    # the geometric mean (the statistic Δ% is computed from) and p10–p90, in ms
    assert f"{_gm(base):,.2f} ({quantile(base, 0.1):,.2f}–{quantile(base, 0.9):,.2f})" in row1
    assert f"{_gm(slow):,.2f} ({quantile(slow, 0.1):,.2f}–{quantile(slow, 0.9):,.2f})" in row1
    assert f"{_gm(slow) - _gm(base):+,.2f}" in row1  # Δ ms of the same geometric means
    assert f"{(_gm(base) / _gm(slow) - 1) * 100:+.2f}%" in row1  # speedup = before/after − 1
    delta = (_gm(slow) / _gm(base) - 1) * 100
    assert f"| {delta:+.1f}% [" in row1  # Δ% with its interval beside it
    # one engine start per arm: the iterations' interval is shown, but no verdict is drawn from it
    assert "no verdict: 1/1 engine start(s), interval of the iterations only (within: worse, p=" in row1
    assert "| worse" not in row1 and "| 1/1 | 5/5 |" in row1
    row4 = next(line for line in text.splitlines() if line.startswith("| 4 | 32 / 8 |"))
    assert "missing" in row4


def test_with_several_engine_starts_the_verdict_is_across_starts_paired_by_round(tmp_path):
    """Three starts per arm: iterations inside a start agree closely, starts differ by a few percent. The
    within-start spread would call a 1 % slowdown certain; across starts, paired by round, it is not."""
    from scipy import stats as sps

    base_gm = [100.0, 104.0, 97.0]  # ms per start: the engine start matters more than the iterations
    slow_gm = [101.0, 105.5, 97.5]
    for arm, gms in (("base", base_gm), ("slow", slow_gm)):
        for r, gm in enumerate(gms):
            job = _job(arm, 1, r)
            d = tmp_path / arm / "latency" / job["point"]
            values = [gm / 1000 * f for f in (0.999, 1.0, 1.001)]
            atomic_write_json(d / f"rep-{r}.json", {"latencies": values})
            atomic_write_json(d / f"rep-{r}.job.json", {"schema_version": 1, "job": job, "status": "ok", "hash": "x"})
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "plan": {"arms": ["base", "slow"], "baseline": "base"}}))
    text = markdown_section(section(load_run(tmp_path)))
    row = next(line for line in text.splitlines() if line.startswith("| 1 | 32 / 8 |"))
    logs = [math.log(_gm([s / 1000 * f * 1000 for f in (0.999, 1.0, 1.001)]) / _gm([b * f for f in (0.999, 1.0, 1.001)]))
            for b, s in zip(base_gm, slow_gm, strict=True)]
    mean, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(3)
    half = sps.t.ppf(0.975, 2) * se
    lo, hi = (math.exp(mean - half) - 1) * 100, (math.exp(mean + half) - 1) * 100
    assert f"{(math.exp(mean) - 1) * 100:+.1f}% [{lo:+.1f}, {hi:+.1f}]" in row.replace("%,", ",")
    assert "| 3 | 9/9 | not significant: 95% interval includes 0" in row
    assert f"{statistics.geometric_mean(base_gm):,.2f} (" in row  # the mean over the starts


def test_report_section_empty_without_latency_jobs(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "plan": {"arms": ["a", "b"], "baseline": "a"}}))
    assert section(load_run(tmp_path)) is None


def test_prompt_id_bound_matches_the_installed_tool():
    """The vocabulary pre-check relies on `vllm bench latency` drawing prompt ids below PROMPT_ID_BOUND."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("vllm")
    src = (Path(next(iter(spec.submodule_search_locations))) / "benchmarks" / "latency.py").read_text()
    assert re.search(rf"np\.random\.randint\(\s*{PROMPT_ID_BOUND},", src)


def test_check_vocab_rejects_a_small_vocabulary(tiny_model, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    (small / "config.json").write_text(json.dumps({"vocab_size": 1688}))
    with pytest.raises(SuiteError, match="vocab_size .* < 10000"):
        check_vocab(str(small))
    check_vocab(str(tiny_model))  # the generator pads the embedding for `vllm bench latency`
    big = tmp_path / "m"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    check_vocab(str(big))
    check_vocab("org/hub-model")  # not a local directory: nothing to check
