"""Patch sets against a moving vLLM: does each set still apply to a given release (the newest on PyPI, say)?

For each set, on one release, :func:`track_set` checks the set's own diff for that release, or, when its manifest
has none, its newest earlier diff, strictly (the same in-memory apply as every run, :mod:`suite.patches`), in
the direction the manifest's state says, and byte-compiles what it would write:

* ``applies``: the set can be used there as before (a forward set's diff applies; a present set's reverse still
  applies, so the "before" arm can be recreated);
* ``present-upstream``: a forward set's diff applies in reverse: upstream merged the change;
* ``no-longer-applies``: neither; the file and the hunk that fails are named, as `suite validate` names them;
* ``no-diff``: the manifest has no diff for that release or an earlier one.

A result that used an earlier diff is recorded beside the set (``patches/<set>/tracked/<release>.json``):
:meth:`suite.patches.PatchSet.support` lets a run use that diff on that release only while the record says it
applies and the diff's bytes are the ones checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, computed_field

from suite.errors import PatchError
from suite.patches import HunkFailed, PatchSet, TrackResult, base_version, check_diff, release_key
from suite.proc import ask

EXIT_PRESENT_UPSTREAM = 3  # a forward set's change is in the release already (nothing left to measure)
EXIT_NO_LONGER_APPLIES = 4  # a set's diff fails there (takes precedence over 3)
PIP_INDEX_TIMEOUT_S = 120
RELEASE = re.compile(r"^\d+\.\d+\.\d+(\.\d+)?$")  # X.Y.Z (vLLM has had a few X.Y.Z.W)


class TrackReport(BaseModel):
    """What `suite patches track` prints with --json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm: str  # the release checked
    requested: str  # what was asked for: "latest" or a release number
    matrix: str | None = None  # the matrix whose sets were checked (--matrix)
    sets: list[TrackResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        statuses = {r.status for r in self.sets}
        if "no-longer-applies" in statuses:
            return EXIT_NO_LONGER_APPLIES
        if "present-upstream" in statuses:
            return EXIT_PRESENT_UPSTREAM
        return 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def runnable(self) -> bool:
        """Every set checked can be used on the release: a matrix of them can run there."""
        return all(r.status == "applies" for r in self.sets)


# ---------------------------------------------------------------- which release


def latest_vllm_release() -> str:
    """The newest vLLM release on the package index pip is configured for (``pip index versions vllm``: final
    releases only, as pip would install them)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--json", "--disable-pip-version-check"]
    proc = ask(cmd, timeout_s=PIP_INDEX_TIMEOUT_S, what="cannot find the newest vLLM release (no index reachable?)",
               error=PatchError)
    if proc.returncode != 0:
        raise PatchError(f"cannot find the newest vLLM release: `pip index versions vllm` failed: "
                         f"{proc.stderr.strip()[-500:]}")
    try:
        data = json.loads(proc.stdout)
        versions = [v for v in [data.get("latest"), *data.get("versions", [])] if isinstance(v, str)]
    except (json.JSONDecodeError, AttributeError):
        raise PatchError(f"cannot read `pip index versions vllm --json`: {proc.stdout.strip()[:200]!r}") from None
    finals = [v for v in versions if RELEASE.match(v)]
    if not finals:
        raise PatchError("`pip index versions vllm` lists no vLLM release")
    return max(finals, key=release_key)


def resolve_release(spec: str) -> str:
    """``latest`` -> the newest release on the index; ``0.34.0`` (or ``0.34.0+cpu``) -> ``0.34.0``."""
    if spec.strip().lower() == "latest":
        return latest_vllm_release()
    version = base_version(spec)
    if not RELEASE.match(version):
        raise PatchError(f"--vllm {spec!r}: give a release such as 0.34.0, or latest")
    return version


# ---------------------------------------------------------------- one set on one release


def _compiles(changed: dict[str, bytes | None]) -> tuple[str, str] | None:
    """(file, why) of the first written Python file that does not compile, or None."""
    for rel, data in sorted(changed.items()):
        if data is None or not rel.endswith(".py"):
            continue
        try:
            compile(data, rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            return rel, f"{rel}{f':{line}' if line else ''} does not compile: {getattr(exc, 'msg', exc)}"
    return None


def track_set(pset: PatchSet, vllm_version: str, tree: Path) -> TrackResult:
    """How ``pset`` fits the vLLM release whose ``vllm/`` package lies under ``tree`` (see the module doc)."""
    version = base_version(vllm_version)
    support = pset.manifest.versions.get(version)
    diff_version = version if support is not None else pset.earlier_version(version)
    if diff_version is None:
        known = ", ".join(sorted(pset.manifest.versions, key=release_key))
        return TrackResult(set=pset.name, vllm=version, status="no-diff",
                           detail=f"no diff for vLLM {version} or an earlier release (its manifest lists: {known})")
    support = pset.manifest.versions[diff_version]
    fallback = diff_version != version
    diff_name = support.diff or f"{diff_version}.diff"
    path = pset.path / diff_name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PatchError(f"patch set {pset.name!r}: cannot read {path}: {exc.strerror}") from None
    source = f"{pset.name}/{diff_name}"
    which = f"{diff_name} (its newest earlier diff: none for {version})" if fallback else diff_name
    common = dict(set=pset.name, vllm=version, diff=diff_name, diff_version=diff_version, fallback=fallback,
                  sha256=hashlib.sha256(data).hexdigest())

    def attempt(reverse: bool) -> dict[str, bytes | None] | HunkFailed:
        try:
            return check_diff(pset.name, data, source, tree, reverse=reverse)
        except HunkFailed as exc:
            return exc

    def failed(exc: HunkFailed, note: str = "") -> TrackResult:
        return TrackResult(**common, status="no-longer-applies", state=support.state, file=exc.file,
                           hunk=exc.hunk, detail=f"{exc}{note}")

    want_reverse = support.state == "present"
    first = attempt(want_reverse)
    if isinstance(first, HunkFailed):
        other = attempt(not want_reverse)
        if isinstance(other, HunkFailed):
            return failed(first)
        if want_reverse:  # a present set whose forward diff applies: the change left upstream
            return failed(first, f"; {diff_name} applies forward instead: vLLM {version} no longer has the change "
                                 "(reverted upstream?)")
        return TrackResult(**common, status="present-upstream", state="present",
                           detail=f"{which} applies in reverse: vLLM {version} already has the change "
                                  "(merged upstream)")
    broken = _compiles(first)
    if broken is not None:
        return TrackResult(**common, status="no-longer-applies", state=support.state, file=broken[0],
                           detail=f"{source} applies to vLLM {version} but {broken[1]}")
    files = sorted(first)
    if want_reverse:
        detail = f"{which} applies in reverse: upstream still has the change; the before arm reverses it"
    else:
        detail = f"{which} applies"
    return TrackResult(**common, status="applies", state=support.state, files=files, detail=detail)


def record(pset: PatchSet, result: TrackResult) -> Path | None:
    """Keep a result that used an earlier diff beside the set, for a run on that release to read; a result for
    a release the manifest lists needs no record (any old one is removed). Returns the record's path."""
    path = pset.tracked_path(result.vllm)
    if not result.fallback:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(result.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path


def track(sets: Iterable[PatchSet], vllm_version: str, tree: Path, *, requested: str | None = None,
          matrix: str | None = None, keep: bool = True) -> TrackReport:
    """Every set on one release; ``keep``: record the results that used an earlier diff (:func:`record`)."""
    results = []
    for pset in sets:
        result = track_set(pset, vllm_version, tree)
        if keep and result.status != "no-diff":
            record(pset, result)
        results.append(result)
    return TrackReport(vllm=base_version(vllm_version), requested=requested or base_version(vllm_version),
                       matrix=matrix, sets=results)


# ---------------------------------------------------------------- for people: a Markdown summary (CI job summaries)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


STATUS_WORDS = {"applies": "applies", "present-upstream": "**present upstream**",
                "no-longer-applies": "**no longer applies**", "no-diff": "no diff"}


def markdown(report: TrackReport) -> str:
    """The report as Markdown: a table of the sets, then one alert per set that is present upstream or no
    longer applies, naming the file and hunk."""
    asked = " (the newest on the index)" if report.requested == "latest" else ""
    lines = [f"### Patch sets on vLLM {report.vllm}{asked}", ""]
    if not report.sets:
        return "\n".join([*lines, "The matrix uses no patch set.", ""])
    lines += ["| set | on this release | diff checked | |", "|---|---|---|---|"]
    for r in report.sets:
        diff = "—" if r.diff is None else f"`{r.diff}`" + (" (earlier release's)" if r.fallback else "")
        how = f" ({r.state})" if r.status == "applies" and r.state == "present" else ""
        note = f"`{r.file}` {r.hunk or ''}".strip() if r.status == "no-longer-applies" else ", ".join(r.files)
        lines.append(f"| {r.set} | {STATUS_WORDS[r.status]}{how} | {diff} | {_cell(note)} |")
    lines.append("")
    for r in report.sets:
        if r.status == "no-longer-applies":
            where = f"`{r.file}`" + (f", hunk `{r.hunk}`" if r.hunk else "")
            lines += ["> [!CAUTION]",
                      f"> **{r.set} no longer applies to vLLM {r.vllm}**: `{r.diff}` fails at {where}.",
                      f"> {_cell(r.detail)}",
                      f"> Rebase it: write `patches/{r.set}/{r.vllm}.diff` against vLLM {r.vllm} and list "
                      f"`\"{r.vllm}\": {r.state}` in its manifest.", ""]
        elif r.status == "present-upstream":
            lines += ["> [!IMPORTANT]",
                      f"> **{r.set} is present upstream in vLLM {r.vllm}**: {_cell(r.detail)}.",
                      f"> A patched arm would run vLLM's own code. To measure the change as merged, list "
                      f"`\"{r.vllm}\": present` in its manifest and reverse it in the before arm (`-{r.set}`).",
                      ""]
    return "\n".join(lines)
