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
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from suite.errors import SuiteError
from suite.fixtures.gemma4 import ensure_model
from suite.matrix_load import load_matrix
from suite.runtime.preflight import FALLBACK_WEIGHT_PATTERNS, Download, hub_cache_dir, hub_hint, plan_fetch

NAME = "fetch"
HELP = ("Download the matrix's model and tokenizer into the HF cache before a run (local models: nothing to do; "
        "model.generate: write the dummy-weight model's directory).")

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX")
    p.add_argument("--cache-dir", type=Path, help="hub cache directory (default: the one the runtime uses)")
    p.add_argument("--dry-run", action="store_true", help="print what would be downloaded, and where")


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
            raise SuiteError(f"{d.what} {d.repo_id}: {type(exc).__name__}: {exc} ({hub_hint(exc)})") from None
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
    for m in {m.id: m for m in matrix.models_by_arm().values()}.values():
        generated = ensure_model(m, log=log)
        if generated is not None:
            log(f"model {generated}: ready ({m.weights_note()})")
    fetch(downloads, cache_dir, log=log)
    return 0
