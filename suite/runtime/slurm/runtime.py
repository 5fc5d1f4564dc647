"""The Slurm runtime on the login node: arms prepared here; the sessions run as batch jobs (the scheduler
suite.runtime.slurm.driver submits them; suite.runtime.slurm.worker serves each one on a node)."""

from __future__ import annotations

from pathlib import Path

from suite.errors import SuiteError
from suite.matrix import Matrix
from suite.matrix_blocks import ArmSpec
from suite.patches import AppliedPatch
from suite.records import ArmRuntimeInfo
from suite.runtime.base import ArmEnv, ArmPlacement
from suite.runtime.local import overlay_words, prepare_local_arm
from suite.runtime.slurm.cluster import preflight, spec_of


class SlurmRuntime:
    """Prepares arms on the login node. Container mode ``none``: like the local runtime (the overlay lies in
    the cache directory, which the compute nodes must see). Container modes: the image's vLLM is not here,
    so the patch sets are checked against the arm's vLLM source tree now (fail before any submission) and
    applied inside the job, on the node, to the image's own vLLM. It starts nothing here: not an arm backend
    (suite.runtime.base.Runtime); the sessions' processes start on the nodes, with the local runtime."""

    kind = "slurm"

    def __init__(self, matrix: Matrix, cache_root: Path):
        self.matrix = matrix
        self.cache_root = cache_root
        self.spec = spec_of(matrix)

    def preflight(self) -> None:
        """The matrix's requests against the cluster (partition, GPUs, `sbatch --test-only`), before any arm is
        prepared or any run directory is made."""
        preflight(self.matrix)

    def image_for(self, spec: ArmSpec) -> str | None:
        return spec.image or self.spec.image

    def prepare_arm(self, arm: str, spec: ArmSpec) -> ArmEnv:
        if self.spec.container == "none":
            return prepare_local_arm(arm, spec, self.cache_root / "overlays")
        image = self.image_for(spec)
        if not image:
            raise SuiteError(f"arm {arm!r}: runtime.slurm.container is {self.spec.container!r} but no image is "
                             "given (set runtime.slurm.image or the arm's image)")
        patches: list[AppliedPatch] = []
        if spec.patches:
            from suite.patches import check_patch_sets, resolve_patches, vllm_source_tree

            tree = vllm_source_tree(spec.vllm, self.cache_root / "vllm-src")
            check_patch_sets(spec.patches, tree, spec.vllm)
            # patch sets and the matrix's own diff files alike: the sha256 of the exact diff the job applies
            patches = [AppliedPatch.resolved(r, "applied in the job") for r in resolve_patches(spec.patches, spec.vllm)]
        return ArmEnv(arm=arm, vllm_version=spec.vllm, image=image, patches=patches)

    def arm_info(self, arm: str) -> ArmRuntimeInfo:  # noqa: ARG002
        return ArmRuntimeInfo()

    def placement(self, arm: str, spec: ArmSpec, offline: bool) -> ArmPlacement:  # noqa: ARG002
        """Each session a batch job on a node; there the local runtime starts the arm's processes, from its
        overlay (container mode none) or from the image's own vLLM with the patches applied in the job."""
        where = ("every session of the arm is a Slurm batch job (container mode "
                 f"{self.spec.container}): `suite slurm-scripts MATRIX` prints them")
        if self.spec.container == "none":
            return ArmPlacement(overlay_words(spec), (("sessions", where),))
        patched = ", its patches applied in the job" if spec.patches else ""
        image = self.image_for(spec) or "<no image: set runtime.slurm.image>"
        return ArmPlacement(f"(on the node, in {self.spec.container} image {image}{patched})", (("sessions", where),))

