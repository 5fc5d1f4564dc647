"""suite.proc's short questions to a tool: `ask` (an answer, or an error naming the command) and `query` (an
optional fact: the tool's stdout or None)."""

from __future__ import annotations

import sys

import pytest

from suite.errors import PatchError, SuiteError
from suite.proc import ask, query


def test_ask_returns_the_finished_process_whatever_its_exit_status():
    proc = ask([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
               timeout_s=30, what="a question")
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")


def test_ask_names_the_command_when_the_tool_is_missing_or_silent():
    with pytest.raises(PatchError, match=r"cannot get it: `no-such-tool-xyz` is not on PATH\n  command: "
                                         r"no-such-tool-xyz --version"):
        ask(["no-such-tool-xyz", "--version"], timeout_s=5, what="cannot get it", error=PatchError)
    with pytest.raises(SuiteError, match=r"the sleeper: no answer in 0.5 s\n  command: .* -c 'import time; "):
        ask([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5, what="the sleeper")


def test_ask_gives_the_tool_no_stdin():
    """A tool that reads stdin (a prompt for a password, `git` asking for credentials) gets end of file at once."""
    proc = ask([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout_s=30, what="stdin")
    assert proc.stdout == "''\n"


def test_query_is_the_stdout_or_none():
    assert query([sys.executable, "-c", "print(42)"], timeout_s=30) == "42\n"
    assert query([sys.executable, "-c", "import sys; print(42); sys.exit(1)"], timeout_s=30) is None
    assert query(["no-such-tool-xyz"], timeout_s=5) is None
    assert query([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5) is None
    assert query([sys.executable, "-c", "import os; print(os.environ['X'])"], timeout_s=30, env={"X": "y"}) == "y\n"
