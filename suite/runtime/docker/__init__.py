"""The docker runtime: each arm's vLLM in an image of its own (image_sources, build_context, images,
image_build), every process of the arm in a container of that image (containers, runtime).

``DOCKER_DIR`` is the repository's docker/ folder, which the image modules read: the vendor Dockerfiles, the
scripts and README placeholders the build context carries, the local base image's build script.
"""

from suite import REPO_ROOT

DOCKER_DIR = REPO_ROOT / "docker"
