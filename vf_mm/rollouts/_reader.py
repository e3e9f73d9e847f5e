"""Reading a run back: ``read_results`` (with the torn-last-line handling) and
``read_metadata``.

The file format is documented in ``_results.py`` (module docstring).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf_mm.errors import ResultsError
from vf_mm.rollouts._format import METADATA_FILE, RESULTS_FILE, Key, _parse_line

logger = logging.getLogger("vf_mm.rollouts")


@dataclass(slots=True)
class _Scan:
    rows: list[dict[str, Any]]
    keys: dict[Key, int] = field(default_factory=dict)  # key -> line number
    end: int = 0  # the end of the last whole line: where a torn tail starts
    size: int = 0
    torn_line: int | None = None
    torn_reason: str = ""


def _scan(path: Path, *, keep_rows: bool) -> _Scan:
    """Read every line; a bad line is allowed only as the last one (torn)."""
    scan = _Scan(rows=[])
    offset = 0
    bad: tuple[int, int, str] | None = None  # (line number, start offset, why)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):  # binary: splits on b"\n" only
            if bad is not None:
                raise ResultsError(
                    f"{path}: line {bad[0]} is corrupt ({bad[2]}) and is not the last line; "
                    "the file was changed by something other than a ResultsWriter",
                    path=str(path),
                    line=bad[0],
                )
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                bad = (number, start, "no newline at its end: cut off mid-write")
                continue
            row, why = _parse_line(raw[:-1])
            if row is None:
                bad = (number, start, why)
                continue
            key = (row["example_id"], row["rollout_index"])
            if key in scan.keys:
                raise ResultsError(
                    f"{path}: line {number} repeats example {key[0]!r} rollout {key[1]} "
                    f"of line {scan.keys[key]}",
                    path=str(path),
                    line=number,
                )
            scan.keys[key] = number
            if keep_rows:
                scan.rows.append(row)
    scan.size = offset
    scan.end = offset if bad is None else bad[1]
    if bad is not None:
        scan.torn_line, scan.torn_reason = bad[0], bad[2]
    return scan


def _results_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def read_results(path: str | os.PathLike[str], *, strict: bool = False) -> list[dict[str, Any]]:
    """Every row of ``OUTDIR/results.jsonl`` (``path`` is the OUTDIR or the file), in order.

    A corrupt line before the last, or a key that appears twice, raises ``ResultsError``
    with its line number (``.line``). A torn *last* line (no newline at its end, or not
    JSON: a writer killed mid-write, or a run still being written) is left out with a
    logged warning, or raises when ``strict``. Asset URLs stay relative to the OUTDIR.
    """
    file = _results_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no results file at {file}")
    scan = _scan(file, keep_rows=True)
    if scan.torn_line is not None:
        message = (
            f"{file}: the last line ({scan.torn_line}) is torn ({scan.torn_reason}); "
            f"{scan.size - scan.end} bytes"
        )
        if strict:
            raise ResultsError(message, path=str(file), line=scan.torn_line)
        logger.warning("%s: left out (resume the run to truncate it)", message)
    return scan.rows


def read_metadata(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """``OUTDIR/metadata.json`` as a dict (``ResultsError`` if it is not a JSON object)."""
    path = Path(outdir) / METADATA_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (UnicodeDecodeError, ValueError) as exc:
        raise ResultsError(f"{path} is not valid JSON: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise ResultsError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data
