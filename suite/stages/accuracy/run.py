"""Run lm-eval (the real ``lm-eval run`` CLI) against one arm's live vLLM server.

The hub dataset (``openai/gsm8k``) is used as lm-eval ships it. A local directory with ``train.jsonl`` and
``test.jsonl`` runs offline: a task YAML is generated that *includes* lm-eval's own task file (prompt,
filters, metrics unchanged) and only swaps the data source for local JSON files (no dataset download).

lm-eval's raw outputs (``results_*.json``, ``samples_*.jsonl``) stay under ``out_dir`` exactly as lm-eval
writes them; beside them ``suite-accuracy.json`` records the command, the dataset, which files this run
produced and how long it took. ``suite.stages.accuracy.summary`` reads them back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from suite.errors import SuiteError
from suite.fixtures.gsm8k import is_synthetic_dataset, write_synthetic_gsm8k
from suite.lm_eval_flags import MODEL_OF
from suite.proc import LM_EVAL_PYTHON, ask, failure, run_tool
from suite.records import JobNotes
from suite.stages.accuracy.spec import AccuracyParams
from suite.stages.base import JobEnv
from suite.store import atomic_write_json

SIDECAR = "suite-accuracy.json"
SCHEMA = "suite.accuracy/1"
TASK_DIR = "task"
LOCAL_TASK_PREFIX = "suite_local_"
HUB_DATASET = "openai/gsm8k"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def is_local_dataset(dataset: str) -> bool:
    """True when ``dataset`` names an existing directory (else it is a hub id)."""
    return Path(dataset).is_dir()


def local_task_name(task: str) -> str:
    return LOCAL_TASK_PREFIX + task


# The same search as lm_eval_task_yaml, as a script for the interpreter that runs lm-eval (LM_EVAL_PYTHON: under
# the docker runtime the arm image's lm-eval venv), so the path it prints is valid where lm-eval runs.
FIND_TASK_YAML = r"""
import importlib.util, pathlib, re, sys
task = sys.argv[1]
spec = importlib.util.find_spec("lm_eval")
if spec is None or spec.origin is None:
    sys.exit("lm-eval is not installed in this Python environment (pip install 'lm-eval[api]')")
root = pathlib.Path(spec.origin).parent / "tasks"
pattern = re.compile(r"^task:\s*['\"]?" + re.escape(task) + r"['\"]?\s*$", re.M)
for path in sorted(root.rglob(task + ".yaml")) + sorted(root.rglob("*.yaml")):
    try:
        if pattern.search(path.read_text()):
            print(path)
            sys.exit(0)
    except OSError:
        pass
sys.exit(f"lm-eval has no task {task!r} under {root}")
"""


def tool_task_yaml(task: str, argv: Callable[[list[str]], list[str]], env: dict | None = None) -> str:
    """lm-eval's own YAML that defines ``task``, as the tool that runs lm-eval sees it (``argv`` maps a
    ``lm-eval-python ...`` command line onto that tool's interpreter: JobEnv.client_argv)."""
    cmd = argv([LM_EVAL_PYTHON, "-c", FIND_TASK_YAML, task])
    proc = ask(cmd, env=env, timeout_s=300, what=f"cannot locate lm-eval's {task} task")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SuiteError(f"cannot locate lm-eval's {task} task: {(proc.stderr or proc.stdout).strip()[-500:]}\n"
                         f"  command: {shlex.join(cmd)}")
    return proc.stdout.strip().splitlines()[-1]


def lm_eval_task_yaml(task: str) -> Path:
    """lm-eval's own YAML that defines ``task`` (found inside the installed lm_eval package)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        raise SuiteError("lm-eval is not installed in this Python environment (pip install 'lm-eval[api]')")
    tasks_root = Path(spec.origin).parent / "tasks"
    pattern = re.compile(rf"^task:\s*['\"]?{re.escape(task)}['\"]?\s*$", re.M)
    for path in sorted(tasks_root.rglob(f"{task}.yaml")) + sorted(tasks_root.rglob("*.yaml")):
        try:
            if pattern.search(path.read_text()):
                return path
        except OSError:
            continue
    raise SuiteError(f"lm-eval has no task {task!r} under {tasks_root}")


def write_local_task(spec: AccuracyParams, include_dir: Path, task_yaml: str | None = None) -> str:
    """Write a task YAML reading ``spec.dataset``'s local JSON files; returns the task name. ``task_yaml``:
    lm-eval's own YAML of the task as lm-eval's interpreter sees it (default: this interpreter's lm-eval)."""
    data = Path(spec.dataset).resolve()
    files = {split: data / f"{split}.jsonl" for split in ("train", "test")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise SuiteError(
            f"accuracy dataset {data}: missing {', '.join(missing)} (need train.jsonl and test.jsonl)"
        )
    name = local_task_name(spec.task)
    include_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "include": task_yaml or str(lm_eval_task_yaml(spec.task)),
        "task": name,
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {k: str(v) for k, v in files.items()}},
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
    }
    # JSON is valid YAML; it keeps paths with odd characters quoted correctly.
    (include_dir / f"{name}.yaml").write_text(json.dumps(body, indent=2) + "\n")
    return name


def _endpoint_url(base_url: str, endpoint: str) -> str:
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return f"{root}/v1/chat/completions" if endpoint == "chat" else f"{root}/v1/completions"


def _model_args(base_url: str, served_name: str, tokenizer: str, spec: AccuracyParams,
                trust_remote_code: bool = False) -> str:
    for label, value in (("served name", served_name), ("tokenizer", tokenizer), ("base_url", base_url)):
        if "," in value:
            raise SuiteError(f"lm-eval model_args cannot carry a {label} containing ',': {value!r}")
    args = {
        "model": served_name,
        "base_url": _endpoint_url(base_url, spec.endpoint),
        "num_concurrent": str(spec.concurrency),
        "max_retries": "3",
        "seed": str(spec.seed),
    }
    if Path(tokenizer).is_dir():  # a local tokenizer: absolute, so lm-eval never mistakes it for a hub id
        tokenizer = str(Path(tokenizer).resolve())
    if spec.endpoint == "completions":
        args |= {"tokenizer": tokenizer, "tokenizer_backend": "huggingface", "tokenized_requests": "False"}
        if trust_remote_code:  # the tokenizer loads here, as the server's does
            args["trust_remote_code"] = "True"
    return ",".join(f"{k}={v}" for k, v in args.items())


def lm_eval_command(
    *,
    base_url: str,
    served_name: str,
    tokenizer: str,
    spec: AccuracyParams,
    out_dir: Path,
    include_dir: Path | None,
    trust_remote_code: bool = False,
) -> list[str]:
    """The exact ``lm-eval run`` command line for one arm (pure: writes nothing).

    ``include_dir`` holds the generated local task (see ``write_local_task``); ``None`` = lm-eval's own task
    (hub dataset).
    """
    task = local_task_name(spec.task) if include_dir is not None else spec.task
    cmd = [
        sys.executable, "-m", "lm_eval", "run",
        "--model", MODEL_OF[spec.endpoint],
        "--model_args", _model_args(base_url, served_name, tokenizer, spec, trust_remote_code),
        "--tasks", task,
        "--num_fewshot", str(spec.num_fewshot),
        "--seed", str(spec.seed),
        "--gen_kwargs", f"max_gen_toks={spec.max_gen_toks}",
        "--output_path", str(out_dir),
        "--log_samples",
    ]  # fmt: skip
    if spec.limit is not None:
        cmd += ["--limit", str(spec.limit)]
    if spec.endpoint == "chat":
        cmd += ["--apply_chat_template"]
    if include_dir is not None:
        cmd += ["--include_path", str(include_dir)]
    return cmd


def _outputs(out_dir: Path) -> set[Path]:
    return {p for pat in ("results_*.json", "samples_*.jsonl") for p in out_dir.rglob(pat)}


def run_accuracy(
    *,
    base_url: str,
    served_name: str,
    tokenizer: str,
    spec: AccuracyParams,
    out_dir: Path,
    log_path: Path,
    env: dict | None = None,
    timeout_s: float | None = None,
    cpus: frozenset[int] | None = None,
    argv: Callable[[list[str]], list[str]] | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """Run lm-eval on the live server at ``base_url``; returns ``out_dir`` holding its raw outputs. ``argv``
    (JobEnv.client_argv) maps the ``lm-eval-python -m lm_eval ...`` command onto the tool that runs it (the
    docker runtime: the lm-eval venv of the arm's image, in the server's container); default: this
    interpreter.

    Raises ``SuiteError`` (with the command and the log tail) when lm-eval fails, times out or writes no
    samples.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    local = is_local_dataset(spec.dataset)
    include_dir = out_dir / TASK_DIR if local else None
    if include_dir is not None:
        write_local_task(spec, include_dir, tool_task_yaml(spec.task, argv, env) if argv is not None else None)
    elif spec.dataset != HUB_DATASET:
        raise SuiteError(
            f"accuracy dataset {spec.dataset!r} is neither an existing local directory nor lm-eval's own "
            f"{HUB_DATASET!r}; give a directory with train.jsonl and test.jsonl"
        )
    cmd = lm_eval_command(
        base_url=base_url, served_name=served_name, tokenizer=tokenizer, spec=spec, out_dir=out_dir,
        include_dir=include_dir, trust_remote_code=trust_remote_code,
    )  # fmt: skip
    if argv is not None:
        cmd = argv([LM_EVAL_PYTHON, *cmd[1:]])
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    hf_cache: tempfile.TemporaryDirectory[str] | None = None
    if local:
        run_env |= OFFLINE_ENV
        # A private datasets cache: the local JSON files are re-read every run, never served stale.
        hf_cache = tempfile.TemporaryDirectory(prefix="suite-lmeval-ds-")
        run_env["HF_DATASETS_CACHE"] = hf_cache.name
    before = _outputs(out_dir)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    try:
        run_tool(cmd, env=run_env, log_path=log_path, timeout_s=timeout_s, what="lm-eval",
                 header=f"$ {shlex.join(cmd)}\n", cpus=cpus)
    finally:
        if hf_cache is not None:
            hf_cache.cleanup()
    duration = time.monotonic() - t0
    new = sorted(_outputs(out_dir) - before)
    samples = [p for p in new if p.name.startswith("samples_")]
    results = [p for p in new if p.name.startswith("results_")]
    if not samples or not results:
        raise failure("lm-eval", "failed (no results/samples file written)", cmd, log_path)
    sidecar = {
        "schema": SCHEMA,
        "command": cmd,
        "offline_env": OFFLINE_ENV if local else {},
        "task": spec.task,
        "lm_eval_task": local_task_name(spec.task) if local else spec.task,
        "spec": spec.model_dump(mode="json"),
        "dataset": {
            "source": "local" if local else "hub",
            "path": str(Path(spec.dataset).resolve()) if local else spec.dataset,
            "synthetic": bool(local and is_synthetic_dataset(spec.dataset)),
        },
        "served_name": served_name,
        "base_url": base_url,
        "results_files": [str(p.relative_to(out_dir)) for p in results],
        "samples_files": [str(p.relative_to(out_dir)) for p in samples],
        "started_at": started.isoformat(),
        "duration_s": round(duration, 3),
    }
    atomic_write_json(out_dir / SIDECAR, sidecar)
    return out_dir


def resolve_spec(spec: AccuracyParams, run_root: Path) -> AccuracyParams:
    """`dataset: synthetic` becomes a GSM8K-format set generated once per run under ``run_root/data``."""
    if spec.dataset != "synthetic":
        return spec
    data = run_root / "data" / "gsm8k-synthetic"
    if not (data / "test.jsonl").is_file():
        write_synthetic_gsm8k(data, n_test=spec.limit or 50, seed=spec.seed)
    return spec.model_copy(update={"dataset": str(data)})


def execute(env: JobEnv) -> JobNotes:
    """lm-eval against the session's server; raw outputs kept in the job's result directory."""
    assert env.server is not None
    run_accuracy(base_url=env.server.base_url, served_name=env.model.served_name, tokenizer=env.tokenizer,
                 spec=resolve_spec(AccuracyParams.model_validate(env.job.params), env.run_root), out_dir=env.result,
                 log_path=env.log, env=env.client_env, cpus=env.client_cpus, argv=env.client_argv,
                 trust_remote_code=env.trust_remote_code)
    return JobNotes()
