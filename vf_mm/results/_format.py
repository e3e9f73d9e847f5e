"""The run directory's file formats: ``results.jsonl`` + ``metadata.json`` + ``assets/``;
file names, row keys, and encoding and checking one line. The formats and their crash
safety are specified in ``docs/formats/results.md``.

Invariants this module keeps: a row has ``ROW_KEYS`` (then the caller's extra keys), one
line per (example_id, rollout_index); JSON has no NaN or infinity, so a non-finite number
anywhere in a row is refused with ``ResultsError`` (record a failed score as None) rather
than written as a file other JSON readers cannot parse.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

from vf_mm.errors import ResultsError

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
#: Version of the OUTDIR layout, stored in metadata.json as ``results_format``. Format 1
#: held ``error`` as one ``"Type: message (where)"`` string; readers accept both forms
#: (``vf_mm.types.RolloutError.from_value``).
RESULTS_FORMAT = 2
#: The keys of every results.jsonl line, in the order they are written (``extra`` follows).
ROW_KEYS = (
    "example_id",
    "rollout_index",
    "prompt",
    "completion",
    "answer",
    "info",
    "reward",
    "metrics",
    "error",
    "truncated",
    "num_turns",
    "prompt_tokens",
    "completion_tokens",
    "timing",
)

Key = tuple[int | str, int]


# -- keys and values ---------------------------------------------------------------


def _example_id(value: Any) -> int | str:
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ResultsError(f"example_id must be an int or a str, not {type(value).__name__}")


def _rollout_index(value: Any) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return int(value)
    raise ResultsError(f"rollout_index must be an int >= 0, got {value!r}")


def _number(value: Any, where: str, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f):
            return f
        raise ResultsError(
            f"{where}, field {path!r}: {f} is not JSON (JSON has no NaN or infinity; "
            "record a failed score as None)"
        )
    raise ResultsError(
        f"{where}, field {path!r}: must be a real number or None, not {type(value).__name__}"
        + (" (convert a tensor with float(x))" if hasattr(value, "shape") else "")
    )


def _dumps(row: Any, **options: Any) -> bytes:
    """JSON text and a newline, as UTF-8 (``ensure_ascii=False``); a str with lone
    surrogates (which UTF-8 cannot hold) is written with ``\\u`` escapes instead, so it
    reads back the same. ``options`` go to ``json.dumps`` (default: one compact line)."""
    options = {"allow_nan": False, "separators": (",", ":"), **options}
    try:
        return (json.dumps(row, ensure_ascii=False, **options) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(row, ensure_ascii=True, **options) + "\n").encode("ascii")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_line(raw: bytes, *, lenient: bool = False) -> tuple[dict[str, Any] | None, str]:
    """``(row, "")`` for a valid line (no newline), else ``(None, why)``.

    Strict (what a ``ResultsWriter`` writes): UTF-8 JSON without NaN or infinity, an
    object with a valid ``example_id`` and ``rollout_index``. ``lenient``: any JSON object
    (NaN allowed, bad UTF-8 replaced, keys optional), for showing files other tools wrote.
    """
    try:
        if lenient:
            row = json.loads(raw.decode("utf-8", errors="replace"))
        else:
            row = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason} at byte {exc.start})"
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    if lenient:
        return row, ""
    try:
        _example_id(row["example_id"])
        _rollout_index(row["rollout_index"])
    except KeyError as exc:
        return None, f"no {exc.args[0]!r} key"
    except ResultsError as exc:
        return None, str(exc)
    return row, ""
