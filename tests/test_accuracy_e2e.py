"""End to end with real vLLM servers (tiny MoE on the CPU) and the real lm-eval CLI.

One module-scoped fixture runs everything, one server at a time:
  1. baseline server (the tiny MoE): lm-eval on synthetic GSM8K, greedy equivalence twice, then lm-eval on
     a *calibrated* answer key (see below);
  2. perturbed server (the same model with noised router-gate weights): lm-eval on the calibrated key,
     greedy equivalence.
The tests then check the summaries against numbers recomputed here straight from lm-eval's samples.

Calibrated answer key: a random-weight model never solves a problem, so every accuracy would be 0 and no
question could flip. For half of the questions we replace the reference answer by the number the baseline
model itself produced in step 1 (its flexible-extract output). The baseline then scores on those questions
by construction, and the perturbed arm scores only where its routing change left that number intact, so the
paired numbers (flips, McNemar p) have something to measure. Real model outputs, real lm-eval scoring.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from scipy.special import ndtr

from suite.fixtures.gsm8k import write_synthetic_gsm8k
from suite.stages.accuracy.equivalence import run_equivalence
from suite.stages.accuracy.read import summarize_accuracy, summarize_equivalence
from suite.stages.accuracy.run import SIDECAR, run_accuracy
from suite.stages.accuracy.spec import AccuracyParams
from suite.stages.accuracy.summary import render_accuracy_md

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SERVED = "tiny-moe"
N_QUESTIONS = 20
MAX_GEN_TOKS = 32
EQ_PROMPTS, EQ_TOKENS = 16, 48


def _free_port(lo: int = 18200, hi: int = 18299) -> int:
    for port in range(lo, hi + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


class TinyServer:
    """`vllm serve` of a local model in its own process group; SIGTERM (then SIGKILL) the group on exit."""

    def __init__(self, model: Path, work: Path, startup_timeout_s: float = 240):
        self.model, self.work, self.timeout = model, work, startup_timeout_s
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = work / "server.log"

    def __enter__(self) -> TinyServer:
        tmp = self.work / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env |= {
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        vllm = Path(sys.executable).parent / "vllm"
        cmd = [
            str(vllm), "serve", str(self.model), "--served-model-name", SERVED, "--host", "127.0.0.1",
            "--port", str(self.port), "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "8",
            "--enforce-eager",
        ]  # fmt: skip
        self._logf = self.log.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        t0 = time.monotonic()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self._tail()}")
                if time.monotonic() - t0 > self.timeout:
                    raise RuntimeError(f"vllm serve not healthy after {self.timeout} s:\n{self._tail()}")
                try:
                    with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(1)
        except BaseException:
            self._stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def _stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._logf.close()

    def __exit__(self, *exc: object) -> None:
        self._stop()


def _perturbed_copy(model: Path, out: Path, seed: int = 0) -> Path:
    """The model with Gaussian noise (std = the weights' own std) added to every router-gate weight."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out)
    path = out / "model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(seed)
    gates = [k for k in tensors if k.endswith("block_sparse_moe.gate.weight")]
    assert gates, "no router-gate weights found"
    for k in gates:
        w = tensors[k].float()
        tensors[k] = (w + w.std() * torch.randn(w.shape, generator=gen)).to(tensors[k].dtype)
    path.unlink()
    save_file(tensors, path, metadata={"format": "pt"})
    return out


def _samples(acc_dir: Path) -> dict[tuple[int, str], dict]:
    side = json.loads((acc_dir / SIDECAR).read_text())
    (name,) = side["samples_files"]
    rows = [json.loads(line) for line in (acc_dir / name).read_text().splitlines() if line.strip()]
    return {(r["doc_id"], r["filter"]): r for r in rows}


def _results(acc_dir: Path) -> dict:
    side = json.loads((acc_dir / SIDECAR).read_text())
    (name,) = side["results_files"]
    (entry,) = json.loads((acc_dir / name).read_text())["results"].values()
    return entry


def _calibrated_dataset(src: Path, base_samples: dict, out: Path) -> tuple[Path, set[int]]:
    """Copy the synthetic dataset; even doc_ids get the baseline's own flexible-extract number as answer."""
    shutil.copytree(src, out)
    rows = [json.loads(line) for line in (src / "test.jsonl").read_text().splitlines()]
    keyed = set()
    for doc_id, row in enumerate(rows[:N_QUESTIONS]):
        got = base_samples[(doc_id, "flexible-extract")]["filtered_resps"][0]
        if doc_id % 2 == 0 and got != "[invalid]":
            number = got.replace(",", "").replace("$", "").rstrip(".")
            row["answer"] = f"Calibration key (baseline output).\n#### {number}"
            keyed.add(doc_id)
    (out / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, keyed


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    path = REPO / "models" / "tiny-moe"
    from suite.fixtures.tiny_moe import generate_tiny_moe

    return generate_tiny_moe(path)  # returns at once when the model is already there


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("accuracy-e2e")
    data = write_synthetic_gsm8k(root / "gsm8k-synthetic", n_test=N_QUESTIONS + 10, n_train=10, seed=0)
    perturbed = _perturbed_copy(tiny_model, root / "tiny-moe-perturbed")
    spec = AccuracyParams(
        dataset=str(data), limit=N_QUESTIONS, max_gen_toks=MAX_GEN_TOKS, concurrency=8, num_fewshot=5,
        min_accuracy=0.0, max_drop=0.05,
    )  # fmt: skip
    ns = SimpleNamespace(root=root, spec=spec, timings={})

    def timed(name, fn, **kw):
        t0 = time.monotonic()
        out = fn(**kw)
        ns.timings[name] = round(time.monotonic() - t0, 2)
        return out

    common = {"served_name": SERVED, "tokenizer": str(tiny_model)}
    with TinyServer(tiny_model, root / "srv-base") as srv:
        ns.timings["start_base"] = round(srv.startup_s, 1)
        ns.base_acc = timed(
            "lm_eval_base", run_accuracy, base_url=srv.base_url, spec=spec, out_dir=root / "base" / "accuracy",
            log_path=root / "base" / "lm_eval.log", timeout_s=180, **common,
        )  # fmt: skip
        eq = {"served_name": SERVED, "n_prompts": EQ_PROMPTS, "max_tokens": EQ_TOKENS}
        ns.base_eq1 = timed(
            "equivalence_base",
            run_equivalence,
            base_url=srv.base_url,
            out_path=root / "base" / "eq1.json",
            **eq,
        )
        ns.base_eq2 = run_equivalence(base_url=srv.base_url, out_path=root / "base" / "eq2.json", **eq)
        cal_data, ns.keyed = _calibrated_dataset(data, _samples(ns.base_acc), root / "gsm8k-calibrated")
        ns.cal_spec = spec.model_copy(update={"dataset": str(cal_data)})
        ns.base_cal = timed(
            "lm_eval_base_cal", run_accuracy, base_url=srv.base_url, spec=ns.cal_spec,
            out_dir=root / "base" / "accuracy-cal", log_path=root / "base" / "lm_eval_cal.log", timeout_s=180, **common,
        )  # fmt: skip
    with TinyServer(perturbed, root / "srv-cand") as srv:
        ns.timings["start_cand"] = round(srv.startup_s, 1)
        ns.cand_cal = timed(
            "lm_eval_cand_cal", run_accuracy, base_url=srv.base_url, spec=ns.cal_spec,
            out_dir=root / "cand" / "accuracy-cal", log_path=root / "cand" / "lm_eval_cal.log", timeout_s=180, **common,
        )  # fmt: skip
        ns.cand_eq = run_equivalence(base_url=srv.base_url, out_path=root / "cand" / "eq.json", **eq)
    print(f"\naccuracy e2e timings (s): {ns.timings}")
    return ns


def _recomputed(base: dict, cand: dict, filt: str) -> dict:
    keys = sorted(k for k in base if k[1] == filt)
    b = {k[0]: base[k]["exact_match"] == 1.0 for k in keys}
    c = {k[0]: cand[k]["exact_match"] == 1.0 for k in keys}
    lost = [d for d in b if b[d] and not c[d]]
    gained = [d for d in b if c[d] and not b[d]]
    return {
        "n": len(keys),
        "base_acc": sum(b.values()) / len(keys),
        "cand_acc": sum(c.values()) / len(keys),
        "lost": lost,
        "gained": gained,
        # McNemar's score form: z = (gained - lost) / sqrt(gained + lost)
        "p": 2 * ndtr(-abs(len(gained) - len(lost)) / math.sqrt(len(lost) + len(gained))) if lost or gained else 1.0,
    }


def test_run_accuracy_writes_raw_lm_eval_outputs(arms: SimpleNamespace) -> None:
    side = json.loads((arms.base_acc / SIDECAR).read_text())
    assert side["dataset"]["synthetic"] is True and side["dataset"]["source"] == "local"
    assert side["offline_env"] == {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = side["command"]
    assert cmd[cmd.index("--model") + 1] == "local-completions"
    assert cmd[cmd.index("--limit") + 1] == str(N_QUESTIONS)
    assert "--log_samples" in cmd and f"max_gen_toks={MAX_GEN_TOKS}" in cmd
    samples = _samples(arms.base_acc)
    assert len(samples) == 2 * N_QUESTIONS  # one line per question per filter
    assert {k[1] for k in samples} == {"strict-match", "flexible-extract"}
    assert all(r["resps"][0][0] for r in samples.values()), "empty completions"


def test_summary_equals_numbers_recomputed_from_samples(arms: SimpleNamespace) -> None:
    s = summarize_accuracy(arms.base_acc, arms.base_acc, arms.spec)  # an arm against itself
    samples = _samples(arms.base_acc)
    reported = _results(arms.base_acc)
    for f in s.filters:
        r = _recomputed(samples, samples, f.filter)
        assert f.n_paired == r["n"] == N_QUESTIONS
        assert (
            f.base.acc == pytest.approx(r["base_acc"]) == pytest.approx(reported[f"exact_match,{f.filter}"])
        )
        assert f.base.stderr == pytest.approx(reported[f"exact_match_stderr,{f.filter}"])
        assert (f.lost, f.gained, f.delta, f.mcnemar_p) == (0, 0, 0.0, 1.0)
    # the random-weight model answers nothing right: the gate cannot judge a drop from 0 (UNINFORMATIVE)
    assert s.verdict == "UNINFORMATIVE" and s.synthetic
    assert "SYNTHETIC" in render_accuracy_md(s)


def test_equivalence_same_server_twice_is_identical(arms: SimpleNamespace) -> None:
    e = summarize_equivalence(arms.base_eq1, arms.base_eq2)
    assert e.unit == "tokens"
    assert (e.n, e.n_identical, e.share_identical, e.median_first_divergence) == (
        EQ_PROMPTS,
        EQ_PROMPTS,
        1.0,
        None,
    )
    data = json.loads(arms.base_eq1.read_text())
    assert all(len(r["token_ids"]) > 0 for r in data["results"])


def test_perturbed_arm_diverges_in_greedy_completions(arms: SimpleNamespace) -> None:
    e = summarize_equivalence(arms.base_eq1, arms.cand_eq)
    assert e.n == EQ_PROMPTS and e.share_identical < 1.0
    base = json.loads(arms.base_eq1.read_text())["results"]
    cand = json.loads(arms.cand_eq.read_text())["results"]
    for b, c, pos in zip(base, cand, e.first_divergence, strict=True):
        if pos is None:
            assert b["token_ids"] == c["token_ids"]
        else:
            assert b["token_ids"][:pos] == c["token_ids"][:pos]
            assert (
                pos == min(len(b["token_ids"]), len(c["token_ids"]))
                or b["token_ids"][pos] != c["token_ids"][pos]
            )


def test_perturbed_arm_paired_numbers(arms: SimpleNamespace) -> None:
    s = summarize_accuracy(
        arms.base_cal, arms.cand_cal, arms.cal_spec, base_label="baseline", cand_label="perturbed"
    )
    base, cand = _samples(arms.base_cal), _samples(arms.cand_cal)
    for f in s.filters:
        r = _recomputed(base, cand, f.filter)
        assert f.n_paired == r["n"]
        assert (f.base.acc, f.cand.acc) == (pytest.approx(r["base_acc"]), pytest.approx(r["cand_acc"]))
        assert list(f.lost_doc_ids) == r["lost"] and list(f.gained_doc_ids) == r["gained"]
        assert f.mcnemar_p == pytest.approx(r["p"])
        assert f.both_correct + f.both_wrong + f.lost + f.gained == f.n_paired
        assert f.delta == pytest.approx((f.gained - f.lost) / f.n_paired)
    flex = s.by_filter("flexible-extract")
    # the baseline answers its own calibrated key (greedy on one server; allow a little batch-order noise,
    # the requests run 8 at a time) ...
    base_right = {
        d for (d, filt), row in base.items() if filt == "flexible-extract" and row["exact_match"] == 1.0
    }
    assert len(arms.keyed) >= N_QUESTIONS // 4 and len(arms.keyed & base_right) >= 0.8 * len(arms.keyed)
    # ... and the perturbed routing changes some of those answers: the paired numbers move.
    assert flex.lost >= 1 and flex.delta < 0
    gate = {g.name: g for g in s.gates}
    assert gate["max_drop"].passed == (flex.base.acc - flex.cand.acc <= 0.05)
    assert s.verdict == ("PASS" if all(g.passed for g in s.gates) else "FAIL")
    md = render_accuracy_md(s, summarize_equivalence(arms.base_eq1, arms.cand_eq))
    assert "| flexible-extract |" in md and "perturbed" in md and "Greedy equivalence" in md
    print("\n" + md)
