"""The docker runtime: each arm's vLLM in an image of its own (image_sources, build_context, images,
image_build), every process of the arm in a container of that image (containers, runtime).

``DOCKER_DIR`` is the repository's docker/ folder, which the image modules read: the vendor Dockerfiles, the
scripts and README placeholders the build context carries, the local base image's build script.
``image_vendor``: the vendor the arms' images are built for and their containers run with (runtime.vendor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from suite import REPO_ROOT

if TYPE_CHECKING:
    from suite.matrix import Matrix
    from suite.matrix_blocks import Vendor

DOCKER_DIR = REPO_ROOT / "docker"


def image_vendor(matrix: Matrix) -> Vendor:
    """The vendor of the arms' images and containers: runtime.vendor, cpu when it is not given (also for a
    matrix of another kind that a docker runtime is built over in code)."""
    return matrix.runtime.hosts_vendor or "cpu"
