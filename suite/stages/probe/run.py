"""Patch-activation proof: which router-gate path ran for each batch-size bucket, per arm.

With ``probe: true`` the first server session of each arm starts with the in-server probe
(``suite.stages.probe.plugin``, a vLLM general plugin: see that module) on its PYTHONPATH and
``SUITE_GATE_PROBE_DIR`` naming a fresh directory, where every vLLM process that builds a GateLinear writes
its counters as ``<pid>.json``. The probe job (:func:`execute`, first job of the session) snapshots those
counters once startup (profile run, warmup) is over, sends a fixed set of requests whose prefill and
decode steps cover the buckets reachable with the server's ``--max-num-seqs``, waits for the next flush,
and stores the difference, merged over processes, in ``<arm>/probe/gate-paths/rep-0.json``. Then it drops a
``STOP`` file, so the serve jobs after it run without the Python-level wrappers.

:func:`report_section` turns the stored results into a table arm x bucket -> path(s) with call counts and
says when the arms' paths differ, when a patched arm's new op never ran, and which buckets ran frozen
inside a compiled graph (steps seen, no ``GateLinear.forward`` call at run time).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.records import JobNotes
from suite.stages.base import JobEnv, SessionEnv
from suite.stages.probe.plugin import BUCKET_LABELS, ENV_DIR, ENV_FLUSH, STOP_FILE, bucket
from suite.stages.probe.read import FROZEN, NOT_EXERCISED, ProbeResult
from suite.store import atomic_write_json, atomic_write_text, read_json

PLUGIN_NAME = "suite_gate_probe"
PLUGIN_VERSION = "1"
FLUSH_S = 0.5
__all__ = ["bucket", "BUCKET_LABELS", "execute", "server_env", "install_probe_site"]


# ---------------------------------------------------------------------------------------- into the server


def install_probe_site(dest: Path) -> Path:
    """A directory that, on PYTHONPATH, makes vLLM load the probe: the package plus a dist-info whose
    entry point (group ``vllm.general_plugins``) importlib.metadata finds."""
    src = Path(__file__).resolve().parent / "plugin.py"
    pkg = dest / PLUGIN_NAME
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, pkg / "__init__.py")
    info = dest / f"{PLUGIN_NAME}-{PLUGIN_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_NAME}\nVersion: {PLUGIN_VERSION}\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{PLUGIN_NAME} = {PLUGIN_NAME}:register\n")
    (info / "RECORD").write_text("")
    return dest


def server_env(session: SessionEnv) -> dict[str, str]:
    """Server hook: environment additions for a server whose session holds a pending probe job.

    Local and docker runtimes: the site directory (in the run directory, which a container sees at the same
    path) goes on PYTHONPATH after the arm's overlay (docker: the image's own vLLM; this host's PYTHONPATH means
    nothing inside the image); each server start gets a fresh output directory (a restart never mixes its
    counters with the last one's). Once the probe job is done (a restart later in the session, or a resume) it
    is no longer pending: nothing added."""
    if session.runtime not in ("local", "docker") or not any(j.kind == "probe" for j in session.pending):
        return {}
    base = session.arm_dir / "probe"
    site = install_probe_site(base / "site")
    procs = base / "procs"
    procs.mkdir(parents=True, exist_ok=True)
    n = 0
    while (procs / f"server-{n}").exists():
        n += 1
    out = procs / f"server-{n}"
    out.mkdir()
    host = os.environ.get("PYTHONPATH", "") if session.runtime == "local" else ""
    pythonpath = session.base_env.get("PYTHONPATH") or host
    env = {ENV_DIR: str(out), ENV_FLUSH: str(FLUSH_S),
           "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(site)) if p)}
    plugins = session.base_env.get("VLLM_PLUGINS", os.environ.get("VLLM_PLUGINS"))
    if plugins is not None and PLUGIN_NAME not in plugins.split(","):  # an allowlist: add ourselves
        env["VLLM_PLUGINS"] = ",".join(p for p in (plugins, PLUGIN_NAME) if p)
    return env


# ---------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Burst:
    concurrency: int
    prompt_len: int
    max_tokens: int

    def describe(self) -> str:
        return f"{self.concurrency} x (prompt {self.prompt_len} tokens, {self.max_tokens} out)"


def request_plan(max_num_seqs: int | None, max_model_len: int) -> list[Burst]:
    """Single requests whose prefill alone fills a bucket (12, 24, 100, 200 tokens: 9-16, 17-32, 33-128,
    >128; their decode steps have M = 1), then bursts of c simultaneous requests whose decode steps have
    M = c (2-4, 5-8, 9-16, 17-32). Concurrency above max_num_seqs is left out (unreachable)."""
    cap = max_num_seqs or 256
    room = max(1, max_model_len - 8)
    bursts = [Burst(1, min(n, room), 2) for n in (12, 24, 100, 200)]
    levels = [c for c in (2, 4, 8, 16, 32) if c <= cap]
    if cap < 32 and cap not in levels:
        levels.append(cap)
    bursts += [Burst(c, min(16, room), 8) for c in sorted(levels)]
    return bursts


def _prompt(seed: int, length: int) -> list[int]:
    """Distinct token ids per request (no prefix-cache hits), fixed across arms and runs; ids below 1100
    (the tiny MoE has 1688)."""
    return [100 + (seed * 131 + i * 17) % 1000 for i in range(length)]


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def send_requests(base_url: str, served_name: str, bursts: list[Burst], timeout: float = 300.0) -> list[dict]:
    done = []
    seed = 0
    for burst in bursts:
        bodies = []
        for _ in range(burst.concurrency):
            seed += 1
            bodies.append({"model": served_name, "prompt": _prompt(seed, burst.prompt_len),
                           "max_tokens": burst.max_tokens, "temperature": 0, "ignore_eos": True})
        with ThreadPoolExecutor(max_workers=burst.concurrency) as pool:
            try:
                out = list(pool.map(lambda b: _post(f"{base_url}/v1/completions", b, timeout), bodies))
            except urllib.error.HTTPError as exc:
                body = exc.read().decode(errors="replace")[:500]
                raise SuiteError(f"probe request failed ({burst.describe()}): {exc}: {body}") from None
            except (urllib.error.URLError, OSError, TimeoutError, json.JSONDecodeError) as exc:
                raise SuiteError(f"probe request failed ({burst.describe()}): {exc}") from None
        tokens = sum(int(o.get("usage", {}).get("completion_tokens", 0)) for o in out)
        done.append({"concurrency": burst.concurrency, "prompt_len": burst.prompt_len,
                     "max_tokens": burst.max_tokens, "completion_tokens": tokens})
    return done


# ---------------------------------------------------------------------------------------- counters


def read_procs(out_dir: Path) -> dict[str, dict[str, Any]]:
    procs = {}
    for path in sorted(out_dir.glob("*.json")):
        try:
            procs[path.stem] = read_json(path)
        except (OSError, json.JSONDecodeError):
            continue  # written atomically: only a foreign file can be unreadable
    return procs


def _key(c: dict[str, Any]) -> tuple[str, str, str]:
    return c["kind"], c["bucket"], c["path"]


def diff_counts(before: Iterable[dict], after: Iterable[dict]) -> list[dict]:
    """after - before, per (kind, bucket, path); entries that did not grow are left out."""
    old = {_key(c): c["count"] for c in before}
    out = []
    for c in after:
        n = c["count"] - old.get(_key(c), 0)
        if n > 0:
            out.append({**c, "count": n})
    return out


def merge_counts(lists: Iterable[Iterable[dict]]) -> list[dict]:
    total: dict[tuple[str, str, str], int] = {}
    for counts in lists:
        for c in counts:
            total[_key(c)] = total.get(_key(c), 0) + c["count"]
    return [{"kind": k, "bucket": b, "path": p, "count": n} for (k, b, p), n in sorted(total.items())]


def summarize(counts: list[dict]) -> dict[str, dict[str, Any]]:
    """Per bucket: steps (model forward passes), GateLinear.forward calls by path, custom-op calls made
    with no GateLinear.forward running, and a verdict."""
    out: dict[str, dict[str, Any]] = {}
    for label in BUCKET_LABELS:
        steps = sum(c["count"] for c in counts if c["kind"] == "steps" and c["bucket"] == label)
        paths = {c["path"]: c["count"] for c in counts if c["kind"] == "gate" and c["bucket"] == label}
        outside = {c["path"]: c["count"] for c in counts if c["kind"] == "outside" and c["bucket"] == label}
        calls = sum(paths.values())
        if calls:
            verdict = "eager (GateLinear.forward ran)"
        elif steps:
            verdict = FROZEN
        elif outside:
            verdict = "custom op only"
        else:
            verdict = NOT_EXERCISED
        out[label] = {"steps": steps, "forward_calls": calls, "paths": paths, "outside": outside,
                      "verdict": verdict}
    return out


def merge_processes(before: dict[str, dict], after: dict[str, dict]) -> dict[str, Any]:
    """The requests' share of every process's counters, merged; plus what each process reported."""
    run = merge_counts(diff_counts(before.get(pid, {}).get("counts", []), data.get("counts", []))
                       for pid, data in after.items())
    startup = merge_counts(data.get("counts", []) for data in before.values())
    processes = [{"pid": data.get("pid"), "argv": data.get("argv"), "platform": data.get("platform"),
                  "gates": data.get("gates", []), "present_ops": data.get("present_ops", []),
                  "instrumented": data.get("instrumented", []), "errors": data.get("errors", [])}
                 for data in after.values()]
    ops = sorted({op for p in processes for op in p["present_ops"]})
    return {"buckets": summarize(run), "counts": run, "startup_counts": startup, "processes": processes,
            "present_ops": ops}


def _wait_flush(out_dir: Path, since: float, timeout: float, need_gates: bool) -> dict[str, dict]:
    """Wait until every probe file was written after `since` (at least one file; with need_gates, one
    that saw a GateLinear)."""
    deadline = time.monotonic() + timeout
    while True:
        procs = read_procs(out_dir)
        ok = procs and all(p.get("written_at", 0) > since for p in procs.values())
        if ok and need_gates:
            ok = any(p.get("gates") for p in procs.values())
        if ok:
            return procs
        if time.monotonic() >= deadline:
            seen = ", ".join(f"{k}.json (written {p.get('written_at', 0) - since:+.1f} s)"
                             for k, p in procs.items()) or "no file"
            raise SuiteError(f"gate probe: no fresh report from the server in {out_dir} after {timeout:.0f} s "
                             f"({seen}); was the plugin loaded? (server log: 'suite_gate_probe', VLLM_PLUGINS)")
        time.sleep(0.2)


def _wait_stopped(out_dir: Path, timeout: float) -> bool:
    """After the STOP file: wait until every process has taken its wrappers out (its last report says
    inactive), so the serving points after the probe job run the server's own, unwrapped code."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = read_procs(out_dir)
        if procs and not any(p.get("active") for p in procs.values()):
            return True
        time.sleep(0.2)
    return False


def _max_num_seqs(argv: list[str]) -> int | None:
    for i, a in enumerate(argv):
        if a == "--max-num-seqs" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--max-num-seqs="):
            return int(a.split("=", 1)[1])
    return None


class ProbeNotes(JobNotes):
    """A probe job's notes: the batch-size buckets its requests exercised, the processes that reported, and
    whether the plugin stopped recording when told."""

    buckets_exercised: list[str]
    processes: int
    probe_stopped: bool


def execute(env: JobEnv) -> ProbeNotes:
    job, server = env.job, env.server
    assert server is not None
    out_dir = Path(server.env[ENV_DIR]) if server.env.get(ENV_DIR) else None
    if out_dir is None:
        raise SuiteError(f"gate probe: the server of arm {job.arm!r} was started without the probe plugin "
                         "(the probe supports the local and docker runtimes)")
    t0 = time.time()
    _wait_flush(out_dir, t0, timeout=60.0, need_gates=True)
    before = read_procs(out_dir)
    max_seqs = _max_num_seqs(server.argv)
    bursts = request_plan(max_seqs, env.model.max_model_len)
    sent = send_requests(server.base_url, env.model.served_name, bursts)
    t_done = time.time()
    after = _wait_flush(out_dir, t_done, timeout=30.0, need_gates=True)
    atomic_write_text(out_dir / STOP_FILE, f"probe job done at {t_done}\n")
    stopped = _wait_stopped(out_dir, timeout=30.0)
    merged = merge_processes(before, after)
    result = ProbeResult.model_validate(
        {"arm": job.arm, "max_num_seqs": max_seqs, "requests": sent, "probe_dir": out_dir.name, **merged})
    atomic_write_json(env.result, result.model_dump(mode="json", by_alias=True))
    exercised = [label for label, b in result.buckets.items() if b.verdict != NOT_EXERCISED]
    return ProbeNotes(buckets_exercised=exercised, processes=len(after), probe_stopped=stopped)


# ---------------------------------------------------------------------------------------- report










