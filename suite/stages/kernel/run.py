"""The `kernel:` block of a matrix: the router-gate microbenchmark run in each arm's own environment.

Each arm's job runs `python -m suite.stages.kernel.bench` as a subprocess with the arm's (patched) vLLM first on
PYTHONPATH and its own compile caches, so the gate is timed exactly as that arm's vLLM dispatches it. The gate's
shape is the arm's model's: the bench reads it from the model's config (``--model``, as the layer stage's bench
takes it), there, where the arm's server loads the same model.
"""

from __future__ import annotations

from suite.errors import SuiteError
from suite.proc import run_tool
from suite.records import CommandNotes
from suite.served_model import ServedModel
from suite.stages.base import JobEnv
from suite.stages.kernel.spec import KernelParams


def kernel_command(params: KernelParams, model: ServedModel, out: str, arm: str) -> list[str]:
    return [
        "python", "-m", "suite.stages.kernel.bench", "--json", out, "--arm", arm, "--model", model.id,
        "--m", ",".join(str(m) for m in params.m), "--trace-m", str(params.trace_m),
        "--calls", str(params.iters), "--trials", str(params.trials),
    ]


def execute(env: JobEnv) -> CommandNotes:
    """The microbenchmark in the arm's environment (offline: no server)."""
    out = env.result
    out.parent.mkdir(parents=True, exist_ok=True)
    assert isinstance(env.job.params, KernelParams), env.job.kind
    cmd = env.tool(kernel_command(env.job.params, env.model, str(out), env.job.arm))
    run_tool(cmd.argv, env=cmd.env, log_path=env.log, timeout_s=3600, what="kernel benchmark")
    if not out.is_file():
        raise SuiteError(f"kernel benchmark wrote no result\n  command: {' '.join(cmd.argv)}")
    return CommandNotes(command=cmd.argv)
