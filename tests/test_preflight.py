"""What a first GPU host stops on, checked before any pull, build or download (`suite.runtime.preflight`):
the driver against the image's CUDA, the GPUs in containers, disk for the images and the model, model access on
the hub. The hub's answers come from a local server that speaks the hub's API (the real client's code path:
this machine cannot reach the hub); the CLI refuses a run and shows every check in `suite doctor MATRIX`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from suite.runtime.docker.bases import CUDA_129_BASE, cuda_base
from suite.runtime.preflight import (
    MODEL_PATTERNS,
    Download,
    PreflightError,
    container_gpus,
    enforce,
    image_disk,
    model_access,
)
from tests.conftest import run_suite

GB = 10**9


@pytest.mark.parametrize("driver, override, image, runs", [
    (None, None, "vllm/vllm-openai:v0.33.0", True),  # a build host: no driver to ask
    (590, None, "vllm/vllm-openai:v0.33.0", True),
    (580, None, "vllm/vllm-openai:v0.33.0", True),
    (570, None, "vllm/vllm-openai:v0.33.0-cu129", True),  # picked by itself
    (535, None, "vllm/vllm-openai:v0.33.0-cu129", True),
    (530, None, "vllm/vllm-openai:v0.33.0", False),  # nothing vLLM ships runs there
    (570, "vllm/vllm-openai:v{vllm}", "vllm/vllm-openai:v0.33.0", False),  # a CUDA 13 base the matrix insists on
    (550, CUDA_129_BASE, "vllm/vllm-openai:v0.33.0-cu129", True),
    (520, CUDA_129_BASE, "vllm/vllm-openai:v0.33.0-cu129", False),
    (570, "registry.example/vllm:nightly", "registry.example/vllm:nightly", False),  # a name without -cu12: CUDA 13
])
def test_the_driver_picks_the_cuda_build_or_stops_with_the_fix(driver, override, image, runs):
    choice = cuda_base("0.33.0", override, driver)
    assert (choice.image, choice.runs) == (image, runs)
    if not runs:
        assert f"R{driver}" in choice.why and "R580" in choice.fix
    if override is not None and not runs and driver >= 535:  # the 12.9 build would run: say how to get it
        assert 'base_image: "vllm/vllm-openai:v{vllm}-cu129"' in choice.fix


def test_gpus_reach_containers_through_the_runtime_the_hook_or_cdi(tmp_path):
    none = lambda name: None  # noqa: E731  (no such program on PATH)
    cdi = tmp_path / "cdi"
    failed = container_gpus("cuda", ["io.containerd.runc.v2", "runc"], 580, which=none, cdi_dirs=[cdi])
    assert failed.status == "fail" and "nvidia-ctk runtime configure --runtime=docker" in failed.fix
    assert container_gpus("cuda", ["nvidia", "runc"], 580, which=none, cdi_dirs=[cdi]).status == "ok"
    hook = container_gpus("cuda", ["runc"], 580, which=lambda n: f"/usr/bin/{n}", cdi_dirs=[cdi])
    assert hook.status == "ok" and "hook" in hook.detail
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert "CDI spec (nvidia.yaml)" in container_gpus("cuda", ["runc"], 580, which=none, cdi_dirs=[cdi]).detail
    assert container_gpus("cuda", ["nvidia"], None, which=none, cdi_dirs=[cdi]).status == "fail"  # no driver
    dev = tmp_path / "dev"
    assert container_gpus("rocm", [], None, dev=dev).status == "fail"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").write_text("")
    assert container_gpus("rocm", [], None, dev=dev).status == "fail"  # no render node: no GPU
    (dev / "dri" / "renderD128").write_text("")
    assert container_gpus("rocm", [], None, dev=dev).status == "ok"


def test_disk_for_the_images_counts_the_bases_still_to_pull(tmp_path):
    assert image_disk("cuda", tmp_path, [], 0).status == "ok"
    one = image_disk("cuda", tmp_path, ["vllm/vllm-openai:v0.33.0"], 2)
    assert "about 41 GiB needed: vllm/vllm-openai:v0.33.0 to pull, 2 image(s) to build" in one.detail
    huge = image_disk("rocm", tmp_path, [f"base{i}" for i in range(100_000)], 0)
    assert huge.status == "fail" and "docker system prune" in huge.fix
    assert image_disk("cuda", None, ["x"], 1).status == "warn"  # an engine whose data root is not readable here


class Hub(BaseHTTPRequestHandler):
    """The hub's model API as the client meets it: a gated repository (401, X-Error-Code: GatedRepo), one that
    does not exist (404, RepoNotFound), an open one with its files and their sizes."""

    def do_GET(self) -> None:  # noqa: N802
        if "/api/models/org/gated" in self.path:
            self._send(401, {"error": "Access to model org/gated is restricted."}, {"X-Error-Code": "GatedRepo"})
        elif "/api/models/org/open" in self.path:
            self._send(200, {"id": "org/open", "sha": "a" * 40, "private": False, "gated": False, "siblings": [
                {"rfilename": "config.json", "size": 1000}, {"rfilename": "model-1.safetensors", "size": 4 * GB},
                {"rfilename": "model-2.safetensors", "size": 3 * GB}, {"rfilename": "original/consolidated.pth",
                                                                       "size": 7 * GB}]})
        else:
            self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})

    def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_model_access_is_asked_of_the_hub_before_any_download(hub, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored token either
    api = HfApi(endpoint=hub)
    gated, _ = model_access(Download("model", "org/gated", MODEL_PATTERNS), tmp_path, api)
    assert gated.status == "fail" and "without a token" in gated.detail and "accept its terms" in gated.fix
    missing, _ = model_access(Download("model", "org/nope", MODEL_PATTERNS), tmp_path, api)
    assert missing.status == "fail" and "RepositoryNotFoundError" in missing.detail
    ok, size = model_access(Download("model", "org/open", MODEL_PATTERNS), tmp_path, api)
    assert ok.status == "ok" and size == 7 * GB + 1000  # what vLLM reads: not the original/ checkpoint
    away, _ = model_access(Download("model", "org/open", MODEL_PATTERNS), tmp_path, HfApi(endpoint="http://127.0.0.1:9"))
    assert away.status == "warn" and "not reachable" in away.detail
    with pytest.raises(PreflightError, match="(?s)model access: org/gated.*fix: the repository is gated"):
        enforce([gated, ok], say=print)


MATRIX = """\
name: pre
model: {{id: {model}}}
serve_args: [--max-model-len, "512"]
runtime: {{kind: local}}
arms:
  baseline: {{vllm: "0.32.0"}}
  patched: {{vllm: "0.32.0", patches: [synthetic-gate-delay]}}
serve:
  - {{isl: 64, osl: 16, concurrency: 1, num_prompts: 2}}
"""


def test_a_run_of_a_gated_model_stops_before_anything_and_the_doctor_shows_why(hub, tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX.format(model="org/gated"))
    env = {"HF_ENDPOINT": hub, "HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf")}
    proc = run_suite("run", str(matrix), "--out", str(tmp_path / "runs"), env=env, timeout=300)
    assert proc.returncode != 0
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "preflight: nothing pulled, built or downloaded" in said and "org/gated: GatedRepoError" in said, said
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory made
    doctor = run_suite("doctor", str(matrix), "--only", "port", "--json", env=env, timeout=300)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 1 and checks["pre: model access"]["status"] == "fail", doctor.stdout
    matrix.write_text(MATRIX.format(model="org/open"))
    ok = run_suite("doctor", str(matrix), "--only", "port", "--json", env=env, timeout=300)
    checks = {c["name"]: c for c in json.loads(ok.stdout)}
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert checks["pre: model access"]["detail"] == "org/open: 3 files, 7.0 GB"
    assert checks["pre: disk for the model"]["status"] in ("ok", "fail")  # 7 GB against this disk's free space
