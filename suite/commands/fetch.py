"""`suite fetch MATRIX`: download the matrix's model (and its tokenizer, when that is another repository) into
the Hugging Face cache the arms' servers read, before any clock starts. A first run would otherwise download
hundreds of GB inside the server's start-up timeout.

The cache is the one the runtime uses: for `runtime: docker` the containers' hub cache
($HF_HUB_CACHE, mounted and set in them, unless `docker.hf_cache` is given; else the directory mounted as their
HF_HOME, `docker.hf_cache` or $HF_HOME or ~/.cache/huggingface, plus `hub/`); otherwise the hub's own default
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). A model given as a local directory needs
nothing and is only checked; one with `model.generate:` (a dummy-weight model: config + tokenizer, no weights) is
written here when its directory does not exist yet (suite.fixtures.gemma4.ensure_model, the same call the runner
makes before its first server). Access tokens come from the environment (HF_TOKEN), as huggingface_hub reads them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from suite.errors import SuiteError
from suite.fixtures.gemma4 import ensure_model
from suite.matrix import DockerSpec, Matrix, load_matrix

NAME = "fetch"
HELP = ("Download the matrix's model and tokenizer into the HF cache before a run (local models: nothing to do; "
        "model.generate: write the dummy-weight model's directory).")

# What vLLM reads from a model repository: configs, safetensors weights, tokenizer files, chat templates and
# remote code. Original/consolidated checkpoints, GGUF, ONNX, TF/Flax weights are left out.
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja")
# Only for a repository without safetensors (vLLM then loads PyTorch .bin / .pt weights).
FALLBACK_WEIGHT_PATTERNS = ("*.bin", "*.pt")
TOKENIZER_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")


@dataclass(frozen=True)
class Download:
    what: str  # model | tokenizer
    repo_id: str
    allow_patterns: tuple[str, ...]
    weights: bool = True  # False: a dummy-weight model (load_format: dummy) needs its config and tokenizer only


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX")
    p.add_argument("--cache-dir", type=Path, help="hub cache directory (default: the one the runtime uses)")
    p.add_argument("--dry-run", action="store_true", help="print what would be downloaded, and where")


def hub_cache_dir(matrix: Matrix) -> Path:
    """The hub cache the matrix's servers will read (see the module docstring)."""
    if matrix.runtime.kind == "docker":
        from suite.runtime.docker.runtime import hub_cache_dir as container_hub_cache

        return container_hub_cache(matrix.runtime.docker or DockerSpec())
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def is_local(ref: str) -> bool:
    """load_matrix makes a model or tokenizer written as a local path (./, ../, /, ~) absolute."""
    return Path(ref).is_absolute()


def plan_fetch(matrix: Matrix) -> tuple[list[Download], list[str]]:
    """(downloads, notes): what to download for every model the matrix names (the matrix's and an arm's own),
    and what needs nothing (local directories). A repository named twice is downloaded once."""
    downloads: list[Download] = []
    notes: list[str] = []
    for m in matrix.models_by_field().values():
        for what, ref in (("model", m.id), ("tokenizer", m.tokenizer)):
            if ref is None or (what == "tokenizer" and ref == m.id):
                continue
            if is_local(ref):
                generated = what == "model" and m.generate is not None
                if generated and not Path(ref).exists():
                    notes.append(f"{what} {ref}: generated here by model.generate: {m.generate} (config + "
                                 "tokenizer; weights: dummy)")
                    continue
                if not Path(ref).is_dir():
                    raise SuiteError(f"{what} {ref} is a local path but no such directory exists")
                notes.append(f"{what} {ref} is a local directory: nothing to fetch"
                             + (" (weights: dummy, --load-format dummy)" if m.dummy else ""))
                continue
            weights = what == "model" and not m.dummy
            download = Download(what, ref, MODEL_PATTERNS if weights else TOKENIZER_PATTERNS, weights=weights)
            if download not in downloads:
                downloads.append(download)
    return downloads, list(dict.fromkeys(notes))


def _hint(exc: Exception) -> str:
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return "the repository is gated: accept its terms on the hub and pass a token (HF_TOKEN)"
    if isinstance(exc, RepositoryNotFoundError):
        return ("no such repository, or no access to it: check the id and HF_TOKEN; for a checkpoint of your "
                "own give model.id as a local directory (or set the matrix's ${...} variable)")
    if isinstance(exc, LocalEntryNotFoundError):
        return "the hub is not reachable (or HF_HUB_OFFLINE=1) and the files are not in the cache"
    return "see the message above"


def _snapshot_files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def fetch(downloads: list[Download], cache_dir: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Download each repository's matching files into cache_dir (huggingface_hub.snapshot_download: files
    already there are not downloaded again). Returns the snapshot directories."""
    import huggingface_hub

    cache_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for d in downloads:
        log(f"{d.what} {d.repo_id}: downloading {', '.join(d.allow_patterns)} into {cache_dir} ...")
        try:
            path = Path(huggingface_hub.snapshot_download(d.repo_id, cache_dir=cache_dir,
                                                          allow_patterns=list(d.allow_patterns)))
            if d.what == "model" and d.weights and not any(p.suffix == ".safetensors" for p in _snapshot_files(path)):
                log(f"{d.what} {d.repo_id}: no safetensors; downloading {', '.join(FALLBACK_WEIGHT_PATTERNS)}")
                path = Path(huggingface_hub.snapshot_download(d.repo_id, cache_dir=cache_dir,
                                                              allow_patterns=list(FALLBACK_WEIGHT_PATTERNS)))
        except Exception as exc:  # the hub client raises many kinds; each becomes one clear error
            raise SuiteError(f"{d.what} {d.repo_id}: {type(exc).__name__}: {exc} ({_hint(exc)})") from None
        files = _snapshot_files(path)
        size = sum(p.stat().st_size for p in files)
        log(f"{d.what} {d.repo_id}: {len(files)} files, {size / 1e9:.2f} GB in {path}")
        out.append(path)
    return out


def run(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True)

    def log(msg: str) -> None:
        console.print(msg, markup=False, highlight=False)

    matrix = load_matrix(args.matrix)
    downloads, notes = plan_fetch(matrix)
    for note in notes:
        log(note)
    cache_dir = args.cache_dir or hub_cache_dir(matrix)
    if args.dry_run:
        for d in downloads:
            log(f"would download {d.what} {d.repo_id} ({', '.join(d.allow_patterns)}) into {cache_dir}")
        return 0
    for m in matrix.models_by_field().values():
        generated = ensure_model(m, log=log)
        if generated is not None:
            log(f"model {generated}: ready ({m.weights_note()})")
    fetch(downloads, cache_dir, log=log)
    return 0
