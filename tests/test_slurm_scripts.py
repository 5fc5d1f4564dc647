"""Slurm job scripts and request checks that need no cluster: the exact sbatch options and worker command
lines of the three container modes (pyxis and apptainer cannot run on this machine), gres parsing, and the
matrix's sbatch list (its check, the GPUs read from it). The cluster itself is exercised in test_slurm_cluster.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_load import parse_matrix
from suite.runtime.slurm.cluster import (
    container_mounts,
    job_script,
    node_gpus,
    parse_session_id,
    sbatch_options,
    worker_command,
)
from suite.sbatch import GpuRequest, gpu_request

BASE = """
name: t
model: {id: /models/m}
runtime:
  kind: slurm
  slurm: %s
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch], image: "registry#vllm/vllm-openai:v0.33.0"}
serve:
  - {isl: 64, osl: 16, concurrency: [1]}
serve_args: [--max-model-len, "512"]
"""

RUN, REPO, WORK, MATRIX = Path("/shared/runs/r1"), Path("/shared/suite"), Path("/shared/work"), Path("/shared/m.yaml")


def matrix(slurm: str, vendor: str | None = None):
    text = BASE % slurm
    return parse_matrix(text if vendor is None else text.replace("  kind: slurm\n", f"  kind: slurm\n  vendor: {vendor}\n"))


def test_sbatch_options_from_the_spec() -> None:
    m = matrix("{sbatch: [--partition=gpu, --gres=gpu:h200:8, --cpus-per-task=16, --mem=200G, --exclusive,"
               " --time=02:00:00, --account=bench, --qos, high]}")
    opts = sbatch_options(m, name="suite:t:baseline#0", output="/o/%j.out", workdir=WORK)
    assert opts == ["--job-name=suite:t:baseline#0", "--output=/o/%j.out", "--nodes=1", "--ntasks=1",
                    "--chdir=/shared/work", "--export=ALL", "--partition=gpu", "--gres=gpu:h200:8",
                    "--cpus-per-task=16", "--mem=200G", "--exclusive", "--time=02:00:00", "--account=bench",
                    "--qos=high"]  # the list as written, a separate value joined to its option


def test_a_list_without_a_time_asks_for_an_hour() -> None:
    for slurm in ("{}", "{sbatch: [--cpus-per-task=2]}"):
        opts = sbatch_options(matrix(slurm), name="n", output="o", workdir=WORK)
        assert opts[:3] == ["--job-name=n", "--output=o", "--time=01:00:00"], opts
        assert sum(o.startswith("--time") for o in opts) == 1


@pytest.mark.parametrize(("options", "asked"), [
    ([], None), (["--exclusive", "--mem=64G"], None),
    (["--gres=gpu:2"], GpuRequest(2, None, "--gres=gpu:2")),
    (["--gres=gpu:mi355x:4"], GpuRequest(4, "mi355x", "--gres=gpu:mi355x:4")),
    (["--gres=gpu:h200"], GpuRequest(1, "h200", "--gres=gpu:h200")), (["--gres=gpu"], GpuRequest(1, None, "--gres=gpu")),
    (["--gres=shard:1,gpu:h100:2"], GpuRequest(2, "h100", "--gres=shard:1,gpu:h100:2")),
    (["--gres=gres/gpu:3"], GpuRequest(3, None, "--gres=gres/gpu:3")), (["--gres=gpu:0"], None),
    (["--gpus=8"], GpuRequest(8, None, "--gpus=8")), (["--gpus-per-node=h200:2"], GpuRequest(2, "h200", "--gpus-per-node=h200:2")),
    (["--gpus-per-task=1"], GpuRequest(1, None, "--gpus-per-task=1")),
    (["--gres=gpu:1", "--gpus=4"], GpuRequest(4, None, "--gpus=4")),  # the last one asking stands
    (["--gres=shard:2"], None), (["--gres-flags=enforce-binding"], None),
])
def test_gpus_a_job_asks_for(options: list[str], asked: GpuRequest | None) -> None:
    assert gpu_request(options) == asked


def test_container_none_runs_the_login_nodes_python() -> None:
    m = matrix("{container: none}")
    cmd = worker_command(m, image=None, run_dir=RUN, matrix_path=MATRIX, session="baseline#0", repo_root=REPO,
                         workdir=WORK, python="/shared/suite/.venv/bin/python")
    assert cmd == ["/shared/suite/.venv/bin/python", "-m", "suite.runtime.slurm.worker", "/shared/runs/r1", "--matrix",
                   "/shared/m.yaml", "--session", "baseline#0"]


def test_pyxis_command_line() -> None:
    m = matrix("{container: pyxis, image: 'nvcr.io#vllm/vllm-openai:v0.33.0', sbatch: [--gres=gpu:8], "
               "container_mounts: [/scratch/hf:/root/.cache/huggingface, /data]}")
    cmd = worker_command(m, image="nvcr.io#vllm/vllm-openai:v0.33.0", run_dir=RUN, matrix_path=MATRIX,
                         session="patched#1", repo_root=REPO, workdir=WORK)
    assert cmd[:3] == ["srun", "--ntasks=1", "--container-image=nvcr.io#vllm/vllm-openai:v0.33.0"]
    assert cmd[3] == ("--container-mounts=/shared/runs/r1:/shared/runs/r1,/shared/suite:/shared/suite,"
                      "/shared/work:/shared/work,/models/m:/models/m,/scratch/hf:/root/.cache/huggingface,"
                      "/data:/data")
    assert cmd[4] == "--container-workdir=/shared/work"
    assert cmd[5:] == ["python3", "-m", "suite.runtime.slurm.worker", "/shared/runs/r1", "--matrix", "/shared/m.yaml",
                       "--session", "patched#1", "--overlays", "node-local"]


@pytest.mark.parametrize(("vendor", "sbatch", "flag"), [("cuda", "[--gres=gpu:8]", ["--nv"]),
                                                         (None, "[--gres=gpu:8]", ["--nv"]),  # cuda: the default
                                                         ("rocm", "[--gpus=mi355x:8]", ["--rocm"]),
                                                         ("cuda", "[--gres=gpu:0]", []), ("cuda", "[]", []),
                                                         ("rocm", "[]", []), ("cpu", "[]", []), (None, "[]", [])])
def test_apptainer_command_line(vendor: str | None, sbatch: str, flag: list[str]) -> None:
    """runtime.vendor gives apptainer's GPU flag (--nv, --rocm) to a job that asks for GPUs; a job without GPUs
    gets none, whatever the vendor."""
    m = matrix(f"{{container: apptainer, image: /images/vllm.sif, sbatch: {sbatch}}}", vendor)
    cmd = worker_command(m, image="/images/vllm.sif", run_dir=RUN, matrix_path=MATRIX, session="baseline#0",
                         repo_root=REPO, workdir=WORK)
    assert cmd == ["apptainer", "exec", *flag, "--bind",
                   "/shared/runs/r1:/shared/runs/r1,/shared/suite:/shared/suite,/shared/work:/shared/work,"
                   "/models/m:/models/m", "--pwd", "/shared/work", "/images/vllm.sif", "python3", "-m",
                   "suite.runtime.slurm.worker", "/shared/runs/r1", "--matrix", "/shared/m.yaml", "--session",
                   "baseline#0", "--overlays", "node-local"]


def test_job_script_is_a_valid_batch_script(tmp_path: Path) -> None:
    m = matrix("{container: pyxis, image: 'img:1', sbatch: [--partition=gpu, --gres=gpu:1]}")
    js = job_script(m, arm="patched", index=2, image="img:2", run_dir=RUN, matrix_path=MATRIX, repo_root=REPO,
                    workdir=WORK)
    lines = js.text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH ")]
    assert "--job-name=suite:t:patched#2" in directives
    assert "--output=/shared/runs/r1/slurm/patched-s2.%j.out" in directives
    assert "--gres=gpu:1" in directives and "--partition=gpu" in directives
    assert "export PYTHONPATH=/shared/suite${PYTHONPATH:+:$PYTHONPATH}" in lines
    exec_line = lines[-1]
    assert exec_line.startswith("exec srun ")
    assert "--container-image=img:2" in shlex.split(exec_line)  # the arm's image overrides slurm.image
    assert js.path == RUN / "slurm" / "patched-s2.sbatch"
    script = tmp_path / "s.sh"
    script.write_text(js.text)
    import subprocess

    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_container_mounts_keep_each_path_once() -> None:
    m = matrix("{container: apptainer, image: x.sif, container_mounts: [/shared/runs/r1]}")
    mounts = container_mounts(m, RUN, REPO, REPO)
    assert mounts == ["/shared/runs/r1:/shared/runs/r1", "/shared/suite:/shared/suite", "/models/m:/models/m"]


@pytest.mark.parametrize(("gres", "typ", "n"), [
    ("gpu:h200:8", "h200", 8), ("gpu:h200:8(S:0-1)", "h200", 8), ("gpu:h200:8(S:0-1)", None, 8),
    ("gpu:h200:4(S:0),gpu:a100:2(S:1)", None, 6), ("gpu:h200:4,gpu:a100:2", "a100", 2), ("gpu:8", None, 8),
    ("gpu:8", "h200", 0), ("(null)", None, 0), ("gpu:mi355x:8(S:0-7)", "h200", 0),
])
def test_node_gpus(gres: str, typ: str | None, n: int) -> None:
    assert node_gpus(gres, typ) == n


def test_session_ids() -> None:
    assert parse_session_id("baseline.aa#3") == ("baseline.aa", 3)
    with pytest.raises(Exception, match="ARM#N"):
        parse_session_id("baseline")


@pytest.mark.parametrize("value", ["abc", "1:2:3:4", "01:00:00x"])
def test_bad_time_is_a_matrix_error(value: str) -> None:
    with pytest.raises(MatrixError, match=rf"<matrix>:6: runtime\.slurm\.sbatch: --time={value}: a Slurm time is MM, "):
        matrix(f"{{sbatch: ['--time={value}']}}")


@pytest.mark.parametrize("value", ["30", "01:00:00", "2-00:00:00", "1-12", "UNLIMITED"])
def test_good_times(value: str) -> None:
    assert matrix(f"{{sbatch: ['--time={value}']}}").runtime.slurm.sbatch == [f"--time={value}"]
    assert matrix(f"{{sbatch: [--time, '{value}']}}").runtime.slurm.sbatch == [f"--time={value}"]


@pytest.mark.parametrize(("sbatch", "said"), [
    ("[-p, gpu]", "'-p': write sbatch's long option, e.g. --partition=gpu for -p gpu"),
    ("['--partition gpu']", "'--partition gpu' is not one sbatch option: write --partition=gpu"),
    ("[gpu]", "'gpu' is not an sbatch option: each entry is --name or --name=value"),
    ("[--exclusive=user, again]", "'again' is not an sbatch option"),
    ("[--job-name=mine]", "--job-name is refused: the driver names each job suite:<matrix>:<arm>#<n>"),
    ("[--output=/tmp/x.out]", "--output is refused: the driver writes each job's log to <run>/slurm/"),
    ("[--array=0-3]", "--array is refused: each session is one job of its own"),
    ("[--wrap=true]", "--wrap is refused: the driver writes a batch script per session"),
    ("[--part=gpu]", "--part: write the option's full name (--partition)"),
    ("[--n=1]", "--n: write the option's full name (--nodes or --ntasks)"),
    ("[--gres]", "--gres needs a value: --gres=VALUE"),
    ("[--time, 1:00:00]", "--time: write the time in quotes or as --time=VALUE (YAML read it as 3600)"),
    ("[true]", "True is not an sbatch option: write each as text"),
])
def test_a_bad_sbatch_entry_is_named(sbatch: str, said: str) -> None:
    with pytest.raises(MatrixError) as exc:
        matrix(f"{{sbatch: {sbatch}}}")
    assert str(exc.value).startswith("<matrix>:6: runtime.slurm.sbatch: ") and said in str(exc.value), exc.value


def test_unknown_slurm_field_is_refused() -> None:
    with pytest.raises(MatrixError, match=r"runtime\.slurm\.gpus: unknown field"):
        matrix("{gpus: 8}")


def test_a_retired_slurm_field_names_the_sbatch_option() -> None:
    with pytest.raises(MatrixError) as exc:
        matrix("{exclusive: true, mem: 64G, extra_sbatch: [--account=abc, --qos=high]}")
    said = str(exc.value).splitlines()
    assert said[0].startswith("<matrix>:6: runtime.slurm.exclusive: retired: write sbatch's own option in "
                              "runtime.slurm.sbatch, e.g. sbatch: [--exclusive] ")
    assert said[1].startswith("<matrix>:6: runtime.slurm.mem: retired: ") and "sbatch: [--mem=64G]" in said[1]
    assert "sbatch: [--account=abc, --qos=high]" in said[2] and "unknown field" not in str(exc.value)


def test_slurm_scripts_command_prints_every_session(tmp_path: Path) -> None:
    from tests.conftest import run_suite

    path = tmp_path / "m.yaml"
    path.write_text((BASE % "{container: apptainer, image: /img/base.sif, sbatch: [--gres=gpu:2]}")
                    + "order: abba\nrepeats: 2\n")
    proc = run_suite("slurm-scripts", str(path), "--out", str(tmp_path / "runs"), check=True)
    heads = [line for line in proc.stdout.splitlines() if line.startswith("# ---- ")]
    from suite.design import round_order

    order = [f"{arm}-s{r}.sbatch" for r in range(2) for arm in round_order(["baseline", "patched"], r)]
    assert [h.split("/slurm/")[1].split(" ")[0] for h in heads] == order  # the plan's order: one script a session
    execs = [line for line in proc.stdout.splitlines() if line.startswith("exec ")]
    assert all(e.startswith("exec apptainer exec --nv --bind ") for e in execs)
    assert "registry#vllm/vllm-openai:v0.33.0" in execs[1] and "/img/base.sif" in execs[0]
    assert not (tmp_path / "runs").exists()


def test_slurm_scripts_refuses_other_runtimes(tmp_path: Path) -> None:
    from tests.conftest import run_suite

    path = tmp_path / "m.yaml"
    path.write_text((BASE % "{}").replace("kind: slurm", "kind: local"))
    proc = run_suite("slurm-scripts", str(path))
    assert proc.returncode == 2 and "not 'slurm'" in proc.stderr


def test_report_section_lists_every_submission(tmp_path: Path) -> None:
    """The report's Slurm section (suite.report_sections, read from the run directory, not the runtime)."""
    import json

    from suite.analysis import load_run
    from suite.records import SCHEMA_VERSION, Manifest
    from suite.render.markdown import section
    from suite.report_sections import slurm_section
    from suite.store import RunStore

    RunStore(tmp_path).write_manifest(Manifest.model_validate({"schema_version": SCHEMA_VERSION,
                                       "plan": {"arms": ["baseline", "patched"], "baseline": "baseline"}}))
    assert slurm_section(load_run(tmp_path)) is None
    (tmp_path / "slurm").mkdir()
    subs = [
        {"session": "baseline#0", "attempt": 0, "job_id": "7", "node": "n1", "state": "TIMEOUT", "exit_code": "0:15",
         "start": "s0", "end": "e0", "missing_after": 2},
        {"session": "patched#0", "attempt": 0, "job_id": "8", "node": "n2", "state": "COMPLETED", "exit_code": "0:0",
         "start": "s1", "end": "e1", "missing_after": 0},
        {"session": "baseline#0", "attempt": 1, "job_id": "9", "node": "n1", "state": "COMPLETED",
         "exit_code": "0:0", "start": "s2", "end": "e2", "missing_after": 0},
    ]
    (tmp_path / "slurm" / "jobs.json").write_text(json.dumps({"schema_version": 1, "submissions": subs}))
    found = slurm_section(load_run(tmp_path))
    assert found is not None
    text = section(found)
    assert text.startswith("## Slurm jobs")
    assert "| baseline#0 | 0 | 7 | n1 | TIMEOUT (0:15) | s0 | e0 | 2 |" in text
    assert "| baseline#0 | 1 | 9 | n1 | COMPLETED (0:0) | s2 | e2 | 0 |" in text
    assert "Resubmitted sessions: baseline#0" in text
    assert "Sessions ran on 2 nodes (n1, n2)" in text


@pytest.mark.parametrize("matrix", [
    {"runtime": {"kind": "slurm", "slurm": {"gpu_vendor": "rocm", "poll_interval_s": 1.0, "sbatch": ["--gpus=8"]}}},
    {"runtime": {"kind": "docker", "docker": {"vendor": "rocm", "shm_size": "64g"}},
     "arms": {"mine": {"aiter": {"git": "https://github.com/ROCm/aiter", "ref": "v0.1.19", "prebuild_kernels": 0,
                                 "gpu_archs": "gfx942;gfx950"}}}},
])
def test_a_run_stored_with_the_retired_runtime_and_aiter_fields_still_loads(tmp_path: Path, matrix: dict) -> None:
    """Runs recorded before runtime.vendor, the driver's fixed poll interval and aiter.build_env: their matrix
    record (and a Slurm run's manifest `slurm`) carry runtime.docker.vendor, runtime.slurm.gpu_vendor,
    poll_interval_s and aiter.prebuild_kernels / gpu_archs; the run loads, and the fields ride along as read."""
    from suite.analysis import load_run
    from suite.records import SCHEMA_VERSION, Manifest
    from suite.store import RunStore

    old = {"schema_version": SCHEMA_VERSION, "runtime": matrix["runtime"]["kind"],
           "matrix": {"name": "old", "arms": {"baseline": {}, **matrix.get("arms", {})}, **matrix},
           "plan": {"arms": ["baseline"], "baseline": "baseline"}}
    if "slurm" in matrix["runtime"]:
        old["slurm"] = {**matrix["runtime"]["slurm"], "container": "none", "max_resubmits": 1, "parallel": True}
    store = RunStore(tmp_path)
    store.write_manifest(Manifest.model_validate(old))
    run = load_run(tmp_path)
    again = run.manifest.model_dump(mode="json")
    runtime = again["matrix"]["runtime"]
    assert {k: runtime[k] for k in matrix["runtime"]} == matrix["runtime"] and again.get("slurm") == old.get("slurm")
    assert {k: v for k, v in again["matrix"]["arms"].get("mine", {}).items() if k == "aiter"} == \
        {k: v for k, v in matrix.get("arms", {}).get("mine", {}).items()}


def test_a_malformed_ledger_is_named(tmp_path: Path) -> None:
    """A ledger entry without its job id: a resume (the driver reads the ledger back) stops with the file and
    the entry's field named; the report shows the Slurm section as that warning instead of a table."""
    import json

    from suite.analysis import load_run
    from suite.errors import SuiteError
    from suite.records import SCHEMA_VERSION, Manifest
    from suite.render.markdown import section
    from suite.report_sections import slurm_section
    from suite.store import RunStore

    store = RunStore(tmp_path)
    assert store.slurm_ledger() is None  # no Slurm run: no ledger, no section
    store.write_manifest(Manifest.model_validate({"schema_version": SCHEMA_VERSION,
                                                  "plan": {"arms": ["baseline"], "baseline": "baseline"}}))
    (tmp_path / "slurm").mkdir()
    store.slurm_ledger_path().write_text(json.dumps({"schema_version": 1, "submissions": [
        {"session": "baseline#0", "attempt": 0, "state": "PENDING"}]}))
    with pytest.raises(SuiteError, match=r"jobs\.json: not a Slurm job ledger this suite reads: "
                                         r"submissions\.0\.job_id: Field required"):
        store.slurm_ledger()
    found = slurm_section(load_run(tmp_path))
    assert found is not None and "Slurm job ledger could not be read" in section(found)
    store.slurm_ledger_path().write_text("{not json")
    with pytest.raises(SuiteError, match="unreadable Slurm job ledger"):
        store.slurm_ledger()


def test_the_dry_run_shows_each_arm_on_the_node_without_asking_the_cluster(tmp_path: Path) -> None:
    """`suite run --dry-run` of a Slurm matrix: the arm's server in its container image on the node (the
    patched arm's patches applied in the job), and where the batch scripts are printed. No preflight: this
    machine's Slurm is not running in this test, and nothing is prepared or written."""
    from tests.conftest import run_suite

    path = tmp_path / "m.yaml"
    path.write_text(BASE % "{container: apptainer, image: /img/base.sif}")
    proc = run_suite("run", str(path), "--dry-run", "--out", str(tmp_path / "runs"), check=True)
    servers = {line.split("]")[0].strip(" ["): line for line in proc.stdout.splitlines() if "] server: " in line}
    assert "(on the node, in apptainer image /img/base.sif) vllm serve /models/m" in servers["baseline"]
    assert ("(on the node, in apptainer image registry#vllm/vllm-openai:v0.33.0, its patches applied in the job) "
            "vllm serve /models/m") in servers["patched"]
    sessions = [line for line in proc.stdout.splitlines() if "] sessions: " in line]
    assert len(sessions) == 2 and all("container mode apptainer" in s and "`suite slurm-scripts MATRIX`" in s
                                      for s in sessions)
    path.write_text(BASE % "{container: none}")
    proc = run_suite("run", str(path), "--dry-run", "--out", str(tmp_path / "runs"), check=True)
    assert "PYTHONPATH=<arm overlay: the installed vLLM + patches> vllm serve /models/m" in proc.stdout
    assert not (tmp_path / "runs").exists()
