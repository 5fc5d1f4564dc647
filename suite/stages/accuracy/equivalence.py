"""Greedy equivalence: a fixed prompt set sent at temperature 0 to one arm's server.

The prompt set is a pure function of ``(n_prompts, seed)`` -- identical on every arm -- and mixes synthetic
GSM8K-style questions with short free-text prompts. Requests go one at a time, so every prompt runs in a
batch of one on every arm (batch composition cannot differ between arms or between runs). Token ids come
back through vLLM's ``return_token_ids``; a server that does not return them is compared on text instead
(``unit: "chars"``). ``suite.stages.accuracy.summary.summarize_equivalence`` compares two such files.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from suite.errors import SuiteError
from suite.fixtures.gsm8k import synthetic_problems
from suite.records import JobNotes
from suite.stages.accuracy.spec import AccuracyParams
from suite.stages.base import JobEnv
from suite.store import atomic_write_json

SCHEMA = "suite.equivalence/1"
_WORDS = (
    "the router sends each token to two experts and the gate decides which ones because a small change in "
    "the logits can move a token from one expert to another so the output of the layer may drift while "
    "throughput improves we measure both and report what changed over the whole batch after every step"
).split()
_OPENERS = (
    "Once upon a time",
    "The main reason why",
    "In a small village by the sea,",
    "Here is a list of things to check before a long trip:",
    "The results of the experiment showed that",
    "def fibonacci(n):",
    "A mixture of experts layer works as follows.",
    "Dear team, thank you for",
)


def equivalence_prompts(n_prompts: int, seed: int = 0) -> list[str]:
    """The fixed prompt set: depends on ``n_prompts`` and ``seed`` only."""
    rng = random.Random(f"suite-equivalence-{seed}")
    questions = synthetic_problems((n_prompts + 1) // 2, seed + 7919)
    prompts: list[str] = []
    for i in range(n_prompts):
        if i % 2 == 0:
            prompts.append(f"Question: {questions[i // 2]['question']}\nAnswer:")
        else:
            tail = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 20)))
            prompts.append(f"{rng.choice(_OPENERS)} {tail}")
    return prompts


def prompt_set_sha256(prompts: list[str]) -> str:
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()


def _post(url: str, payload: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:500]
        raise SuiteError(f"equivalence: POST {url} -> HTTP {exc.code}: {body}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SuiteError(f"equivalence: POST {url} failed: {exc}") from None


def run_equivalence(
    *,
    base_url: str,
    served_name: str,
    n_prompts: int,
    max_tokens: int,
    out_path: Path,
    seed: int = 0,
    request_timeout_s: float = 300.0,
) -> Path:
    """Send the fixed prompt set greedily to ``base_url``; write the completions to ``out_path`` (atomic)."""
    if n_prompts <= 0 or max_tokens <= 0:
        raise SuiteError("equivalence: n_prompts and max_tokens must be > 0")
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/completions"
    prompts = equivalence_prompts(n_prompts, seed)
    results = []
    started = datetime.now(UTC)
    t0 = time.monotonic()
    for i, prompt in enumerate(prompts):
        payload = {
            "model": served_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "n": 1,
            "seed": seed,
            "return_token_ids": True,
        }
        body = _post(url, payload, request_timeout_s)
        try:
            choice = body["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise SuiteError(f"equivalence: unexpected response from {url}: {str(body)[:500]}") from None
        token_ids = choice.get("token_ids")
        results.append(
            {
                "index": i,
                "prompt": prompt,
                "text": choice.get("text", ""),
                "token_ids": list(token_ids) if token_ids is not None else None,
                "finish_reason": choice.get("finish_reason"),
                "completion_tokens": (body.get("usage") or {}).get("completion_tokens"),
            }
        )
    unit = "tokens" if all(r["token_ids"] is not None for r in results) else "chars"
    data = {
        "schema": SCHEMA,
        "served_name": served_name,
        "base_url": base_url,
        "seed": seed,
        "n_prompts": n_prompts,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "concurrency": 1,
        "prompt_set_sha256": prompt_set_sha256(prompts),
        "unit": unit,
        "started_at": started.isoformat(),
        "duration_s": round(time.monotonic() - t0, 3),
        "results": results,
    }
    out_path = Path(out_path)
    atomic_write_json(out_path, data)
    return out_path


def execute(env: JobEnv) -> JobNotes:
    """Greedy completions of a fixed prompt set from the session's server (compared across arms)."""
    assert env.server is not None
    spec = AccuracyParams.model_validate(env.job.params)
    run_equivalence(base_url=env.server.base_url, served_name=env.model.served_name, n_prompts=spec.equivalence_prompts,
                    max_tokens=spec.equivalence_max_tokens, out_path=env.result, seed=spec.seed)
    return JobNotes()
