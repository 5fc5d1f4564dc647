"""Rounds until decided: the looks of a `repeats: auto` run (group-sequential design of suite.verdict).

After each round whose count is one of the design's looks, every candidate's primary test is evaluated on the
rounds stored so far (the same analysis the report uses). The run stops when every candidate is decided, or
at the last look the time budget allows; the rounds not run are never planned-and-missing: the manifest says
where the run stopped and why.

The A/A control (the baseline's second arm) is a sequential test of its own, on the same design: at each look
its primary test is evaluated too, and the first look that decides it (a confirmed difference: CONTROL
FAILED; equivalence inside the margin: CONTROL PASSED) is where it stops: its later rounds' server sessions
are not run, and the report judges it there (``SequentialRecord.control_after``). It never holds the run: a
control still undecided when every candidate is decided is judged at that stopping look, final.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from suite.analysis import load_run, primary
from suite.plan import AA_SUFFIX, Plan, Session, session_round
from suite.records import LookRecord, SequentialRecord
from suite.verdict import VerdictSpec


def evaluate_look(run_dir: Path, spec: VerdictSpec, rounds: int, final: bool, control: bool = True) -> LookRecord:
    """Every serving candidate's primary test on the first ``rounds`` rounds stored in the run directory (a
    correctness-only arm has no speed test to wait for: it would keep every run to its last look), and the A/A
    control's (``control`` False: not evaluated, its test was decided at an earlier look)."""
    run = load_run(run_dir)
    outcomes, decided, reasons = {}, {}, {}
    for cand in (c for c in run.candidates if run.serves(c)):
        res = primary(run, cand, spec, look=rounds, final=final)
        ev = res.evaluation
        if ev is None:
            outcomes[cand], decided[cand], reasons[cand] = "INCONCLUSIVE", False, res.error or "no rounds yet"
            continue
        outcomes[cand] = str(ev.outcome)
        decided[cand] = bool(ev.decided)
        reasons[cand] = ev.reason
    ctrl_word = ctrl_decided = None
    if run.aa_arm is not None and control:
        ctrl = primary(run, run.aa_arm, spec, look=rounds, final=final).evaluation
        ctrl_word = str(ctrl.outcome) if ctrl is not None else "INCONCLUSIVE"
        ctrl_decided = bool(ctrl.decided) if ctrl is not None else final
    return LookRecord(rounds=rounds, outcomes=outcomes, decided=decided, reasons=reasons, final=final,
                      control=ctrl_word, control_decided=ctrl_decided)


@dataclass
class SequentialRun:
    """The stopping state of one run: looks taken, where it stopped, the time budget."""

    spec: VerdictSpec
    budget_s: float | None
    started: float = field(default_factory=time.monotonic)
    looks: list[LookRecord] = field(default_factory=list)
    stop_after: int | None = None  # rounds run; later rounds are not needed
    why: str = ""
    round_ends: list[float] = field(default_factory=list)  # when each round of this process finished
    control_arm: str | None = None  # the A/A arm: its sessions of rounds after its own test decided are not run
    control_after: int | None = None  # rounds after which the A/A control's own test decided
    unit: str = "rounds"  # what a round is called in the lines it writes ("rounds" under together: all)

    @classmethod
    def resume(cls, spec: VerdictSpec, budget_s: float | None, stored: SequentialRecord | None,
               control_arm: str | None = None, unit: str = "rounds") -> SequentialRun:
        """The state a stored run left: its looks, and where it (and its A/A control) stopped and why."""
        state = cls(spec=spec, budget_s=budget_s, control_arm=control_arm, unit=unit)
        if stored is not None:
            state.looks = list(stored.looks)
            state.stop_after, state.why = stored.stop_after, stored.why
            state.control_after = stored.control_after
        return state

    def needed(self, rnd: int | None) -> bool:
        return rnd is None or self.stop_after is None or rnd < self.stop_after

    def needed_session(self, session: Session) -> bool:
        """Whether the runner still runs this server session: its round is needed, and it is not an A/A
        session of a round after the control's own test decided (an offline session, of no round, is)."""
        rnd = session_round(session)
        if not self.needed(rnd):
            return False
        return not (rnd is not None and self.control_after is not None and session.arm == self.control_arm
                    and rnd >= self.control_after)

    def after_round(self, run_dir: Path, rounds_done: int, rounds_started: int,
                    one_time_s: float = 0.0, per_batch: int = 1) -> LookRecord | None:
        """Called when ``rounds_done`` rounds are complete; takes the look if one is due and decides to stop.
        ``one_time_s``: the seconds this round spent on jobs no later round repeats (correctness, the probe),
        left out of what a later round is expected to cost. ``per_batch``: rounds that run at the same time
        (GPU groups in runtime.gpus: a wave), so that one call's time covers that many rounds."""
        now = time.monotonic()
        self.round_ends.append(now)
        looks = self.spec.looks
        if self.stop_after is not None:
            return None
        last = rounds_done == looks[-1]
        over_budget = False
        if not last and self.budget_s is not None and rounds_started:
            # a later round costs what the last one did, less the jobs it ran once (the first round's accuracy,
            # equivalence and probe jobs); the first round still counts its one-time starts (the client's, a
            # correctness-only arm's server), so the estimate errs long
            ends = [self.started, *self.round_ends]
            per_round = max(ends[-1] - ends[-2] - one_time_s, 0.0)
            nxt = next((k for k in looks if k > rounds_done), looks[-1])
            over_budget = (now - self.started) + math.ceil((nxt - rounds_done) / per_batch) * per_round > self.budget_s
        if rounds_done not in looks:
            if over_budget:  # the next look cannot be reached: stop here rather than run past the budget
                self.stop_after = rounds_done
                self.why = (f"time budget ({self.budget_s / 60:g} min) would be spent before the next look "
                            f"(after {nxt} {self.unit}); {rounds_done} of them measured, no look taken")
            return None
        look = evaluate_look(run_dir, self.spec, rounds_done, final=last or over_budget,
                             control=self.control_after is None)
        return self.take_look(look, over_budget=over_budget)

    def take_look(self, look: LookRecord, over_budget: bool = False) -> LookRecord:
        """The stopping rule on one look's outcomes (``evaluate_look``'s, or a simulation's): records the look,
        stops the A/A control at the first look that decides its own test (a decided control's outcome is
        carried to the later looks, which do not test it again), and the run when every candidate is
        decided, at the design's last look, or where the budget runs out."""
        looks = self.spec.looks
        rounds_done = look.rounds
        last = rounds_done == looks[-1]
        if self.control_after is not None:  # decided at an earlier look: its outcome stands
            first = next((lk for lk in self.looks if lk.rounds == self.control_after), None)
            look = look.model_copy(update={"control": first.control if first is not None else look.control,
                                           "control_decided": True})
        elif look.control_decided:
            self.control_after = rounds_done
        # a resumed run looks again at the rounds it already had: the new look replaces the stored one (the 2026-12-05
        # H100 run, resumed on a second machine, listed its look after 2 rounds twice)
        self.looks = sorted([*(lk for lk in self.looks if lk.rounds != rounds_done), look], key=lambda lk: lk.rounds)
        if over_budget:  # a final look: every test decides (INCONCLUSIVE at the latest)
            self.stop_after = rounds_done
            self.why = f"time budget ({self.budget_s / 60:g} min) would be spent before the next look"
        elif last:  # every test decides at the last look, INCONCLUSIVE at the latest: say which stop this is
            self.stop_after, self.why = rounds_done, f"last look of the design (after {rounds_done} {self.unit})"
        elif all(look.decided.values()) and look.decided:
            k = looks.index(rounds_done) + 1
            self.stop_after, self.why = rounds_done, f"every candidate decided at look {k} of {len(looks)}"
        return look

    def record(self) -> SequentialRecord:
        return SequentialRecord(design=self.spec, looks=self.looks,
                                stop_after=self.stop_after, why=self.why,
                                budget_min=None if self.budget_s is None else self.budget_s / 60,
                                control_after=self.control_after)


def aa_arm(plan: Plan) -> str | None:
    """The plan's A/A arm (``aa: true | alternate``), whose own test may stop it before the run stops."""
    name = plan.baseline + AA_SUFFIX
    return name if name in plan.arms else None


def planned_rounds(plan: Plan) -> list[int]:
    return sorted({r for s in plan.sessions if (r := session_round(s)) is not None})
