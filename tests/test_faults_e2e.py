"""Fault injection against the real CPU vLLM server: nothing measured is ever lost.

One chain of real `suite run` invocations on one run directory (one server at a time) drives most faults:

1. ``run1``: arm ``broken`` has a bad serve arg (fails to start), arm ``baseline`` serves three tiny points;
   the test SIGKILLs the baseline server's process group while point 0 runs (-> failed with log tail,
   server restarted, point 1 completes), then SIGTERMs ``suite run`` while point 2 runs (-> interrupted).
   HF_TOKEN and an arm env FOO_API_KEY carry secret values all along.
2. ``run2_sigint``: ``--resume``, Ctrl-C (SIGINT to the process group) while the baseline server starts.
3. ``run3_kill9``: ``--resume`` killed with SIGKILL at random moments (and once while a server starts).
4. ``run4_final``: ``--resume`` runs only the missing jobs and finishes.

The resumes use the same matrix without the broken arm (as a user who gives up on it would): re-trying a
server that cannot start costs a vLLM import per resume, which this 2-core box cannot spare.

Bad input (malformed YAML, unknown field, impossible point, unknown / conflicting patch set, port in use, a
startup timeout, a full disk) is tried as ``--resume`` of a copy of the run directory after run 1, so each
test also proves that the measured results already there are untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from suite.records import Manifest
from tests.conftest import REPO, processes_mentioning, run_suite, start_suite_in_group, wait_for

pytestmark = pytest.mark.e2e

HF_SECRET = "hf_SECRETVALUE123"
FOO_SECRET = "foo_SECRETVALUE456"
POINTS = ["isl32-osl8-c1-n2", "isl32-osl8-c2-n2", "isl32-osl8-c3-n2"]

MATRIX = """\
name: faults-chaos
model: {{id: {model}}}
runtime: {{kind: local, startup_timeout_s: {timeout}, max_restarts: 1}}
serve_args: [--port, "{port}", --served-model-name, tiny-moe, --max-model-len, "256", --dtype, bfloat16, --max-num-seqs, "4", --enforce-eager]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  broken: {{vllm: "0.32.0", serve_args: [--no-such-flag]}}
  baseline: {{vllm: "0.32.0", env: {{FOO_API_KEY: {foo}}}}}
baseline: baseline
serve:
  - {{isl: 32, osl: 8, concurrency: [1, 2, 3], num_prompts: 2, client: cli, warmup: false}}
"""
# `client: cli` (a `vllm bench serve` process per point, the persistent client's fallback path) keeps each
# point ~10 s long: the window in which this chain kills the server or the run mid-point


def matrix_text(model: Path, timeout: float = 600, port: int = 0, broken: bool = True) -> str:
    text = MATRIX.format(model=model, timeout=timeout, port=port, foo=FOO_SECRET)
    return text if broken else "\n".join(line for line in text.splitlines() if "broken:" not in line) + "\n"


# ------------------------------------------------------------------------------------------------ helpers


def suite_env() -> dict[str, str]:
    return {**os.environ, "HF_TOKEN": HF_SECRET, "COLUMNS": "200"}


def start_suite(args: list[str], log: Path) -> subprocess.Popen:
    return start_suite_in_group(args, log, suite_env())


def server_pids(cache_dir: Path) -> list[int]:
    """`vllm serve` processes of one arm: their working directory is the arm's cache dir."""
    want = os.path.realpath(cache_dir)
    pids = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            if p.info["cwd"] and os.path.realpath(p.info["cwd"]) == want and "serve" in (p.info["cmdline"] or []):
                pids.append(p.info["pid"])
        except (psutil.Error, OSError):
            continue
    return pids


def reap_leftovers(run_dir: Path, grace_s: float = 60.0) -> list[str]:
    """Wait up to grace_s for every process of the run to be gone; kill (and report) what is left."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not processes_mentioning(str(run_dir)):
            return []
        time.sleep(0.5)
    left = []
    for pid in processes_mentioning(str(run_dir)):
        try:
            p = psutil.Process(pid)
            left.append(f"{pid}: {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.Error:
            continue
    return left


def record(run_dir: Path, arm: str, point: str) -> dict | None:
    path = run_dir / arm / "serve" / point / "rep-0.job.json"
    return json.loads(path.read_text()) if path.is_file() else None


def all_json_parses(run_dir: Path) -> list[Path]:
    files = sorted(run_dir.rglob("*.json"))
    for f in files:
        json.loads(f.read_text())  # raises on a truncated file
    return files


def measured_files(run_dir: Path) -> dict[str, str]:
    """sha256 of every raw result of an ok job and of its record: what must never be lost or changed."""
    out = {}
    for rec_path in sorted(run_dir.glob("*/*/*/*.job.json")):
        rec = json.loads(rec_path.read_text())
        if rec.get("status") == "ok":
            raw = rec_path.with_name(rec_path.name.replace(".job.json", ".json"))
            for f in (rec_path, raw):
                out[str(f.relative_to(run_dir))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def server_logs(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_size for p in run_dir.glob("*/server-*.log")}


def find_secrets(root: Path) -> list[str]:
    hits = []
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            for s in (HF_SECRET, FOO_SECRET):
                if s.encode() in data:
                    hits.append(f"{f.relative_to(root)}: {s}")
    return hits


def resume_matrix(run: Observed) -> Path:
    return run.matrix.with_name("resume.yaml")


@dataclass
class Observed:
    run_dir: Path
    matrix: Path
    rc: int
    output: str
    seconds: float
    records: dict[str, dict | None] = field(default_factory=dict)  # "arm/point" -> record at the end
    manifest: dict = field(default_factory=dict)
    report: str = ""
    leftovers: list[str] = field(default_factory=list)
    notes: dict = field(default_factory=dict)


def observe(run_dir: Path, matrix: Path, proc: subprocess.Popen, log: Path, t0: float, **notes) -> Observed:
    leftovers = reap_leftovers(run_dir)
    recs = {f"{a}/{p}": record(run_dir, a, p) for a in ("broken", "baseline") for p in POINTS}
    report = run_dir / "report.md"
    return Observed(run_dir=run_dir, matrix=matrix, rc=proc.returncode, output=log.read_text(errors="replace"),
                    seconds=time.monotonic() - t0, records=recs,
                    manifest=json.loads((run_dir / "manifest.json").read_text()),
                    report=report.read_text() if report.is_file() else "", leftovers=leftovers, notes=notes)


# ------------------------------------------------------------------------------------------------ the chain


@pytest.fixture(scope="module")
def chaos_dir(tmp_path_factory, tiny_model) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("faults")
    matrix = base / "chaos.yaml"
    matrix.write_text(matrix_text(tiny_model))
    (base / "resume.yaml").write_text(matrix_text(tiny_model, broken=False))
    return base, matrix


@pytest.fixture(scope="module")
def run1(chaos_dir) -> Observed:
    base, matrix = chaos_dir
    out, log = base / "runs", base / "run1.out"
    out.mkdir()
    t0 = time.monotonic()
    proc = start_suite(["run", str(matrix), "--out", str(out)], log)
    try:
        run_dir = wait_for("run directory", lambda: next(iter(out.iterdir()), None), proc, log, 120)
        # the broken arm fails first; then the baseline server starts and point 0's client begins
        wait_for("broken arm recorded failed", lambda: record(run_dir, "broken", POINTS[-1]), proc, log, 300)
        p0_log = run_dir / "baseline" / "serve" / POINTS[0] / "rep-0.log"
        wait_for("point 0 client started", p0_log.exists, proc, log, 900)
        (pid,) = wait_for("baseline server pid", lambda: server_pids(run_dir / "baseline" / "cache")[:1], proc,
                          log, 30)
        server_env = psutil.Process(pid).environ()
        pgid = os.getpgid(pid)
        os.killpg(pgid, signal.SIGKILL)
        killed_at = time.time()
        # the restarted server serves point 1; SIGTERM `suite run` once point 2's client runs
        wait_for("point 1 recorded", lambda: record(run_dir, "baseline", POINTS[1]), proc, log, 900)
        p2_log = run_dir / "baseline" / "serve" / POINTS[2] / "rep-0.log"
        wait_for("point 2 client started", p2_log.exists, proc, log, 120)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return observe(run_dir, matrix, proc, log, t0, killed_at=killed_at,
                   server_secrets=(server_env.get("HF_TOKEN"), server_env.get("FOO_API_KEY")))


def test_start_failure_is_clear_and_the_other_arm_runs(run1):
    for p in POINTS:
        rec = run1.records[f"broken/{p}"]
        assert rec["status"] == "failed"
        err = rec["error"]
        assert "exited before it became healthy" in err
        assert "command: " in err and "--no-such-flag" in err  # the exact command
        assert "--- log tail ---" in err and "no-such-flag" in err.split("--- log tail ---", 1)[1]
    # the console names the arm, the exact command and the last lines of the server log
    out = run1.output
    assert "arm broken: vLLM server exited before it became healthy" in out
    assert "command: " in out and "--no-such-flag" in out
    assert any(line.startswith("  | ") and "no-such-flag" in line for line in out.splitlines()), out
    assert run1.records[f"baseline/{POINTS[1]}"]["status"] == "ok"  # the other arm still ran


def test_server_sigkill_mid_point_is_recorded_and_the_server_restarted(run1):
    rec = run1.records[f"baseline/{POINTS[0]}"]
    assert rec["status"] == "failed" and rec["server_died"] is True, rec
    assert "vllm bench serve" in rec["error"] or "server died" in rec["error"]
    assert rec["server_log_tail"].strip()  # the dead server's last words
    assert (run1.run_dir / "baseline" / "server-0.log").is_file()
    restart_log = run1.run_dir / "baseline" / "server-0-restart1.log"
    assert restart_log.is_file() and "Application startup complete" in restart_log.read_text()
    ok = run1.records[f"baseline/{POINTS[1]}"]
    assert ok["status"] == "ok"
    raw = json.loads((run1.run_dir / "baseline" / "serve" / POINTS[1] / "rep-0.json").read_text())
    assert raw["completed"] == 2 and raw["failed"] == 0
    # the report shows the gap: the failed point, marked as a server death
    assert "## Failed jobs" in run1.report
    row = next(line for line in run1.report.splitlines() if f"serve/{POINTS[0]}/rep-0" in line)
    assert row.startswith("| baseline |") and "(server died)" in row


def test_sigterm_stops_servers_and_keeps_partial_results(run1):
    assert run1.rc == 130, run1.output[-3000:]
    assert "interrupted" in run1.output and "Traceback" not in run1.output
    assert run1.leftovers == [], run1.leftovers
    assert run1.manifest["status"] == "interrupted"
    assert run1.manifest["job_counts"] == {"ok": 1, "failed": 4, "missing": 1}
    assert run1.records[f"baseline/{POINTS[2]}"] is None  # never a half-written record
    all_json_parses(run1.run_dir)
    assert not list(run1.run_dir.rglob("*.partial")) and not list(run1.run_dir.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def run1_state(run1) -> dict[str, str]:
    """What run 1 measured, by content hash (checked again after every later fault)."""
    state = measured_files(run1.run_dir)
    assert len(state) == 2  # point 1: raw result + record
    return state


# ------------------------------------------------------------------------------------------------ bad input


def resume_copy(run1: Observed, tmp_path: Path, matrix_text_: str, env: dict | None = None,
                dest: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    copy = dest or tmp_path / run1.run_dir.name
    shutil.copytree(run1.run_dir, copy, symlinks=True)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(matrix_text_)
    proc = run_suite("run", str(matrix), "--resume", str(copy), env={"HF_TOKEN": HF_SECRET, **(env or {})},
                     timeout=600)
    return proc, copy


def assert_clear_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-5000:]
    for n in needles:
        assert n in text, (n, text[-3000:])


@pytest.mark.parametrize("case", ["malformed-yaml", "unknown-field", "impossible-point"])
def test_bad_matrix_is_one_clear_error(case, run1, run1_state, tmp_path, tiny_model):
    text = matrix_text(tiny_model)
    if case == "malformed-yaml":
        text = text.replace("concurrency: [1, 2, 3]", "concurrency: [1, 2, 3")
        needles = ["m.yaml:11: YAML syntax: expected ',' or ']'"]
    elif case == "unknown-field":
        text = text.replace("max_restarts: 1}", "max_restarts: 1, max_retries: 3}")
        needles = ["m.yaml:3: runtime.max_retries: unknown field"]
    else:
        text = text.replace("isl: 32,", "isl: 250,")
        needles = ["m.yaml:11: serve[0]: isl + osl = 258 exceeds --max-model-len 256 in serve_args"]
    proc, copy = resume_copy(run1, tmp_path, text)
    assert_clear_error(proc, *needles)
    assert proc.returncode == 2
    assert measured_files(copy) == run1_state


def test_unknown_patch_set_fails_before_any_server(run1, run1_state, tmp_path, tiny_model):
    text = matrix_text(tiny_model).replace('broken: {vllm: "0.32.0",', 'broken: {vllm: "0.32.0", patches: [nope],')
    proc, copy = resume_copy(run1, tmp_path, text)
    assert_clear_error(proc, "nope")
    assert proc.returncode == 2
    assert server_logs(copy) == server_logs(run1.run_dir)  # failed in prepare: no server started
    assert measured_files(copy) == run1_state


CONFLICT_DIFF = """\
--- a/vllm/model_executor/layers/fused_moe/router/gate_linear.py
+++ b/vllm/model_executor/layers/fused_moe/router/gate_linear.py
@@ -1,4 +1,5 @@
 # SPDX-License-Identifier: Apache-2.0
 # this context line is not in vLLM 0.32.0
+import os
 import torch
 from torch.nn.parameter import Parameter
"""


def test_patch_that_does_not_apply_fails_before_any_server(run1, run1_state, tmp_path, tiny_model):
    patches = tmp_path / "patches"
    for name in os.listdir(REPO / "patches"):
        if (REPO / "patches" / name).is_dir():
            shutil.copytree(REPO / "patches" / name, patches / name)
    bad = patches / "conflicting-gate"
    bad.mkdir()
    (bad / "manifest.yaml").write_text(
        (REPO / "patches" / "synthetic-gate-delay" / "manifest.yaml").read_text()
        .replace("Synthetic router-gate delay", "Deliberately conflicting diff"))
    (bad / "0.32.0.diff").write_text(CONFLICT_DIFF)
    text = matrix_text(tiny_model).replace('broken: {vllm: "0.32.0",',
                                           'broken: {vllm: "0.32.0", patches: [conflicting-gate],')
    overlays = REPO / ".cache" / "overlays"
    half_built = set(overlays.glob("*.tmp*"))
    proc, copy = resume_copy(run1, tmp_path, text, env={"SUITE_PATCHES_DIR": str(patches)})
    assert_clear_error(proc, "patch set 'conflicting-gate' (conflicting-gate/0.32.0.diff) does not apply to "
                       "vllm/model_executor/layers/fused_moe/router/gate_linear.py", "expected '# this context")
    assert proc.returncode == 2
    assert set(overlays.glob("*.tmp*")) <= half_built  # no half-built overlay left behind
    assert server_logs(copy) == server_logs(run1.run_dir)  # failed in prepare: no server started
    assert measured_files(copy) == run1_state


def test_port_in_use_is_clear_and_nothing_is_lost(run1, run1_state, tmp_path, tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc, copy = resume_copy(run1, tmp_path, matrix_text(tiny_model, port=port))
    assert_clear_error(proc, f"port {port} on 127.0.0.1 is already in use", "jobs: 1 ok, 5 failed, 0 missing")
    assert measured_files(copy) == run1_state
    rec = record(copy, "baseline", POINTS[0])
    assert rec["status"] == "failed" and "already in use" in rec["error"]
    assert json.loads((copy / "manifest.json").read_text())["status"] == "incomplete"


def test_startup_timeout_is_clear_and_stops_the_server(run1, run1_state, tmp_path, tiny_model):
    proc, copy = resume_copy(run1, tmp_path, matrix_text(tiny_model, timeout=3))
    assert_clear_error(proc, "arm baseline: vLLM server not healthy after 3 s", "command: ", "  | ")
    rec = record(copy, "baseline", POINTS[0])
    assert "not healthy after 3 s" in rec["error"] and "vllm serve" in rec["error"]
    # the resumed server appends to run 1's log; the tail in the error is this server's, not run 1's
    tail = rec["error"].split("--- log tail ---", 1)[1]
    assert "Application startup complete" not in tail, tail
    assert "Application startup complete" in (copy / "baseline" / "server-0.log").read_text()
    assert measured_files(copy) == run1_state
    assert reap_leftovers(copy, grace_s=30) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_clear_and_nothing_is_lost(run1, run1_state, tmp_path, tiny_model, tiny_tmpfs):
    dest = tiny_tmpfs / run1.run_dir.name
    shutil.copytree(run1.run_dir, dest, symlinks=True, ignore=shutil.ignore_patterns("cache"))
    filler = tiny_tmpfs / "filler"
    with open(filler, "wb", buffering=0) as fh, pytest.raises(OSError):  # fill it to the last block
        while True:
            fh.write(b"\0" * 4096)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(matrix_text(tiny_model))
    proc = run_suite("run", str(matrix), "--resume", str(dest), env={"HF_TOKEN": HF_SECRET}, timeout=300)
    assert_clear_error(proc, "No space left on device")
    assert proc.returncode == 2
    assert measured_files(dest) == run1_state
    all_json_parses(dest)
    assert reap_leftovers(dest, grace_s=30) == []


# ------------------------------------------------------------------------------------------------ interrupts


@pytest.fixture(scope="module")
def run2_sigint(run1, run1_state) -> Observed:
    """Ctrl-C (SIGINT to the whole foreground process group) while the baseline server is starting."""
    log = run1.run_dir.parent.parent / "run2.out"
    t0 = time.monotonic()
    proc = start_suite(["run", str(resume_matrix(run1)), "--resume", str(run1.run_dir)], log)
    try:
        wait_for("baseline server starting", lambda: server_pids(run1.run_dir / "baseline" / "cache"), proc, log,
                 300)
        time.sleep(3.0)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return observe(run1.run_dir, run1.matrix, proc, log, t0)


def test_ctrl_c_stops_the_starting_server_and_keeps_results(run2_sigint, run1_state):
    r = run2_sigint
    assert r.rc == 130 and "interrupted" in r.output and "Traceback" not in r.output, r.output[-3000:]
    assert "resume: 1 jobs already done, 2 to run" in r.output
    assert r.leftovers == []
    assert r.manifest["status"] == "interrupted"
    assert measured_files(r.run_dir) == run1_state
    all_json_parses(r.run_dir)


@pytest.fixture(scope="module")
def run3_kill9(run2_sigint, run1_state) -> list[dict]:
    """`suite run --resume` SIGKILLed at random moments, and once while the baseline server starts."""
    run_dir, matrix = run2_sigint.run_dir, resume_matrix(run2_sigint)
    seed = int(os.environ.get("SUITE_FAULTS_SEED") or time.time())
    rng = random.Random(seed)
    results = []
    for i, moment in enumerate([rng.uniform(0.5, 15.0), rng.uniform(0.5, 15.0), None]):
        log = run_dir.parent.parent / f"run3-{i}.out"
        proc = start_suite(["run", str(matrix), "--resume", str(run_dir)], log)
        try:
            if moment is None:
                wait_for("baseline server starting", lambda: server_pids(run_dir / "baseline" / "cache"), proc,
                         log, 300)
                time.sleep(2.0)
            else:
                time.sleep(moment)
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        files = all_json_parses(run_dir)  # at this moment: nothing truncated
        results.append({"seed": seed, "moment": moment, "json_files": len(files),
                        "leftovers": reap_leftovers(run_dir), "manifest": json.loads(
                            (run_dir / "manifest.json").read_text()), "measured": measured_files(run_dir)})
    return results


def test_kill9_leaves_every_json_whole_and_no_server_behind(run3_kill9, run1_state):
    for r in run3_kill9:
        assert r["json_files"] >= 5, r
        assert r["measured"] == run1_state, r
        # a kill -9 cannot be handled by suite; the server dies with it (parent-death signal)
        assert r["leftovers"] == [], r
        manifest = r["manifest"]
        assert manifest["status"] != "complete", r
        assert manifest["job_counts"]["missing"] + manifest["job_counts"]["failed"] > 0


@pytest.fixture(scope="module")
def run4_final(run3_kill9, run1, run1_state) -> Observed:
    log = run1.run_dir.parent.parent / "run4.out"
    t0 = time.monotonic()
    proc = start_suite(["run", str(resume_matrix(run1)), "--resume", str(run1.run_dir)], log)
    try:
        proc.wait(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return observe(run1.run_dir, run1.matrix, proc, log, t0)


def test_resume_runs_only_the_missing_jobs(run4_final, run1, run1_state):
    r = run4_final
    assert "resume: 1 jobs already done, 2 to run" in r.output, r.output[-3000:]
    assert measured_files(r.run_dir).items() >= run1_state.items()  # point 1 untouched (same bytes)
    assert r.records[f"baseline/{POINTS[1]}"] == run1.records[f"baseline/{POINTS[1]}"]
    for p in (POINTS[0], POINTS[2]):
        rec = r.records[f"baseline/{p}"]
        assert rec["status"] == "ok" and rec["written"] >= run1.records[f"baseline/{POINTS[1]}"]["written"]
        raw = json.loads((r.run_dir / "baseline" / "serve" / p / "rep-0.json").read_text())
        assert raw["completed"] == 2
    assert r.rc == 0 and "jobs: 3 ok, 0 failed, 0 missing" in r.output, r.output[-3000:]
    assert r.manifest["status"] == "complete"
    assert r.manifest["job_counts"] == {"ok": 3, "failed": 0, "missing": 0}
    # every stretch is kept: the run's start is run 1's, its end this resume's; a stretch killed with -9 has
    # no end, so the run's running time is unknown rather than counted across the gaps between stretches
    first, *_, last = stretches = r.manifest["stretches"]
    assert r.manifest["started"] == run1.manifest["started"] == first["started"]
    assert len(run1.manifest["stretches"]) == 1 and len(stretches) >= 4
    assert last["jobs"] == 2 and last["finished"] == r.manifest["finished"]
    assert any("finished" not in s for s in stretches[2:-1])  # the kill -9 stretches
    assert Manifest.model_validate(r.manifest).running_seconds() is None
    assert r.leftovers == []
    # the arm left out of the resumed matrix keeps its failed records, and the report still shows them
    assert r.records[f"broken/{POINTS[0]}"]["status"] == "failed"
    assert "## Failed jobs" in r.report and "| broken |" in r.report
    assert f"| baseline | serve/{POINTS[0]}/rep-0 |" not in r.report  # the gap is filled


def test_secrets_never_reach_the_run_directory(run4_final, run1):
    # the secrets did reach the server (so the search below is meaningful) ...
    assert run1.notes["server_secrets"] == (HF_SECRET, FOO_SECRET)
    # ... and appear nowhere in the run directory: manifest, server and client logs, records, report, caches
    hits = find_secrets(run4_final.run_dir)
    assert hits == []
    manifest = run4_final.manifest
    assert manifest["matrix"]["arms"]["baseline"]["env"]["FOO_API_KEY"] == "<redacted>"
    assert manifest["arms"]["baseline"]["env"]["FOO_API_KEY"] == "<redacted>"
