"""Unified diffs: parsed (git or ``diff -u``: `parse_unified_diff`, every path inside the ``vllm/`` package) and
one file's hunks applied strictly (`apply_hunks`): every hunk's context and removed lines must match exactly, at
the stated line (shifted by the offset at which the previous hunk matched) or at their only exact occurrence
after the previous hunk; no fuzz. Bytes in, bytes out: what files a patch set or diff file writes, and the
all-or-nothing application, are :mod:`suite.patches`'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from suite.errors import PatchError


@dataclass
class Hunk:
    header: str  # the "@@ -a,b +c,d @@ ..." line, for error messages
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, bytes]]  # (' ' | '-' | '+', line bytes including its line ending, if any)

    def reversed(self) -> Hunk:
        flip = {" ": " ", "-": "+", "+": "-"}
        lines = [(flip[op], text) for op, text in self.lines]
        # Keep each run of changed lines in '-' then '+' order (cosmetic; the result is the same).
        header = f"@@ -{self.new_start},{self.new_len} +{self.old_start},{self.old_len} @@ (reversed)"
        return Hunk(header, self.new_start, self.new_len, self.old_start, self.old_len, lines)

    def old_lines(self) -> list[bytes]:
        return [t for op, t in self.lines if op in " -"]

    def new_lines(self) -> list[bytes]:
        return [t for op, t in self.lines if op in " +"]


@dataclass
class FilePatch:
    old_path: str | None  # None for /dev/null (file created)
    new_path: str | None  # None for /dev/null (file deleted)
    hunks: list[Hunk] = field(default_factory=list)

    def reversed(self) -> FilePatch:
        return FilePatch(self.new_path, self.old_path, [h.reversed() for h in self.hunks])

    @property
    def path(self) -> str:
        p = self.new_path or self.old_path
        assert p is not None
        return p


_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_path(raw: bytes) -> str | None:
    text = raw.split(b"\t", 1)[0].strip().decode()
    if text == "/dev/null":
        return None
    parts = text.split("/", 1)  # -p1
    if len(parts) != 2 or not parts[1]:
        raise PatchError(f"diff path {text!r} has no a/ or b/ prefix")
    path = parts[1]
    if path.startswith("/") or ".." in Path(path).parts or not path.startswith("vllm/"):
        raise PatchError(f"diff path {text!r} must lie inside the vllm/ package")
    return path


def parse_unified_diff(data: bytes, source: str = "<diff>") -> list[FilePatch]:
    """Parse a unified diff (git or diff -u). Anything between file sections (git headers, text) is ignored."""
    lines = data.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")):
            if line.startswith(b"@@"):
                raise PatchError(f"{source}:{i + 1}: hunk outside a file section")
            i += 1
            continue
        fp = FilePatch(_strip_path(line[4:]), _strip_path(lines[i + 1][4:]))
        if fp.old_path is None and fp.new_path is None:
            raise PatchError(f"{source}:{i + 1}: both sides are /dev/null")
        i += 2
        while i < len(lines) and lines[i].startswith(b"@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchError(f"{source}:{i + 1}: malformed hunk header {lines[i].decode().strip()!r}")
            hunk = Hunk(
                header=lines[i].decode(errors="replace").rstrip("\r\n"),
                old_start=int(m.group(1)),
                old_len=int(m.group(2)) if m.group(2) is not None else 1,
                new_start=int(m.group(3)),
                new_len=int(m.group(4)) if m.group(4) is not None else 1,
                lines=[],
            )
            i += 1
            old_seen = new_seen = 0
            while old_seen < hunk.old_len or new_seen < hunk.new_len:
                if i >= len(lines):
                    raise PatchError(f"{source}: hunk {hunk.header!r} is truncated")
                body = lines[i]
                op = body[:1].decode(errors="replace")
                if body in (b"\n", b"\r\n"):  # some editors strip the space of an empty context line
                    op, body = " ", b" " + body
                if op not in (" ", "-", "+"):
                    raise PatchError(f"{source}:{i + 1}: unexpected line in hunk {hunk.header!r}")
                hunk.lines.append((op, body[1:]))
                old_seen += op in " -"
                new_seen += op in " +"
                i += 1
                if i < len(lines) and lines[i].startswith(b"\\"):  # "\ No newline at end of file"
                    last_op, last_text = hunk.lines[-1]
                    hunk.lines[-1] = (last_op, last_text.rstrip(b"\r\n"))
                    i += 1
            if old_seen != hunk.old_len or new_seen != hunk.new_len:
                raise PatchError(f"{source}: hunk {hunk.header!r} line counts do not match its header")
            fp.hunks.append(hunk)
        if not fp.hunks and fp.old_path is not None and fp.new_path is not None:
            raise PatchError(f"{source}: file section for {fp.path} has no hunks")
        files.append(fp)
    if not files:
        raise PatchError(f"{source}: no file sections found (not a unified diff?)")
    return files


class HunkError(Exception):
    def __init__(self, hunk: Hunk, detail: str):
        super().__init__(detail)
        self.hunk = hunk
        self.detail = detail


def _unique_block(src: list[bytes], block: list[bytes], lo: int) -> int | None:
    hits = [
        i
        for i in range(lo, len(src) - len(block) + 1)
        if src[i] == block[0] and src[i : i + len(block)] == block
    ]
    # Only an unambiguous block may move: two exact occurrences would make the placement a guess.
    return hits[0] if len(hits) == 1 else None


def apply_hunks(original: bytes | None, fp: FilePatch) -> bytes | None:
    """Apply one file's hunks with zero fuzz: each hunk's old lines (context and removed) must occur exactly,
    at the stated line (shifted by the offset at which the previous hunk matched) or, when an earlier set
    moved them, at their only exact occurrence after the previous hunk. Returns None when the file is
    deleted."""
    if fp.old_path is None:
        if original is not None:
            raise HunkError(fp.hunks[0], "the diff creates this file but it already exists")
        src: list[bytes] = []
    else:
        if original is None:
            raise HunkError(fp.hunks[0], "file does not exist")
        src = original.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0  # next unconsumed index in src
    offset = 0  # how far the previous hunk sat from its stated line (another set moved the file's lines)
    for hunk in fp.hunks:
        old = hunk.old_lines()
        stated = hunk.old_start - 1 if hunk.old_len else hunk.old_start  # len 0: insert *after* old_start
        start = stated + offset  # first guess: where the previous hunk's offset puts it
        if start < pos:
            raise HunkError(hunk, "hunks overlap or are out of order")
        actual = src[start : start + len(old)]
        if actual != old and old:
            # Exact content is required, but another set applied earlier to the same file may have moved it:
            # accept the block's one exact occurrence after the previous hunk (an offset, never fuzz).
            found = _unique_block(src, old, pos)
            if found is not None:
                start, actual = found, old
        if actual != old:
            bad = next((k for k, (a, b) in enumerate(zip(actual, old, strict=False)) if a != b), len(actual))
            want = old[bad].decode(errors="replace").rstrip("\r\n") if bad < len(old) else "<end>"
            got = (
                actual[bad].decode(errors="replace").rstrip("\r\n") if bad < len(actual) else "<end of file>"
            )
            raise HunkError(hunk, f"line {start + bad + 1}: expected {want!r}, found {got!r}")
        out.extend(src[pos:start])
        out.extend(hunk.new_lines())
        pos = start + len(old)
        offset = start - stated
    out.extend(src[pos:])
    if fp.new_path is None:
        if out:
            raise HunkError(fp.hunks[-1], "the diff deletes this file but content would remain")
        return None
    return b"".join(out)
