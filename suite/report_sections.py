"""The run-level sections of the report (format neutral) around the verdict: the header, the data-quality
findings right under the verdict cards, failed jobs, the Slurm submissions and provenance; an arm's software
line (on its card and in provenance). The verdict section itself, one card per candidate and the A/A control's:
:mod:`suite.report_verdict`.
"""

from __future__ import annotations

import json
from typing import Any

from suite.analysis import RunData
from suite.document import (
    BulletList,
    Cell,
    Code,
    Note,
    Paragraph,
    Section,
    Table,
    code,
    literal,
)
from suite.errors import SuiteError
from suite.plan import KINDS
from suite.quality.finding import CHECK_ORDER, Finding, order_findings
from suite.quality.run import ACROSS_ROUNDS
from suite.quality.series import DRIFT_MIN_ROUNDS
from suite.quality.software import beyond_patch, named
from suite.records import ArmSoftware, Manifest, MatrixRecord
from suite.run_facts import (
    Environment,
    environment,
    failed_jobs,
    gpu_models,
    running_seconds,
    stretch_last_jobs,
)

ERROR_CHARS = 300  # first line of a failed job's error, in both reports


# ---------------------------------------------------------------------------------------------- header


def title(run: RunData) -> str:
    compared = [a for a in run.arms if a != run.aa_arm]  # the A/A arm is the control, not a compared arm
    return f"{literal(run.matrix.name or run_name(run))}: {literal(' vs '.join(compared))}"


def weights_line(matrix: MatrixRecord, arm: str | None = None) -> str | None:
    """The report's line about the dummy weights (--load-format dummy) ``arm`` served (default: the matrix's
    model), None for real weights."""
    model = matrix.model_of(arm)
    if not model.dummy:
        return None
    config = (f"real-shape config {code(model.generate)}" if model.generate else f"the config of {code(model.id)}")
    return (f"weights: **dummy** ({code('--load-format dummy')}, {config}): timings are real, outputs are not a "
            "model's")


def run_name(run: RunData) -> str:
    """The run directory's name, also for a relative path without one (`suite report .`)."""
    return run.root.resolve().name


def _unfinished(m: Manifest) -> str:
    """Why a run's manifest still says running with jobs missing: its process runs, is gone, or cannot be seen
    from here (another machine, a manifest older than the stretches' pids)."""
    last = m.stretches[-1] if m.stretches else None
    alive = last.alive() if last is not None else None
    if alive:
        return f" — still running (process {last.pid} on this host): what follows is from the jobs it has so far"
    if alive is False:
        return (f" — stopped without closing its manifest (its process {last.pid} on this host is gone: a kill "
                "or a crash): what follows is from the jobs it has; `suite run --resume` runs the rest")
    return (" — the run has not finished, or stopped without closing its manifest (a lost machine, a kill): "
            "what follows is from the jobs it has")


def _offline_rounds(run: RunData) -> str:
    """The offline stages' rounds as they ran (their records' start times): each round's arm order. Read from
    the records, not the plan's rule, which has changed (the runs of 2026-12-02 rotated the arms)."""
    rounds: dict[int, list[tuple[str, str]]] = {}
    for r in run.records:
        if KINDS[r.job.kind].placement == "offline" and r.started:
            rounds.setdefault(r.job.repeat, []).append((r.started, r.job.arm))
    if len(rounds) < 2:
        return ""
    orders = [" → ".join(literal(a) for a in dict.fromkeys(arm for _, arm in sorted(jobs)))
              for _, jobs in sorted(rounds.items())]
    return f"; offline stages: {len(rounds)} rounds, each arm once a round, in the order {'; '.join(orders)}"


def _block_points(run: RunData) -> str:
    """How the blocks of a together: all run ordered their points, read from the plan it recorded (the rule has
    changed: until 2026-12-04 every block took the matrix's order)."""
    blocks: dict[int, list[str]] = {}
    arm = next((j.arm for j in run.plan.jobs if j.key.startswith("serve/")), None)
    for j in run.plan.jobs:
        kind, point, rep = j.key.split("/", 2)
        if j.arm == arm and kind == "serve" and rep.removeprefix("rep-").isdigit():
            blocks.setdefault(int(rep.removeprefix("rep-")), []).append(point)
    if len({tuple(points) for points in blocks.values()}) > 1:
        return " (each block's points in a random order of its own, the same for every arm)"
    return " (every block in the matrix's order of points)" if len(blocks) > 1 else ""


def _gpu_groups(groups: list[str] | None, crossed: bool) -> str:
    """GPU groups (runtime.gpus, a list) in the intro: how many rounds ran at once, and on which GPUs."""
    if not groups:
        return ""
    where = "; ".join(f"{i}: GPUs {literal(g)}" for i, g in enumerate(groups))
    if crossed:
        return (f", each serving arm on a GPU group of its own, the groups crossed over from round to round (round r: "
                f"the i-th serving arm on group (i + r) mod {len(groups)}; {where}): a group's own speed enters each round's "
                f"score with its layout, and the test takes it out (the mean of the {len(groups)} layouts' means, "
                f"the spread within layouts)")
    return (f", {len(groups)} rounds at a time, each on its own GPU group, both arms of a round on the same "
            f"group (round r on group r mod {len(groups)}; {where})")


def machine_line(run: RunData) -> str | None:
    """The report's header line of where and with what the run ran: the machines, driver, CUDA / ROCm, each arm's
    vLLM (and torch, Triton, FlashInfer, AITER where the run recorded the arms' software), the suite; None for a
    run whose records name no machine (before 2026-12-07: the cards say so)."""
    env = environment(run)
    if not env.machines:
        return None
    return (f"ran on: {literal('; '.join(env.machines))}"
            + (f"; driver {literal(', '.join(env.drivers))}" if env.drivers else "")
            + (f"; CUDA/ROCm {literal(', '.join(env.cuda))}" if env.cuda else "")
            + (f"; CPU {literal(', '.join(env.cpus))}" if env.cpus else "")
            + "; vLLM " + literal(", ".join(sorted({str(a.vllm) for a in env.arms.values()})))
            + "".join(f"; {name} {literal(', '.join(versions))}" for name, versions in _packages(env).items())
            + f"; suite {literal(env.suite or '?')}")


def _packages(env: Environment) -> dict[str, list[str]]:
    """"torch" -> the versions the arms recorded (each once, in arm order): torch, Triton, FlashInfer, AITER."""
    out: dict[str, list[str]] = {}
    for info in env.arms.values():
        for name, version in info.packages.items():
            if version not in out.setdefault(name, []):
                out[name].append(version)
    return out


def wall_line(run: RunData) -> str | None:
    """"wall time: 14.7 min running (estimated 16 min before the run)": the stretches' sum, and the estimate a run
    recorded at its start; None when neither is known."""
    guess = run.manifest.estimate_s
    ran, _ = running_seconds(run)
    if ran is None and guess is None:
        return None
    said = f"{ran / 60:.1f} min running" if ran is not None else "running time unknown"
    return f"wall time: {said}" + (f" (estimated {guess / 60:.0f} min before the run)" if guess is not None else "")


def intro(run: RunData) -> list[Paragraph | BulletList | Note]:
    m = run.manifest
    counts = m.job_counts
    matrix = run.matrix
    out: list[Paragraph | BulletList | Note] = []
    if matrix.description:
        out.append(Paragraph(literal(matrix.description)))
    jobs = f" (jobs ok {counts.ok}, failed {counts.failed}, missing {counts.missing})" if counts else ""
    out.append(BulletList([
        f"run: {code(run_name(run))}, status **{literal(m.status)}**{jobs}"
        + (_unfinished(m) if m.status == "running" and counts and counts.missing else ""),
        f"model: {code(matrix.model.id)}"
        + "".join(f" ({literal(a)}: its own, {code(info.model)})" for a, info in m.arms.items() if info.model)
        + f"; runtime: {literal(m.runtime or 'local')}; "
        f"order: {literal(run.order)}"
        + (f", together: {literal(run.design.together)} servers per time window (arms in random order per "
           f"round, seed {literal(run.design.order_seed)})" if run.design.together > 1 and not run.design.all_together
           else "")
        + (f", together: all: every serving arm's server alive at once, a fresh start per round, "
           f"{literal(run.design.blocks)} block{'s' if run.design.blocks != 1 else ''} of every point per round"
           f"{_block_points(run)}, the arms taking turns (seed {literal(run.design.order_seed)})"
           if run.design.all_together else "")
        + _gpu_groups(matrix.runtime.gpu_groups, matrix.runtime.cross_groups)
        + (f", quiet: no request until {literal(f'{run.design.quiet_s:g}')} s after the servers answered"
           if run.design.quiet_s else "")
        + (f", settle: a session's first point measured {literal(f'{matrix.settle_s:g}')} s or more after its "
           "servers answered (load at that point's shape until then)" if matrix.settle_s else "")
        + (", precompile: every serving arm's server started once before the first session of each stretch "
           "(compile caches filled, nothing measured)" if run.design.precompile else "")
        + f"; repeats: {literal(matrix.repeats)}"
        + _offline_rounds(run),
        f"baseline: **{literal(run.baseline)}**; candidates: {literal(', '.join(run.candidates) or '(none)')}"
        + (f"; A/A arm: {literal(run.aa_arm)}" if run.aa_arm else ""),
        *([weights] if (weights := weights_line(matrix, run.baseline)) else []),
        *([where] if (where := machine_line(run)) else []),
        *([wall] if (wall := wall_line(run)) else []),
    ]))
    if run.order == "blocked" and isinstance(matrix.repeats, int) and matrix.repeats > 1:
        out.append(Note("Order **blocked**: each arm ran on its own server at its own time, so machine drift "
                        "between arms is not cancelled and the intervals cover within-server noise only; use "
                        "`order: abba` for verdicts.", "warning"))
    return out


# ------------------------------------------------------------------------------ software, data quality


def _and(items: list[str]) -> str:
    return " and ".join(items) if len(items) <= 2 else ", ".join(items[:-1]) + " and " + items[-1]


SEE_SOFTWARE = " (see Software under Provenance)"


def software_line(run: RunData, arm: str) -> str | None:
    """Whether an arm differs from the baseline only by its patch, for its card: "differ only in" the files its
    patch sets write, identical, or (in bold) every other difference; None when neither arm recorded its software
    (a run from before the suite did: Provenance says so)."""
    d = run.software.get(arm)
    if d is None or d.unrecorded:
        return None
    if d.missing is not None:
        return f"software: not compared with the baseline's ({literal(d.missing)})"
    sw = run.manifest.arms[arm].software
    assert sw is not None
    if d.beyond_patch:
        also = f"; besides the patch sets' {literal(named(d.patched))}" if d.patched else ""
        return (f"**software differs from the baseline's beyond the patch**: "
                f"{'; '.join(literal(p) for p in beyond_patch(d))}{also} — whatever these change is measured with "
                f"the patch{SEE_SOFTWARE}")
    rest = ["its native extensions"] * bool(sw.native) + [f"{name} {literal(v)}" for name, v in sw.versions().items()]
    if d.patched:
        return (f"software: differs from the baseline's only in: {', '.join(code(p) for p in d.patched)} (the patch "
                f"sets' files; {_and([f'every other of its {d.n_files:,} vLLM files', *rest])} as the baseline's)")
    return f"software: identical to the baseline's: {_and([f'its {d.n_files:,} vLLM files', *rest])}"


def _finding_where(run: RunData, f: Finding) -> str:
    """The round (or, together: all, the round and block) a finding is about; blank for none."""
    if f.round is None:
        return ""
    if run.blocks == 1:
        return str(f.round)
    return f"round {f.round}" if f.check in ACROSS_ROUNDS else run.repeat_name(f.round)


HOST_CHECKS = ("other-host", "hosts")  # suite.quality.hosts: they need the machine on each job record


def data_quality_section(run: RunData) -> Section | None:
    if not run.points:
        return None
    findings = order_findings(run.findings)
    if not findings:
        rounds = len({r // run.blocks for p in run.points.values() for reps in p.reps.values() for r in reps})
        recorded = any(r.where is not None for r in run.records)
        software = not all(d.unrecorded for d in run.software.values())
        checks = [c if c != "drift" or rounds >= DRIFT_MIN_ROUNDS else f"drift: not tested, a trend needs "
                  f"{DRIFT_MIN_ROUNDS} {run.design.units} and this run has {rounds}"
                  for c in CHECK_ORDER if (recorded or c not in HOST_CHECKS) and (software or c != "software")]
        if not recorded:
            checks.append(f"{', '.join(HOST_CHECKS)}: not tested, no job recorded the machine it ran on")
        if not software:
            checks.append("software: not tested, no arm recorded its software")
        return Section("Data quality", 2, [Paragraph(
            f"No problem found by any check ({', '.join(checks)}).")], anchor="quality")
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for f in findings:
        groups.setdefault((f.severity, f.check, f.arm), []).append(f)
    summary = [[Cell(sev, style="unreliable" if sev == "unreliable" else None), Cell(literal(check)),
                Cell(literal(arm)), Cell(str(len(fs))),
                Cell(literal(", ".join(sorted({f.point or "(all points)" for f in fs})))),
                Cell(literal(fs[0].message) + (f" (and {len(fs) - 1} more like it)" if len(fs) > 1 else ""))]
               for (sev, check, arm), fs in groups.items()]
    rows = [[Cell(f.severity, style="unreliable" if f.severity == "unreliable" else None), Cell(literal(f.check)),
             Cell(literal(f.arm)), Cell(literal(f.point or "(all points)")),
             Cell(_finding_where(run, f)), Cell(literal(f.message))] for f in findings]
    n_bad = sum(f.severity == "unreliable" for f in findings)
    return Section("Data quality", 2, [
        Paragraph(f"{n_bad} unreliable finding(s) and {len(findings) - n_bad} warning(s). An unreliable repeat is "
                  "left out of its cells and of the primary test (for the metrics it spoils); a warning is shown "
                  "here only."),
        Table(["Severity", "Check", "Arm", "Findings", "Points", "First finding"], summary,
              align=["left", "left", "left", "right", "left", "left"], name="quality"),
        Section("Every finding", 3, [Table(["Severity", "Check", "Arm", "Point",
                                            "Round" if run.blocks == 1 else "Where", "Finding"], rows,
                                           align=["left", "left", "left", "left", "right", "left"],
                                           name="quality")], collapsed=True)], anchor="quality")


# ------------------------------------------------------------------------------------- jobs, provenance


def failures_section(run: RunData) -> Section | None:
    failed = failed_jobs(run)
    if not failed:
        return None
    rows = []
    for r in failed:
        died = " (server died)" if r.server_died else ""
        rows.append([Cell(literal(r.job.arm)), Cell(literal(r.job.key)), Cell(literal(r.status)),
                     Cell(literal(r.first_error_line(ERROR_CHARS)) + died)])
    return Section("Failed jobs", 2, [Table(["Arm", "Job", "Status", "Error"], rows, align=["left"] * 4,
                                            name="failures")], anchor="failures")


SLURM_TITLE = "Slurm jobs"


def slurm_section(run: RunData) -> Section | None:
    """Every Slurm submission of the run (killed and resubmitted ones included), from the driver's ledger."""
    try:
        ledger = run.store.slurm_ledger()
    except SuiteError as exc:
        return Section(SLURM_TITLE, 2, [Note(f"The Slurm job ledger could not be read: {literal(str(exc))}",
                                             "warning")], anchor="slurm")
    subs = ledger.submissions if ledger is not None else []
    if not subs:
        return None
    rows = []
    for s in subs:
        state = s.state + (f" ({s.exit_code})" if s.exit_code else "")
        rows.append([Cell(literal(s.session)), Cell(str(s.attempt)), Cell(literal(s.job_id)),
                     Cell(literal(s.node or "—")), Cell(literal(state)), Cell(literal(s.start or "—")),
                     Cell(literal(s.end or "—")), Cell("—" if s.missing_after is None else str(s.missing_after))])
    blocks: list[Any] = [Table(["Session", "Attempt", "Job id", "Node", "State", "Start", "End",
                                "Jobs missing after"], rows, align=["left"] * 8, name="slurm")]
    resubmitted = sorted({s.session for s in subs if s.attempt > 0})
    if resubmitted:
        blocks.append(Paragraph(f"Resubmitted sessions: {literal(', '.join(resubmitted))} (a resubmission runs only "
                                "the jobs still missing; the results of the earlier attempt were kept)."))
    nodes = sorted({s.node for s in subs if s.node})
    if len(nodes) > 1:
        blocks.append(Note(f"Sessions ran on {len(nodes)} nodes ({literal(', '.join(nodes))}): arms compared across "
                           "nodes carry the nodes' difference too.", "warning"))
    return Section(SLURM_TITLE, 2, blocks, anchor="slurm")


def gpus_line(models: dict[str, int]) -> str:
    """Provenance: the GPUs the jobs ran on (``run_facts.gpu_models``), and a warning when they differ."""
    if len(models) == 1:
        ((gpus, n),) = models.items()
        return f"GPUs (nvidia-smi before each job): {literal(gpus)}, in all {n} jobs that recorded them"
    return ("**GPUs differ between jobs** (nvidia-smi before each job): " + "; ".join(
        f"{literal(gpus)} in {n} jobs" for gpus, n in models.items())
        + ": the run mixes GPU models (a run resumed on another machine), and its rounds with them")


def _tree(sw: ArmSoftware) -> str:
    return f"{sw.vllm_files:,} files, sha256 {code((sw.vllm_digest or '?')[:16])}" if sw.vllm_files else "not found"


def software_table(run: RunData) -> list[Any] | None:
    """Each arm's software as its own environment had it at the run's start (what its servers import), and each
    arm against the baseline; None when no arm recorded it."""
    arms = {a: info.software for a, info in run.manifest.arms.items()}
    if all(sw is None for sw in arms.values()):
        return None
    rows = []
    for arm, sw in arms.items():
        if sw is None or sw.error is not None:
            why = "not recorded" + (f": {sw.error}" if sw is not None else "")
            rows.append([Cell(f"**{literal(arm)}**"), Cell(literal(why))] + [Cell("—") for _ in range(7)])
            continue
        names = ("vllm", "torch", "triton", "flashinfer", "aiter")
        pkgs = [sw.package(name) for name in names]
        cells = [literal(p.label() if p.distribution in (None, name) else f"{p.distribution} {p.label()}") if p
                 else "—" for name, p in zip(names, pkgs, strict=True)]
        cells[1] += f" ({literal(sw.torch_gpu())})" if pkgs[1] and sw.torch_gpu() else ""
        native = "\n".join(f"{code(path)} {code(h[:12])}" for path, h in sw.native.items()) or "none"
        rows.append([Cell(f"**{literal(arm)}**"), *map(Cell, cells), Cell(literal(sw.python or "—")),
                     Cell(_tree(sw)), Cell(native)])
    blocks: list[Any] = [
        Paragraph("Software: what each arm's servers import, read in the arm's own environment before its first "
                  "server started (every file of its vllm package and its sha256: "
                  f"{code('<arm>/vllm-files.json')})."),
        Table(["Arm", "vLLM", "torch", "Triton", "FlashInfer", "AITER", "Python", "vLLM tree", "Native extensions"],
              rows, align=["left"] * 9, name="software")]
    against = [f"{literal(arm)}: " + (line.removeprefix("software: ").removesuffix(SEE_SOFTWARE)
                                       if (line := software_line(run, arm)) else "not compared")
               for arm in run.software]
    if against:
        blocks.append(BulletList(against))
    return blocks


def provenance_section(run: RunData) -> Section:
    m = run.manifest
    host = m.host
    items = [f"suite {literal(m.suite_version)}; created {literal(m.created)}; finished "
             f"{literal(m.finished or '—')}; matrix file {code(m.matrix_path)}",
             f"host {literal(host.hostname)}: {literal(host.platform)}, {host.cpu_count} CPUs, "
             f"Python {literal(host.python)}"]
    if len(m.stretches) > 1:  # resumed: each stretch's own time and machine
        items.append(f"ran in {len(m.stretches)} stretches (resumed): " + "; ".join(
            f"{literal(s.started)} to {literal(s.finished or '—')}"
            + (f" (no end recorded; its last job ended {literal(last)})" if s.finished is None and last else "")
            + (f" on {literal(s.where.label())}" if s.where is not None else f" on {literal(s.hostname)}"
               # host names repeat (every device machine is "vm"): the boot tells two machines apart
               f"{f' (boot {literal(s.boot_id[:8])})' if s.boot_id else ''}")
            + f", {s.jobs} jobs to run"
            for s, last in zip(m.stretches, stretch_last_jobs(run), strict=True)))
    if models := gpu_models(run):
        items.append(gpus_line(models))
    weights = weights_line(run.matrix, run.baseline)
    if weights:
        args = m.weights.model_args if m.weights else []
        items.append(weights + (f"; model flags {code(' '.join(args))}" if args else ""))
    if m.compare:
        a, b = m.compare.a, m.compare.b
        items.append(f"compared: {literal(a.arm)} of {code(a.run)} ({literal(a.status)}) as {literal(a.label)} "
                     f"against {literal(b.arm)} of {code(b.run)} ({literal(b.status)}) as {literal(b.label)}")
    rows = []
    for arm, info in m.arms.items():
        patches = "\n".join(f"{'reverse ' if p.reverse else ''}**{literal(p.name)}** {code(p.sha256)}"
                            for p in info.patches) or "none"
        env = ", ".join(f"{k}={v}" for k, v in info.env.items())
        extra = {k: v for k, v in {"model": info.model, **(info.model_extra or {})}.items()
                 if v not in (None, "", [], {})}
        rows.append([Cell(f"**{literal(arm)}**"), Cell(literal(info.vllm_version)),
                     Cell(literal(info.image or "—")), Cell(patches), Cell(code(env) if env else "—"),
                     Cell(literal(json.dumps(extra, sort_keys=True)) if extra else "—")])
    software = software_table(run)
    if software is None and m.arms:
        items.append("the arms' software (every vLLM file's sha256, torch / Triton / FlashInfer / AITER versions, "
                     "native extensions): not recorded (the run predates the suite recording it)")
    blocks: list[Any] = [BulletList(items)]
    if rows:
        blocks.append(Table(["Arm", "vLLM", "Image", "Patches (sha256)", "Env", "Other"], rows, align=["left"] * 6,
                            name="provenance"))
    if software is not None:
        blocks += software
    blocks.append(Code(json.dumps(run.matrix.model_dump(mode="json", exclude_unset=True), indent=2, sort_keys=True),
                       title="Resolved matrix"))
    return Section("Provenance", 2, blocks, anchor="provenance")
