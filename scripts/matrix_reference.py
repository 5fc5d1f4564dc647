#!/usr/bin/env python3
"""Write docs/matrix.md, the matrix reference, from the schema itself (`suite.matrix.Matrix` and the models under
it): every field with its type, default and the description the schema carries, so the reference and the
validator cannot drift apart. tests/test_matrix.py fails when the file differs from what this prints.

    python3 scripts/matrix_reference.py            # rewrite docs/matrix.md
"""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "matrix.md"


def _type(annotation: object) -> str:
    """A field's type as a reader writes it in YAML."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_type(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type(args[1])}" if len(args) == 2 else "mapping"
    if origin is typing.Annotated:
        return _type(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _default(info) -> str:
    if info.is_required():
        return "required"
    value = info.default if info.default is not PydanticUndefined else info.default_factory()
    if isinstance(value, BaseModel):
        return "(its defaults)"
    return f"`{value!r}`".replace("None", "null").replace("True", "true").replace("False", "false")


def _blocks(model: type) -> list[type]:
    """The models whose fields ``model`` takes in whole, by inheritance (the Matrix: DesignFields), below the
    schema's own base (Strict, pydantic's BaseModel)."""
    return [base for base in model.__mro__[1:] if getattr(base, "model_fields", None)
            and base.__name__ not in ("Strict", "BaseModel") and base.model_fields.keys() <= model.model_fields.keys()
            and any(name in base.__dict__.get("__annotations__", {}) for name in base.model_fields)]


def reference() -> str:
    sys.path.insert(0, str(REPO))
    from suite.matrix import Matrix

    out = ["# Matrix reference", "",
           "Generated from the schema (`python3 scripts/matrix_reference.py`); `suite validate` checks a matrix against "
           "the same models, with `file:line` in every error. How the fields work together, with an annotated "
           "example: `docs/guide.md`; a starter for your change: `suite init`.", ""]
    todo, seen, settable = [Matrix], [], 0
    while todo:
        model = todo.pop(0)
        if model in seen:
            continue
        seen.append(model)
        # a model's fields, then those of each block of fields it takes in whole (the Matrix: its design's)
        parts = [(model, [n for n in model.model_fields if not any(n in b.model_fields for b in _blocks(model))])]
        parts += [(base, list(base.model_fields)) for base in _blocks(model)]
        for part, names in parts:
            doc = " ".join(inspect.cleandoc(part.__doc__ or "").split("\n\n")[0].split())
            out += [f"## {part.__name__}", "", *([doc, ""] if doc else []),
                    "| Field | Type | Default | What it is |", "|---|---|---|---|"]
            for name in names:
                info = model.model_fields[name]
                key = info.alias or name
                desc = (info.description or "—").replace("|", "\\|").replace("\n", " ")
                out.append(f"| `{key}` | {_type(info.annotation)} | {_default(info)} | {desc} |")
                blocks = _models(info.annotation)
                settable += not blocks
                todo += [m for m in blocks if m not in seen]
            out.append("")
    out[4:4] = [f"{settable} fields a matrix can set, in the blocks below (each block once: every arm has the fields of "
                  "ArmSpec, every serving point those of ServePoint).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    OUT.write_text(reference())
    print(f"wrote {OUT}")
