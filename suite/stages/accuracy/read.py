"""Reading lm-eval outputs and greedy-equivalence files into typed, paired per-question results.

Accuracy: samples are paired on ``(doc_id, filter)``; per filter the paired numbers come from
`suite.accuracy_stats.paired_accuracy` (McNemar's score test and Tango's score interval on the difference: one
statistic). Gates judge that interval, not a point estimate: ``max_drop`` through
`suite.accuracy_stats.accuracy_gate`, ``min_accuracy`` through the candidate's Wilson interval; each gate is PASS / FAIL / INCONCLUSIVE / UNINFORMATIVE.

Equivalence: two ``run_equivalence`` files -> share of identical greedy completions and the median position
of the first differing token among the completions that differ.

`compare_arms` finds both through the store from a run's job records.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from suite.accuracy_stats import (
    GateOutcome,
    PairedAccuracy,
    accuracy_gate,
    accuracy_gate_reason,
    paired_accuracy,
)
from suite.errors import SuiteError
from suite.plan import Job
from suite.records import JobRecord
from suite.stages.accuracy.spec import AccuracyParams
from suite.store import RunStore

FILTERS = ("strict-match", "flexible-extract")
GATE_FILTER = "flexible-extract"
SIDECAR = "suite-accuracy.json"  # written by suite.stages.accuracy.run.run_accuracy
CONFIDENCE = 0.95
# worst first: one failing gate fails the arm; an undecided one leaves it undecided
GATE_ORDER = (GateOutcome.FAIL, GateOutcome.INCONCLUSIVE, GateOutcome.UNINFORMATIVE, GateOutcome.PASS)


@dataclass(frozen=True)
class ArmScore:
    correct: int
    n: int
    acc: float
    stderr: float
    reported_acc: float | None = None  # lm-eval's own number from results_*.json, for cross-checking
    reported_stderr: float | None = None


@dataclass(frozen=True)
class FilterComparison:
    filter: str
    n_paired: int
    base: ArmScore
    cand: ArmScore
    paired: PairedAccuracy  # McNemar p, the interval on the paired difference
    both_correct: int
    both_wrong: int
    lost_doc_ids: tuple[int, ...] = ()  # right on base, wrong on candidate
    gained_doc_ids: tuple[int, ...] = ()  # wrong on base, right on candidate
    answers_changed: int | None = None  # questions whose extracted answer differs (None: not in the samples)

    @property
    def delta(self) -> float:
        return self.paired.delta

    @property
    def lost(self) -> int:
        return self.paired.flipped_to_wrong

    @property
    def gained(self) -> int:
        return self.paired.flipped_to_correct

    @property
    def mcnemar_p(self) -> float:
        return self.paired.p_value

    @property
    def uninformative(self) -> bool:
        """No arm answers any question right: "+0.0 pp, p = 1" would say nothing about a change."""
        return self.base.correct == 0 and self.cand.correct == 0


@dataclass(frozen=True)
class GateResult:
    name: str  # "min_accuracy" | "max_drop" | "filter_missing"
    filter: str
    threshold: float  # fraction (0.05 = 5 pp)
    value: float  # the point estimate the gate is about (accuracy, or drop), fraction
    outcome: GateOutcome
    reason: str

    @property
    def status(self) -> str:
        return self.outcome.value

    @property
    def passed(self) -> bool:
        return self.outcome == GateOutcome.PASS


@dataclass(frozen=True)
class ArmRun:
    """Where one arm's numbers came from."""

    dir: str
    samples_file: str
    results_file: str | None
    lm_eval_task: str
    dataset: str | None = None
    synthetic: bool = False
    duration_s: float | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    max_gen_toks: int | None = None


@dataclass(frozen=True)
class AccuracyComparison:
    task: str
    base_label: str
    cand_label: str
    n_questions: int
    filters: tuple[FilterComparison, ...]
    gates: tuple[GateResult, ...]
    verdict: str  # a GateOutcome value, or "NO GATES"
    base_run: ArmRun
    cand_run: ArmRun
    synthetic: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # questions whose whole generated response differs (lm-eval generates greedily): a change in the model's
    # outputs, right or wrong; None when the samples hold no responses
    responses_changed: int | None = None

    def by_filter(self, name: str) -> FilterComparison:
        for f in self.filters:
            if f.filter == name:
                return f
        raise KeyError(name)


@dataclass(frozen=True)
class EquivalenceSummary:
    n: int
    n_identical: int
    share_identical: float
    median_first_divergence: float | None  # over the differing completions; None when all are identical
    unit: str  # "tokens" | "chars"
    first_divergence: tuple[int | None, ...]  # per prompt; None = identical
    max_tokens: int | None = None
    prompt_set_sha256: str | None = None


def mean_stderr(values: list[float]) -> float:
    """Standard error of the mean with the sample (n-1) standard deviation, as lm-eval reports it."""
    if len(values) < 2:
        return float("nan")
    return statistics.stdev(values) / math.sqrt(len(values))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read {path}: {exc}") from None


def _locate(arm_dir: Path) -> tuple[Path, Path | None, dict[str, Any]]:
    """The samples file, the results file and the sidecar (may be empty) of one arm's accuracy dir."""
    arm_dir = Path(arm_dir)
    if not arm_dir.is_dir():
        raise SuiteError(f"accuracy output {arm_dir} does not exist")
    sidecar_path = arm_dir / SIDECAR
    sidecar: dict[str, Any] = _read_json(sidecar_path) if sidecar_path.is_file() else {}
    if sidecar.get("samples_files"):
        samples = [arm_dir / p for p in sidecar["samples_files"]]
        results = [arm_dir / p for p in sidecar.get("results_files", [])]
    else:
        samples = sorted(arm_dir.rglob("samples_*.jsonl"), key=lambda p: p.name.rsplit("_", 1)[-1])
        results = sorted(arm_dir.rglob("results_*.json"), key=lambda p: p.name.rsplit("_", 1)[-1])
        # No sidecar: take the newest run in the directory (lm-eval puts the run's timestamp in every name).
        if samples:
            stamp = samples[-1].name.rsplit("_", 1)[-1].removesuffix(".jsonl")
            samples = [p for p in samples if p.name.endswith(f"_{stamp}.jsonl")]
            results = [p for p in results if p.name == f"results_{stamp}.json"]
    if len(samples) != 1:
        found = ", ".join(str(p) for p in samples) or "none"
        raise SuiteError(f"{arm_dir}: expected one lm-eval samples_*.jsonl file, found {found}")
    return samples[0], (results[0] if results else None), sidecar


def _read_samples(path: Path) -> dict[tuple[int, str], dict[str, Any]]:
    out: dict[tuple[int, str], dict[str, Any]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SuiteError(f"cannot read {path}: {exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = (int(row["doc_id"]), str(row["filter"]))
            correct = float(row["exact_match"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SuiteError(
                f"{path}:{lineno}: not an lm-eval sample with doc_id/filter/exact_match: {exc}"
            ) from None
        if correct not in (0.0, 1.0):
            raise SuiteError(f"{path}:{lineno}: exact_match {correct} is not 0 or 1")
        if key in out:
            raise SuiteError(f"{path}:{lineno}: duplicate sample for doc_id {key[0]} filter {key[1]}")
        row["_correct"] = correct == 1.0
        out[key] = row
    if not out:
        raise SuiteError(f"{path}: no samples")
    return out


def _reported(results_path: Path | None, task: str | None, filt: str) -> tuple[float | None, float | None]:
    if results_path is None or not results_path.is_file():
        return None, None
    res = _read_json(results_path).get("results", {})
    entry = res.get(task) if task else None
    if entry is None and len(res) == 1:
        entry = next(iter(res.values()))
    if not isinstance(entry, dict):
        return None, None
    acc, err = entry.get(f"exact_match,{filt}"), entry.get(f"exact_match_stderr,{filt}")
    to_float = lambda v: float(v) if isinstance(v, int | float) else None  # noqa: E731 ("N/A" for n=1)
    return to_float(acc), to_float(err)


def _arm_run(arm_dir: Path, samples: Path, results: Path | None, sidecar: dict[str, Any]) -> ArmRun:
    spec = sidecar.get("spec", {})
    dataset = sidecar.get("dataset", {})
    task = sidecar.get("lm_eval_task") or samples.name.removeprefix("samples_").rsplit("_", 1)[0]
    return ArmRun(
        dir=str(arm_dir),
        samples_file=str(samples.relative_to(arm_dir)),
        results_file=str(results.relative_to(arm_dir)) if results else None,
        lm_eval_task=task,
        dataset=dataset.get("path"),
        synthetic=bool(dataset.get("synthetic", False)),
        duration_s=sidecar.get("duration_s"),
        num_fewshot=spec.get("num_fewshot"),
        limit=spec.get("limit"),
        max_gen_toks=spec.get("max_gen_toks"),
    )


def _score(rows: list[dict[str, Any]], reported: tuple[float | None, float | None]) -> ArmScore:
    values = [1.0 if r["_correct"] else 0.0 for r in rows]
    return ArmScore(
        correct=int(sum(values)),
        n=len(values),
        acc=sum(values) / len(values),
        stderr=mean_stderr(values),
        reported_acc=reported[0],
        reported_stderr=reported[1],
    )


def _min_accuracy_gate(flex: FilterComparison, floor: float) -> GateResult:
    """The candidate's accuracy is at least ``floor``: PASS when its Wilson interval lies at or above it,
    FAIL when the interval lies below, INCONCLUSIVE when it straddles the floor; UNINFORMATIVE at a floor
    of 0 (nothing could fail it)."""
    lo, hi = (binomtest(flex.cand.correct, flex.cand.n).proportion_ci(CONFIDENCE, method="wilson")
              if flex.cand.n else (0.0, 1.0))
    ci = f"{CONFIDENCE:.0%} [{100 * lo:.1f}, {100 * hi:.1f}] %"
    acc = f"{100 * flex.cand.acc:.1f} % ({ci})"
    if floor <= 0:
        outcome, reason = GateOutcome.UNINFORMATIVE, f"{acc}: a floor of 0 cannot fail"
    elif lo >= floor:
        outcome, reason = GateOutcome.PASS, f"{acc} ≥ floor {100 * floor:.1f} %"
    elif hi < floor:
        outcome, reason = GateOutcome.FAIL, f"{acc} below floor {100 * floor:.1f} %"
    else:
        outcome, reason = GateOutcome.INCONCLUSIVE, f"{acc} straddles floor {100 * floor:.1f} %"
    return GateResult("min_accuracy", flex.filter, floor, flex.cand.acc, outcome, reason)


def _gates(spec: Any, flex: FilterComparison) -> list[GateResult]:
    gates = []
    min_accuracy = getattr(spec, "min_accuracy", None)
    max_drop = getattr(spec, "max_drop", None)
    if min_accuracy is not None:
        gates.append(_min_accuracy_gate(flex, min_accuracy))
    if max_drop is not None:
        outcome = accuracy_gate(flex.paired, 100 * max_drop)
        gates.append(GateResult("max_drop", flex.filter, max_drop, -flex.delta, outcome,
                                accuracy_gate_reason(flex.paired, 100 * max_drop)))
    return gates


def gate_verdict(gates: tuple[GateResult, ...] | list[GateResult]) -> str:
    """The arm's accuracy verdict: the worst gate (FAIL, then INCONCLUSIVE, UNINFORMATIVE, PASS)."""
    if not gates:
        return "NO GATES"
    return next(o for o in GATE_ORDER if any(g.outcome == o for g in gates)).value


def _changed(base: dict[tuple[int, str], dict[str, Any]], cand: dict[tuple[int, str], dict[str, Any]],
             keys: list[tuple[int, str]], field_: str) -> int | None:
    """How many of ``keys`` hold a different ``field_`` (lm-eval's `resps` / `filtered_resps`) in the two arms;
    None when a sample lacks it."""
    if not all(field_ in base[k] and field_ in cand[k] for k in keys):
        return None
    return sum(1 for k in keys if base[k][field_] != cand[k][field_])


def summarize_accuracy(
    base_dir: Path,
    cand_dir: Path,
    spec: Any = None,
    *,
    base_label: str = "baseline",
    cand_label: str = "patched",
) -> AccuracyComparison:
    """Pair two arms' lm-eval samples on (doc_id, filter) and compute the paired numbers and gates.

    ``spec`` is the job's ``AccuracyParams`` (only ``min_accuracy`` and ``max_drop`` are read; ``None`` =
    no gates). Raises ``SuiteError`` when the arms did not evaluate the same questions with the same prompts.
    """
    base_dir, cand_dir = Path(base_dir), Path(cand_dir)
    b_samples, b_results, b_side = _locate(base_dir)
    c_samples, c_results, c_side = _locate(cand_dir)
    base_run = _arm_run(base_dir, b_samples, b_results, b_side)
    cand_run = _arm_run(cand_dir, c_samples, c_results, c_side)
    base, cand = _read_samples(b_samples), _read_samples(c_samples)
    if set(base) != set(cand):
        only_b, only_c = sorted(set(base) - set(cand)), sorted(set(cand) - set(base))
        raise SuiteError(
            f"the arms evaluated different questions: {len(only_b)} (doc_id, filter) pairs only in {base_dir}, "
            f"{len(only_c)} only in {cand_dir} (e.g. {(only_b or only_c)[:3]}); give both the same limit and dataset"
        )
    for key in sorted(base):
        for h in ("doc_hash", "prompt_hash"):
            if h in base[key] and h in cand[key] and base[key][h] != cand[key][h]:
                raise SuiteError(
                    f"doc_id {key[0]}: {h} differs between {b_samples} and {c_samples}; the arms saw different "
                    f"{'questions' if h == 'doc_hash' else 'prompts (few-shot examples, template or seed)'}"
                )
    filters = [f for f in FILTERS if any(k[1] == f for k in base)]
    filters += sorted({k[1] for k in base} - set(filters))
    comparisons = []
    for filt in filters:
        keys = sorted(k for k in base if k[1] == filt)
        paired = paired_accuracy({k: base[k]["_correct"] for k in keys}, {k: cand[k]["_correct"] for k in keys},
                                 confidence=CONFIDENCE)
        lost_ids = tuple(k[0] for k in keys if base[k]["_correct"] and not cand[k]["_correct"])
        gained_ids = tuple(k[0] for k in keys if not base[k]["_correct"] and cand[k]["_correct"])
        both = sum(1 for k in keys if base[k]["_correct"] and cand[k]["_correct"])
        comparisons.append(
            FilterComparison(
                filter=filt,
                n_paired=len(keys),
                base=_score([base[k] for k in keys], _reported(b_results, base_run.lm_eval_task, filt)),
                cand=_score([cand[k] for k in keys], _reported(c_results, cand_run.lm_eval_task, filt)),
                paired=paired,
                both_correct=both,
                both_wrong=len(keys) - both - len(lost_ids) - len(gained_ids),
                lost_doc_ids=lost_ids,
                gained_doc_ids=gained_ids,
                answers_changed=_changed(base, cand, keys, "filtered_resps"),
            )
        )
    gates: list[GateResult] = []
    notes: list[str] = []
    flex = next((c for c in comparisons if c.filter == GATE_FILTER), None)
    if flex is not None:
        gates = _gates(spec, flex)
    elif spec is not None and (
        getattr(spec, "min_accuracy", None) is not None or getattr(spec, "max_drop", None) is not None
    ):
        notes.append(f"gates not evaluated: the samples have no {GATE_FILTER} filter")
        gates = [GateResult("filter_missing", GATE_FILTER, float("nan"), float("nan"), GateOutcome.FAIL,
                            f"the samples have no {GATE_FILTER} filter")]
    verdict = gate_verdict(gates)
    task = b_side.get("task") or base_run.lm_eval_task
    return AccuracyComparison(
        task=task,
        base_label=base_label,
        cand_label=cand_label,
        n_questions=len({k[0] for k in base}),
        filters=tuple(comparisons),
        gates=tuple(gates),
        verdict=verdict,
        base_run=base_run,
        cand_run=cand_run,
        synthetic=base_run.synthetic or cand_run.synthetic,
        notes=tuple(notes),
        # the raw response does not depend on the filter: one filter's rows, one row per question
        responses_changed=_changed(base, cand, sorted(k for k in base if k[1] == filters[0]), "resps")
        if filters else None,
    )


def first_divergence(a: list[Any] | str, b: list[Any] | str) -> int | None:
    """Index of the first differing element; the shorter length when one is a prefix; None if equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def summarize_equivalence(base_json: Path, cand_json: Path) -> EquivalenceSummary:
    """Compare two ``run_equivalence`` files prompt by prompt."""
    base, cand = _read_json(Path(base_json)), _read_json(Path(cand_json))
    for key in ("prompt_set_sha256", "max_tokens"):
        if base.get(key) != cand.get(key):
            raise SuiteError(
                f"equivalence files differ in {key} ({base.get(key)!r} vs {cand.get(key)!r}): "
                f"{base_json} and {cand_json} did not send the same requests"
            )
    b_rows, c_rows = base.get("results", []), cand.get("results", [])
    if len(b_rows) != len(c_rows) or not b_rows:
        raise SuiteError(
            f"equivalence files hold {len(b_rows)} and {len(c_rows)} completions; need the same > 0"
        )
    use_tokens = all(r.get("token_ids") is not None for r in b_rows + c_rows)
    positions: list[int | None] = []
    for b, c in zip(b_rows, c_rows, strict=True):
        if b.get("prompt") != c.get("prompt"):
            raise SuiteError(
                f"equivalence prompt {b.get('index')} differs between {base_json} and {cand_json}"
            )
        a_out, c_out = (
            (b["token_ids"], c["token_ids"]) if use_tokens else (b.get("text", ""), c.get("text", ""))
        )
        positions.append(first_divergence(a_out, c_out))
    diverging = [p for p in positions if p is not None]
    n = len(positions)
    return EquivalenceSummary(
        n=n,
        n_identical=n - len(diverging),
        share_identical=(n - len(diverging)) / n,
        # the lower median: a position that exists (16 completions half at token 0, half at 1: token 0, not 0.5)
        median_first_divergence=float(statistics.median_low(diverging)) if diverging else None,
        unit="tokens" if use_tokens else "chars",
        first_divergence=tuple(positions),
        max_tokens=base.get("max_tokens"),
        prompt_set_sha256=base.get("prompt_set_sha256"),
    )


@dataclass(frozen=True)
class ArmsCorrectness:
    """Accuracy and greedy equivalence of one candidate against the baseline, as far as the run has them."""

    accuracy: AccuracyComparison | None
    equivalence: EquivalenceSummary | None
    problems: tuple[str, ...]  # a side without a result, or two sides that cannot be compared

    @property
    def empty(self) -> bool:
        return self.accuracy is None and self.equivalence is None and not self.problems


def compare_arms(store: RunStore, records: Sequence[JobRecord], base: str, cand: str) -> ArmsCorrectness:
    """Find both arms' accuracy and equivalence outputs from the run's (job, record) pairs (paths through the
    store) and compare them; an arm whose job did not finish is named in ``problems``, never skipped."""
    found: dict[tuple[str, str], tuple[Path | None, JobRecord, Job]] = {}
    for rec in records:
        job = rec.job
        if job.kind not in ("accuracy", "equivalence") or job.tag or job.arm not in (base, cand):
            continue
        path = store.result_path(job) if rec.ok else None
        found[(job.kind, job.arm)] = (path if path is not None and path.exists() else None, rec, job)
    acc: AccuracyComparison | None = None
    eq: EquivalenceSummary | None = None
    problems: list[str] = []
    for kind in ("accuracy", "equivalence"):
        b, c = found.get((kind, base)), found.get((kind, cand))
        if b is None and c is None:
            continue
        missing = [arm for arm, got in ((base, b), (cand, c)) if got is None or got[0] is None]
        if missing:
            status = {arm: (got[1].status if got else "not run") for arm, got in ((base, b), (cand, c))}
            problems.append(f"{kind}: no result for {', '.join(f'{a} ({status[a]})' for a in missing)}")
            continue
        assert b is not None and c is not None and b[0] is not None and c[0] is not None
        try:
            if kind == "accuracy":
                params = b[2].params
                assert isinstance(params, AccuracyParams), b[2].kind
                gates = _Gates(params.min_accuracy, params.max_drop)
                acc = summarize_accuracy(b[0], c[0], gates, base_label=base, cand_label=cand)
            else:
                eq = summarize_equivalence(b[0], c[0])
        except SuiteError as exc:
            problems.append(f"{kind}: cannot compare {base} and {cand}: {exc}")
    return ArmsCorrectness(acc, eq, tuple(problems))


@dataclass(frozen=True)
class _Gates:
    min_accuracy: float | None
    max_drop: float | None
