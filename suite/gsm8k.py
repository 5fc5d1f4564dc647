"""Generate SYNTHETIC grade-school math problems in GSM8K's file format (for tests and the CPU demo).

The files look like GSM8K's (``train.jsonl`` / ``test.jsonl``, one JSON object per line with ``question``
and ``answer``; the answer holds worked steps with ``<<a*b=c>>`` calculator notes and ends in ``#### N``), so
lm-eval's own ``gsm8k`` task reads them unchanged. They are NOT GSM8K: every problem comes from a small set
of templates filled with seeded random numbers. The output directory carries a ``SYNTHETIC`` marker file and
a ``dataset.json`` manifest saying so, and the accuracy report labels results on it as synthetic.
Same seed, same files (byte for byte).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path

SYNTHETIC_MARKER = "SYNTHETIC"
MANIFEST = "dataset.json"
GENERATOR = "suite.gsm8k.write_synthetic_gsm8k"

_NAMES = ("Ana", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Liam")
_PRONOUN = {
    "Ana": "she", "Ben": "he", "Carla": "she", "Dev": "he", "Emma": "she", "Farid": "he",
    "Grace": "she", "Hugo": "he", "Ines": "she", "Jamal": "he", "Kira": "she", "Liam": "he",
}  # fmt: skip
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards")
_THINGS = ("notebook", "sandwich", "ticket", "toy car", "plant", "mug", "scarf", "puzzle")


def _calc(expr: str, value: int) -> str:
    return f"{expr} = <<{expr.replace(' ', '')}={value}>>{value}"


def _packs(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    have, packs, per = rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 12)
    bought = packs * per
    total = have + bought
    q = (
        f"{name} has {have} {item}. {_PRONOUN[name].capitalize()} buys {packs} packs of {item}, and each pack "
        f"holds {per} {item}. How many {item} does {name} have now?"
    )
    a = (
        f"{name} buys {_calc(f'{packs} * {per}', bought)} {item}.\n"
        f"Now {_PRONOUN[name]} has {_calc(f'{have} + {bought}', total)} {item}.\n#### {total}"
    )
    return q, a


def _change(rng: random.Random) -> tuple[str, str]:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    price, count = rng.randint(2, 15), rng.randint(2, 6)
    cost = price * count
    bill = ((cost // 10) + rng.randint(1, 3)) * 10
    change = bill - cost
    q = (
        f"A {thing} costs ${price}. {name} buys {count} of them and pays with ${bill}. "
        f"How much change does {name} get back?"
    )
    a = (
        f"The {thing}s cost {_calc(f'{price} * {count}', cost)} dollars.\n"
        f"The change is {_calc(f'{bill} - {cost}', change)} dollars.\n#### {change}"
    )
    return q, a


def _share(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    friends, each, kept = rng.randint(2, 8), rng.randint(2, 12), rng.randint(1, 9)
    total = friends * each + kept
    shared = total - kept
    q = (
        f"{name} has {total} {item}. {_PRONOUN[name].capitalize()} keeps {kept} for {'her' if _PRONOUN[name] == 'she' else 'him'}self "
        f"and shares the rest equally among {friends} friends. How many {item} does each friend get?"
    )
    a = (
        f"{name} shares {_calc(f'{total} - {kept}', shared)} {item}.\n"
        f"Each friend gets {_calc(f'{shared} / {friends}', each)} {item}.\n#### {each}"
    )
    return q, a


def _wages(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    rate, hours, days = rng.randint(8, 25), rng.randint(2, 8), rng.randint(2, 6)
    per_day = rate * hours
    earned = per_day * days
    spent = rng.randint(1, earned // 10) * 5
    left = earned - spent
    q = (
        f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days. "
        f"Then {_PRONOUN[name]} spends ${spent} on groceries. How many dollars does {name} have left?"
    )
    a = (
        f"Each day {name} earns {_calc(f'{rate} * {hours}', per_day)} dollars.\n"
        f"In {days} days that is {_calc(f'{per_day} * {days}', earned)} dollars.\n"
        f"After groceries {_PRONOUN[name]} has {_calc(f'{earned} - {spent}', left)} dollars left.\n#### {left}"
    )
    return q, a


def _reading(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    per_day, days, extra = rng.randint(5, 30), rng.randint(3, 14), rng.randint(1, 40)
    read = per_day * days
    total = read + extra
    q = (
        f"{name} reads {per_day} pages every day for {days} days, then reads {extra} more pages on the weekend. "
        f"How many pages does {name} read in total?"
    )
    a = (
        f"On weekdays {name} reads {_calc(f'{per_day} * {days}', read)} pages.\n"
        f"In total that is {_calc(f'{read} + {extra}', total)} pages.\n#### {total}"
    )
    return q, a


def _garden(rng: random.Random) -> tuple[str, str]:
    rows, per_row, dead = rng.randint(3, 12), rng.randint(4, 15), rng.randint(1, 10)
    planted = rows * per_row
    dead = min(dead, planted - 1)
    alive = planted - dead
    q = (
        f"A gardener plants {rows} rows of tulips with {per_row} tulips in each row. {dead} of the tulips do not "
        f"bloom. How many tulips bloom?"
    )
    a = (
        f"The gardener plants {_calc(f'{rows} * {per_row}', planted)} tulips.\n"
        f"The number that bloom is {_calc(f'{planted} - {dead}', alive)}.\n#### {alive}"
    )
    return q, a


TEMPLATES: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _packs,
    _change,
    _share,
    _wages,
    _reading,
    _garden,
)


def synthetic_problems(n: int, seed: int, *, exclude: set[str] | None = None) -> list[dict[str, str]]:
    """``n`` distinct problems ``{"question", "answer"}`` from the seeded templates (deterministic)."""
    rng = random.Random(f"suite-gsm8k-{seed}")
    seen = set(exclude or ())
    out: list[dict[str, str]] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct synthetic problems")
        question, answer = TEMPLATES[len(out) % len(TEMPLATES)](rng)
        if question in seen:
            continue
        seen.add(question)
        out.append({"question": question, "answer": answer})
    return out


def answer_value(answer: str) -> str:
    """The final number of a GSM8K answer (the text after ``#### ``)."""
    return answer.rsplit("#### ", 1)[-1].strip()


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)


def is_synthetic_dataset(path: str | Path) -> bool:
    return (Path(path) / SYNTHETIC_MARKER).is_file()


def write_synthetic_gsm8k(out_dir: Path, n_test: int = 50, n_train: int = 20, seed: int = 0) -> Path:
    """Write SYNTHETIC ``train.jsonl`` and ``test.jsonl`` in GSM8K's format to ``out_dir``; returns it.

    Train and test never share a question. A ``SYNTHETIC`` marker and a ``dataset.json`` manifest
    (generator, seed, counts) label the directory as generated, not GSM8K.
    """
    if n_test <= 0 or n_train < 0:
        raise ValueError("n_test must be > 0 and n_train >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    test = synthetic_problems(n_test, seed)
    train = synthetic_problems(n_train, seed + 1_000_003, exclude={r["question"] for r in test})
    _write_jsonl(out / "test.jsonl", test)
    _write_jsonl(out / "train.jsonl", train)
    (out / SYNTHETIC_MARKER).write_text(
        "SYNTHETIC data: template-generated grade-school math problems in GSM8K's file format.\n"
        "This is NOT the GSM8K dataset; accuracy on it says nothing about a model's GSM8K score.\n"
        f"Generated by {GENERATOR}(seed={seed}, n_test={n_test}, n_train={n_train}).\n"
    )
    manifest = {
        "synthetic": True,
        "format": "gsm8k",
        "generator": GENERATOR,
        "seed": seed,
        "n_test": n_test,
        "n_train": n_train,
        "templates": [t.__name__.lstrip("_") for t in TEMPLATES],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out
