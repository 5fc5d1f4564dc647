from __future__ import annotations

import argparse
import os
from pathlib import Path

NAME = "slurm-scripts"
HELP = ("Print the sbatch script of every session of a `runtime: slurm` matrix (container mode none, pyxis or "
        "apptainer) without preparing arms or submitting anything.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", type=Path)
    p.add_argument("--out", type=Path, default=Path("runs"), help="base directory the run directory would be in")


def run(args: argparse.Namespace) -> int:
    from suite import REPO_ROOT
    from suite.errors import SuiteError
    from suite.matrix_load import load_matrix
    from suite.plan import build_plan
    from suite.runtime.slurm.cluster import job_script
    from suite.runtime.slurm.runtime import SlurmRuntime

    matrix = load_matrix(args.matrix)
    if matrix.runtime.kind != "slurm":
        raise SuiteError(f"{args.matrix}: runtime.kind is {matrix.runtime.kind!r}, not 'slurm'")
    runtime = SlurmRuntime(matrix, REPO_ROOT / ".cache")  # no preflight: nothing is submitted
    run_dir = (args.out / f"<utc>-{matrix.name}").resolve()
    plan = build_plan(matrix)
    for s in plan.sessions:
        image = runtime.image_for(plan.arms[s.arm])
        js = job_script(matrix, arm=s.arm, index=s.index, image=image, run_dir=run_dir,
                        matrix_path=args.matrix.resolve(), repo_root=REPO_ROOT, workdir=Path(os.getcwd()))
        print(f"# ---- {js.path} ({len(s.jobs)} jobs)")
        print(js.text)
    return 0
