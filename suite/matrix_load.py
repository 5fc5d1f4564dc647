"""Load and validate matrix YAML files.

A matrix says *what* to measure (:class:`suite.matrix.Matrix`). Every validation error is reported as
``file:line: field: message``; nothing here starts a process.

:func:`load_matrix` is strict about everything it can check without running anything: unknown fields (with a
did-you-mean, or what to write instead of a retired one), duplicate keys (YAML would keep the last one
silently), sizes beyond the limits of :mod:`suite.matrix_blocks`, patch sets that do not exist or do not fit
the arm's vLLM, diff files and wheels that are missing or malformed. :func:`parse_matrix` without
``base_dir`` checks the text alone (no file system).
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from suite.errors import MatrixError
from suite.matrix import Matrix
from suite.matrix_blocks import SourceFrom, file_sha256
from suite.matrix_retired import retired_message
from suite.model_config import gate_shape, local_config
from suite.served_model import TOKENIZER, map_flag_values

# ---------------------------------------------------------------- loading with file:line errors


def _node_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Line (1-based) of the deepest YAML node reachable along a pydantic error location."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line = key.start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic adds union-branch tags ('int', 'str', 'function-before[...]') into locations.
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"int", "str"})))
    if len(loc) >= 3 and loc[0] == "arms" and loc[2] == "vllm_from":  # written as `vllm: {wheel|git: ...}`
        loc = (*loc[:2], "vllm", *loc[3:])
    return loc


# A whole-matrix check about one place names it first ("serve[2]: ...", "arms.patched.vllm: ..."), so that the
# error points at that place's line.
LOCATED = re.compile(r"^(?:(serve|latency)\[(\d+)\]|arms\.([A-Za-z0-9][A-Za-z0-9_.-]*)\."
                     r"(vllm|patches|serve_args|env|aiter|model\.generate|model)"
                     r"|(serve_args|accuracy|env|arms|model\.generate)|runtime\.(gpus|cross_groups)"
                     r"|verdict\.(points|expect)): ")


def _located(msg: str) -> tuple[tuple[Any, ...], str] | None:
    m = LOCATED.match(msg)
    if not m:
        return None
    if m.group(7):
        loc: tuple[Any, ...] = ("verdict", m.group(7))
    elif m.group(6):
        loc = ("runtime", m.group(6))
    elif m.group(5):
        loc = tuple(m.group(5).split("."))
    else:
        loc = (m.group(1), int(m.group(2))) if m.group(1) else ("arms", m.group(3), *m.group(4).split("."))
    return loc, msg[m.end():]


FIELD_PREFIX = re.compile(r"^([a-z_]+): ")


def _mapping_at(data: Any, loc: tuple[Any, ...]) -> dict[str, Any] | None:
    """The mapping the matrix's data holds at ``loc`` (a field's block), or None."""
    for part in loc:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data if isinstance(data, dict) else None


def _has_key(root: yaml.Node | None, loc: tuple[Any, ...], key: str) -> bool:
    node = root
    for part in (*loc, key):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return False
    return node is not None


def _duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """Every mapping key given twice (YAML keeps the last one silently: two arms named `baseline` would be
    one arm), reported at the second key's line."""
    errors: list[str] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, loc = stack.pop()
        if id(node) in seen_nodes:  # aliases share nodes (and may be recursive)
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    ident = (key.tag, key.value)
                    if ident in first:
                        errors.append(f"{source}:{line}: {_format_loc((*loc, key.value))}: duplicate key "
                                      f"(first at line {first[ident]}); YAML would keep only the last one")
                    else:
                        first[ident] = line
                    stack.append((value, (*loc, key.value)))
                else:
                    stack.append((value, loc))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
    return sorted(errors, key=lambda e: int(e[len(source) + 1:].split(":", 1)[0]))


@functools.cache
def known_fields() -> tuple[str, ...]:
    """Every field name (and alias) of the matrix's models: where an unknown field's did-you-mean looks."""
    names: set[str] = set()
    todo: list[type[BaseModel]] = [Matrix]
    seen: set[type[BaseModel]] = set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            names.update(x for x in (name, info.alias) if x)
            todo.extend(_model_types(info.annotation))
    return tuple(sorted(names))


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a field's annotation (through lists, dicts, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _model_types(arg)]


def parse_matrix(text: str, source: str = "<matrix>", base_dir: Path | None = None) -> Matrix:
    """Validate a matrix's text. With ``base_dir`` (the matrix file's directory) also resolve its relative
    paths and check what they name: patch sets, diff files, wheels (see :func:`check_files`)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise MatrixError(f"{source}:{line}: YAML syntax: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:  # e.g. a reader error (control character): it has a position, not a mark
        pos = getattr(exc, "position", None)
        line = text.count("\n", 0, pos) + 1 if isinstance(pos, int) else 1
        raise MatrixError(f"{source}:{line}: YAML: {exc}") from None
    except RecursionError:
        raise MatrixError(f"{source}:1: YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise MatrixError(f"{source}:1: a matrix must be a mapping at the top level")
    duplicates = _duplicate_keys(root, source)
    if duplicates:
        raise MatrixError("\n".join(duplicates))
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _clean_loc(tuple(err["loc"]))
            line = _node_line(root, loc) or 1
            msg = err["msg"].removeprefix("Value error, ")
            where = _located(msg) if not loc else None
            field = FIELD_PREFIX.match(msg) if loc and not where else None
            if where:  # a check about one place: point at that place's line
                loc, msg = where
                line = _node_line(root, loc) or 1
            elif field and _has_key(root, loc, field.group(1)):  # "vllm: ..." about the arm's vllm key
                loc, msg = (*loc, field.group(1)), msg[field.end():]
                line = _node_line(root, loc) or line
            if err["type"] == "extra_forbidden" and (retired := retired_message(loc, err["input"],
                                                                                _mapping_at(data, loc[:-1]))):
                msg = retired
            elif err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(loc[-1]) if loc else "", known_fields(), n=1, cutoff=0.7)
                msg = "unknown field" + (f" (did you mean {close[0]}?)" if close else "")
            elif err["type"] == "less_than_equal" and isinstance(err["input"], int | float):
                msg = f"{err['input']:,} is beyond the limit {err['ctx']['le']:,} (a typo?)"
            lines.append((err["type"] != "extra_forbidden", line, f"{source}:{line}: {_format_loc(loc)}: {msg}"))
        # unknown fields first, by line: a typo'd name is why the field it meant reads missing
        raise MatrixError("\n".join(text for *_, text in sorted(lines, key=lambda x: x[:2]))) from None
    if base_dir is not None:
        matrix = resolve_local_paths(matrix, base_dir)
        errors = check_files(matrix)
        if errors:
            raise MatrixError("\n".join(f"{source}:{_node_line(root, loc) or 1}: {_format_loc(loc)}: {msg}"
                                         for loc, msg in errors))
        matrix = with_digests(matrix)
    return matrix


def _local(value: str | None, base_dir: Path) -> str | None:
    """An absolute path for a value written as a local path (./, ../, /, ~); anything else as it is."""
    if value is None:
        return None
    if value.startswith("~"):
        return str(Path(value).expanduser().resolve())
    if value.startswith(("./", "../", "/")):
        return str((base_dir / value).resolve())
    return value


def _local_tokenizer(args: list[str], base_dir: Path) -> list[str]:
    """serve_args with a --tokenizer written as a local path made absolute."""
    return map_flag_values(args, TOKENIZER, lambda value: _local(value, base_dir) or value)


def resolve_local_paths(matrix: Matrix, base_dir: Path) -> Matrix:
    """Make local paths absolute (relative to the matrix): a model id or a --tokenizer in serve_args that names
    a directory (./, ../, /, ~), diff files in `patches:`, wheel files and local git repositories in `vllm:` and
    `aiter:`, the tuned CSVs of `aiter:`, and `runtime.docker.hf_cache`."""
    base_dir = Path(base_dir)
    model = matrix.model.model_copy(update={"id": _local(matrix.model.id, base_dir)})
    arms = {}
    for name, arm in matrix.arms.items():
        patches = [ref.model_copy(update={"path": str((base_dir / ref.path).expanduser().resolve())})
                   if ref.path is not None else ref for ref in arm.patches]
        src = arm.vllm_from
        if src is not None:
            src = src.model_copy(update={
                "wheel": str((base_dir / src.wheel).expanduser().resolve()) if src.wheel is not None else None,
                "git": _local(src.git, base_dir)})
        own = arm.model
        if own is not None:
            own = own.model_copy(update={"id": _local(own.id, base_dir)})
        aiter = arm.aiter
        if aiter is not None:
            aiter = aiter.model_copy(update={
                "wheel": str((base_dir / aiter.wheel).expanduser().resolve()) if aiter.wheel is not None else None,
                "git": _local(aiter.git, base_dir),
                "tuned_gemm_bf16": [str((base_dir / p).expanduser().resolve()) for p in aiter.tuned_gemm_bf16]})
        arms[name] = arm.model_copy(update={"patches": patches, "vllm_from": src, "model": own, "aiter": aiter,
                                            "serve_args": _local_tokenizer(arm.serve_args, base_dir)})
    runtime = matrix.runtime
    if runtime.docker is not None and runtime.docker.hf_cache:  # a bind mount needs an absolute path
        hf_cache = str((base_dir / Path(runtime.docker.hf_cache).expanduser()).resolve())
        runtime = runtime.model_copy(update={"docker": runtime.docker.model_copy(update={"hf_cache": hf_cache})})
    return matrix.model_copy(update={"model": model, "arms": arms, "runtime": runtime,
                                     "serve_args": _local_tokenizer(matrix.serve_args, base_dir)})


def missing_model_paths(matrix: Matrix) -> list[str]:
    """The models' local directories (model.id, a --tokenizer in serve_args, given as a path: ./, ../, /, ~) that
    do not exist and that no generator writes. Found here, a typo in a path is not found first by a server that
    fails to start, after every arm's image was built. Not an error of the file: a directory may be made later
    (`make model`), so `suite validate` warns and `suite run` refuses."""
    out = []
    for name, m in matrix.models_by_arm().items():
        own = matrix.arms[name].model is not None
        places = [] if m.generate is not None else [(f"arms.{name}.model.id: " if own else "model.id: ", m.id)]
        if (where := matrix.flag_place(name, TOKENIZER)) is not None:  # a generated model is written at the start
            places.append((f"{where}: {TOKENIZER} ", m.tokenizer))
        for field, value in places:
            if Path(value).is_absolute() and not Path(value).is_dir():  # else a Hugging Face id (org/name)
                out.append(f"{field}{value} is no directory (a local model must exist before the run; "
                           "`make model` writes models/tiny-moe; a Hugging Face id has the form org/name)")
    return list(dict.fromkeys(out))


def gate_shape_problems(matrix: Matrix) -> list[str]:
    """With a kernel block: the arms' models given as local directories whose config gives no router gate shape
    (a dense model; `suite.model_config.gate_shape`), found before any server starts rather than by the kernel
    job at the run's end. A hub id's config is read where the job runs, and only there."""
    if matrix.kernel is None:
        return []
    out = []
    for model in dict.fromkeys(m.id for m in matrix.models_by_arm().values()):
        try:
            if (config := local_config(model)) is not None:
                gate_shape(config, model)
        except ValueError as exc:
            out.append(f"kernel: {exc}")
    return out


def _wheel_errors(loc: tuple[str, ...], src: SourceFrom | None, what: str) -> list[tuple[tuple[Any, ...], str]]:
    """A source's wheel (an arm's vLLM or AITER): missing, or not the sha256 the matrix gives."""
    if src is None or src.wheel is None:
        return []
    wheel = Path(src.wheel)
    if not wheel.is_file():
        return [((*loc, "wheel"), f"{what} {wheel} does not exist")]
    if src.sha256 is not None and file_sha256(wheel) != src.sha256:
        return [((*loc, "sha256"), f"{wheel.name} has sha256 {file_sha256(wheel)}, not the {src.sha256} the matrix "
                 "gives")]
    return []


def check_files(matrix: Matrix) -> list[tuple[tuple[Any, ...], str]]:
    """What a matrix names on disk, checked before anything runs: each patch set exists and fits the arm's
    vLLM version (forward / present), each diff file exists and is a unified diff, each wheel (vLLM's, AITER's)
    exists and matches its sha256, each tuned CSV of `aiter:` exists. Returns (location, message) pairs; empty when all is well."""
    from suite.errors import PatchError
    from suite.patches import get_patch_set, list_patch_sets, resolve_patches

    errors: list[tuple[tuple[Any, ...], str]] = []
    known: list[str] | None = None
    for name, arm in matrix.arms.items():
        bad_ref = False
        for i, ref in enumerate(arm.patches):
            where = ("arms", name, "patches", i)
            try:
                if ref.path is None:
                    get_patch_set(ref.name)
                # a set: fits the arm's vLLM version, forward/reverse as its manifest says; a diff file: it
                # reads and parses (no version to check)
                resolve_patches([ref], arm.vllm)
            except PatchError as exc:
                bad_ref = True
                msg = str(exc)
                if ref.path is None and msg.startswith("unknown patch set"):
                    if known is None:
                        try:
                            known = [s.name for s in list_patch_sets()]
                        except PatchError:  # a broken manifest elsewhere: its own error, not this one's
                            known = []
                    msg = (f"unknown patch set {ref.name!r} (known: {', '.join(known) or 'none'}; a diff file "
                           "of your own ends in .diff or .patch, or holds a '/')")
                errors.append((where, msg))
            if ref.path is not None and ref.sha256 is not None and not bad_ref and Path(ref.path).is_file() \
                    and file_sha256(Path(ref.path)) != ref.sha256:
                bad_ref = True
                errors.append((where, f"{Path(ref.path).name} has sha256 {file_sha256(Path(ref.path))}, not the "
                                      f"{ref.sha256} the matrix gives"))
        if arm.patches and not bad_ref:
            try:  # all of them together: nothing listed twice
                resolve_patches(arm.patches, arm.vllm)
            except PatchError as exc:
                errors.append((("arms", name, "patches"), str(exc)))
        errors += _wheel_errors(("arms", name, "vllm"), arm.vllm_from, "wheel file")
        aiter = arm.aiter
        errors += _wheel_errors(("arms", name, "aiter"), aiter, "AITER wheel file")
        for i, csv in enumerate(aiter.tuned_gemm_bf16 if aiter is not None else ()):
            if not Path(csv).is_file():
                errors.append((("arms", name, "aiter", "tuned_gemm_bf16", i), f"tuned CSV {csv} does not exist"))
    return errors


def with_digests(matrix: Matrix) -> Matrix:
    """Fill in the sha256 of each wheel and diff file (checked by :func:`check_files` where the matrix gives
    one), so that the resolved matrix, the run manifest, the plan's job hashes and `suite validate` carry it."""
    arms = {}
    for name, arm in matrix.arms.items():
        src = arm.vllm_from
        if src is not None and src.wheel is not None and src.sha256 is None:
            arm = arm.model_copy(update={"vllm_from": src.model_copy(update={"sha256": file_sha256(Path(src.wheel))})})
        aiter = arm.aiter
        if aiter is not None and aiter.wheel is not None and aiter.sha256 is None:
            arm = arm.model_copy(update={"aiter": aiter.model_copy(update={"sha256": file_sha256(Path(aiter.wheel))})})
        patches = [ref.model_copy(update={"sha256": file_sha256(Path(ref.path))})
                   if ref.path is not None and ref.sha256 is None else ref for ref in arm.patches]
        arms[name] = arm.model_copy(update={"patches": patches})
    return matrix.model_copy(update={"arms": arms})


def describe_sources(matrix: Matrix) -> list[str]:
    """One line per arm whose vLLM or patches come from files: for `suite validate` to show what was checked."""
    lines = []
    for name, arm in matrix.arms.items():
        src = arm.vllm_source()
        if src.kind == "wheel":
            lines.append(f"arm {name}: vLLM {src.version} from wheel {src.path} (sha256 {src.sha256})")
        elif src.kind == "git":
            lines.append(f"arm {name}: vLLM {src.version} from git {src.url} @ {src.ref}")
        aiter = arm.aiter
        if aiter is not None and aiter.wheel is not None:
            lines.append(f"arm {name}: AITER from wheel {aiter.wheel} (sha256 {aiter.sha256})")
        elif aiter is not None and aiter.git is not None:
            lines.append(f"arm {name}: AITER from git {aiter.git} @ {aiter.ref}")
        for csv in aiter.tuned_gemm_bf16 if aiter is not None else ():
            lines.append(f"arm {name}: AITER tuned BF16 GEMM CSV {csv} (sha256 {file_sha256(Path(csv))})")
        for ref in arm.patches:
            if ref.path is not None:
                lines.append(f"arm {name}: {'reverse ' if ref.reverse else ''}diff {ref.path} "
                             f"(sha256 {ref.sha256 or '?'})")
    return lines


def line_of(path: str | Path, loc: tuple[Any, ...]) -> int:
    """The line of a matrix file's key at ``loc`` (e.g. ("arms", "mine", "patches")), for an error found after
    loading (1 when the file cannot be read again)."""
    try:
        return _node_line(yaml.compose(Path(path).read_text(), Loader=yaml.SafeLoader), loc) or 1
    except (OSError, yaml.YAMLError):
        return 1


def nothing_to_compare(matrix: Matrix, path: str | Path) -> str | None:
    """A new run of one arm and no A/A arm measures nothing it can compare (a resume may: the run's other arms
    are in it). The error at the arms' line, or None."""
    if len(matrix.arms) >= 2 or matrix.aa:
        return None
    return (f"{path}:{line_of(path, ('arms',))}: arms: one arm ({', '.join(matrix.arms)}) has nothing to compare with: add the baseline, "
            "or aa: true to measure the arm against itself (an A/A run: the noise floor); `suite run --no-compare` "
            "measures one arm's numbers alone")


def load_matrix(path: str | Path) -> Matrix:
    """Load a matrix file strictly: the schema, duplicate keys, sizes, and what it names on disk."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise MatrixError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_matrix(text, source=str(path), base_dir=path.parent.resolve())
