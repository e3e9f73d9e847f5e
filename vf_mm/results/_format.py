"""The run directory's file formats: ``results.jsonl`` + ``metadata.json`` + ``assets/``;
file names, row keys, and encoding and checking one line.

Layout of an OUTDIR (what ``vf-mm eval -o OUTDIR`` writes and ``vf-mm view`` reads)::

    OUTDIR/
      metadata.json    the run: the caller's metadata (``config``: env id, env args, model,
                       sampling args, num examples, rollouts per example, ...) plus
                       ``results_format``, ``started_at``, ``finished_at`` (null until
                       ``finalize``) and ``results`` (``summarize`` aggregates, null until
                       ``finalize``); always replaced atomically
      results.jsonl    one JSON object per line, one line per (example_id, rollout_index)
      assets/<hash>.png  each distinct image once (see ``_assets.py``)
      assets/<hash>.<ext>  each distinct video once: mp4, mov, webm, mkv, avi or ts, its
                       container (see ``_assets.py`` and ``vf_mm.videos.encode_lossless``)

One line of ``results.jsonl`` (``ROW_KEYS``, then the caller's ``extra`` keys)::

    {"example_id": int | str, "rollout_index": int,
     "prompt": [message, ...], "completion": [message, ...],   # images, videos: asset refs
     "answer": JSON, "info": {...}, "reward": float | null, "metrics": {name: float | null},
     "error": {"type": str, "message": str, "where": str} | null,
     "truncated": bool,   # ran out of context: scored on its turns (absent in older files: false)
     "num_turns": int, "prompt_tokens": int | null,
     "completion_tokens": int | null, "timing": {...}, ...extra}

Crash safety (a ``kill -9`` at any moment, then ``resume=True``):

- a line is appended with one ``write()`` on an ``O_APPEND`` file (a loop only if the
  kernel takes part of it), so a killed writer leaves at most one torn line: the last.
  Opening with ``resume=True`` truncates it away (``truncated_bytes``, and a log warning);
  a corrupt line anywhere else is an error naming its line number, never skipped.
- the assets a line refers to are written (atomically) before the line.
- ``metadata.json`` is written at the start (``finished_at: null``) and by ``finalize``,
  each time to a temporary file that is fsynced and renamed over it.
- ``done`` is read back from the file, and ``write`` refuses a key already in it, so each
  (example, rollout) is in the file once. An OUTDIR is locked (``flock``) by its writer:
  a second writer on the same OUTDIR is refused.
- ``os.fsync`` of ``results.jsonl`` (after the assets folder) every ``fsync_every`` lines
  and on ``close``/``finalize``: a killed *process* loses nothing the kernel has; fsync is
  for power loss.

Numbers: JSON has no NaN or infinity, so a NaN/inf reward, metric or any other value is
refused with ``ResultsError`` (record a failed score as ``None``/null instead): a results
file that other JSON readers cannot parse is worse than a loud error.
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
