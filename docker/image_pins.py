"""Constraints that keep an image's Python packages as they are while another tool (lm-eval) is installed.

    python3 image_pins.py > /tmp/image-pins.txt
    pip install -c /tmp/image-pins.txt "lm-eval[api]==X"

One ``name==version`` line per distribution the interpreter imports: where a name is installed twice (a
Debian copy in dist-packages under pip's copy in site-packages), the first one on ``sys.path``, the one an
``import`` finds, which is the one vLLM was tested with. A version that is not PEP 440 (Debian's
``1.1build1``) cannot be a constraint, and pip >= 24.1 refuses the whole file for one such line: it is left
out and named in a comment (pip does not replace such a package, it cannot compare its version).
Runs with the image's own interpreter during the build; standard library and ``packaging`` only (vLLM
depends on it).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from packaging.version import InvalidVersion, Version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(dists: object = None) -> tuple[list[str], list[str]]:
    """(constraint lines, skipped lines as comments) for the distributions in import order."""
    seen: dict[str, str] = {}
    skipped: list[str] = []
    for dist in dists if dists is not None else importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name or canonical(name) in seen:
            continue  # a shadowed copy: the import system never loads it
        try:
            Version(dist.version)
        except InvalidVersion:
            skipped.append(f"# {canonical(name)} {dist.version}: not a PEP 440 version, not pinned")
            seen[canonical(name)] = ""
            continue
        seen[canonical(name)] = dist.version
    lines = [f"{n}=={v}" for n, v in sorted(seen.items()) if v]
    return lines, skipped


def main() -> int:
    lines, skipped = pins()
    sys.stdout.write("\n".join([*skipped, *lines]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
