"""Serving points through the real `vllm bench serve` client."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.runtime.base import read_tail

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"


def serve_command(*, vllm: str, base_url: str, served_name: str, tokenizer: str, params: dict[str, Any],
                  result_dir: Path, result_filename: str, metadata: dict[str, str] | None = None) -> list[str]:
    """The exact `vllm bench serve` command for one point (vLLM's own flags and names)."""
    cmd = [
        vllm, "bench", "serve",
        "--backend", "vllm",
        "--base-url", base_url,
        "--model", served_name,
        "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(params["isl"]),
        "--random-output-len", str(params["osl"]),
        "--random-range-ratio", str(params["random_range_ratio"]),
        "--num-prompts", str(params["num_prompts"]),
        "--max-concurrency", str(params["concurrency"]),
        "--request-rate", str(params["request_rate"] or "inf"),
        "--num-warmups", str(params["num_warmups"]),
        "--seed", str(params["seed"]),
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", METRIC_PERCENTILES,
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_filename,
    ]
    if metadata:
        cmd += ["--metadata", *[f"{k}={v}" for k, v in metadata.items()]]
    return cmd


def run_serve(cmd: list[str], *, result_path: Path, log_path: Path, env: dict[str, str],
              timeout_s: float) -> None:
    """Run the client; the raw result JSON lands at result_path atomically (written under a temporary
    name by the tool itself, then renamed), so a kill never leaves a truncated result."""
    tmp_name = cmd[cmd.index("--result-filename") + 1]
    tmp_path = result_path.parent / tmp_name
    result_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise SuiteError(f"`vllm bench serve` timed out after {timeout_s:.0f} s\n  command: "
                             f"{' '.join(cmd)}\n--- log tail ---\n{read_tail(log_path, 20)}") from None
    if proc.returncode != 0 or not tmp_path.is_file():
        tmp_path.unlink(missing_ok=True)
        raise SuiteError(f"`vllm bench serve` failed (exit status {proc.returncode})\n  command: "
                         f"{' '.join(cmd)}\n--- log tail ---\n{read_tail(log_path, 20)}")
    os.replace(tmp_path, result_path)
