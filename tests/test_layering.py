"""The house rules, read from the code's own imports: one-way flow, no cycles, no import-by-string.

Every `import`/`from ... import` of a `suite` module anywhere in a file (top level or inside a function)
counts. The order is the data flow of docs/ARCHITECTURE.md: a module may import only modules of its own
layer or of the layers before it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "suite"

# every package under suite/stages/ is a stage; its modules' floors are placed by name, read from the tree
STAGE_PACKAGES = sorted(p.parent.name for p in (SUITE / "stages").glob("*/__init__.py"))
# the floors, in order; a module belongs to the first prefix that matches (longest prefixes first)
LAYERS: list[tuple[str, ...]] = [
    ("suite", "suite.errors", "suite.proc"),
    ("suite.stats", "suite.accuracy_stats", "suite.scores", "suite.verdict", "suite.verdict_family"),
    ("suite.matrix_blocks", "suite.design", "suite.matrix_jobs", "suite.matrix", "suite.matrix_load",
     "suite.served_model", "suite.server_address", "suite.bench_flags", "suite.lm_eval_flags", "suite.model_config",
     "suite.matrix_retired",
     "suite.sbatch",
     "suite.unified_diff", "suite.patches", "suite.patch_track", "suite.fixtures"),
    # what the plan knows of each kind, declared by its stage (spec.py) and gathered in job order (kinds)
    ("suite.stages.spec", "suite.stages.kinds", *(f"suite.stages.{k}.spec" for k in STAGE_PACKAGES)),
    ("suite.plan", "suite.estimate"),
    ("suite.records", "suite.store"),
    ("suite.runtime",),
    ("suite.stages",),  # a stage's run.py (and its helpers): one job against a JobEnv
    ("suite.quality", "suite.document", "suite.stages.serve.checks"),  # a stage's own data-quality checks
    ("suite.candidate", "suite.analysis", "suite.run_facts", "suite.report_sections", "suite.report_verdict",
     "suite.render", "suite.share", "suite.report", "suite.history", "suite.stages.registry",
     *(f"suite.stages.{k}.{m}" for k in STAGE_PACKAGES for m in ("summary", "stage"))),
    ("suite.sequential",),
    ("suite.sessions", "suite.runner", "suite.calibrate"),  # calibrate: this machine (runtime) and its stored runs (store)
    ("suite.doctor", "suite.commands", "suite.cli", "suite.__main__"),
]
# entry points that are allowed above their package: the Slurm worker runs sessions on a node
ENTRY_POINTS = {"suite.runtime.slurm.worker"}


def module_name(path: Path) -> str:
    rel = path.relative_to(SUITE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    mod = module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "suite")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "suite":
                for a in node.names:  # `from suite.stages.serve import run` names a module too
                    full = f"{node.module}.{a.name}"
                    out.add(full if (SUITE.parent / (full.replace(".", "/") + ".py")).is_file() else node.module)
    out.discard(mod)
    return out


MODULES = {module_name(p): p for p in sorted(SUITE.rglob("*.py"))}
GRAPH = {m: {i for i in imports_of(p) if i in MODULES} for m, p in MODULES.items()}


def layer(mod: str) -> int:
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for pre in prefixes:
            if (mod == pre or mod.startswith(pre + ".")) and len(pre) > best_len:
                best, best_len = i, len(pre)
    assert best is not None, f"{mod} is on no floor of docs/ARCHITECTURE.md"
    return best


def test_no_import_cycle():
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_only_flow_one_way(mod):
    if mod in ENTRY_POINTS:
        return
    up = sorted(i for i in GRAPH[mod] if layer(i) > layer(mod))
    assert up == [], f"{mod} (floor {layer(mod)}) imports later floors: {up}"


def test_every_stage_package_declares_its_kinds_and_its_stage():
    """A stage package holds both halves of itself: spec.py (on the plan's floor) and stage.py (on the report's);
    tests/test_plan.py checks the two lists of suite.stages.kinds and suite.stages.registry name them all."""
    assert STAGE_PACKAGES, "no stage package found under suite/stages"
    missing = sorted(f"{k}/{m}.py" for k in STAGE_PACKAGES for m in ("spec", "stage")
                     if not (SUITE / "stages" / k / f"{m}.py").is_file())
    assert missing == []


def test_stage_halves_sit_on_their_floors():
    """The plan-level half of a stage sits below the plan, the run-level half above its run and summary."""
    for k in STAGE_PACKAGES:
        assert layer(f"suite.stages.{k}.spec") < layer("suite.plan") < layer(f"suite.stages.{k}.run")
        assert layer(f"suite.stages.{k}.stage") == layer("suite.stages.registry") == layer(f"suite.stages.{k}.summary")


def test_no_import_by_string():
    for mod, path in MODULES.items():
        text = path.read_text()
        # bench: --gate-factory; gate_paths: the candidate kernels, which a vLLM tree may lack
        assert "import_module(" not in text or mod in ("suite.stages.kernel.bench", "suite.stages.kernel.gate_paths"), mod


def test_report_side_never_reaches_the_runtime_or_runner():
    for mod in MODULES:
        if layer(mod) == layer("suite.analysis") or mod.startswith("suite.stages"):
            bad = sorted(i for i in GRAPH[mod] if i.startswith(("suite.runtime", "suite.runner")))
            assert bad == [], f"{mod} imports {bad}"


def test_architecture_lists_every_module():
    doc = (SUITE.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for path in sorted(SUITE.rglob("*.py")):
        rel = path.relative_to(SUITE.parent).as_posix()
        if path.name == "__init__.py" and path.parent != SUITE:
            continue
        folder, stem = rel.rsplit("/", 1)
        # listed as its path, or in a brace group such as suite/stages/serve/{run,client}.py
        grouped = any(f"{folder}/{{" in line and (f"{{{stem[:-3]}," in line or f",{stem[:-3]}," in line
                                                  or f",{stem[:-3]}}}" in line) for line in doc.splitlines())
        if rel not in doc and not grouped and not any(f"`{rel}`" in line for line in doc.splitlines()):
            # "suite/runtime/docker/runtime.py`, `images.py`" style: the file name after its folder on one line
            if not any(folder in line and f"`{stem}`" in line for line in doc.splitlines()):
                missing.append(rel)
    assert missing == []


# A module holds one job: past this many lines it holds several (split it by job, and place the new modules in
# LAYERS and in docs/ARCHITECTURE.md).
MAX_LINES = 700


def test_no_module_is_over_700_lines():
    lines = {path.relative_to(SUITE.parent).as_posix(): len(path.read_text().splitlines())
             for path in SUITE.rglob("*.py")}
    over = {rel: n for rel, n in sorted(lines.items()) if n > MAX_LINES}
    assert over == {}, f"over {MAX_LINES} lines (split them by job): {over}"


def test_a_design_option_is_read_from_the_design_not_the_matrix():
    """One owner for the experimental design: a design knob (`suite.design.DesignFields`) is read from the matrix
    only where the matrix is checked and planned (`suite.matrix`, `suite.matrix_load`, `suite.plan`, which makes
    the `Design`; `suite.records` reads the knobs of runs recorded before the plan carried one); the runner, the
    executor, the estimate, the analysis and the report read the `Design`. So a new option touches its field,
    `suite.plan.design_of` and what uses it (docs/ARCHITECTURE.md, "A design option"), never a copy of the rule.
    `repeats` and `budget_min` say how long a run goes, not how its rounds run: the sequential runner, the
    estimate and the report read them from the matrix."""
    from suite.design import Design, DesignFields

    knobs = [name for name in DesignFields.model_fields if name not in ("repeats", "budget_min")]
    laid_out = {"drift_check"}  # the plan lays it out as jobs (each session's drift repeat): nothing to record
    assert set(knobs) - laid_out <= set(Design.model_fields), "a knob the plan does not record in the Design"
    reads = re.compile(r"\bmatrix\.(" + "|".join(knobs) + r")\b")
    owners = {"suite/matrix.py", "suite/matrix_load.py", "suite/plan.py", "suite/records.py", "suite/design.py"}
    repo = SUITE.parent
    found = [f"{p.relative_to(repo)}:{n}: {line.strip()}" for p in sorted(SUITE.rglob("*.py"))
             if str(p.relative_to(repo)) not in owners
             for n, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert found == [], "read the plan's Design instead:\n" + "\n".join(found)


# the processes started outside suite.proc, each for a reason suite.proc's two ways do not serve
PROCESS_EXCEPTIONS = {
    # `docker build` streamed line by line into build events (a step once), killed on an interrupt
    ("suite/runtime/docker/image_build.py", "subprocess.Popen"): 1,
    # `suite doctor` asks vLLM (an import in a fresh interpreter) and its CLI at once, each with its timeout
    ("suite/doctor.py", "subprocess.Popen"): 2,
    # the GPU's clock after a timing: in an arm's image the kernel timer stands alone, without the suite package
    ("suite/stages/kernel/timing.py", "subprocess.run"): 1,
}
PROCESS_CALLS = re.compile(r"^(subprocess\.(run|Popen|call|check_call|check_output|getoutput|getstatusoutput)"
                           r"|os\.(system|popen|exec\w*|spawn\w*|posix_spawn\w*|fork))$")


def test_one_way_to_run_a_tool():
    """docs/ARCHITECTURE.md: a tool runs through `suite.proc`: a job or a server through `start` / `run_tool` (its
    process group, log, timeout, the log tail in its error), a short question through `ask` / `query` (its
    timeout; the command in its error, or None for an optional fact). Any other process start is one of the
    named exceptions (an image's standalone tools cannot import the suite: tests/test_docker_unit.py holds them to
    that)."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(SUITE.rglob("*.py")):
        rel = path.relative_to(SUITE.parent).as_posix()
        if rel == "suite/proc.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if PROCESS_CALLS.match(name):
                    found[(rel, name)] = found.get((rel, name), 0) + 1
    assert found == PROCESS_EXCEPTIONS, "start tools through suite.proc (start, run_tool, ask, query)"


# where the runtime kinds are named: the places docs/ARCHITECTURE.md lists for a backend ("An arm backend")
BACKEND_PLACES = {
    "suite/matrix_blocks.py",  # the runtime.kind literal and the runtime blocks' own rules
    "suite/matrix.py",  # what a runtime cannot honour (one rule each)
    "suite/runner.py",  # RUNTIMES, and the Slurm scheduler (sessions as batch jobs)
    "suite/estimate.py",  # which GPUs a runtime's servers see, for the price of a start
    "suite/runtime/preflight.py",  # the checks before a run that only one runtime needs (the Docker engine)
    "suite/commands/doctor.py", "suite/commands/build.py", "suite/commands/slurm_scripts.py",  # its commands
}
RUNTIME_KIND = re.compile(r"""runtime\.kind\s*(==|!=)|kind\s*(==|!=)\s*["'](local|docker|slurm)["']""")


def test_a_backend_is_named_in_its_listed_places():
    """Outside the backends' own modules (suite/runtime/<kind>/, suite/runtime/local.py) a runtime kind is compared
    only in the places docs/ARCHITECTURE.md lists for a new backend; each reads it for its own job."""
    found = set()
    for path in sorted(SUITE.rglob("*.py")):
        rel = path.relative_to(SUITE.parent).as_posix()
        if rel.startswith(("suite/runtime/docker/", "suite/runtime/slurm/")) or rel == "suite/runtime/local.py":
            continue
        if any(RUNTIME_KIND.search(line) for line in path.read_text().splitlines()):
            found.add(rel)
    assert found <= BACKEND_PLACES, f"a runtime kind compared outside the listed places: {sorted(found - BACKEND_PLACES)}"
    assert found == BACKEND_PLACES, f"no longer named there (drop from the list and the docs): {sorted(BACKEND_PLACES - found)}"
