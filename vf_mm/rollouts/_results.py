"""The evaluation results store: ``results.jsonl`` + ``metadata.json`` + ``assets/``.

Layout of an OUTDIR (what ``vf-mm eval -o OUTDIR`` writes and ``vf-mm view`` reads)::

    OUTDIR/
      metadata.json    the run: the caller's metadata (``config``: env id, env args, model,
                       sampling args, num examples, rollouts per example, ...) plus
                       ``results_format``, ``started_at``, ``finished_at`` (null until
                       ``finalize``) and ``results`` (``summarize`` aggregates, null until
                       ``finalize``); always replaced atomically
      results.jsonl    one JSON object per line, one line per (example_id, rollout_index)
      assets/<hash>.png  each distinct image once (see ``_assets.py``)

One line of ``results.jsonl`` (``ROW_KEYS``, then the caller's ``extra`` keys)::

    {"example_id": int | str, "rollout_index": int,
     "prompt": [message, ...], "completion": [message, ...],      # images as asset refs
     "answer": JSON, "info": {...}, "reward": float | null, "metrics": {name: float | null},
     "error": str | null, "num_turns": int, "prompt_tokens": int | null,
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

import asyncio
import contextlib
import json
import logging
import math
import numbers
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vf_mm.errors import ImageError, ResultsError, ResumeMismatchError
from vf_mm.images import ImagePolicy
from vf_mm.rollouts._assets import (
    AssetStore,
    atomic_write_bytes,
    fsync_dir,
    is_temp_name,
    to_json_value,
)
from vf_mm.types import RolloutOutput

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest works
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "METADATA_FILE",
    "RESULTS_FILE",
    "RESULTS_FORMAT",
    "ROW_KEYS",
    "ResultsWriter",
    "pass_at_k",
    "read_metadata",
    "read_results",
    "summarize",
]

logger = logging.getLogger("vf_mm.rollouts")

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
#: Version of the OUTDIR layout, stored in metadata.json as ``results_format``.
RESULTS_FORMAT = 1
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
    "num_turns",
    "prompt_tokens",
    "completion_tokens",
    "timing",
)

Key = tuple[int | str, int]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- keys and values ---------------------------------------------------------------


def _example_id(value: Any) -> int | str:
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ResultsError(f"example_id must be an int or a str, not {type(value).__name__}")


def _rollout_index(value: Any) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0:
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


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """``(row, "")`` for a valid line (no newline), else ``(None, why)``."""
    try:
        row = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason} at byte {exc.start})"
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    try:
        _example_id(row["example_id"])
        _rollout_index(row["rollout_index"])
    except KeyError as exc:
        return None, f"no {exc.args[0]!r} key"
    except ResultsError as exc:
        return None, str(exc)
    return row, ""


# -- reading -----------------------------------------------------------------------


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


# -- writing -----------------------------------------------------------------------


def _in_use_message(outdir: Path, names: Sequence[str]) -> str:
    return (
        f"{outdir} already holds {' and '.join(names)} of a run: pass resume=True "
        "(vf-mm eval --resume) to continue it, or choose another outdir"
    )


def _short(value: Any, limit: int = 80) -> str:
    text = value if value is ResumeMismatchError.MISSING else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ResultsWriter:
    """Append rollouts to ``OUTDIR/results.jsonl``, images to ``OUTDIR/assets/``.

    ``metadata`` describes the run; its ``config`` dict (env id, env args, model, sampling
    args, num examples, rollouts per example, ...) is what ``resume=True`` compares with
    the stored run: any differing key raises ``ResumeMismatchError`` (listing the keys)
    before anything on disk changes. Without ``resume``, an OUTDIR that already holds a
    ``results.jsonl`` or ``metadata.json`` is refused (``ResultsError``). ``resume=True``
    on an OUTDIR with no run in it starts a new one.

    After opening: ``done`` (the keys already written), ``truncated_bytes`` (the torn
    tail cut off the results file, 0 if none), ``removed_temp_files`` (temporary files
    of a killed writer, deleted), ``resumed`` (whether earlier rows were found).

    ``write`` is thread safe (call it from worker threads, or ``await awrite(...)`` from
    asyncio, which runs it in a thread since it encodes PNGs). Use it as a context
    manager or call ``close()``; ``finalize`` stores the aggregates in metadata.json.
    ``fsync_every``: fsync the results file (and the assets folder) every that many
    lines; 0 or None = only on ``close``/``finalize``. ``policy`` decides which image
    sources may be read (``vf_mm.images.ImagePolicy``; default: any local path, no network).
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        *,
        resume: bool = False,
        metadata: Mapping[str, Any],
        fsync_every: int | None = 100,
        policy: ImagePolicy | None = None,
    ) -> None:
        if not isinstance(metadata, Mapping):
            raise ResultsError(f"metadata must be a dict, not {type(metadata).__name__}")
        self.metadata: dict[str, Any] = to_json_value(metadata, "metadata")
        config = self.metadata.setdefault("config", {})
        if not isinstance(config, dict):
            raise ResultsError(f"metadata['config'] must be a dict, not {type(config).__name__}")
        if fsync_every is not None and (
            not isinstance(fsync_every, int) or isinstance(fsync_every, bool) or fsync_every < 0
        ):
            raise ValueError(f"fsync_every must be an int >= 0 or None, got {fsync_every!r}")
        self.outdir = Path(outdir)
        self.results_path = self.outdir / RESULTS_FILE
        self.metadata_path = self.outdir / METADATA_FILE
        self.fsync_every = fsync_every or 0
        self.truncated_bytes = 0
        self.removed_temp_files = 0
        self.resumed = False
        self.started_at = _now()
        self._lock = threading.Lock()
        self._done: set[Key] = set()
        self._size = 0
        self._unsynced = 0
        self._broken: str | None = None
        self._fd: int | None = None

        self.outdir.mkdir(parents=True, exist_ok=True)
        existed = self.results_path.exists()
        self._fd = self._open_results(resume)
        try:
            self.assets = AssetStore(self.outdir, policy=policy)
            self._prepare(resume)
            self._write_metadata(results=None, finished_at=None)
        except BaseException:
            if not existed:  # leave no empty results file that would refuse the next try
                with contextlib.suppress(OSError):
                    os.unlink(self.results_path)
            self._release()
            raise

    # -- opening

    def _open_results(self, resume: bool) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
        if not resume:
            if self.metadata_path.exists():
                names = [RESULTS_FILE] if self.results_path.exists() else []
                raise ResultsError(
                    _in_use_message(self.outdir, [*names, METADATA_FILE]), path=str(self.outdir)
                )
            flags |= os.O_EXCL
        try:
            fd = os.open(self.results_path, flags, 0o644)
        except FileExistsError:
            raise ResultsError(
                _in_use_message(self.outdir, [RESULTS_FILE]), path=str(self.outdir)
            ) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ResultsError(
                    f"{self.outdir} is being written by another ResultsWriter (its "
                    f"{RESULTS_FILE} is locked); one writer per outdir",
                    path=str(self.outdir),
                ) from None
        if not resume:
            fsync_dir(self.outdir)
        return fd

    def _prepare(self, resume: bool) -> None:
        if not resume:
            return
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        try:
            stored = read_metadata(self.outdir)
        except FileNotFoundError:
            stored = None
        if stored is None and size > 0:
            raise ResultsError(
                f"{self.outdir} holds a {RESULTS_FILE} but no {METADATA_FILE}: the run's "
                "configuration cannot be checked, so it is not resumed",
                path=str(self.outdir),
            )
        if stored is not None:
            self._check_config(stored)
            if isinstance(stored.get("started_at"), str):
                self.started_at = stored["started_at"]
        scan = _scan(self.results_path, keep_rows=False)  # raises on a corrupt middle line
        if scan.end < scan.size:
            os.ftruncate(self._fd, scan.end)
            os.fsync(self._fd)
            self.truncated_bytes = scan.size - scan.end
            logger.warning(
                "%s: cut off a torn last line (line %d, %d bytes: %s) left by an interrupted "
                "writer",
                self.results_path,
                scan.torn_line,
                self.truncated_bytes,
                scan.torn_reason,
            )
        self._size = scan.end
        self._done = set(scan.keys)
        self.resumed = bool(self._done)
        self.removed_temp_files = self.assets.remove_temp_files() + self._remove_temp_metadata()

    def _check_config(self, stored: Mapping[str, Any]) -> None:
        old = stored.get("config", {})
        new = self.metadata["config"]
        if not isinstance(old, dict):
            old = {}
        missing = ResumeMismatchError.MISSING
        differences = {
            key: (old.get(key, missing), new.get(key, missing))
            for key in sorted(set(old) | set(new))
            if old.get(key, missing) != new.get(key, missing)
        }
        if differences:
            lines = "; ".join(
                f"{key}: stored {_short(a)}, now {_short(b)}" for key, (a, b) in differences.items()
            )
            raise ResumeMismatchError(
                f"cannot resume {self.outdir}: the run configuration differs in "
                f"{', '.join(differences)} ({lines}); use the stored configuration or "
                "another outdir",
                path=str(self.outdir),
                differences=differences,
            )

    def _remove_temp_metadata(self) -> int:
        removed = 0
        for entry in os.scandir(self.outdir):
            if (
                is_temp_name(entry.name)
                and entry.name.startswith(f".{METADATA_FILE}")
                and entry.is_file(follow_symlinks=False)
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        return removed

    # -- state

    @property
    def done(self) -> frozenset[Key]:
        """The (example_id, rollout_index) keys in the results file (a snapshot)."""
        with self._lock:
            return frozenset(self._done)

    def is_done(self, example_id: int | str, rollout_index: int) -> bool:
        with self._lock:
            return (_example_id(example_id), rollout_index) in self._done

    def pending(self, example_ids: Iterable[int | str], rollouts_per_example: int) -> list[Key]:
        """The keys of ``example_ids`` x ``range(rollouts_per_example)`` not yet written,
        in that order."""
        with self._lock:
            return [
                (e, r)
                for e in map(_example_id, example_ids)
                for r in range(rollouts_per_example)
                if (e, r) not in self._done
            ]

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _check_writable(self) -> None:
        if self._fd is None:
            raise ResultsError(f"the ResultsWriter for {self.outdir} is closed")
        if self._broken is not None:
            raise ResultsError(
                f"the ResultsWriter for {self.outdir} failed earlier and stopped: {self._broken}"
            )

    # -- writing rows

    def write(
        self,
        output: RolloutOutput,
        *,
        rollout_index: int,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append ``output`` as one line (its images stored first); return the row written.

        Raises ``ResultsError`` for a key already written, a value JSON cannot hold
        (naming the field), or ``extra`` keys that clash with ``ROW_KEYS``; image
        errors (``vf_mm.errors.ImageError``) say which message and part. Nothing is
        appended when it raises.
        """
        key: Key = (_example_id(output.example_id), _rollout_index(rollout_index))
        with self._lock:
            self._check_writable()
            self._check_new(key)
        row = self._row(output, key, extra)
        data = _dumps(row)
        with self._lock:
            self._check_writable()
            self._check_new(key)
            self._append(data)
            self._done.add(key)
            self._unsynced += 1
            if self.fsync_every and self._unsynced >= self.fsync_every:
                self._sync_locked()
        return row

    async def awrite(
        self,
        output: RolloutOutput,
        *,
        rollout_index: int,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``write`` in a worker thread, for asyncio callers."""
        return await asyncio.to_thread(self.write, output, rollout_index=rollout_index, extra=extra)

    def _check_new(self, key: Key) -> None:
        if key in self._done:
            raise ResultsError(
                f"example {key[0]!r} rollout {key[1]} is already in {self.results_path}; "
                "each (example, rollout) is written once (check writer.done before running it)"
            )

    def _row(
        self, output: RolloutOutput, key: Key, extra: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        where = f"example {key[0]!r} rollout {key[1]}"
        prompt = self._messages(output.prompt, f"{where}, prompt")
        completion = self._messages(output.completion, f"{where}, completion")
        metrics = output.metrics if output.metrics is not None else {}
        if not isinstance(metrics, Mapping):
            raise ResultsError(f"{where}, field 'metrics': must be a dict of numbers")
        for name in metrics:
            if not isinstance(name, str):
                raise ResultsError(f"{where}, field 'metrics': key {name!r} is not a str")
        error = output.error
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        elif error is not None and not isinstance(error, str):
            raise ResultsError(
                f"{where}, field 'error': must be a str or None, not {type(error).__name__}"
            )
        num_turns, prompt_tokens, completion_tokens = _turns_and_tokens(output)
        row: dict[str, Any] = {
            "example_id": key[0],
            "rollout_index": key[1],
            "prompt": prompt,
            "completion": completion,
            "answer": to_json_value(output.answer, where, "answer"),
            "info": to_json_value(output.info if output.info is not None else {}, where, "info"),
            "reward": _number(output.reward, where, "reward"),
            "metrics": {k: _number(v, where, f"metrics.{k}") for k, v in metrics.items()},
            "error": error,
            "num_turns": num_turns,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "timing": to_json_value(
                output.timing if output.timing is not None else {}, where, "timing"
            ),
        }
        if extra:
            if not isinstance(extra, Mapping):
                raise ResultsError(f"{where}: extra must be a dict, not {type(extra).__name__}")
            for name, value in extra.items():
                if not isinstance(name, str):
                    raise ResultsError(f"{where}: extra key {name!r} is not a str")
                if name in row:
                    raise ResultsError(
                        f"{where}: extra key {name!r} clashes with a results.jsonl field "
                        f"({', '.join(ROW_KEYS)})"
                    )
                row[name] = to_json_value(value, where, name)
        return row

    def _messages(self, messages: Any, where: str) -> list[dict[str, Any]]:
        if messages is None:
            return []
        try:
            return self.assets.to_jsonable(messages, where=where)
        except ImageError as exc:
            if exc.where is None:
                exc.where = where
            raise

    def _append(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except BaseException as exc:
            if written:  # never leave half a line before the next one
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError as undo:
                    self._broken = (
                        f"a failed write ({exc!r}) left {written} bytes of a line that could "
                        f"not be removed ({undo!r}); resume=True repairs the file"
                    )
            raise
        self._size += len(data)

    # -- durability, metadata, closing

    def _sync_locked(self) -> None:
        assert self._fd is not None
        self.assets.sync()  # the assets' renames are durable before the lines naming them
        os.fsync(self._fd)
        self._unsynced = 0

    def sync(self) -> None:
        """fsync the assets folder and the results file now."""
        with self._lock:
            self._check_writable()
            self._sync_locked()

    def _write_metadata(self, *, results: Any, finished_at: str | None) -> None:
        document = {
            **self.metadata,
            "results_format": RESULTS_FORMAT,
            "started_at": self.started_at,
            "finished_at": finished_at,
            "results": results,
        }
        atomic_write_bytes(self.metadata_path, _dumps(document, indent=2, separators=None))

    def finalize(self, aggregates: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """fsync the results, then store ``aggregates`` (default: ``summarize`` of the
        whole results file) and ``finished_at`` in metadata.json; return the aggregates.
        The writer stays open (``close`` it)."""
        if aggregates is None:
            with self._lock:
                self._check_writable()
                self._sync_locked()
            aggregates = summarize(read_results(self.results_path, strict=True))
        checked = to_json_value(aggregates, "aggregates")
        with self._lock:
            self._check_writable()
            self._sync_locked()
            self._write_metadata(results=checked, finished_at=_now())
        return checked

    def close(self) -> None:
        """fsync and close the results file (releasing the outdir). Idempotent."""
        with self._lock:
            if self._fd is None:
                return
            try:
                if self._broken is None:
                    self._sync_locked()
            finally:
                self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # also drops the flock

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else f"{len(self._done)} rows"
        return f"ResultsWriter({str(self.outdir)!r}, {state})"


def _turns_and_tokens(output: RolloutOutput) -> tuple[int, int | None, int | None]:
    """``num_turns`` = trajectory steps (or assistant messages when there is no
    trajectory); token counts = sums over the steps' prompt and completion ids, None when
    there is no trajectory or a step has no tokens (an API backend)."""
    steps = output.trajectory or []
    if steps:
        num_turns = len(steps)
    else:
        num_turns = sum(
            1
            for m in output.completion or []
            if isinstance(m, Mapping) and m.get("role") == "assistant"
        )
    if not steps or any(step.tokens is None for step in steps):
        return num_turns, None, None
    prompt_tokens = sum(len(step.tokens.prompt_ids) for step in steps)  # type: ignore[union-attr]
    completion_tokens = sum(len(step.tokens.completion_ids) for step in steps)  # type: ignore[union-attr]
    return num_turns, prompt_tokens, completion_tokens


# -- aggregates --------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` succeeded:
    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021); needs ``1 <= k <= n``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean_std(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "std": None, "count": 0}
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return {"mean": mean, "std": math.sqrt(variance), "count": len(values)}


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    k_values: Iterable[int] | None = None,
    threshold: float = 1.0,
) -> dict[str, Any]:
    """Aggregates of results rows, for metadata.json and summary tables::

        {"count": rows, "examples": distinct example ids, "errors": rows with an error,
         "reward": {"mean", "std", "count"},            # over rows whose reward is not null
         "metrics": {name: {"mean", "std", "count"}},   # over rows that have the metric
         "pass_at_k": {"1": p, ...}, "pass_threshold": threshold,
         "tokens": {"prompt": total, "completion": total, "rows_without_tokens": n},
         "mean_turns": float | null}

    ``std`` is the population standard deviation (0.0 for one value). pass@k is the
    unbiased estimator per example (success = reward >= ``threshold``; a null reward, as
    an errored rollout has, is a failure), averaged over the examples with at least k
    rollouts (null when none has). ``k_values`` defaults to 1, 2, 4, ... up to the
    fewest rollouts any example has.
    """
    rows = list(rows)
    rewards: list[float] = []
    metrics: dict[str, list[float]] = {}
    outcomes: dict[Any, list[bool]] = {}
    turns: list[float] = []
    prompt_tokens = completion_tokens = without_tokens = errors = 0
    for row in rows:
        reward = row.get("reward")
        if reward is not None:
            rewards.append(float(reward))
        if row.get("error") is not None:
            errors += 1
        for name, value in (row.get("metrics") or {}).items():
            if value is not None:
                metrics.setdefault(name, []).append(float(value))
        outcomes.setdefault(row.get("example_id"), []).append(
            reward is not None and float(reward) >= threshold
        )
        if row.get("num_turns") is not None:
            turns.append(float(row["num_turns"]))
        if row.get("prompt_tokens") is None or row.get("completion_tokens") is None:
            without_tokens += 1
        else:
            prompt_tokens += int(row["prompt_tokens"])
            completion_tokens += int(row["completion_tokens"])

    fewest = min((len(v) for v in outcomes.values()), default=1)
    if k_values is None:
        ks = [1]
        while ks[-1] * 2 <= fewest:
            ks.append(ks[-1] * 2)
    else:
        ks = sorted(set(k_values))
        for k in ks:
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"k_values must be ints >= 1, got {k!r}")
    pass_k: dict[str, float | None] = {}
    for k in ks:
        estimates = [pass_at_k(len(v), sum(v), k) for v in outcomes.values() if len(v) >= k]
        pass_k[str(k)] = math.fsum(estimates) / len(estimates) if estimates else None

    return {
        "count": len(rows),
        "examples": len(outcomes),
        "errors": errors,
        "reward": _mean_std(rewards),
        "metrics": {name: _mean_std(values) for name, values in sorted(metrics.items())},
        "pass_at_k": pass_k,
        "pass_threshold": threshold,
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "rows_without_tokens": without_tokens,
        },
        "mean_turns": math.fsum(turns) / len(turns) if turns else None,
    }
