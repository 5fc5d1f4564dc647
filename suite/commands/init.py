"""`suite init MATRIX --diff mine.diff --gpu h100`: a commented starter matrix for "my change on my GPU", with
the settings the shipped GPU matrices rely on (prefix caching off, a quiet period after each start, vLLM's own
warm-ups, the points where a router-gate change acts, rounds until the declared test decides), checked as
`suite validate` checks it (the diff applied to its vLLM release's files), with its time estimate."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from suite import REPO_ROOT
from suite.errors import SuiteError

NAME = "init"
HELP = "Write a commented starter matrix for your change on your GPU (or CPU), and check it."

GPUS = {
    # gpu: (vendor, default model, served name, the model's context for these points, memory flag)
    "h100": ("cuda", "google/gemma-4-26B-A4B-it", "gemma-4-26b-a4b", 8192, "0.90"),
    "h200": ("cuda", "google/gemma-4-26B-A4B-it", "gemma-4-26b-a4b", 8192, "0.90"),
    "mi355x": ("rocm", "amd/GLM-5.2-MXFP4", "glm-5.2", 8192, "0.90"),
    "cpu": ("cpu", "models/tiny-moe", "tiny-moe", 2048, None),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", type=Path, help="the matrix file to write (not overwritten)")
    p.add_argument("--diff", type=Path, metavar="PATH",
                   help="your unified diff against the arm's vLLM (default: the ll-bf16-router-gemm-dispatch patch set)")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="where it runs (default h100)")
    p.add_argument("--runtime", choices=("docker", "local", "slurm"), default=None,
                   help="docker (default on a GPU), local (the installed vLLM; the default on cpu) or slurm")
    p.add_argument("--model", help="hub id or local directory (default: Gemma 4 26B-A4B on NVIDIA, GLM-5.2 MXFP4 "
                                   "on MI355X, the tiny local MoE on cpu)")
    p.add_argument("--vllm", default=None, help="vLLM release of both arms (default 0.33.0; cpu: 0.32.0)")
    p.add_argument("--name", help="the matrix's name (default: the file's stem)")


def _relative(path: Path, base: Path) -> str:
    try:
        rel = path.resolve().relative_to(base.resolve())
        return f"./{rel.as_posix()}"
    except ValueError:
        return str(path.resolve())


def starter_text(*, name: str, gpu: str, runtime: str, model: str, vllm: str, patch: str,
                 diff_said: str) -> str:
    """The matrix's text: every setting with the reason it is there."""
    vendor, _, served, max_len, mem = GPUS[gpu]
    cpu = vendor == "cpu"
    rounds = (2, 4) if cpu else (2, 4, 6)  # a CPU box's servers start in ~40 s: fewer looks keep it short
    runtime_block = {
        "docker": ("runtime:\n  kind: docker                       # each arm's vLLM built into its image\n"
                   f"  vendor: {vendor:<27}# the hosts' GPUs: the image's Dockerfile, base and run flags\n"
                   "  startup_timeout_s: 1800\n" + ("" if cpu else '  gpus: "0"\n  docker: {shm_size: 16g}\n')),
        "local": ("runtime:\n  kind: local                        # the vLLM installed beside the suite, patched in an "
                  "overlay per arm\n  startup_timeout_s: 900\n" + ("" if cpu else '  gpus: "0"\n')),
        "slurm": ("runtime:\n  kind: slurm                        # each server session an sbatch job\n"
                  f"  vendor: {vendor:<27}# the nodes' GPUs (apptainer: --nv or --rocm)\n"
                  "  startup_timeout_s: 1800\n  slurm: {sbatch: [" + ("" if cpu else "--gres=gpu:1, ")
                  + "--time=02:00:00]}\n"),
    }[runtime]
    serve_args = (f'[--served-model-name, {served}, --max-model-len, "{max_len}",\n             '
                  + ('--dtype, bfloat16, --max-num-seqs, "8", --enforce-eager, --kv-cache-memory-bytes, 64M]' if cpu
                     else f'--dtype, bfloat16, --gpu-memory-utilization, "{mem}", --max-num-seqs, "256",\n'
                          '             --no-enable-prefix-caching]'))
    flags = 'bench_args: [--num-warmups, "2"' + ("]" if cpu else ', --seed, "0"]')  # `vllm bench serve`'s own
    points = (f"  - {{isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 8x, {flags}}}\n" if cpu else
              f"  - {{isl: 128, osl: 64, concurrency: 1, num_prompts: 16, {flags}}}\n"
              f"  - {{isl: 128, osl: 64, concurrency: [8, 16], num_prompts: 8x, {flags}}}\n"
              f"  - {{isl: 1024, osl: 1024, concurrency: [1, 32], num_prompts: 3x, {flags}}}\n")
    return f"""\
# {name}: your router-gate change against the same vLLM without it, one server at a time (ABBA rounds: a fresh
# server per arm per round, the arms in a fresh random order), rounds until the declared test decides.
# Written by `suite init`; `suite validate {name}.yaml` checks it, `suite run {name}.yaml --dry-run` shows the plan
# and how long it takes. Every field: docs/guide.md.
name: {name}
description: >-
  {model} on {gpu.upper() if gpu != "cpu" else "a CPU"}: vLLM {vllm} against vLLM {vllm} with {diff_said}.
model:
  id: {model}
{runtime_block}# `vllm serve` flags (vLLM's own): clients ask for the served name; every point's isl + osl fits --max-model-len.
# Prefix caching off: the warm-ups replay the first prompt, and a cache hit would time a different path.
serve_args: {serve_args}
arms:
  baseline: {{vllm: "{vllm}"}}                # the baseline goes through the same door as the change
  patched: {{vllm: "{vllm}", patches: [{patch}]}}
# Where a router-gate change acts: small decode batches (M = concurrency per step). c1-c16 at 128 in / 64 out are
# the points the stored GPU runs decided on; 1024/1024 adds a long decode and a batch where the gate's share is small.
serve:
{points}repeats: auto          # rounds until every point is decided, looks fixed in advance
order: abba
quiet_s: 8             # no request for 8 s after a server answered /health (a just-started server runs slow)
drift_check: true      # each session's first point measured again at its end
verdict:
  metrics: [mean_tpot_ms]    # the decode step, where the gate sits; add output_throughput, mean_ttft_ms, ...
  target_pct: 1              # a point within +/-1 % reads "equal"
  looks: {list(rounds)}       # rounds after which the test looks; the last: the most rounds the run takes
  # what the change should do, per point (better | worse | changed | flat); the card says whether it did:
  # expect: {{isl128-osl64-c1-n16: better, others: flat}}
"""


def run(args: argparse.Namespace) -> int:
    from suite.calibrate import estimate_here
    from suite.commands.validate import patch_problems
    from suite.errors import MatrixError
    from suite.matrix_load import load_matrix, missing_model_paths
    from suite.plan import build_plan

    console = Console()
    path: Path = args.matrix
    if path.exists():
        raise SuiteError(f"{path} exists: give another file name (init never overwrites)")
    vendor, model, _, _, _ = GPUS[args.gpu]
    runtime = args.runtime or ("local" if vendor == "cpu" else "docker")
    vllm = args.vllm or ("0.32.0" if vendor == "cpu" else "0.33.0")
    base = path.resolve().parent
    model = args.model or (_relative(REPO_ROOT / model, base) if vendor == "cpu" else model)  # `make model` writes it
    if args.diff is not None:
        if not args.diff.is_file():
            raise SuiteError(f"--diff {args.diff}: no such file")
        patch, said = _relative(args.diff, base), f"your diff {args.diff.name}"
    else:  # a shipped change of this vendor, as the example to replace
        patch = "rocm-aiter-router-gemm" if vendor == "rocm" else "ll-bf16-router-gemm-dispatch"
        said = f"the {patch} patch set (put yours here: patches: [./mine.diff])"
    name = args.name or path.stem
    text = starter_text(name=name, gpu=args.gpu, runtime=runtime, model=model, vllm=vllm, patch=patch, diff_said=said)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    try:
        m = load_matrix(path)
    except MatrixError as exc:
        path.unlink()
        raise SuiteError(f"the starter would not validate (not written): {exc}") from None
    problems = patch_problems(m, str(path), console)
    console.print(f"wrote {path}")
    for line in missing_model_paths(m):
        console.print(f"  [yellow]warning[/yellow]: {line}", highlight=False)
    for line in estimate_here(m, build_plan(m)).brief():
        console.print("  " + line, markup=False, highlight=False)
    if problems:
        for p in problems:
            console.print(f"[red]{p}[/red]", highlight=False)
        console.print("the matrix is written; fix the diff (or its vLLM release) and run `suite validate` again")
        return 2
    console.print(f"next: suite run {path} --dry-run, then suite run {path}", highlight=False)
    return 0
