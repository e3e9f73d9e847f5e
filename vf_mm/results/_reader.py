"""The one reader of a run directory: ``scan_results`` / ``read_results`` and ``read_metadata``.

Every consumer of ``results.jsonl`` goes through ``scan_results``: resuming writers,
``summarize`` at the end of a run (``iter_results``: the same rows, one at a time, for
a run of any length), ``vf-mm view`` and users. What happens to a bad line
(not UTF-8, not JSON, not an object, no valid ``example_id`` / ``rollout_index``, a key
seen before, or a last line without its newline) is the caller's explicit choice:

``bad_lines="raise"``
    any bad line raises ``ResultsError`` naming its line number (``.line``).
``bad_lines="torn-tail"`` (the default)
    a bad *last* line is what a writer killed mid-write leaves behind (or a run still
    being written): it is left out, recorded in ``ResultsScan.bad_lines`` and logged. A
    bad line anywhere else was not written by a ``ResultsWriter``, so it raises.
``bad_lines="skip"``
    every bad line is left out and recorded; the rows that remain are whole. For
    showing what is there (the HTML report), never for resuming a run.

A key may appear again only as a *retry*: when its earlier record has an ``error`` (a
resumed run re-runs failed rollouts, and the file stays append-only). The last record of
each key is the one read, in the place of the line that holds it; ``ResultsScan.failed``
holds the keys whose last record failed. A key repeated after a record without an error
is a bad line.

What counts as a row is a second, separate choice: ``schema="strict"`` (the default) is
what a ``ResultsWriter`` writes: JSON without NaN or infinity, a valid ``example_id`` and
``rollout_index``, each key once. ``schema="lenient"`` takes any JSON object per line
(NaN allowed, invalid UTF-8 replaced, keys optional and not indexed, repeats kept, blank
lines ignored, a whole last line without its newline kept), for showing a file another
tool wrote or a person edited.

The file format is documented in ``_format.py`` (module docstring).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vf_mm.errors import ResultsError
from vf_mm.results._format import METADATA_FILE, RESULTS_FILE, Key, _parse_line

logger = logging.getLogger("vf_mm.results")

BadLinePolicy = Literal["raise", "torn-tail", "skip"]
RowSchema = Literal["strict", "lenient"]
_POLICIES = ("raise", "torn-tail", "skip")
_NOT_LAST = "and is not the last line; the file was changed by something other than a ResultsWriter"


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of ``results.jsonl`` that is not a whole row: where it is and why.

    Attributes:
        line: Its 1-based line number.
        offset: The byte offset of its first byte.
        reason: Why it is not a row.
        torn: It is the last line of the file, without its newline: cut off mid-write.
    """

    line: int  # 1-based line number
    offset: int  # byte offset of its first byte
    reason: str
    torn: bool  # the last line of the file, without its newline: cut off mid-write


@dataclass(slots=True)
class ResultsScan:
    """What ``scan_results`` found: the rows, their keys, and every line left out.

    Attributes:
        path: The results file.
        rows: The whole rows, in file order (empty with ``keep_rows=False``).
        keys: ``(example_id, rollout_index)`` to the line of its last record.
        failed: Keys whose last record has an error.
        retries: Records that replaced an earlier, failed one.
        bad_lines: Every line left out.
        size: Bytes in the file.
        end: The end of the last whole line: where a torn tail starts (``== size`` if
            none).
    """

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    keys: dict[Key, int] = field(default_factory=dict)  # (example_id, rollout_index) -> line
    failed: set[Key] = field(default_factory=set)  # keys whose last record has an error
    retries: int = 0  # records that replaced an earlier, failed one
    bad_lines: list[BadLine] = field(default_factory=list)
    size: int = 0  # bytes in the file
    end: int = 0  # end of the last whole line: where a torn tail starts (== size if none)

    @property
    def torn_tail(self) -> BadLine | None:
        """The bad last line a killed writer leaves (what ``resume`` truncates), if any."""
        last = self.bad_lines[-1] if self.bad_lines else None
        return last if last is not None and last.offset == self.end else None


def _results_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def scan_results(
    path: str | os.PathLike[str],
    *,
    bad_lines: BadLinePolicy = "torn-tail",
    schema: RowSchema = "strict",
    keep_rows: bool = True,
) -> ResultsScan:
    """Read ``OUTDIR/results.jsonl`` line by line.

    Args:
        path: The OUTDIR or the file.
        bad_lines: What a bad line does (module docstring).
        schema: What a row is (module docstring).
        keep_rows: False keeps only the keys (what a resuming writer needs).

    Raises:
        ResultsError: A bad line ``bad_lines`` refuses.
        FileNotFoundError: There is no results file.
    """
    if bad_lines not in _POLICIES:
        raise ValueError(f"bad_lines must be one of {_POLICIES}, not {bad_lines!r}")
    if schema not in ("strict", "lenient"):
        raise ValueError(f"schema must be 'strict' or 'lenient', not {schema!r}")
    lenient = schema == "lenient"
    file = _results_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no results file at {file}")
    scan = ResultsScan(path=file)
    pending: BadLine | None = None  # a bad line is allowed (torn-tail) only as the last one
    offset = 0
    with open(file, "rb") as f:
        for number, raw in enumerate(f, start=1):  # binary: splits on b"\n" only
            if pending is not None:
                _refuse(file, pending, _NOT_LAST)
            start, offset = offset, offset + len(raw)
            if lenient and not raw.strip():
                continue
            row, bad = _read_line(raw, lenient)
            if row is not None and not lenient:
                key = (row["example_id"], row["rollout_index"])
                if key in scan.failed:  # a retry of a failed rollout: the last record counts
                    scan.failed.discard(key)
                    scan.retries += 1
                    if keep_rows:
                        scan.rows = [r for r in scan.rows if _key(r) != key]
                elif key in scan.keys:
                    bad = f"repeats example {key[0]!r} rollout {key[1]} of line {scan.keys[key]}"
                    if bad_lines != "skip":  # a whole, valid line: never a torn tail
                        raise ResultsError(
                            f"{file}: line {number} {bad}", path=str(file), line=number
                        )
            if bad is not None:
                entry = BadLine(number, start, bad, torn=not raw.endswith(b"\n"))
                if bad_lines == "raise":
                    _refuse(file, entry, "")
                scan.bad_lines.append(entry)
                if bad_lines == "torn-tail":
                    pending = entry
                continue
            assert row is not None
            if not lenient:  # a lenient row may have no key, or repeat one
                scan.keys[_key(row)] = number
                if row.get("error") is not None:
                    scan.failed.add(_key(row))
            if keep_rows:
                scan.rows.append(row)
    scan.size = offset
    scan.end = pending.offset if pending is not None else offset
    return scan


def _key(row: dict[str, Any]) -> Key:
    return (row["example_id"], row["rollout_index"])


def _read_line(raw: bytes, lenient: bool) -> tuple[dict[str, Any] | None, str | None]:
    """One line (with its newline) as ``(row, None)``, or ``(None, why it is bad)``. A
    lenient read takes a last line without its newline when it parses whole."""
    if not raw.endswith(b"\n"):
        if lenient:
            row, _ = _parse_line(raw, lenient=True)
            if row is not None:
                return row, None
        return None, "no newline at its end: cut off mid-write"
    row, why = _parse_line(raw[:-1], lenient=lenient)
    return (row, None) if row is not None else (None, why)


def _refuse(file: Path, bad: BadLine, tail: str) -> None:
    state = "torn" if bad.torn else "corrupt"
    message = f"{file}: line {bad.line} is {state} ({bad.reason})"
    raise ResultsError(f"{message} {tail}".rstrip(), path=str(file), line=bad.line)


def read_results(
    path: str | os.PathLike[str], *, bad_lines: BadLinePolicy = "torn-tail"
) -> list[dict[str, Any]]:
    """Every whole row of ``OUTDIR/results.jsonl``, in file order.

    That is ``scan_results(...).rows``.

    Asset URLs stay relative to the OUTDIR. A torn last line left out is logged as a
    warning (``scan_results`` leaves reporting to its caller).

    Args:
        path: The OUTDIR or its results file.
        bad_lines: What a bad line does (module docstring).

    Raises:
        ResultsError: A bad line ``bad_lines`` refuses.
        FileNotFoundError: There is no results file.
    """
    scan = scan_results(path, bad_lines=bad_lines)
    _warn_torn(scan)
    return scan.rows


def iter_results(
    path: str | os.PathLike[str], *, bad_lines: BadLinePolicy = "torn-tail"
) -> Iterator[dict[str, Any]]:
    """``read_results``, one row at a time.

    The same rows in the same order (the last record of each key, in the place of its
    line), holding one row at a time instead of the whole file. For what sums up a run of
    any length (``summarize`` at the end of ``evaluate_to_dir``).

    Two passes: ``scan_results(keep_rows=False)`` first (it applies ``bad_lines`` and
    learns which line holds each key's last record, keeping only the keys), then the file
    again up to where that scan ended, yielding those lines. What a ``ResultsWriter``
    appends after the first pass is not read.

    Args:
        path: The OUTDIR or its results file.
        bad_lines: What a bad line does (module docstring).

    Raises:
        ResultsError: A bad line ``bad_lines`` refuses, or a file rewritten between the two
            passes (the second finds fewer of its rollouts).
        FileNotFoundError: There is no results file.
    """
    scan = scan_results(path, bad_lines=bad_lines, keep_rows=False)
    _warn_torn(scan)
    return _final_records(scan)


def _warn_torn(scan: ResultsScan) -> None:
    """Log a torn last line the scan left out (``scan_results`` leaves that to readers)."""
    torn = scan.torn_tail
    if torn is not None:
        logger.warning(
            "%s: the last line (%d) is torn (%s); %d bytes left out (resume the run to "
            "truncate it)",
            scan.path,
            torn.line,
            torn.reason,
            scan.size - scan.end,
        )


def _final_records(scan: ResultsScan) -> Iterator[dict[str, Any]]:
    """The second pass: the last record of each key ``scan`` found, in file order, up to
    where it ended. ``ResultsError`` when the file no longer holds them (rewritten since
    the scan: a writer only appends), rather than fewer rows than the run has."""
    offset = found = 0
    with open(scan.path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            offset += len(raw)
            if offset > scan.end:
                break
            row, _ = _read_line(raw, lenient=False)
            if row is not None and scan.keys.get(_key(row)) == number:
                found += 1
                yield row
    if found != len(scan.keys):
        raise ResultsError(
            f"{scan.path} changed while it was read: {len(scan.keys)} rollouts on the first "
            f"pass, {found} on the second (a writer only appends; this file was rewritten)",
            path=str(scan.path),
        )


def read_metadata(outdir: str | os.PathLike[str]) -> dict[str, Any]:
    """``OUTDIR/metadata.json`` as a dict.

    Args:
        outdir: The run directory.

    Raises:
        ResultsError: It is not a JSON object.
        FileNotFoundError: There is none.
    """
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
