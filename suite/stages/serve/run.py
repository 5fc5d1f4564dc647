"""Serving points through the real `vllm bench serve` client."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from suite.errors import SuiteError
from suite.plan import Job
from suite.proc import run_tool
from suite.records import ClientRecord, JobNotes
from suite.stages.base import JobEnv
from suite.stages.serve.client import WORKER_PATH, PersistentClient, with_flag
from suite.stages.serve.sizing import PointSize, point_size
from suite.stages.serve.spec import ServeParams
from suite.stages.serve.warmup import WarmPoint, WarmupRecord, warm_session
from suite.stats import LATENCIES, PERCENTILES
from suite.store import RunStore

PERCENTILE_METRICS = ",".join(LATENCIES)  # every latency of the metric registry ...
METRIC_PERCENTILES = ",".join(str(q) for q in PERCENTILES)  # ... at its percentiles


def serve_command(*, vllm: str, base_url: str, served_name: str, tokenizer: str, params: ServeParams,
                  result_dir: Path, result_filename: str, metadata: dict[str, str] | None = None,
                  trust_remote_code: bool = False) -> list[str]:
    """The exact `vllm bench serve` command for one point (vLLM's own flags and names); ``trust_remote_code``:
    the client loads the tokenizer as the server does (a model whose tokenizer is code of its own)."""
    cmd = [
        vllm, "bench", "serve",
        "--backend", "vllm",
        "--base-url", base_url,
        "--model", served_name,
        "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(params.isl),
        "--random-output-len", str(params.osl),
        "--random-range-ratio", str(params.random_range_ratio),
        "--num-prompts", str(params.num_prompts),
        "--max-concurrency", str(params.concurrency),
        "--request-rate", str(params.request_rate or "inf"),
        "--num-warmups", str(params.num_warmups),
        "--seed", str(params.seed),
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", METRIC_PERCENTILES,
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_filename,
    ]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    if metadata:
        cmd += ["--metadata", *[f"{k}={v}" for k, v in metadata.items()]]
    return cmd


def run_serve(cmd: list[str], *, result_path: Path, log_path: Path, env: dict[str, str],
              timeout_s: float, cpus: frozenset[int] | None = None) -> float:
    """Run the client; the raw result JSON lands at result_path atomically (written under a temporary
    name by the tool itself, then renamed), so a kill never leaves a truncated result. Returns wall seconds."""
    tmp_name = cmd[cmd.index("--result-filename") + 1]
    tmp_path = result_path.parent / tmp_name
    result_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path.unlink(missing_ok=True)
    try:
        wall = run_tool(cmd, env=env, log_path=log_path, timeout_s=timeout_s, what="`vllm bench serve`", cpus=cpus)
        if not tmp_path.is_file():
            raise SuiteError(f"`vllm bench serve` wrote no result file\n  command: {' '.join(cmd)}")
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    os.replace(tmp_path, result_path)
    return wall


def point_timeout_s(params: ServeParams) -> float:
    return max(600.0, 10.0 * params.num_prompts * params.osl / 8)


def serve_params(job: Job) -> ServeParams:
    assert isinstance(job.params, ServeParams), job.kind
    return job.params


def bench_argv(env: JobEnv, job: Job, result: Path) -> list[str]:
    """The arguments after `vllm bench serve` for one job (what the persistent client and the CLI take)."""
    assert env.server is not None
    cmd = serve_command(vllm="vllm", base_url=env.server.base_url, served_name=env.model.served_name,
                        tokenizer=env.tokenizer, params=serve_params(job), result_dir=result.parent,
                        result_filename=f".{result.name}.partial",
                        metadata={"arm": job.arm, "point": job.point, "repeat": str(job.repeat)},
                        trust_remote_code=env.trust_remote_code)
    return cmd[3:]


def session_client(env: JobEnv) -> PersistentClient:
    """The bench client: one long-lived process running vLLM's own `vllm bench serve` code for every point
    (`client: cli` in a point: a fresh CLI process per point). A client whose command does not depend on
    the server (the local runtime: the host's vLLM) serves the whole run; one that runs inside the
    server's container lives as long as that server."""
    mode = serve_params(env.job).client
    worker = env.client_argv(["python", str(WORKER_PATH)])
    cli = env.client_argv(["vllm"])
    scope = env.scope if env.client_in_server or env.run_scope is None else env.run_scope
    assert env.session_dir is not None
    log_dir = env.session_dir if scope is env.scope else env.run_root / "client"
    name = f"client-{mode}" + (f"-group-{env.lane}" if env.lane else "")  # sets at once: a client per GPU group
    return scope.get(f"bench-client-{mode}-{'|'.join(worker)}", lambda: PersistentClient(
        worker, env=env.client_env, log_path=log_dir / f"{name}.log", cli=cli, mode=mode,
        cpus=env.client_cpus))


def warm(env: JobEnv, client: PersistentClient) -> WarmupRecord | None:
    """Before the first measured point of a session: every pending point's shape once (requests discarded),
    then the prefix cache reset. Returns the warm-up record (None when this session is already warm)."""
    if env.scope.has("warm") or not serve_params(env.job).warmup:
        return None
    assert env.server is not None and env.session_dir is not None
    points = [WarmPoint(bench_argv(env, j, env.result), serve_params(j).concurrency)
              for j in env.pending if j.kind == "serve"]
    warmed = warm_session(client, points, reset_prefix_cache=env.server.reset_prefix_cache,
                          scratch_dir=env.session_dir / "warmup")
    env.scope.get("warm", lambda: contextlib.nullcontext(warmed))
    return warmed.record()


def sized_argv(env: JobEnv, argv: list[str]) -> tuple[list[str], PointSize | None]:
    """A point sized by time (num_prompts in seconds: its params' `duration_s`) gets one prompt count per round,
    the same for every arm (``suite.stages.serve.sizing``): the round's, else from the latest earlier round's runs,
    else from the session's warm-up at the same shape; with none of these it keeps its params' num_prompts (the
    default multiple of its concurrency)."""
    params = serve_params(env.job)
    if not params.duration_s:
        return argv, None
    warm_rate = None
    if env.scope.has("warm"):
        shape = env.scope.get("warm", contextlib.nullcontext).for_argv(argv)
        warm_rate = shape.request_throughput if shape is not None and shape.ok else None
    size = point_size(RunStore(env.run_root), env.job, env.round, params.duration_s, params.concurrency, warm_rate)
    if size is None:
        return argv, None
    return with_flag(argv, "--num-prompts", str(size.prompts)), size


class ServeNotes(JobNotes):
    """A serving point's notes: the bench command line, whether the prefix cache was reset before it, how its
    client ran, the session's warm-ups (on the session's first point), and the prompt count of a point sized by
    time (num_prompts in seconds) with where it came from."""

    command: list[str]
    prefix_cache_reset: bool
    client: ClientRecord
    warmup: WarmupRecord | None = None
    sized: PointSize | None = None


def execute(env: JobEnv) -> ServeNotes:
    """One serving point (one repeat) against the session's server, through the session's client."""
    job, server = env.job, env.server
    assert server is not None
    client = session_client(env)
    warmup = warm(env, client)
    reset = server.reset_prefix_cache()
    result = env.result
    argv, sized = sized_argv(env, bench_argv(env, job, result))
    params = serve_params(job)
    if sized is not None:
        params = params.model_copy(update={"num_prompts": sized.prompts})
    run = client.run(argv, result, point_timeout_s(params), log_path=env.log)
    raw = json.loads(result.read_text())
    if not raw.get("completed"):  # the tool exits 0 even when every request failed (e.g. the server died)
        raise SuiteError(f"`vllm bench serve` completed no request ({raw.get('failed')} failed); raw output "
                         f"kept in {result.name}\n  command: {' '.join(run.command)}")
    return ServeNotes(command=run.command, prefix_cache_reset=reset, client=run, warmup=warmup,
                      sized=sized)
