"""``to_json_value``: the one rule for what a results file (and anything vf_mm stores as
JSON) holds: dicts with str keys, lists, str, int, finite float, bool, None. Numbers of
other types (numpy scalars) become ``int``/``float``; anything else is refused, never
stringified, naming where it was and why (bytes, tensors, images, sets, objects)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from vf_mm.errors import ResultsError


def _refusal(value: Any) -> str:
    kind = type(value)
    name = (
        f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__name__
    )
    if isinstance(value, (bytes, bytearray, memoryview)):
        hint = "bytes are not JSON: put an image in an image content part, decode text first"
    elif hasattr(value, "tolist") and hasattr(value, "shape"):
        hint = "a tensor or array is not JSON: convert it (.tolist()) or leave it out"
    elif kind.__module__.startswith("PIL."):
        hint = "images are stored as assets only from message content parts"
    elif isinstance(value, (set, frozenset)):
        hint = "a set is not JSON: pass a sorted list"
    else:
        hint = "only str, int, float, bool, None, lists and str-keyed dicts are stored"
    return f"{name} is not JSON ({hint})"


def _at(where: str, path: str) -> str:
    return f"{where}, field {path!r}" if path else where


def to_json_value(value: Any, where: str, path: str = "") -> Any:
    """A JSON-native copy of ``value`` (dicts, lists, str, int, float, bool, None).

    Tuples become lists; ``numbers.Integral``/``numbers.Real`` (numpy scalars) become
    ``int``/``float``.

    Args:
        value: The value to copy.
        where: Names the value in an error (a row, a field).
        path: The place of ``value`` inside ``where``; nested values extend it.

    Raises:
        ResultsError: Anything else (bytes, tensors, arrays, sets, objects), dict keys
            that are not ``str``, and NaN or infinity (JSON has no such numbers), naming
            ``where`` and the path inside it.
    """

    def convert(v: Any, path: str) -> Any:
        if v is None or isinstance(v, (str, bool)):
            return v
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            f = float(v)
            if not math.isfinite(f):
                raise ResultsError(
                    f"{_at(where, path)}: {f} is not JSON (JSON has no NaN or infinity; "
                    "record a failed value as None)"
                )
            return f
        if isinstance(v, Mapping):
            out: dict[str, Any] = {}
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ResultsError(
                        f"{_at(where, path)}: dict key {k!r} ({type(k).__name__}) is not "
                        "a str; JSON keys are strings"
                    )
                out[k] = convert(item, f"{path}.{k}" if path else k)
            return out
        if isinstance(v, (list, tuple)):
            return [convert(item, f"{path}[{i}]") for i, item in enumerate(v)]
        raise ResultsError(f"{_at(where, path)}: {_refusal(v)}")

    return convert(value, path)
