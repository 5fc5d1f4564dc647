"""What a run says, as values: run data read through the store, per-cell comparisons, Holm, the primary test
per candidate, noise floors, drift and data-quality findings. The report, `suite history` and `suite compare`
all read it; nothing here formats text for a reader (the sections do, `suite.report_sections` and the stage
summaries).

Cells (point × metric): Δ% is the ratio of the geometric means of the repeats, with a t interval on the log
ratio (`suite.stats.compare`): Welch for independent repeats, paired per round under ABBA. Pairing is by
round index (the job's ``repeat``), never by list position: a round one arm lost is dropped from both sides
and noted. Before → after are the geometric means of exactly the values Δ came from, so an arrow and its Δ
cannot disagree. A repeat a data-quality check (`suite.quality`) calls unreliable is left out of the cell
(and of the primary test), with the reason; a finding about a whole cell makes the cell unreliable. The
per-cell verdicts are then held to Holm's step-down over all of a candidate's cells (family-wise α), so a
▲ or ▼ says *where* it changed; *whether* it changed is the primary test's (`suite.verdict`): a composite of
the headline metrics on per-round scores, paired by round, declared before the run.

Mean ITL equals mean TPOT by construction in `vllm bench serve` (both are total decode time over decoded
tokens), so it is left out of the cells; median and p99 ITL stay.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from suite.candidate import FAMILY_ALPHA, NO_DATA, CandidateSummary, CellResult
from suite.design import Design
from suite.document import Note, Section, code, literal
from suite.errors import SuiteError
from suite.model_config import local_config
from suite.plan import AA_SUFFIX
from suite.quality.fast_path import check_fast_path, gate_shapes_from_config
from suite.quality.finding import Finding, RepeatResult, order_findings, repeat_name
from suite.quality.run import run_checks
from suite.quality.software import SoftwareDiff, compare_software, software_findings
from suite.records import JobRecord, Manifest, MatrixRecord, PlanRecord
from suite.scores import round_scores
from suite.stages.accuracy.read import compare_arms
from suite.stages.serve.read import (
    PointResults,
    ServePoints,
    load_points,
    server_logs,
    server_records,
)
from suite.stats import (
    DETAIL,
    OneWay,
    Strata,
    Verdict,
    compare_metric,
    geometric_mean_ratio,
    holm_threshold,
    noise_floor_pct,
    one_way,
    set_value,
)
from suite.stats import holm as stats_holm
from suite.store import RunStore, Unreadable
from suite.verdict import Outcome, VerdictSpec, every_other_look, every_other_round
from suite.verdict_family import Evaluation, Hypothesis, evaluate

# ---------------------------------------------------------------------------------------------- run data


@dataclass
class RunData:
    store: RunStore
    manifest: Manifest
    records: list[JobRecord]  # every job record of the run (each holds its job)
    serve: ServePoints  # the serving results by point, and those that could not be read

    @property
    def points(self) -> dict[str, PointResults]:
        return self.serve.points

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def plan(self) -> PlanRecord:
        return self.manifest.plan

    @property
    def matrix(self) -> MatrixRecord:
        return self.manifest.matrix

    @property
    def arms(self) -> list[str]:
        return self.manifest.arm_names

    @property
    def baseline(self) -> str:
        return self.plan.baseline or (self.arms[0] if self.arms else "")

    @property
    def candidates(self) -> list[str]:
        return [a for a in self.arms if a != self.baseline and not a.endswith(AA_SUFFIX)]

    def serves(self, arm: str) -> bool:
        """False for a correctness-only arm (`serving: false`): it has no serving numbers to show."""
        spec = self.matrix.arms.get(arm)
        return spec is None or spec.serving

    @property
    def serving_summaries(self) -> list[CandidateSummary]:
        return [s for s in self.summaries if self.serves(s.candidate)]

    @property
    def aa_arm(self) -> str | None:
        name = self.baseline + AA_SUFFIX
        return name if name in self.arms else None

    @cached_property
    def design(self) -> Design:
        """The run's design as its plan recorded it (older runs: as its matrix record implies)."""
        return self.plan.design or self.matrix.design(self.plan.order)

    @property
    def order(self) -> str:
        return self.design.order

    @property
    def paired(self) -> bool:
        """Under ABBA each round's arms ran back to back (together: all: in one window): compare them per round."""
        return self.design.paired

    @property
    def layouts(self) -> int:
        """How many GPU layouts the rounds cycle through (runtime.cross_groups); 1 for every other design."""
        return self.design.layouts

    @property
    def blocks(self) -> int:
        """Blocks per unit (together: all: a round's blocks are its jobs' repeats); 1 otherwise."""
        return self.design.blocks

    def repeat_name(self, r: int) -> str:
        return repeat_name(r, self.blocks)

    @cached_property
    def floors(self) -> dict[str, float]:
        return noise_floors(self)

    @cached_property
    def summaries(self) -> list[CandidateSummary]:
        """One per candidate, computed once: every section and command reads these same values."""
        return summarize_candidates(self, self.floors)

    @cached_property
    def control(self) -> CandidateSummary | None:
        """The A/A control: the baseline's second arm judged by the same primary test as a candidate (never
        pooled with itself). Two identical arms: a REGRESSION / IMPROVEMENT / MIXED here is a false alarm of
        this run, the measure of how far its speed verdicts can be trusted. None without an A/A arm."""
        if self.aa_arm is None:
            return None
        return summarize_candidate(self, self.aa_arm, self.floors, verdict_spec(self))

    @cached_property
    def findings(self) -> list[Finding]:
        return quality_findings(self)

    @cached_property
    def software(self) -> dict[str, SoftwareDiff]:
        """Every arm but the baseline: its recorded software against the baseline's (`suite.quality.software`)."""
        return software_diffs(self)

    @cached_property
    def quality(self) -> QualityIndex:
        return QualityIndex(self.findings)


def load_run(run_dir: Path) -> RunData:
    """Read a run directory (manifest, job records, serving results) through the store."""
    store = RunStore.open(Path(run_dir))
    try:
        records = store.records()
        return RunData(store=store, manifest=store.manifest(), records=records, serve=load_points(store, records))
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"{run_dir}: cannot read the run: {exc}") from None


def round_machines(run: RunData, point: str | None = None) -> dict[int, str]:
    """round -> the machine the baseline's serving jobs of that round ran on (at ``point``, or at every point:
    a round cut by a move between machines is its own stratum, "A+B"); rounds without a record of it left out."""
    seen: dict[int, set[str]] = defaultdict(set)
    for p in run.points.values():
        if point is None or p.point == point:
            for r, rec in p.records.get(run.baseline, {}).items():
                if rec.where is not None:
                    seen[r // run.blocks].add(rec.where.key)
    return {r: "+".join(sorted(keys)) for r, keys in seen.items()}


def strata_of(run: RunData, rounds: Iterable[int], point: str | None = None) -> Strata | None:
    """What the paired test takes out over ``rounds``: runtime.cross_groups' GPU layouts, and the machine when the
    rounds ran on more than one (a run resumed on another machine with --allow-other-host; a pair split across
    machines is left out by the other-host check, so the baseline's machine is the pair's)."""
    by_machine = round_machines(run, point)
    used = {r: by_machine.get(r) for r in rounds}
    keys = sorted({m for m in used.values() if m is not None})
    if len(keys) <= 1 or None in used.values():
        return Strata.layouts(run.layouts)
    index = {m: i for i, m in enumerate(keys)}
    unit = run.design.units
    if run.layouts > 1:
        n = run.layouts
        return Strata(n * len(keys), kind="GPU layouts × machines", unit=unit,
                      by_round={r: r % n + n * index[m] for r, m in used.items() if m is not None})
    return Strata(len(keys), kind="machines", unit=unit, by_round={r: index[m] for r, m in used.items() if m})


# ------------------------------------------------------------------------------------------ data quality


def _plan_positions(run: RunData) -> dict[tuple[str, str], int]:
    """(arm, job key) -> position in the run order: the planned order (a session runs its jobs in plan
    order); for a job the plan does not list, and for every job of a side-by-side run, its record's start
    time."""
    positions = {(j.arm, j.key): i for i, j in enumerate(run.plan.jobs)}
    if run.design.together > 1 or run.design.all_together:  # a window's jobs alternate: by start time
        positions = {}
    unplanned = sorted((rec.started, rec.job.arm, rec.job.key) for rec in run.records
                       if (rec.job.arm, rec.job.key) not in positions and rec.started)
    base = len(positions)
    for i, (_, arm, key) in enumerate(unplanned):
        positions[(arm, key)] = base + i
    return positions


def quality_findings(run: RunData) -> list[Finding]:
    """Every data-quality check of `suite.quality` over the run's serving repeats, server records and logs."""
    positions = _plan_positions(run)
    repeats = []
    sessions: set[tuple[str, int]] = set()
    for p in run.points.values():
        for arm, rounds in p.reps.items():
            for r, raw in rounds.items():
                job = p.records[arm][r].job
                sessions.add((arm, job.session))
                repeats.append(RepeatResult(arm=arm, point=p.point, round=r, raw=raw, params=p.params,
                                            session=job.session, order=positions.get((arm, job.key)),
                                            client=p.records[arm][r].client, end=p.drift.get(arm, {}).get(r),
                                            host=p.records[arm][r].where))
    logs = server_logs(run.store, sessions)
    found = fast_path_findings(run, logs) + software_findings(run.software.values())
    if not repeats:
        return found
    return order_findings(run_checks(repeats, servers=server_records(run.store, sessions), logs=logs,
                                     blocks=run.blocks,
                                     # `suite compare` sets two runs side by side: their machines may differ by design
                                     baseline=run.baseline if run.manifest.compare is None else None) + found)


def software_diffs(run: RunData) -> dict[str, SoftwareDiff]:
    """arm -> its software against the baseline's, for every arm but the baseline (in plan order): the records of
    the manifest, file by file from each arm's ``vllm-files.json``."""
    arms = run.manifest.arms
    base = arms.get(run.baseline)
    theirs = base.software if base is not None else None
    their_files = run.store.vllm_files(run.baseline) if theirs is not None else None
    out = {}
    for arm in run.arms:
        if arm == run.baseline:
            continue
        mine = arms[arm].software if arm in arms else None
        out[arm] = compare_software(arm, run.baseline, mine, theirs,
                                    run.store.vllm_files(arm) if mine is not None else None, their_files)
    return out


def fast_path_findings(run: RunData, logs: dict[tuple[str, int], str]) -> list[Finding]:
    """Per arm: did its server log say a kernel the router gate is routed to ran untuned or was switched off
    (a patched arm then measured the old path; a stock arm, the fallback)."""
    config = local_config(run.matrix.model.id or "")
    shapes = gate_shapes_from_config(config) if config is not None else []
    out: list[Finding] = []
    for arm, info in run.manifest.arms.items():
        patches = info.patches
        text = "\n".join(v for (a, _), v in sorted(logs.items()) if a == arm)
        if text:
            out += check_fast_path(arm, patches, text, gate_shapes=shapes)
    return out


class QualityIndex:
    """Which values the data-quality findings spoil."""

    def __init__(self, findings: list[Finding]) -> None:
        self.unreliable = [f for f in order_findings(findings) if f.severity == "unreliable"]

    def repeat_checks(self, arm: str, point: str, round_: int, key: str) -> list[str]:
        """The checks that leave one repeat's value of ``key`` out (findings about that very repeat)."""
        return sorted({f.check for f in self.unreliable
                       if f.arm == arm and f.point == point and f.round == round_ and f.affects(key)})

    def cell_reasons(self, arm: str, point: str, key: str) -> list[str]:
        """Findings about a whole cell of one arm (not about one repeat): the cell is unreliable."""
        return [f"{f.check}: {f.message}" for f in self.unreliable
                if f.arm == arm and f.point in (None, point) and f.round is None and f.affects(key)]


# ------------------------------------------------------------------------------------------------ cells


def with_left_out(section: Section | None, unreadable: list[Unreadable], title: str, anchor: str) -> Section | None:
    """A stage's section, with a warning first for the stored results of ok jobs its reader could not take (the
    file and why): the section shows the rest and says that it is not all; when nothing could be read, the
    section is the warning alone (``title``, ``anchor``), not missing without a word."""
    if not unreadable:
        return section
    files = "; ".join(f"{code(u.path)}: {literal(u.error)}" for u in unreadable)
    n = len(unreadable)
    note = Note(f"{n} stored result{'s' if n > 1 else ''} of jobs that ended ok could not be read and "
                f"{'are' if n > 1 else 'is'} left out of this section: {files}", "warning")
    if section is None:
        return Section(title, 2, [note], anchor=anchor)
    return replace(section, blocks=[note, *section.blocks])


def geometric_mean(values: list[float]) -> float | None:
    if not values:
        return None
    if min(values) <= 0:
        return 0.0 if min(values) == 0 else None
    return math.exp(math.fsum(map(math.log, values)) / len(values))


def _values(run: RunData, point: PointResults, arm: str, key: str,
            left_out: list[tuple[str, int, str]]) -> dict[int, float]:
    """round -> value, without the repeats a data-quality check left out (added to ``left_out``; the Data
    quality section holds the findings' full text)."""
    out = {}
    for r, v in point.values(arm, key).items():
        checks = run.quality.repeat_checks(arm, point.point, r, key)
        if checks:
            left_out.append((arm, r, ", ".join(checks)))
        else:
            out[r] = v
    return out


def by_round(values: Mapping[int, float], blocks: int) -> dict[int, float]:
    """Block values (job repeats) -> round values, the one rule for a round's blocks everywhere (a cell, the
    primary test): each round's ``set_value`` of its positive blocks, kept only where the round has all its
    ``blocks`` of them (a round cut short, or a block a data-quality check spoiled, is not scored on fewer blocks
    than its pair). With one block per round, the values themselves."""
    if blocks == 1:
        return dict(values)
    grouped: dict[int, list[float]] = defaultdict(list)
    for r, v in values.items():
        if v > 0:
            grouped[r // blocks].append(v)
    return {r: set_value(vs) for r, vs in sorted(grouped.items()) if len(vs) == blocks}


def _pair(run: RunData, cand: str, base: dict[int, float], new: dict[int, float]
          ) -> tuple[tuple[int, ...], list[float], list[float], list[tuple[int, str]]]:
    """(rounds used, baseline values, candidate values, unpaired rounds dropped): by round index under ABBA;
    together: all: blocks paired first, then each round the ``set_value`` of its paired blocks."""
    if run.paired:
        dropped = [(r, cand if r in base else run.baseline) for r in sorted(base.keys() ^ new.keys())]
        if run.blocks > 1:  # a block without a positive value on both sides is left out: so is its round
            both = [r for r in base.keys() & new.keys() if base[r] > 0 and new[r] > 0]
            base = by_round({r: base[r] for r in both}, run.blocks)
            new = by_round({r: new[r] for r in both}, run.blocks)
        rounds = tuple(sorted(base.keys() & new.keys()))
        return rounds, [base[r] for r in rounds], [new[r] for r in rounds], dropped
    return tuple(sorted(base.keys() | new.keys())), list(base.values()), list(new.values()), []


def compare_cell(run: RunData, point: PointResults, cand: str, key: str, floors: dict[str, float]) -> CellResult:
    """One cell before Holm: data quality applied, rounds paired by index under ABBA.

    Repeats a data-quality check calls unreliable are left out. When that leaves a side with nothing, the cell
    is computed over every repeat instead (so its numbers stay visible) and marked unreliable with the checks
    that spoiled it; it is not tested."""
    left_out: list[tuple[str, int, str]] = []
    base = _values(run, point, run.baseline, key, left_out)
    new = _values(run, point, cand, key, left_out)
    spoiled = ""
    if (not base and point.values(run.baseline, key)) or (not new and point.values(cand, key)):
        side = run.baseline if not base else cand
        checks = sorted({c for arm, _, cs in left_out if arm == side for c in cs.split(", ")})
        spoiled = (f"every {side} repeat is unreliable ({', '.join(checks)}): Δ over all repeats shown, not "
                   "tested")
        base, new = point.values(run.baseline, key), point.values(cand, key)
    rounds, bv, cv, dropped = _pair(run, cand, base, new)
    if not bv or not cv:
        side = run.baseline if not bv else cand
        return CellResult(point.point, key, None, None, None, rounds, None, f"missing: no {side} value",
                          tuple(left_out), tuple(dropped), run.blocks)
    strata = strata_of(run, rounds, point.point) if run.paired else None  # GPU layouts, machines: taken out
    c = compare_metric(key, bv, cv, noise_floor_pct=floors.get(key), paired=run.paired,
                       **(dict(strata=strata, rounds=rounds) if strata is not None else {}))
    verdict, reason = c.verdict, c.reason
    whole = [f"{arm}: {why}" for arm in (run.baseline, cand) for why in run.quality.cell_reasons(arm, point.point, key)]
    if spoiled or whole:
        verdict, reason = Verdict.UNRELIABLE, "; ".join(([spoiled] if spoiled else []) + whole)
    return CellResult(point.point, key, c, geometric_mean(bv), geometric_mean(cv), rounds, verdict, reason,
                      tuple(left_out), tuple(dropped), run.blocks)


def holm(cells: list[CellResult], alpha: float = FAMILY_ALPHA) -> list[CellResult]:
    """Holm's step-down over the reliable cells: a significant cell that does not survive it reads "not
    significant" with the threshold it missed."""
    tested = {i: c.comparison.p_value for i, c in enumerate(cells)
              if c.reliable and c.comparison is not None and c.comparison.p_value is not None}
    m = len(tested)
    keep = stats_holm(tested, alpha)
    out = []
    for i, c in enumerate(cells):
        if not c.significant:
            out.append(c)
        elif i in keep:
            out.append(_with(c, c.verdict, f"{c.reason}; survives Holm over {m} cells"))
        else:
            needed = holm_threshold(tested, i, alpha)
            out.append(_with(c, Verdict.NOT_SIGNIFICANT,
                             f"p={c.comparison.p_value:.3g} alone, not significant after Holm over {m} cells"
                             f" (family-wise α {alpha:g}; this cell needed p ≤ {needed:.2g})"))
    return out


def _with(c: CellResult, verdict: Verdict | None, reason: str) -> CellResult:
    return replace(c, verdict=verdict, reason=reason)


def candidate_cells(run: RunData, cand: str, floors: dict[str, float] | None = None,
                    metrics: tuple[str, ...] = DETAIL, primary: Evaluation | None = None
                    ) -> dict[tuple[str, str], CellResult]:
    """(point, metric) -> cell. A cell the primary family tested (a declared metric at a declared point) takes its
    verdict from the family (``primary``: confirmed better or worse, else not significant), so the tables and
    the card cannot disagree; the others, shown beside it, are held to Holm's step-down among themselves."""
    floors = noise_floors(run) if floors is None else floors
    keys = [(p.point, k) for p in run.points.values() for k in metrics]
    family = {(h.point, h.metric): h for h in primary.cells} if primary is not None else {}
    raw = [compare_cell(run, run.points[p], cand, k, floors) for p, k in keys]
    rest = holm([c for key, c in zip(keys, raw, strict=True) if key not in family])
    out = {}
    for key, c in zip(keys, raw, strict=True):
        h = family.get(key)
        out[key] = rest.pop(0) if h is None else _from_family(c, h)
    return out


def _from_family(c: CellResult, h: Hypothesis) -> CellResult:
    """A cell the primary family tested: its verdict, Δ and interval are the family's test's (the one the card
    shows for the point: each number once), a data-quality verdict stays."""
    if not c.reliable:
        return c
    r = h.result
    shown = h.shown
    own = shown.own_interval_pct if not shown.rci_too_wide else None
    if c.comparison is not None and shown.delta_pct is not None:
        c = replace(c, comparison=replace(
            c.comparison, delta_pct=shown.delta_pct, ratio=1 + shown.delta_pct / 100, p_value=shown.p_value,
            ci_low_pct=own[0] if own else None, ci_high_pct=own[1] if own else None,
            method=f"the primary test's Δ and interval: {shown.variance}"))
    level = f"{100 * h.level:.3g} % of α, look {r.look} of {r.n_looks}"
    if h.confirmed is not None:
        return _with(c, Verdict.BETTER if h.confirmed == Outcome.IMPROVEMENT else Verdict.WORSE,
                     f"confirmed by the primary test (its share: {level}, p={r.p_value:.2g})")
    p = f", p={r.p_value:.2g}" if r.p_value is not None else ""
    return _with(c, Verdict.NOT_SIGNIFICANT, f"not confirmed by the primary test (its share: {level}{p})")


# ---------------------------------------------------------------------------------------- noise, drift


def noise_floors(run: RunData) -> dict[str, float]:
    """Per metric: the A/A floor from baseline vs baseline.aa across all points (empty without A/A)."""
    aa = run.aa_arm
    if aa is None:
        return {}
    floors: dict[str, float] = {}
    for key in DETAIL:
        pairs = [(list(p.values(run.baseline, key).values()), list(p.values(aa, key).values()))
                 for p in run.points.values()]
        pairs = [(b, c) for b, c in pairs if b and c and min(b + c) > 0]
        if pairs:
            floors[key] = noise_floor_pct(pairs)
    return floors


@dataclass(frozen=True)
class DriftCheck:
    """A point of one session measured first and again at the session's end (``drift_check``)."""

    arm: str
    point: str
    round: int
    values: tuple[tuple[str, float, float], ...]  # (metric, at the first measurement, at the session's end)


DRIFT_METRICS = ("mean_tpot_ms", "output_throughput")


def drift_checks(point: PointResults) -> list[DriftCheck]:
    """Per arm and round: the drift repeat (end of session) against the same round's repeat of the point."""
    out = []
    for arm, ends in sorted(point.drift.items()):
        for r, end in sorted(ends.items()):
            start = point.reps.get(arm, {}).get(r)
            if start is None:
                continue
            values = tuple((k, a, b) for k in DRIFT_METRICS
                           if (a := start.number(k)) is not None and (b := end.number(k)) is not None
                           and a > 0 and b > 0)
            if values:
                out.append(DriftCheck(arm, point.point, r, values))
    return out


def completed_failed(point: PointResults, arm: str) -> tuple[int, int]:
    """Requests completed and failed over an arm's repeats at a point."""
    reps = point.reps.get(arm, {}).values()
    return sum(r.completed or 0 for r in reps), sum(r.failed or 0 for r in reps)


# ------------------------------------------------------------------------------------ the primary test


def verdict_spec(run: RunData) -> VerdictSpec:
    """The primary test declared for this run: the matrix's ``verdict:`` block (its sequential design under
    ``repeats: auto``; a fixed design at the run's repeats otherwise), or the default composite in a fixed design
    over the run's rounds (a fixed-repeats run was never looked at early)."""
    declared = run.matrix.verdict
    repeats = run.matrix.repeats
    if declared is not None and repeats == "auto":
        return declared
    n = max(2, repeats if isinstance(repeats, int) and not isinstance(repeats, bool) else 1)
    kept = declared.model_dump(exclude={"looks"}) if declared is not None else {}
    return VerdictSpec.model_validate({**kept, "looks": [n]})


def stopped_after(run: RunData) -> int | None:
    """Rounds a sequential run stopped after (the look it took), as the runner recorded it."""
    seq = run.manifest.sequential
    return seq.stop_after if seq is not None else None


def decided_after(run: RunData, cand: str) -> int | None:
    """Rounds after which the sequential runner's look decided ``cand`` (the first look that did), when the
    run went on for other candidates: a decided test is final at its look; the rounds after it are measured,
    shown in the cells, and not tested again. For the A/A arm: where the control's own test decided (its later
    rounds were not run)."""
    seq = run.manifest.sequential
    if seq is not None and cand == run.aa_arm:  # the control's own stop (a run recorded before it had one: None)
        return seq.control_after
    return next((look.rounds for look in (seq.looks if seq is not None else []) if look.decided.get(cand)), None)


def round_data(run: RunData, arm: str, metrics: tuple[str, ...], points: tuple[str, ...] | None = None,
               *, sets: bool = True) -> tuple[dict[int, dict[str, dict[str, float]]], list[str]]:
    """round -> point -> metric -> value of one arm (``points``: only those), without values a data-quality
    check spoiled (listed). Together: all: a round's blocks combined (``sets=False``:
    block -> point -> metric -> value, the blocks as they were measured)."""
    rounds: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)
    left_out: list[str] = []
    for p in run.points.values():
        if points is not None and p.point not in points:
            continue
        for r, raw in p.reps.get(arm, {}).items():
            row = {}
            for key in metrics:
                value = raw.number(key)
                if value is None:
                    continue
                if run.quality.repeat_checks(arm, p.point, r, key) or run.quality.cell_reasons(arm, p.point, key):
                    left_out.append(f"{arm} {p.point} round {r} {key}")
                    continue
                row[key] = value
            rounds[r][p.point] = row
    if run.blocks > 1 and sets:
        return _restart_sets(rounds, run.blocks), left_out
    return dict(sorted(rounds.items())), left_out


def _restart_sets(blocks: Mapping[int, Mapping[str, Mapping[str, float]]], n: int
                  ) -> dict[int, dict[str, dict[str, float]]]:
    """block -> point -> metric -> value, as round -> point -> metric -> the ``set_value`` of the round's
    blocks. A value is kept only where the round has all its n blocks (a round cut short, or a block a data-quality
    check spoiled, is not scored on fewer blocks than its pair: the pairing across arms is by round)."""
    series: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r, points in blocks.items():
        for point, row in points.items():
            for key, value in row.items():
                series[(point, key)][r] = value
    sets: dict[int, dict[str, dict[str, float]]] = {r: {} for r in sorted({r // n for r in blocks})}
    for (point, key), values in sorted(series.items()):
        for r, value in by_round(values, n).items():  # a point the round lacks a block of is missing from it:
            sets[r].setdefault(point, {})[key] = value  # the round reads incomplete
    return sets


def block_scores(run: RunData, cand: str, spec: VerdictSpec) -> dict[int, list[float]]:
    """Together: all: round -> the primary test's score of each of its blocks (``cand`` against the
    baseline block by block, the composite of the declared metrics and points), the rounds with all their blocks;
    empty for any other order."""
    if run.blocks <= 1:
        return {}
    base, _ = round_data(run, run.baseline, spec.metrics, spec.points, sets=False)
    new, _ = round_data(run, cand, spec.metrics, spec.points, sets=False)
    by_set: dict[int, list[float]] = defaultdict(list)
    for block, score in sorted(round_scores(base, new, spec.metrics).scores.items()):
        by_set[block // run.blocks].append(score)
    return {s: v for s, v in by_set.items() if len(v) == run.blocks}


def set_spread(run: RunData, cand: str, spec: VerdictSpec) -> OneWay | None:
    """Together: all: how much of the rounds' spread is the noise of their blocks and how much a round's
    own (a server start's offset, shared by its blocks): the one-way analysis of ``block_scores``."""
    return one_way(list(block_scores(run, cand, spec).values()))


@dataclass(frozen=True)
class Primary:
    evaluation: Evaluation | None  # None: no rounds of one side, or values the test refuses (``error``)
    left_out: tuple[str, ...]  # values not used: spoiled by a data-quality finding
    error: str | None = None


def primary(run: RunData, cand: str, spec: VerdictSpec, *, look: int | None = None, final: bool = True) -> Primary:
    """The candidate's primary test. ``look``: evaluate the first ``look`` rounds (round index < look) at the
    design's look for that many rounds, as the sequential runner does after each round and the report does for
    a run that stopped early; None: every stored round. ``final``: no more rounds will come (an undecided test
    is INCONCLUSIVE). The A/A arm's rounds are pooled only under ABBA, where they share the baseline's rounds,
    and never into the A/A arm's own test (the control)."""
    base, left_b = round_data(run, run.baseline, spec.metrics, spec.points)
    new, left_c = round_data(run, cand, spec.metrics, spec.points)
    halved = None
    if cand == run.aa_arm:  # the control: its own paired test, without the "not pooled" remark of a candidate
        spec = spec.model_copy(update={"pool_aa": False})
        if run.design.aa == "alternate" and (halved := every_other_round(spec)) is not None:
            spec, run_spec = halved, spec  # its own design: the rounds it has at each of the run's looks
    aa = (round_data(run, run.aa_arm, spec.metrics, spec.points)[0] if run.aa_arm and run.paired and spec.pool_aa
          else None)
    k = None
    if look is not None:
        base, new = {r: v for r, v in base.items() if r < look}, {r: v for r, v in new.items() if r < look}
        aa = {r: v for r, v in aa.items() if r < look} if aa else aa
        k = (every_other_look(run_spec, spec, look) if halved is not None
             else max(1, sum(1 for x in spec.looks if x <= look)))
    left_out = tuple(left_b + left_c)
    if not base or not new:
        return Primary(None, left_out)
    try:
        return Primary(evaluate(base, new, spec, aa_rounds=aa or None, look=k, final=final,
                                unit=run.design.unit,
                                strata=strata_of(run, base.keys() & new.keys())), left_out)
    except ValueError as exc:  # malformed values (negative, not a number): said, not hidden
        return Primary(None, left_out, f"primary test refused the values: {exc}")


# ------------------------------------------------------------------------------------- candidate summary


def summarize_candidate(run: RunData, cand: str, floors: dict[str, float] | None = None,
                        spec: VerdictSpec | None = None) -> CandidateSummary:
    floors = noise_floors(run) if floors is None else floors
    spec = verdict_spec(run) if spec is None else spec
    decided = decided_after(run, cand)
    test = primary(run, cand, spec, look=decided if decided is not None else stopped_after(run))
    ev = test.evaluation
    cells = candidate_cells(run, cand, floors, primary=ev)
    counts = dict.fromkeys(Verdict, 0)
    for c in cells.values():
        if c.verdict is not None:
            counts[c.verdict] += 1
    ratios = [c.ratio for (_, k), c in cells.items() if k == "output_throughput" and c.ratio]
    geo = (geometric_mean_ratio(ratios) - 1) * 100 if ratios else None
    overall = NO_DATA if ev is None or not any(c.tested for c in cells.values()) else ev.outcome.value
    return CandidateSummary(candidate=cand, baseline=run.baseline, overall=overall, spec=spec, evaluation=ev,
                            cells=cells, counts=counts, geomean_throughput_pct=geo, points=len(ratios),
                            correctness=compare_arms(run.store, run.records, run.baseline, cand),
                            left_out=test.left_out, error=test.error, decided_after=decided,
                            offline_only=not run.points and not run.serve.unreadable)


def summarize_candidates(run: RunData, floors: dict[str, float] | None = None) -> list[CandidateSummary]:
    """One summary per candidate (the A/A arm is not a candidate)."""
    floors = noise_floors(run) if floors is None else floors
    spec = verdict_spec(run)
    return [summarize_candidate(run, cand, floors, spec) for cand in run.candidates]

