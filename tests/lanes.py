"""Two lanes on a 2-core box: the server-bound tests in one, everything else beside them.

A test marked e2e, docker or slurm starts real vLLM servers, containers or a Slurm cluster: those run one at a
time, in one pytest-xdist worker, in their usual order with the Docker modules last (a tiny-MoE CPU server
takes ~3 GiB, and one module's servers must not share the box with another's). Every other test (pure Python,
CLI calls on stored data, the persistent client without a server) runs in the other worker(s) meanwhile: a
server-bound module spends most of its time in single-threaded imports and waits, so the second core is free
for them. A test marked docker_build (the Docker modules' CPU images: minutes of building, no server) runs
last in that other lane, long before the server lane's Docker modules need its images.

`make test` runs ``pytest -n auto --dist loadgroup --no-loadscope-reorder``: the server lane is the first
work unit (its items lead the collection, and xdist names them ``...@servers``), so it starts at once; every
other test is a unit of its own, handed to whichever worker is free (while the server lane runs, that is the
other one, in collection order, so a module-scoped fixture is mostly built once). Without xdist
(`pytest tests/test_x.py`) the server-bound tests simply run first.

pytest 9.2 changed how node ids are stored, and pytest-xdist 3.8's loadgroup silently stops grouping under it
(pytest-dev/pytest-xdist#1386): the locks pin pytest 9.1.1, and tests/test_lanes_and_budget.py fails if the
grouping is lost.
"""

from __future__ import annotations

import os

import pytest

SERVER_MARKS = ("e2e", "docker", "slurm")
SERVER_LANE = "servers"
LATE_MARK = "docker_build"
# a worker starts with the terminal size execnet gives it (COLUMNS=80, LINES=24): the CLI's tables then wrap
# where a test reads them whole; a worker takes the controller's own values (usually none) instead
TERMINAL_VARS = ("COLUMNS", "LINES")


def server_bound(item: pytest.Item) -> bool:
    return not late(item) and any(item.get_closest_marker(mark) for mark in SERVER_MARKS)


def late(item: pytest.Item) -> bool:
    """A Docker image build (marked docker_build): no server, but minutes of work, done once the other lane's
    quick tests are through, well before the server lane's Docker modules need its images."""
    return item.get_closest_marker(LATE_MARK) is not None


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the Docker modules last: the other lane builds their images meanwhile (tests/test_docker_build.py), and a
    # module whose images are still being built waits for that build (suite.runtime.docker.image_build.build_lock)
    servers = sorted((item for item in items if server_bound(item)),
                     key=lambda item: item.get_closest_marker("docker") is not None)
    for item in servers:
        item.add_marker(pytest.mark.xdist_group(SERVER_LANE))
    rest = [item for item in items if not server_bound(item)]
    items[:] = servers + [item for item in rest if not late(item)] + [item for item in rest if late(item)]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on the controller: what each worker gets
def pytest_configure_node(node) -> None:
    node.workerinput["suite_terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_VARS}


def pytest_configure(config: pytest.Config) -> None:
    for key, value in getattr(config, "workerinput", {}).get("suite_terminal_env", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
