"""Opening a run directory for appending: the refusals, the lock, and what a resume finds.

A run directory has one writer at a time and is never overwritten by mistake:
``open_results`` refuses an OUTDIR that holds a run unless the caller resumes it, takes
an exclusive lock on ``results.jsonl`` for as long as the descriptor is open, and checks
again after locking (a rollout may have landed since it looked). ``resume_results`` then
checks the stored configuration against the new one before anything on disk changes,
repairs what an interrupted writer left (a torn last line, temporary files) and returns
the keys already written. ``ResultsWriter`` is the only caller; it owns the descriptor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vf_mm._files import fsync_dir
from vf_mm._text import shorten
from vf_mm.errors import ResultsError, ResumeMismatchError
from vf_mm.results._assets import AssetStore, is_temp_name
from vf_mm.results._format import METADATA_FILE, RESULTS_FILE, Key
from vf_mm.results._reader import read_metadata, scan_results

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest works
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("vf_mm.results")


@dataclass(frozen=True)
class Resumed:
    """What ``resume_results`` found in a run directory, repaired.

    ``started_at``: the stored run's start time (None when there is none to keep);
    ``size``: the length of ``results.jsonl`` after the repair, where the next line goes;
    ``done``: the keys not to be run again; ``truncated_bytes``: the torn tail cut off
    (0 if none); ``removed_temp_files``: temporary files of a killed writer, deleted.
    """

    started_at: str | None
    size: int
    done: frozenset[Key]
    truncated_bytes: int
    removed_temp_files: int


def open_results(outdir: Path, *, resume: bool) -> int:
    """Open and lock ``OUTDIR/results.jsonl`` for appending; return its descriptor.

    Without ``resume``, an OUTDIR holding a rollout, or a ``metadata.json`` with no
    ``results.jsonl``, is refused (``ResultsError``), except a run that stopped before
    its first rollout (an empty ``results.jsonl``): it holds nothing to lose. A results
    file locked by another writer is refused in both cases. Closing the descriptor drops
    the lock.
    """
    results_path = outdir / RESULTS_FILE
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
    if not resume and not _holds_no_rollout(results_path):
        if (outdir / METADATA_FILE).exists():
            names = [RESULTS_FILE] if results_path.exists() else []
            raise ResultsError(_in_use_message(outdir, [*names, METADATA_FILE]), path=str(outdir))
        flags |= os.O_EXCL
    try:
        fd = os.open(results_path, flags, 0o644)
    except FileExistsError:
        raise ResultsError(_in_use_message(outdir, [RESULTS_FILE]), path=str(outdir)) from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ResultsError(
                f"{outdir} is being written by another ResultsWriter (its "
                f"{RESULTS_FILE} is locked); one writer per outdir",
                path=str(outdir),
            ) from None
    if not resume and os.fstat(fd).st_size > 0:  # a rollout landed since we looked
        os.close(fd)
        raise ResultsError(_in_use_message(outdir, [RESULTS_FILE]), path=str(outdir))
    if not resume:
        fsync_dir(outdir)
    return fd


def resume_results(
    fd: int,
    outdir: Path,
    *,
    config: Mapping[str, Any],
    config_defaults: Mapping[str, Any],
    retry_errors: bool,
    assets: AssetStore,
) -> Resumed:
    """Check and repair the run behind ``fd`` (from ``open_results(resume=True)``).

    A run holding a rollout must have a ``metadata.json`` whose ``config`` equals
    ``config`` (``config_defaults`` filling the keys it predates), else ``ResultsError``
    / ``ResumeMismatchError`` before anything changes. A corrupt line other than the last
    raises; a torn last line is cut off. Rollouts whose record has an ``error`` are not
    ``done`` (they run again) unless ``retry_errors`` is False.
    """
    results_path = outdir / RESULTS_FILE
    started_at: str | None = None
    if os.fstat(fd).st_size > 0:  # else no rollout yet: no configuration to keep
        try:
            stored = read_metadata(outdir)
        except FileNotFoundError:
            raise ResultsError(
                f"{outdir} holds a {RESULTS_FILE} but no {METADATA_FILE}: the run's "
                "configuration cannot be checked, so it is not resumed",
                path=str(outdir),
            ) from None
        _check_config(outdir, stored, config, config_defaults)
        if isinstance(stored.get("started_at"), str):
            started_at = stored["started_at"]
    scan = scan_results(results_path, keep_rows=False)  # a corrupt middle line raises
    truncated = 0
    torn = scan.torn_tail
    if torn is not None:
        os.ftruncate(fd, scan.end)
        os.fsync(fd)
        truncated = scan.size - scan.end
        logger.warning(
            "%s: cut off a torn last line (line %d, %d bytes: %s) left by an interrupted writer",
            results_path,
            torn.line,
            truncated,
            torn.reason,
        )
    # a failed rollout is run again unless the caller keeps it (retry_errors=False)
    done = set(scan.keys) - scan.failed if retry_errors else set(scan.keys)
    removed = assets.remove_temp_files() + _remove_temp_metadata(outdir)
    return Resumed(
        started_at=started_at,
        size=scan.end,
        done=frozenset(done),
        truncated_bytes=truncated,
        removed_temp_files=removed,
    )


def _holds_no_rollout(results_path: Path) -> bool:
    """Whether OUTDIR is a run a writer left with no rollout in it (an empty
    results.jsonl): a run that stopped before its first rollout (bad settings, an
    interrupt) holds nothing to lose, so it is reused with or without resume, its
    metadata.json rewritten."""
    try:
        return results_path.stat().st_size == 0
    except FileNotFoundError:
        return False


def _check_config(
    outdir: Path,
    stored: Mapping[str, Any],
    new: Mapping[str, Any],
    config_defaults: Mapping[str, Any],
) -> None:
    old = stored.get("config", {})
    if not isinstance(old, dict):
        old = {}
    # a key added to the configuration after the run was written: what it meant then
    old = {**{k: v for k, v in config_defaults.items() if k in new}, **old}
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
            f"cannot resume {outdir}: the run configuration differs in "
            f"{', '.join(differences)} ({lines}); use the stored configuration or "
            "another outdir",
            path=str(outdir),
            differences=differences,
        )


def _remove_temp_metadata(outdir: Path) -> int:
    removed = 0
    for entry in os.scandir(outdir):
        if (
            is_temp_name(entry.name)
            and entry.name.startswith(f".{METADATA_FILE}")
            and entry.is_file(follow_symlinks=False)
        ):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
    return removed


def _in_use_message(outdir: Path, names: Sequence[str]) -> str:
    return (
        f"{outdir} already holds {' and '.join(names)} of a run: pass resume=True "
        "(vf-mm eval --resume) to continue it, or choose another outdir"
    )


def _short(value: Any, limit: int = 80) -> str:
    text = value if value is ResumeMismatchError.MISSING else json.dumps(value, ensure_ascii=False)
    return shorten(text, limit)
