#!/usr/bin/env python3
"""Regenerate the reports of the stored runs under docs/evidence/ from their raw files (raw.tar.xz), as CI
checks them (tests/test_evidence.py): run this after a change to the statistics or the report, read the diff,
and say in the commit why a stored run now reads differently.

    python3 scripts/evidence_reports.py            # every stored run
    python3 scripts/evidence_reports.py NAME ...   # these runs only (docs/evidence/NAME)
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = REPO / "docs" / "evidence"


def unpack(run: Path, dest: Path) -> Path:
    """A stored run's raw files (its raw.tar.xz) unpacked into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(run / "raw.tar.xz") as tar:
        members = tar.getmembers()
        # extractall's filter= needs Python 3.11.4; Debian's 3.11.2 (CI's) lacks it, so the same check by hand:
        # plain files and folders, each inside dest
        for member in members:
            if not (member.isfile() or member.isdir()):
                raise ValueError(f"{run.name}: {member.name} is not a plain file")
            if Path(member.name).is_absolute() or ".." in Path(member.name).parts:
                raise ValueError(f"{run.name}: {member.name} points outside the run")
        tar.extractall(dest, members)
    return dest


def main(names: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from suite.cli import main as suite

    runs = [EVIDENCE / n for n in names] if names else sorted(p for p in EVIDENCE.iterdir() if (p / "raw.tar.xz").is_file())
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            copy = unpack(run, Path(tmp) / run.name)  # the report names its run by the directory's name
            if suite(["report", str(copy)]) != 0:
                print(f"{run.name}: suite report failed")
                return 1
            changed = [n for n in ("report.md", "report.html")
                       if not (run / n).is_file() or (run / n).read_bytes() != (copy / n).read_bytes()]
            for n in changed:
                shutil.copyfile(copy / n, run / n)
            print(f"{run.name}: {'rewrote ' + ', '.join(changed) if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
