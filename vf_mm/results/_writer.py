"""``ResultsWriter``: appends rollouts to ``OUTDIR/results.jsonl``, crash safe and resumable.

The file format is documented in ``_format.py`` (module docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vf_mm._text import shorten
from vf_mm.errors import ImageError, ResultsError, ResumeMismatchError, VideoError
from vf_mm.images import ImagePolicy
from vf_mm.results._assets import (
    AssetStore,
    atomic_write_bytes,
    fsync_dir,
    is_temp_name,
    to_json_value,
    unavailable,
)
from vf_mm.results._format import (
    METADATA_FILE,
    RESULTS_FILE,
    RESULTS_FORMAT,
    ROW_KEYS,
    Key,
    _dumps,
    _example_id,
    _number,
    _rollout_index,
)
from vf_mm.results._reader import iter_results, read_metadata, scan_results
from vf_mm.results._summary import summarize
from vf_mm.types import RolloutError, RolloutOutput
from vf_mm.videos import VideoLimits

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest works
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("vf_mm.results")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _in_use_message(outdir: Path, names: Sequence[str]) -> str:
    return (
        f"{outdir} already holds {' and '.join(names)} of a run: pass resume=True "
        "(vf-mm eval --resume) to continue it, or choose another outdir"
    )


def _short(value: Any, limit: int = 80) -> str:
    text = value if value is ResumeMismatchError.MISSING else json.dumps(value, ensure_ascii=False)
    return shorten(text, limit)


class ResultsWriter:
    """Append rollouts to ``OUTDIR/results.jsonl``, images and videos to ``OUTDIR/assets/``.

    ``metadata`` describes the run; its ``config`` dict (env id, env args, model, sampling
    args, num examples, rollouts per example, ...) is what ``resume=True`` compares with
    the stored run: any differing key raises ``ResumeMismatchError`` (listing the keys)
    before anything on disk changes. ``config_defaults`` says what a key meant in runs
    written before it existed (``{"image_backend": "pil"}``), so they still resume.
    Without ``resume``, an OUTDIR that already holds a rollout in ``results.jsonl``, or a
    ``metadata.json`` with no ``results.jsonl``, is refused (``ResultsError``).
    ``resume=True`` on an OUTDIR with no run in it starts a new one. A run that stopped
    before its first rollout (an empty ``results.jsonl``) holds nothing to lose: it is
    reused with or without ``resume``, whatever its configuration was.

    A resumed run re-runs the rollouts whose record has an ``error``: they are not in
    ``done``, and their new record is appended (the file stays append-only; the reader
    takes the last record of each key). ``retry_errors=False`` keeps them as they are.

    After opening: ``done`` (the keys already written and not to be run again), ``truncated_bytes`` (the torn
    tail cut off the results file, 0 if none), ``removed_temp_files`` (temporary files
    of a killed writer, deleted), ``resumed`` (whether earlier rows were found).

    ``write`` is thread safe (call it from worker threads, or ``await awrite(...)`` from
    asyncio, which runs it in a thread since it encodes PNGs and videos). Use it as a context
    manager or call ``close()``; ``finalize`` stores the aggregates in metadata.json.
    ``fsync_every``: fsync the results file (and the assets folder) every that many
    lines; 0 or None = only on ``close``/``finalize``. ``policy`` decides which image
    and video sources may be read (``vf_mm.images.ImagePolicy``; default: any local path,
    no network); ``video_limits`` what a video may cost to load (``VideoLimits()`` when
    None; pass the renderer's, so that every clip the run took is stored).
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        *,
        resume: bool = False,
        retry_errors: bool = True,
        metadata: Mapping[str, Any],
        fsync_every: int | None = 100,
        policy: ImagePolicy | None = None,
        config_defaults: Mapping[str, Any] | None = None,
        video_limits: VideoLimits | None = None,
    ) -> None:
        self.config_defaults = dict(config_defaults or {})
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
        self.retry_errors = retry_errors
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
            self.assets = AssetStore(self.outdir, policy=policy, video_limits=video_limits)
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
        if not resume and not self._holds_no_rollout():
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
        if not resume and os.fstat(fd).st_size > 0:  # a rollout landed since we looked
            os.close(fd)
            raise ResultsError(_in_use_message(self.outdir, [RESULTS_FILE]), path=str(self.outdir))
        if not resume:
            fsync_dir(self.outdir)
        return fd

    def _holds_no_rollout(self) -> bool:
        """Whether OUTDIR is a run this writer left with no rollout in it (an empty
        results.jsonl): a run that stopped before its first rollout (bad settings, an
        interrupt) holds nothing to lose, so it is reused with or without resume, its
        metadata.json rewritten."""
        try:
            return self.results_path.stat().st_size == 0
        except FileNotFoundError:
            return False

    def _prepare(self, resume: bool) -> None:
        if not resume:
            return
        assert self._fd is not None
        if os.fstat(self._fd).st_size > 0:  # else no rollout yet: no configuration to keep
            try:
                stored = read_metadata(self.outdir)
            except FileNotFoundError:
                raise ResultsError(
                    f"{self.outdir} holds a {RESULTS_FILE} but no {METADATA_FILE}: the run's "
                    "configuration cannot be checked, so it is not resumed",
                    path=str(self.outdir),
                ) from None
            self._check_config(stored)
            if isinstance(stored.get("started_at"), str):
                self.started_at = stored["started_at"]
        scan = scan_results(self.results_path, keep_rows=False)  # a corrupt middle line raises
        torn = scan.torn_tail
        if torn is not None:
            os.ftruncate(self._fd, scan.end)
            os.fsync(self._fd)
            self.truncated_bytes = scan.size - scan.end
            logger.warning(
                "%s: cut off a torn last line (line %d, %d bytes: %s) left by an interrupted "
                "writer",
                self.results_path,
                torn.line,
                self.truncated_bytes,
                torn.reason,
            )
        self._size = scan.end
        # a failed rollout is run again unless the caller keeps it (retry_errors=False)
        self._done = set(scan.keys) - scan.failed if self.retry_errors else set(scan.keys)
        self.resumed = bool(self._done)
        self.removed_temp_files = self.assets.remove_temp_files() + self._remove_temp_metadata()

    def _check_config(self, stored: Mapping[str, Any]) -> None:
        old = stored.get("config", {})
        new = self.metadata["config"]
        if not isinstance(old, dict):
            old = {}
        # a key added to the configuration after the run was written: what it meant then
        old = {**{k: v for k, v in self.config_defaults.items() if k in new}, **old}
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
        """Append ``output`` as one line (its images and videos stored first); return the
        row written.

        A rollout's content that cannot be stored as it is (an image or a video that does
        not load, a value JSON cannot hold, in its messages, answer or info) does not stop
        the run: the row is written with those values replaced by ``unavailable`` records saying
        why (``AssetStore.to_jsonable(on_error="record")``), its ``error`` set (the
        rollout's own error if it has one, else why it could not be stored) and its reward
        null. Raises ``ResultsError`` for a key already written, a malformed key, reward or
        metrics, or ``extra`` keys that clash with ``ROW_KEYS``; nothing is appended then.
        """
        key: Key = (_example_id(output.example_id), _rollout_index(rollout_index))
        with self._lock:
            self._check_writable()
            self._check_new(key)
        try:
            row = self._row(output, key, extra)
        except _ContentError as exc:
            row = self._row(output, key, extra, failure=exc.cause)
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
        self,
        output: RolloutOutput,
        key: Key,
        extra: Mapping[str, Any] | None,
        *,
        failure: BaseException | None = None,
    ) -> dict[str, Any]:
        """The row for ``output``; ``failure`` (why the content could not be stored as it
        is) writes it in record mode, with that as the error when the rollout had none."""
        where = f"example {key[0]!r} rollout {key[1]}"
        record = failure is not None
        prompt = self._messages(output.prompt, f"{where}, prompt", record=record)
        completion = self._messages(output.completion, f"{where}, completion", record=record)
        metrics = output.metrics if output.metrics is not None else {}
        if not isinstance(metrics, Mapping):
            raise ResultsError(f"{where}, field 'metrics': must be a dict of numbers")
        for name in metrics:
            if not isinstance(name, str):
                raise ResultsError(f"{where}, field 'metrics': key {name!r} is not a str")
        error = output.error
        try:
            error = RolloutError.from_value(error)
        except TypeError as exc:
            raise ResultsError(f"{where}, field 'error': {exc}") from None
        if failure is not None and error is None:
            error = RolloutError.from_exception(failure, where="storing the rollout")
        answer, info = (
            (_stored(output.answer, where, "answer"), _stored(output.info, where, "info"))
            if record
            else (
                self._json(output.answer, where, "answer"),
                self._json(output.info, where, "info"),
            )
        )
        num_turns, prompt_tokens, completion_tokens = _turns_and_tokens(output)
        row: dict[str, Any] = {
            "example_id": key[0],
            "rollout_index": key[1],
            "prompt": prompt,
            "completion": completion,
            "answer": answer,
            "info": info if info is not None else {},
            "reward": None if record else _number(output.reward, where, "reward"),
            "metrics": {k: _number(v, where, f"metrics.{k}") for k, v in metrics.items()},
            "error": error.to_dict() if error is not None else None,
            "truncated": bool(getattr(output, "truncated", False)),
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

    def _messages(self, messages: Any, where: str, *, record: bool) -> list[dict[str, Any]]:
        if messages is None:
            return []
        if record:
            return self.assets.to_jsonable(messages, where=where, on_error="record")
        try:
            return self.assets.to_jsonable(messages, where=where)
        except (ImageError, VideoError) as exc:
            if exc.where is None:
                exc.where = where
            raise _ContentError(exc) from exc
        except ResultsError as exc:
            raise _ContentError(exc) from exc

    @staticmethod
    def _json(value: Any, where: str, path: str) -> Any:
        try:
            return to_json_value(value, where, path)
        except ResultsError as exc:
            raise _ContentError(exc) from exc

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
            aggregates = summarize(iter_results(self.results_path, bad_lines="raise"))
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
    tokens = [step.tokens for step in steps if step.tokens is not None]  # all of them: checked
    prompt_tokens = sum(len(t.prompt_ids) for t in tokens)
    completion_tokens = sum(len(t.completion_ids) for t in tokens)
    return num_turns, prompt_tokens, completion_tokens


class _ContentError(Exception):
    """A rollout's content that cannot be stored as it is: the row is written again in
    record mode (``ResultsWriter.write``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _stored(value: Any, where: str, path: str) -> Any:
    """``value`` as JSON, or an ``unavailable`` record of why it is not."""
    try:
        return to_json_value(value, where, path)
    except ResultsError as exc:
        return unavailable(value, exc)
