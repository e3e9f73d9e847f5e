"""``ResultsWriter``: appends rollouts to ``OUTDIR/results.jsonl``, crash safe and resumable.

The file format is documented in ``_format.py`` (module docstring). Opening the run
directory (refusals, the lock, a resume's checks and repairs) is ``_opening.py``; turning
a rollout into its row is ``_rows.py``; this module appends the rows, keeps the set of
keys written, and makes them durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vf_mm._json import to_json_value
from vf_mm.errors import ResultsError
from vf_mm.images import ImagePolicy
from vf_mm.results._assets import AssetStore, atomic_write_bytes
from vf_mm.results._format import (
    METADATA_FILE,
    RESULTS_FILE,
    RESULTS_FORMAT,
    Key,
    _dumps,
    _example_id,
    _rollout_index,
)
from vf_mm.results._opening import open_results, resume_results
from vf_mm.results._reader import iter_results
from vf_mm.results._rows import build_row
from vf_mm.results._summary import summarize
from vf_mm.types import RolloutOutput
from vf_mm.videos import VideoLimits


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ResultsWriter:
    """Append rollouts to ``OUTDIR/results.jsonl``, images and videos to ``OUTDIR/assets/``.

    Without ``resume``, an OUTDIR that already holds a rollout in ``results.jsonl``, or a
    ``metadata.json`` with no ``results.jsonl``, is refused. ``resume=True`` on an OUTDIR
    with no run in it starts a new one. A run that stopped before its first rollout (an
    empty ``results.jsonl``) holds nothing to lose: it is reused with or without
    ``resume``, whatever its configuration was.

    A resumed run re-runs the rollouts whose record has an ``error``: they are not in
    ``done``, and their new record is appended (the file stays append-only; the reader
    takes the last record of each key).

    After opening: ``done`` (the keys already written and not to be run again),
    ``truncated_bytes`` (the torn tail cut off the results file, 0 if none),
    ``removed_temp_files`` (temporary files of a killed writer, deleted), ``resumed``
    (whether earlier rows were found).

    ``write`` is thread safe (call it from worker threads, or ``await awrite(...)`` from
    asyncio, which runs it in a thread since it encodes PNGs and videos). Use it as a
    context manager or call ``close()``; ``finalize`` stores the aggregates in
    metadata.json.

    Args:
        outdir: The run directory.
        resume: Continue the run stored there.
        retry_errors: False keeps a resumed run's failed rollouts as they are.
        metadata: Describes the run; its ``config`` dict (env id, env args, model,
            sampling args, num examples, rollouts per example, ...) is what ``resume=True``
            compares with the stored run.
        fsync_every: fsync the results file (and the assets folder) every that many lines;
            0 or None = only on ``close``/``finalize``.
        policy: Which image and video sources may be read (``vf_mm.images.ImagePolicy``;
            default: any local path, no network).
        config_defaults: What a key meant in runs written before it existed
            (``{"image_backend": "pil"}``), so they still resume.
        video_limits: What a video may cost to load (``VideoLimits()`` when None; pass the
            renderer's, so that every clip the run took is stored).

    Raises:
        ResumeMismatchError: ``resume=True`` and a stored ``config`` that differs (listing
            the keys), before anything on disk changes.
        ResultsError: An OUTDIR in use (see above), or held by another writer.
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
        self._fd = open_results(self.outdir, resume=resume)
        try:
            self.assets = AssetStore(self.outdir, policy=policy, video_limits=video_limits)
            if resume:
                found = resume_results(
                    self._fd,
                    self.outdir,
                    config=config,
                    config_defaults=self.config_defaults,
                    retry_errors=retry_errors,
                    assets=self.assets,
                )
                if found.started_at is not None:
                    self.started_at = found.started_at
                self.truncated_bytes = found.truncated_bytes
                self._size = found.size
                self._done = set(found.done)
                self.resumed = bool(self._done)
                self.removed_temp_files = found.removed_temp_files
            self._write_metadata(results=None, finished_at=None)
        except BaseException:
            if not existed:  # leave no empty results file that would refuse the next try
                with contextlib.suppress(OSError):
                    os.unlink(self.results_path)
            self._release()
            raise

    # -- state

    @property
    def done(self) -> frozenset[Key]:
        """The (example_id, rollout_index) keys in the results file (a snapshot)."""
        with self._lock:
            return frozenset(self._done)

    def is_done(self, example_id: int | str, rollout_index: int) -> bool:
        """Whether ``(example_id, rollout_index)`` is written and not to be run again.

        Args:
            example_id: The example's id.
            rollout_index: The rollout's index.
        """
        with self._lock:
            return (_example_id(example_id), rollout_index) in self._done

    def pending(self, example_ids: Iterable[int | str], rollouts_per_example: int) -> list[Key]:
        """The keys of ``example_ids`` x ``range(rollouts_per_example)`` not yet written.

        In that order.

        Args:
            example_ids: The examples.
            rollouts_per_example: Rollouts per example.
        """
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
        """Append ``output`` as one line (its images and videos first); return the row written.

        A rollout's content that cannot be stored as it is (an image or a video that does not
        load, a value JSON cannot hold, in its messages, answer or info) does not stop the run:
        the row is written with those values replaced by ``unavailable`` records saying why
        (``AssetStore.to_jsonable(on_error="record")``), its ``error`` set (the rollout's own
        error if it has one, else why it could not be stored) and its reward null.

        Args:
            output: The scored rollout.
            rollout_index: Which of its example's rollouts it is.
            extra: More keys for the row (none may clash with ``ROW_KEYS``).

        Raises:
            ResultsError: A key already written, a malformed key, reward or metrics, or
                ``extra`` keys that clash with ``ROW_KEYS``; nothing is appended then.
        """
        key: Key = (_example_id(output.example_id), _rollout_index(rollout_index))
        with self._lock:
            self._check_writable()
            self._check_new(key)
        row = build_row(output, key, extra, assets=self.assets)
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
        """``write`` in a worker thread, for asyncio callers.

        Args:
            output: See ``write``.
            rollout_index: See ``write``.
            extra: See ``write``.
        """
        return await asyncio.to_thread(self.write, output, rollout_index=rollout_index, extra=extra)

    def _check_new(self, key: Key) -> None:
        if key in self._done:
            raise ResultsError(
                f"example {key[0]!r} rollout {key[1]} is already in {self.results_path}; "
                "each (example, rollout) is written once (check writer.done before running it)"
            )

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
        """fsync the results, store aggregates and ``finished_at`` in metadata.json; return them.

        The writer stays open (``close`` it).

        Args:
            aggregates: The aggregates (default: ``summarize`` of the whole results file).
        """
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
