"""`suite fetch MATRIX`: what it downloads, from where, into which cache; local models need nothing.

The hub is not reachable from this machine, so the tests that download replace exactly one function at its
module boundary, ``huggingface_hub.snapshot_download``, by one that records its arguments and writes the
files a snapshot would hold. Everything else (loading the matrix, choosing the cache, the safetensors check,
error messages, the CLI) runs for real."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest

from suite.commands.fetch import fetch
from suite.errors import SuiteError
from suite.matrix_load import load_matrix
from suite.runtime.preflight import (
    FALLBACK_WEIGHT_PATTERNS,
    MODEL_PATTERNS,
    TOKENIZER_PATTERNS,
    hub_cache_dir,
    plan_fetch,
)
from tests.conftest import REPO, run_suite

MATRIX = """\
name: f
model:
  id: {model}
{tokenizer}runtime: {runtime}
arms:
  baseline: {{vllm: "0.33.0"}}
serve:
  - {{isl: 128, osl: 32, concurrency: [1], num_prompts: 3x}}
"""


def write(tmp_path: Path, model: str, runtime: str = "{kind: local}", tokenizer: str | None = None) -> Path:
    tok = f"serve_args: [--tokenizer, {tokenizer}]\n" if tokenizer else ""
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(model=model, tokenizer=tok, runtime=runtime))
    return path


class Hub:
    """Stands in for huggingface_hub.snapshot_download: records each call and lays out a snapshot."""

    def __init__(self, files: dict[str, list[str]]):
        self.files = files  # repo id -> file names its snapshot holds
        self.calls: list[dict] = []

    def __call__(self, repo_id, *, cache_dir, allow_patterns, **kw):
        import fnmatch

        self.calls.append({"repo_id": repo_id, "cache_dir": Path(cache_dir), "allow_patterns": allow_patterns, **kw})
        snap = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "abc123"
        snap.mkdir(parents=True, exist_ok=True)
        for name in self.files[repo_id]:
            if any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                (snap / name).write_bytes(b"x" * 10)
        return str(snap)


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("HF_HOME", "HF_HUB_CACHE", "SUITE_GLM52_MODEL", "SUITE_GEMMA4_MODEL", "SUITE_QWEN38_FSE_MODEL",
                "SUITE_QWEN38_QUARK_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_local_model_is_a_no_op_that_says_so(tmp_path):
    (tmp_path / "ckpt").mkdir()
    f = write(tmp_path, "./ckpt")
    downloads, notes = plan_fetch(load_matrix(f))
    assert downloads == [] and notes == [f"model {tmp_path / 'ckpt'} is a local directory: nothing to fetch"]
    proc = run_suite("fetch", str(f), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"model {tmp_path / 'ckpt'} is a local directory: nothing to fetch" in proc.stdout
    missing = write(tmp_path, "./nope")
    proc = run_suite("fetch", str(missing), timeout=120)
    assert proc.returncode == 2 and f"model {tmp_path / 'nope'} is a local path but no such directory" in proc.stderr


def test_downloads_weights_and_tokenizer_into_the_docker_hf_cache(tmp_path, clean_env, monkeypatch):
    hub = Hub({"amd/GLM-5.2-MXFP4": ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json",
                                     "original/consolidated.pth", "model.gguf"],
               "org/tok": ["tokenizer.json", "tokenizer_config.json", "model.safetensors"]})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    f = write(tmp_path, "amd/GLM-5.2-MXFP4", "{kind: docker, vendor: rocm, docker: {hf_cache: ./hf}}",
              tokenizer="org/tok")
    m = load_matrix(f)
    cache = hub_cache_dir(m)
    assert cache == tmp_path / "hf" / "hub"  # hf_cache is relative to the matrix file, like its other paths
    paths = fetch(plan_fetch(m)[0], cache, log=lambda _: None)
    assert [(c["repo_id"], c["allow_patterns"], c["cache_dir"]) for c in hub.calls] == [
        ("amd/GLM-5.2-MXFP4", list(MODEL_PATTERNS), cache),
        ("org/tok", list(TOKENIZER_PATTERNS), cache),
    ]
    got = sorted(p.name for p in paths[0].iterdir())
    assert got == ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]  # no .pth, no .gguf
    assert sorted(p.name for p in paths[1].iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_cache_follows_the_runtime(tmp_path, clean_env):
    f = write(tmp_path, "org/m", "{kind: docker, vendor: cuda}")
    assert hub_cache_dir(load_matrix(f)) == Path.home() / ".cache" / "huggingface" / "hub"
    clean_env.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir(load_matrix(f)) == tmp_path / "home" / "hub"  # the directory mounted as HF_HOME
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir(load_matrix(f)) == tmp_path / "elsewhere"  # mounted and set in the containers too
    local = write(tmp_path, "org/m")
    assert hub_cache_dir(load_matrix(local)) == tmp_path / "elsewhere"  # a host server reads HF_HUB_CACHE
    clean_env.delenv("HF_HUB_CACHE")
    assert hub_cache_dir(load_matrix(local)) == tmp_path / "home" / "hub"


def test_bin_weights_only_when_the_repo_has_no_safetensors(tmp_path, clean_env, monkeypatch):
    hub = Hub({"old/model": ["config.json", "pytorch_model.bin", "tokenizer.json"]})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    f = write(tmp_path, "old/model")
    [path] = fetch(plan_fetch(load_matrix(f))[0], tmp_path / "cache", log=lambda _: None)
    assert [c["allow_patterns"] for c in hub.calls] == [list(MODEL_PATTERNS), list(FALLBACK_WEIGHT_PATTERNS)]
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "pytorch_model.bin", "tokenizer.json"]


def test_model_id_from_the_environment_is_what_is_fetched(tmp_path, clean_env, monkeypatch):
    """Every model the matrix names is fetched, an arm's own too (seed 002's Quark-MXFP4 reference arm)."""
    hub = Hub({"me/my-qwen-copy": ["config.json", "model.safetensors"],
               "amd/Qwen3.8-2.4T-A95B-Quark-MXFP4": ["config.json", "model.safetensors"]})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    clean_env.setenv("SUITE_QWEN38_FSE_MODEL", "me/my-qwen-copy")
    m = load_matrix(REPO / "matrices" / "qwen38-fse-mi355x.yaml")
    fetch(plan_fetch(m)[0], tmp_path, log=lambda _: None)
    assert [c["repo_id"] for c in hub.calls] == ["me/my-qwen-copy", "amd/Qwen3.8-2.4T-A95B-Quark-MXFP4"]


def test_hub_errors_become_one_clear_message(tmp_path, clean_env, monkeypatch):
    import httpx2
    from huggingface_hub.errors import RepositoryNotFoundError

    def not_found(repo_id, **kw):
        response = httpx2.Response(404, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}"))
        raise RepositoryNotFoundError(f"Repository Not Found for url: {response.request.url}", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_found)
    m = load_matrix(write(tmp_path, "amd/Qwen3.8-2.4T-A95B-MoE-MXFP4"))
    with pytest.raises(SuiteError) as exc:
        fetch(plan_fetch(m)[0], tmp_path, log=lambda _: None)
    msg = str(exc.value)
    assert msg.startswith("model amd/Qwen3.8-2.4T-A95B-MoE-MXFP4: RepositoryNotFoundError: ")
    assert "HF_TOKEN" in msg and "local directory" in msg


def test_cli_dry_run_and_offline_cache_miss(tmp_path, clean_env):
    f = REPO / "matrices" / "glm52-aiter-router-mi355x.yaml"
    proc = run_suite("fetch", str(f), "--dry-run", "--cache-dir", str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"would download model amd/GLM-5.2-MXFP4 ({', '.join(MODEL_PATTERNS)}) into {tmp_path}" in proc.stdout
    # offline (as on this machine) and not cached: the real hub client's error, in one line, exit 2
    proc = run_suite("fetch", str(f), "--cache-dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model amd/GLM-5.2-MXFP4: LocalEntryNotFoundError" in proc.stderr and "not in the cache" in proc.stderr
