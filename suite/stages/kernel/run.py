"""The `kernel:` block of a matrix: the router-gate microbenchmark run in each arm's own environment.

Each arm's job runs `python -m suite.stages.kernel.bench` as a subprocess with the arm's (patched) vLLM first on
PYTHONPATH and its own compile caches, so the gate is timed exactly as that arm's vLLM dispatches it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from suite.errors import SuiteError
from suite.runtime.base import read_tail


def kernel_command(params: dict[str, Any], out: str, arm: str) -> list[str]:
    return [
        sys.executable, "-m", "suite.stages.kernel.bench", "--json", out, "--arm", arm,
        "--hidden", str(params["hidden"]), "--experts", str(params["experts"]),
        "--m", ",".join(str(m) for m in params["m"]), "--trace-m", str(params["trace_m"]),
        "--calls", str(params["iters"]), "--trials", str(params["trials"]),
    ]


def execute(ctx: Any, job: Any, server: Any) -> dict[str, Any]:  # noqa: ARG001 (offline job)
    out = ctx.store.result_path(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    arm_env = ctx.arm_envs[job.arm]
    env = ctx.runtime.offline_env(arm_env, ctx.store.cache_dir(job.arm)) | ctx.plan.arms[job.arm].env
    cmd = ctx.runtime.offline_argv(arm_env, kernel_command(job.params, str(out), job.arm))
    log = ctx.store.log_path(job)
    with open(log, "wb") as fh:
        try:
            proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=3600, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise SuiteError(f"kernel benchmark timed out\n  command: {' '.join(cmd)}") from None
    if proc.returncode != 0 or not out.is_file():
        raise SuiteError(f"kernel benchmark failed (exit status {proc.returncode})\n  command: {' '.join(cmd)}\n"
                         f"--- log tail ---\n{read_tail(log, 20)}")
    return {"command": cmd}


