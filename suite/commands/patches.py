"""`suite patches list | check | track | apply`: inspect patch sets, check them against vLLM versions, follow them
onto new vLLM releases, apply them."""

from __future__ import annotations

import argparse
import json
import py_compile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from suite.errors import PatchError
from suite.matrix_blocks import PatchRef
from suite.patches import (
    PatchSet,
    apply_patch_sets,
    base_version,
    get_patch_set,
    list_patch_sets,
    make_overlay,
    vllm_source_tree,
    vllm_version_of,
)

NAME = "patches"
HELP = "List patch sets, check them against vLLM versions, track them on new releases, apply them to a vLLM tree."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="patches_command", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="list the patch sets and the vLLM versions each fits")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(_patches=_list)

    ck = sub.add_parser(
        "check",
        help="apply every set as its manifest says to each vLLM version (in a temporary overlay) and byte-compile",
    )
    ck.add_argument(
        "--vllm",
        action="append",
        metavar="X.Y.Z",
        help="vLLM version to check (repeatable); default: every version any manifest names",
    )
    ck.add_argument(
        "--set", action="append", dest="sets", metavar="NAME", help="only these sets (repeatable)"
    )
    ck.add_argument(
        "--cache-dir", type=Path, help="where extracted vLLM trees are kept (default .cache/vllm-src)"
    )
    ck.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ck.set_defaults(_patches=_check)

    tr = sub.add_parser(
        "track",
        help="does each set still apply to a vLLM release (default: the newest on the index)? its own diff, or "
        "its newest earlier one; records what it finds for runs on that release",
        description="For each patch set, on one vLLM release: applies (its own diff for that release, or, when it "
        "has none, its newest earlier diff applied strictly), present-upstream (a forward set's diff applies in "
        "reverse: the change merged) or no-longer-applies (the file and hunk that fail). An earlier diff found "
        "to apply is recorded in patches/SET/tracked/RELEASE.json; a run on that release uses it only then.",
        epilog="exit status: 0 every set applies (or has no diff that old); 3 a set is present upstream; "
        "4 a set no longer applies (over 3); 2 an error (no index reachable, unknown set)",
    )
    tr.add_argument(
        "--vllm", default="latest", metavar="X.Y.Z|latest",
        help="the vLLM release to check (default latest: the newest on the index pip uses)",
    )
    which = tr.add_mutually_exclusive_group()
    which.add_argument("--set", action="append", dest="sets", metavar="NAME", help="only these sets (repeatable)")
    which.add_argument("--matrix", type=Path, metavar="MATRIX", help="only the sets this matrix's arms name")
    tr.add_argument(
        "--cache-dir", type=Path, help="where extracted vLLM trees are kept (default .cache/vllm-src)"
    )
    tr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tr.add_argument(
        "--markdown", type=Path, metavar="FILE",
        help="also write a Markdown summary to FILE (a table, and an alert naming the hunk for each set that "
        "no longer applies or is present upstream): for a CI job summary",
    )
    tr.add_argument(
        "--no-record", action="store_true",
        help="do not record the results in patches/SET/tracked/ (a run then refuses earlier diffs)",
    )
    tr.set_defaults(_patches=_track)

    ap = sub.add_parser(
        "apply", help="apply patch sets to the vllm/ package under --target (strict, all or nothing)"
    )
    ap.add_argument(
        "names", nargs="*", metavar="NAME",
        help="sets to apply forward, in order; a path ending in .diff/.patch (or holding a '/') is a diff file",
    )
    ap.add_argument(
        "--reverse", action="append", default=[], metavar="NAME",
        help="set (or diff file) to apply in reverse, after the forward ones (repeatable)",
    )
    ap.add_argument(
        "--target", type=Path, required=True, help="directory holding vllm/ (site-packages or overlay)"
    )
    ap.add_argument(
        "--vllm", metavar="X.Y.Z", help="vLLM version of the target (default: read vllm/_version.py)"
    )
    ap.add_argument("--json", action="store_true", help="print the applied sets and sha256s as JSON")
    ap.set_defaults(_patches=_apply)


def run(args: argparse.Namespace) -> int:
    return int(args._patches(args) or 0)


# ---------------------------------------------------------------- list


def _list(args: argparse.Namespace) -> int:
    sets = list_patch_sets()
    if args.json:
        print(json.dumps([{"name": s.name, **s.manifest.model_dump(),
                           "tracked": {v: s.require(v).model_dump() for v in s.tracked_versions()}} for s in sets],
                         indent=2))
        return 0
    table = Table(title="patch sets")
    for col in ("set", "platforms", "vLLM versions", "upstream", "title"):
        table.add_column(col, overflow="fold")
    for s in sets:
        versions = ", ".join(
            [f"{v} ({sup.state})" for v, sup in sorted(s.manifest.versions.items())]
            + [f"{v} ({s.require(v).state}, tracked: {s.require(v).diff})" for v in s.tracked_versions()]
        )
        table.add_row(
            s.name, ", ".join(s.manifest.platforms), versions, s.manifest.upstream or "", s.manifest.title
        )
    Console().print(table)
    return 0


# ---------------------------------------------------------------- check


@dataclass
class CheckResult:
    set: str
    vllm: str
    status: str  # applies | present | conflicts | n/a | error
    detail: str = ""
    files: list[str] | None = None


def check_one(pset: PatchSet, version: str, tree: Path) -> CheckResult:
    """Apply `pset` to a hard-link overlay of `tree` as its manifest says for `version` and byte-compile."""
    support = pset.support(version)
    if support is None:
        return CheckResult(pset.name, version, "n/a", "version not in the manifest")
    ref = PatchRef(name=pset.name, reverse=support.state == "present")
    with tempfile.TemporaryDirectory(prefix="suite-check-") as tmp:
        overlay = Path(tmp) / "overlay"
        make_overlay(tree, overlay)
        try:
            applied = apply_patch_sets([ref], overlay, version)
        except PatchError as exc:
            return CheckResult(pset.name, version, "conflicts", str(exc))
        files = applied[0].files
        for rel in files:
            try:
                py_compile.compile(str(overlay / rel), cfile=str(Path(tmp) / "c.pyc"), doraise=True)
            except py_compile.PyCompileError as exc:
                return CheckResult(pset.name, version, "error", f"{rel} does not compile: {exc.msg}", files)
    if support.state == "present":
        return CheckResult(pset.name, version, "present", "already upstream; reverse applies", files)
    return CheckResult(pset.name, version, "applies", "", files)


_STYLE = {
    "applies": "[green]applies[/green]",
    "present": "[cyan]already present[/cyan]",
    "conflicts": "[red]conflicts[/red]",
    "n/a": "[dim]n/a[/dim]",
    "error": "[red]error[/red]",
}


def _check(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    sets = [get_patch_set(n) for n in args.sets] if args.sets else list_patch_sets()
    if not sets:
        raise PatchError("no patch sets found")
    versions = (
        [base_version(v) for v in args.vllm]
        if args.vllm
        else sorted(
            {v for s in sets for v in s.manifest.versions}, key=lambda v: tuple(int(p) for p in v.split("."))
        )
    )
    trees = {}
    for v in versions:
        trees[v] = vllm_source_tree(v, args.cache_dir, log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
        console.print(f"[dim]vLLM {v}: {trees[v]}[/dim]")
    results = [check_one(s, v, trees[v]) for s in sets for v in versions]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        table = Table(title="patch sets × vLLM versions")
        table.add_column("set")
        for v in versions:
            table.add_column(f"vLLM {v}")
        by = {(r.set, r.vllm): r for r in results}
        for s in sets:
            table.add_row(s.name, *(_STYLE[by[s.name, v].status] for v in versions))
        console.print(table)
        for r in results:
            if r.status in ("conflicts", "error"):
                console.print(f"[red]{r.set} @ {r.vllm}[/red]: {r.detail}")
    return 1 if any(r.status in ("conflicts", "error") for r in results) else 0


# ---------------------------------------------------------------- track


def _matrix_sets(path: Path) -> list[PatchSet]:
    """The patch sets a matrix's arms name, in the order they first appear (its own diff files have no
    manifest, hence no release to track)."""
    from suite.errors import MatrixError
    from suite.matrix_load import parse_matrix

    try:
        text = path.read_text()
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    m = parse_matrix(text, source=str(path))  # no file checks: those would judge the sets on the arms' release
    names = dict.fromkeys(ref.name for arm in m.arms.values() for ref in arm.patches if ref.path is None)
    return [get_patch_set(n) for n in names]


_TRACK_STYLE = {
    "applies": "[green]applies[/green]",
    "present-upstream": "[cyan]present upstream[/cyan]",
    "no-longer-applies": "[red]no longer applies[/red]",
    "no-diff": "[dim]no diff[/dim]",
}


def _track(args: argparse.Namespace) -> int:
    from suite.patch_track import TrackReport, markdown, resolve_release, track

    console = Console(stderr=args.json)
    if args.matrix is not None:
        sets = _matrix_sets(args.matrix)
    else:
        sets = [get_patch_set(n) for n in args.sets] if args.sets else list_patch_sets()
        if not sets:
            raise PatchError("no patch sets found")
    version = resolve_release(args.vllm)
    requested = "latest" if args.vllm.strip().lower() == "latest" else version
    if requested == "latest":
        console.print(f"[dim]newest vLLM release on the index: {version}[/dim]")
    matrix = str(args.matrix) if args.matrix is not None else None
    if sets:
        tree = vllm_source_tree(version, args.cache_dir, log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
        console.print(f"[dim]vLLM {version}: {tree}[/dim]")
        report = track(sets, version, tree, requested=requested, matrix=matrix, keep=not args.no_record)
    else:
        report = TrackReport(vllm=version, requested=requested, matrix=matrix, sets=[])
    if args.markdown is not None:
        args.markdown.write_text(markdown(report))
    if args.json:
        print(report.model_dump_json(indent=2))
        return report.exit_code
    table = Table(title=f"patch sets on vLLM {version}")
    for col in ("set", "status", "diff checked", "files / where it fails"):
        table.add_column(col, overflow="fold")
    for r in report.sets:
        diff = (r.diff or "") + (" (earlier)" if r.fallback else "")
        where = f"{r.file} {r.hunk or ''}".strip() if r.status == "no-longer-applies" else " ".join(r.files)
        state = f" ({r.state})" if r.status == "applies" and r.state == "present" else ""
        table.add_row(r.set, _TRACK_STYLE[r.status] + state, diff, where)
    console.print(table)
    if not report.sets:
        console.print(f"{args.matrix} names no patch set: nothing to track")
    for r in report.sets:
        if r.status in ("no-longer-applies", "present-upstream"):
            console.print(f"{_TRACK_STYLE[r.status]} {r.set} @ {r.vllm}: {r.detail}", highlight=False)
    return report.exit_code


# ---------------------------------------------------------------- apply


def _apply(args: argparse.Namespace) -> int:
    refs = [PatchRef(name=n) for n in args.names] + [PatchRef(name=n, reverse=True) for n in args.reverse]
    if not refs:
        raise PatchError("nothing to apply: name at least one set (or --reverse NAME)")
    version = args.vllm or vllm_version_of(args.target)
    applied = apply_patch_sets(refs, args.target, version)
    if args.json:
        print(
            json.dumps(
                {"vllm": version, "target": str(args.target), "patches": [a.model_dump(mode="json") for a in applied]},
                indent=2,
            )
        )
        return 0
    console = Console()
    for a in applied:
        what = {"applied": "applied", "reversed": "reversed", "present": "already present (no change)"}[
            a.action
        ]
        console.print(f"[green]{what}[/green] {a.name}  sha256 {a.sha256}  {' '.join(a.files)}")
    return 0
