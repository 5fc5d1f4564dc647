"""The `layer:` block of a matrix: the decoder-layer subgraph benchmark run in each arm's own environment.

Each arm's job runs `python -m suite.stages.layer.bench` as a subprocess with the arm's (patched) vLLM first on
PYTHONPATH and its own compile caches, so the layer is built and its router gate dispatched exactly as that arm's
vLLM does. The model's own engine flags (``--load-format dummy``, ``--hf-overrides``) go to the bench as they go
to `vllm serve`.
"""

from __future__ import annotations

from suite.errors import SuiteError
from suite.proc import run_tool
from suite.records import CommandNotes
from suite.served_model import ServedModel
from suite.stages.base import JobEnv
from suite.stages.layer.spec import LayerParams


def layer_command(params: LayerParams, model: ServedModel, out: str, arm: str) -> list[str]:
    return [
        "python", "-m", "suite.stages.layer.bench", "--json", out, "--arm", arm, "--model", model.id,
        "--tokens", ",".join(str(t) for t in params.tokens), "--trace-m", str(params.trace_m),
        "--layer-index", str(params.layer_index), "--calls", str(params.iters), "--trials", str(params.trials),
        "--compile", params.compile,
        *model.model_args(),
    ]


def execute(env: JobEnv) -> CommandNotes:
    """The layer benchmark in the arm's environment (offline: no server)."""
    out = env.result
    out.parent.mkdir(parents=True, exist_ok=True)
    assert isinstance(env.job.params, LayerParams), env.job.kind
    cmd = env.tool(layer_command(env.job.params, env.model, str(out), env.job.arm))
    run_tool(cmd.argv, env=cmd.env, log_path=env.log, timeout_s=3600, what="layer benchmark")
    if not out.is_file():
        raise SuiteError(f"layer benchmark wrote no result\n  command: {' '.join(cmd.argv)}")
    return CommandNotes(command=cmd.argv)
