"""``merge_runs``: the run directories of one sharded evaluation combined into one run directory.

One evaluation run as N processes (``vf-mm eval ... --shard i/N -o out/si``) leaves N run
directories whose ``metadata.json`` configs are equal but for ``"shard": "i/N"``, each
holding the rows of the examples that fall in its shard. ``merge_runs(outdir, sources)``
makes them one ordinary run directory, which ``read_results``, ``scan_results``,
``summarize`` and ``vf-mm view`` read like any other:

- ``results.jsonl``: every row of every source as the reader gives it (the last record of
  a retried rollout; a torn last line left out, as ``bad_lines`` says), each line encoded
  by the format's own line encoder, so a row is the same bytes it was in its source. Rows
  go source by source (in shard order), each source's in its file order.
- ``assets/``: each asset a row refers to, copied once (a picture that several shards
  show is one file) after checking it against the content hash in its name, the way the
  store computed it (``image_hash`` of the loaded image; ``video_hash`` of the loaded clip
  at the part's ``frame_rate``). Rows keep their ``assets/<hash>.<ext>`` URLs as they are.
  Files no row refers to (the assets of a record replaced by a retry) are not copied.
- ``metadata.json``: the common config without ``"shard"``, plus ``"merged_shards"``
  (the ``"i/N"`` it holds); a ``"merge"`` record (shards held and missing, and per source
  its path, shards, rows, times and the top-level metadata keys that differ between
  sources, such as the ``server`` each ran against); ``results`` = ``summarize`` of all
  the merged rows, with the client's counts (turns, bridges, renders, fallbacks) summed
  over the sources and ``stopped`` saying which shard a ``--max-errors`` stopped.

A merged directory has ``"merged_shards"`` in place of ``"shard"``, so it can be a source
again (merge 0/4 and 1/4 now, the rest later).

Refused, with ``vf_mm.errors.MergeError`` naming the problem and the directories, before
anything is written: a source that is missing, is not a run directory or is still being
written (its writer holds the lock); configs that differ in anything but the shard; a
source that is not a shard; two sources with the same shard; different shard counts; an
(example, rollout) in two sources; a missing shard (unless ``allow_partial=True``); an
asset that is missing or does not match its hash; an outdir that is not empty, or is inside
a source. A corrupt line in a source raises the reader's ``ResultsError``.

Crash safety: everything is written into a hidden folder beside ``outdir``
(``.<name>.tmp-merge-<random>``), each file fsynced, the results file read back and
checked, and the folder then renamed to ``outdir`` in one step: a merge killed at any
moment leaves no ``outdir`` (at most that hidden folder, to delete), never a half-merged
run that looks whole. The sources are only read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vf_mm._shard import Shard, parse_shard
from vf_mm._text import shorten
from vf_mm.errors import ImageError, MergeError, ResultsError, VideoError
from vf_mm.images import ImagePolicy
from vf_mm.results._assets import (
    ASSETS_DIR,
    AssetRef,
    asset_name_hash,
    asset_refs,
    atomic_write_bytes,
    fsync_dir,
    stored_content_hash,
)
from vf_mm.results._format import METADATA_FILE, RESULTS_FILE, RESULTS_FORMAT, Key, _dumps
from vf_mm.results._reader import BadLinePolicy, ResultsScan, read_metadata, scan_results
from vf_mm.results._summary import summarize
from vf_mm.videos import VideoLimits

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock to test, the rest works
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("vf_mm.results")

#: The config key a shard's run records (``"i/N"``), and the one a merged run records.
SHARD_KEY = "shard"
MERGED_SHARDS_KEY = "merged_shards"
_SHARD_KEYS = (SHARD_KEY, MERGED_SHARDS_KEY)
# metadata.json keys the writer (or a merge) sets for the run itself: never carried over
_RUN_KEYS = frozenset({"config", "results_format", "started_at", "finished_at", "results", "merge"})
_BAD_LINES = ("raise", "torn-tail", "skip")
_MISSING = object()
_LISTED = 5  # overlapping (example, rollout) pairs named in an error


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What ``merge_runs`` wrote.

    Attributes:
        outdir: The merged run directory.
        rows: Rows written.
        shards: The ``"i/N"`` the merged run holds, in order.
        missing: The ``"i/N"`` it does not hold (empty: a full merge).
        assets: Asset files copied.
        metadata: The merged ``metadata.json``.
        warnings: Torn lines left out, unfinished or stopped sources.
    """

    outdir: Path
    rows: int
    shards: tuple[str, ...]  # the "i/N" the merged run holds, in order
    missing: tuple[str, ...]  # the "i/N" it does not hold (empty: a full merge)
    assets: int  # asset files copied
    metadata: dict[str, Any]
    warnings: tuple[str, ...] = ()  # torn lines left out, unfinished or stopped sources

    @property
    def complete(self) -> bool:
        """Whether every shard of i/N is in the merged run."""
        return not self.missing

    @property
    def aggregates(self) -> dict[str, Any]:
        """``summarize`` of the merged rows, with the summed client counts."""
        return self.metadata["results"]


@dataclass(slots=True)
class _Source:
    path: Path
    metadata: dict[str, Any]
    config: dict[str, Any]  # without the shard keys
    shards: tuple[int, ...]
    count: int  # N of i/N
    scan: ResultsScan | None = None
    refs: dict[str, AssetRef] = field(default_factory=dict)  # _ref_key -> first reference

    @property
    def label(self) -> str:
        return ", ".join(_shard(i, self.count) for i in self.shards)


def merge_runs(
    outdir: str | os.PathLike[str],
    sources: Sequence[str | os.PathLike[str]],
    *,
    allow_partial: bool = False,
    bad_lines: BadLinePolicy = "torn-tail",
    policy: ImagePolicy | None = None,
    video_limits: VideoLimits | None = None,
) -> MergeResult:
    """Combine the run directories ``sources`` (shards i/N of one run) into ``outdir``.

    Returns what was written (module docstring: the layout, the refusals, crash safety).

    The invariant: merging the N shards of a run gives the rows, assets and aggregates of
    that run done in one process (the same (example, rollout) rows, byte for byte, each
    asset once), so that a sharded evaluation is not a second kind of result. Why a refusal
    rather than a best effort: a merge that silently mixes two configurations, or counts a
    rollout twice, gives numbers nobody can trust afterwards.

    Args:
        outdir: The new run directory; must not exist or be an empty folder.
        sources: The shards' run directories (never changed).
        allow_partial: Merge even when shards are missing (the merged metadata names
            them).
        bad_lines: What a bad line in a source does, as the reader says (``read_results``;
            the default leaves out a torn last line, with a warning).
        policy: What loading an asset to check its hash may cost (``ImagePolicy()`` when
            None).
        video_limits: The same for clips (``VideoLimits()`` when None).

    Raises:
        MergeError: Sources that are not the shards of one run, a missing shard, a bad
            asset, an outdir in use (nothing written).
    """
    if isinstance(sources, (str, bytes, os.PathLike)) or not isinstance(sources, Iterable):
        raise TypeError(f"sources must be a list of run directories, not {type(sources).__name__}")
    paths = [Path(s) for s in sources]
    if not paths:
        raise ValueError("merge_runs needs at least one source directory")
    if bad_lines not in _BAD_LINES:
        raise ValueError(f"bad_lines must be one of {_BAD_LINES}, not {bad_lines!r}")
    out = Path(outdir)
    _check_sources_exist(paths)
    _check_outdir(out, paths)
    found = sorted((_open_source(p) for p in paths), key=lambda s: s.shards)
    _check_one_run(found)
    count = found[0].count
    held = sorted(i for s in found for i in s.shards)
    missing = [i for i in range(count) if i not in held]
    if missing and not allow_partial:
        raise MergeError(
            f"shard{'s' if len(missing) > 1 else ''} "
            f"{', '.join(_shard(i, count) for i in missing)} of {count} "
            f"{'are' if len(missing) > 1 else 'is'} missing (the sources hold "
            f"{', '.join(_shard(i, count) for i in held)}): run "
            f"{'them' if len(missing) > 1 else 'it'} too, or merge what there is with "
            "allow_partial=True (vf-mm merge --allow-partial)",
            sources=tuple(str(s.path) for s in found),
        )
    warnings: list[str] = []
    for source in found:
        _read_rows(source, bad_lines, warnings)
    _check_no_overlap(found)
    rows = [row for s in found for row in s.scan.rows]  # type: ignore[union-attr]
    metadata = _merged_metadata(found, held, missing)
    copied = _publish(out, found, rows, metadata, policy=policy, video_limits=video_limits)
    for warning in warnings:
        logger.warning("vf_mm merge: %s", warning)
    return MergeResult(
        outdir=out,
        rows=len(rows),
        shards=tuple(_shard(i, count) for i in held),
        missing=tuple(_shard(i, count) for i in missing),
        assets=copied,
        metadata=metadata,
        warnings=tuple(warnings),
    )


# -- the sources --------------------------------------------------------------------


def _shard(index: int, count: int) -> str:
    return str(Shard(index, count))


def _check_sources_exist(paths: list[Path]) -> None:
    seen: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise MergeError(f"source {path} does not exist", sources=(str(path),))
        if not path.is_dir():
            raise MergeError(
                f"source {path} is not a run directory (it is a file, not a folder)",
                sources=(str(path),),
            )
        lacking = [n for n in (METADATA_FILE, RESULTS_FILE) if not (path / n).is_file()]
        if lacking:
            raise MergeError(
                f"source {path} is not a run directory: it has no {' and no '.join(lacking)}",
                sources=(str(path),),
            )
        real = path.resolve()
        if real in seen:
            raise MergeError(
                f"{seen[real]} and {path} are the same source directory, given twice",
                sources=(str(seen[real]), str(path)),
            )
        seen[real] = path


def _check_outdir(out: Path, paths: list[Path]) -> None:
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise MergeError(f"outdir {out} exists and is not a folder", path=str(out))
        with os.scandir(out) as entries:
            if any(True for _ in entries):
                raise MergeError(
                    f"outdir {out} exists and is not empty: a merge writes a new run "
                    "directory; choose another outdir (or empty it)",
                    path=str(out),
                )
    real = out.resolve()
    for path in paths:
        if real.is_relative_to(path.resolve()):
            raise MergeError(
                f"outdir {out} is inside source {path}: a merge never writes into a source",
                path=str(out),
                sources=(str(path),),
            )


def _open_source(path: Path) -> _Source:
    """A source's metadata: its config (without the shard keys) and which shards it holds."""
    where = (str(path),)
    try:
        metadata = read_metadata(path)
    except ResultsError as exc:
        raise MergeError(f"source {path} is not a run directory: {exc}", sources=where) from exc
    fmt = metadata.get("results_format")
    if fmt != RESULTS_FORMAT:
        raise MergeError(
            f"source {path} holds results format {fmt!r}, not {RESULTS_FORMAT}: written by "
            "another vf_mm version; shards of one run share one",
            sources=where,
        )
    config = metadata.get("config")
    if not isinstance(config, dict):
        raise MergeError(f"source {path}: its metadata.json has no config", sources=where)
    shard, merged = config.get(SHARD_KEY), config.get(MERGED_SHARDS_KEY)
    if shard is None and merged is None:
        raise MergeError(
            f"source {path} is not a shard: its config has no {SHARD_KEY!r} (run each "
            "part with vf-mm eval --shard i/N)",
            sources=where,
        )
    if shard is not None and merged is not None:
        raise MergeError(
            f"source {path}: its config has both {SHARD_KEY!r} and {MERGED_SHARDS_KEY!r}",
            sources=where,
        )
    specs = [shard] if shard is not None else merged
    if not isinstance(specs, list) or not specs:
        raise MergeError(
            f"source {path}: {MERGED_SHARDS_KEY!r} must be a list of 'i/N', got {merged!r}",
            sources=where,
        )
    parsed = [_parse_shard(spec, path) for spec in specs]
    counts = {n for _, n in parsed}
    indices = sorted(i for i, _ in parsed)
    if len(counts) > 1 or len(set(indices)) != len(indices):
        raise MergeError(
            f"source {path}: {MERGED_SHARDS_KEY!r} {specs!r} is not distinct shards of one N",
            sources=where,
        )
    rest = {k: v for k, v in config.items() if k not in _SHARD_KEYS}
    return _Source(path, metadata, rest, tuple(indices), counts.pop())


def _parse_shard(spec: Any, path: Path) -> tuple[int, int]:
    try:
        shard = parse_shard(spec) if isinstance(spec, str) else None
    except ValueError:
        shard = None
    if shard is None:
        raise MergeError(
            f"source {path}: shard {spec!r} is not 'i/N' with 0 <= i < N", sources=(str(path),)
        )
    return shard.index, shard.count


def _check_one_run(found: list[_Source]) -> None:
    """Same config but for the shard, same N, each shard in one source only."""
    first = found[0]
    for other in found[1:]:
        keys = sorted(set(first.config) | set(other.config))
        differ = [k for k in keys if first.config.get(k, _MISSING) != other.config.get(k, _MISSING)]
        if differ:
            detail = "; ".join(
                f"{k}: {_short(first.config.get(k, _MISSING))} in {first.path}, "
                f"{_short(other.config.get(k, _MISSING))} in {other.path}"
                for k in differ
            )
            raise MergeError(
                f"{first.path} and {other.path} are not shards of one run: their configs "
                f"differ in {', '.join(differ)} ({detail}); only {SHARD_KEY!r} may differ",
                sources=(str(first.path), str(other.path)),
            )
    for other in found[1:]:
        if other.count != first.count:
            raise MergeError(
                f"{first.path} is a shard of {first.count} ({first.label}) but {other.path} "
                f"of {other.count} ({other.label}): the shard counts differ, so they are not "
                "parts of one split",
                sources=(str(first.path), str(other.path)),
            )
    owner: dict[int, _Source] = {}
    for source in found:
        for index in source.shards:
            if index in owner:
                raise MergeError(
                    f"{owner[index].path} and {source.path} both hold shard "
                    f"{_shard(index, first.count)}: each shard is merged once (two runs of one "
                    "shard? keep one of them)",
                    sources=(str(owner[index].path), str(source.path)),
                )
            owner[index] = source


def _short(value: Any) -> str:
    if value is _MISSING:
        return "<missing>"
    return shorten(json.dumps(value, ensure_ascii=False, sort_keys=True), 60)


@contextlib.contextmanager
def _no_writer(source: _Source) -> Iterator[None]:
    """Hold a shared lock on the source's results file while it is read: a live
    ``ResultsWriter`` holds an exclusive one, so a shard still being written is refused
    (its rows are not all there yet). The lock changes nothing on disk."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(source.path / RESULTS_FILE, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise MergeError(
                f"source {source.path} is being written (its {RESULTS_FILE} is locked by a "
                "running vf-mm eval): merge it once that run has ended",
                sources=(str(source.path),),
            ) from None
        yield
    finally:
        os.close(fd)  # drops the lock


def _read_rows(source: _Source, bad_lines: BadLinePolicy, warnings: list[str]) -> None:
    """The source's rows through the one reader, and what it left out or did not finish."""
    with _no_writer(source):
        scan = scan_results(source.path, bad_lines=bad_lines)
    source.scan = scan
    for bad in scan.bad_lines:
        state = "a torn last line" if bad is scan.torn_tail else "a bad line"
        warnings.append(
            f"{source.path} (shard {source.label}): line {bad.line} is {state} ({bad.reason}); "
            "left out, as the reader does"
        )
    if source.metadata.get("finished_at") is None:
        warnings.append(
            f"{source.path} (shard {source.label}) was not finished (its finished_at is null: "
            f"still running, or killed); its {len(scan.rows)} rows so far are merged"
        )
    stopped = (source.metadata.get("results") or {}).get("stopped")
    if stopped:
        warnings.append(f"{source.path} (shard {source.label}): {stopped}")
    for row in scan.rows:
        for ref in asset_refs(
            row, prefix=f"example {row['example_id']!r} rollout {row['rollout_index']}, "
        ):
            source.refs.setdefault(_ref_key(ref), ref)


def _check_no_overlap(found: list[_Source]) -> None:
    owner: dict[Key, _Source] = {}
    clashes: list[tuple[Key, _Source, _Source]] = []
    for source in found:
        assert source.scan is not None
        for key in source.scan.keys:
            if key in owner:
                clashes.append((key, owner[key], source))
            else:
                owner[key] = source
    if clashes:
        (example, rollout), a, b = clashes[0]
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        listed = ", ".join(f"example {k[0]!r} rollout {k[1]}" for k, _, _ in clashes[:_LISTED])
        raise MergeError(
            f"example {example!r} rollout {rollout} is in both {a.path} and {b.path}{more}: "
            f"shards must not share rows ({listed}); were they run with the same --shard, or "
            "with different sharding?",
            sources=tuple(dict.fromkeys(str(s.path) for _, x, y in clashes for s in (x, y))),
        )


# -- assets -------------------------------------------------------------------------


def _ref_key(ref: AssetRef) -> str:
    # a video's hash covers its frame rate: each (file, rate) a row names is checked
    return ref.url if not ref.video else f"{ref.url}@{ref.frame_rate!r}"


def _check_asset(
    data: bytes,
    ref: AssetRef,
    source: Path,
    *,
    policy: ImagePolicy | None,
    limits: VideoLimits | None,
) -> None:
    """The store's hash of ``data`` is the one in its name (``AssetStore.add`` /
    ``add_video`` computed it from the same loaders)."""
    want = asset_name_hash(ref.url)
    try:
        got = stored_content_hash(
            data, video=ref.video, frame_rate=ref.frame_rate, policy=policy, limits=limits,
            where=ref.where,
        )  # fmt: skip
    except (ImageError, VideoError) as exc:
        raise MergeError(
            f"source {source}: {ref.url} (referred to by {ref.where}) does not load: {exc}",
            sources=(str(source),),
        ) from exc
    if got != want:
        raise MergeError(
            f"source {source}: {ref.url} (referred to by {ref.where}) does not match its hash "
            f"(its content hashes to {got}): the file was changed after it was stored",
            sources=(str(source),),
        )


def _copy_assets(
    staging: Path,
    found: list[_Source],
    *,
    policy: ImagePolicy | None,
    limits: VideoLimits | None,
) -> int:
    """Copy each referred-to asset once into ``staging/assets``, checked; returns how many."""
    folder = staging / ASSETS_DIR
    folder.mkdir()
    copied: set[str] = set()
    checked: set[str] = set()
    for source in found:
        for key, ref in source.refs.items():
            if key in checked:
                continue
            if ref.url in copied:  # this file is in already: check it at this part's rate
                data = (staging / ref.url).read_bytes()
            else:
                try:
                    data = (source.path / ref.url).read_bytes()
                except OSError as exc:
                    raise MergeError(
                        f"source {source.path}: {ref.url} (referred to by {ref.where}) cannot "
                        f"be read: {exc.strerror or exc}",
                        sources=(str(source.path),),
                    ) from exc
            _check_asset(data, ref, source.path, policy=policy, limits=limits)
            if ref.url not in copied:
                with open(staging / ref.url, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                copied.add(ref.url)
            checked.add(key)
    fsync_dir(folder)
    return len(copied)


# -- the merged run -----------------------------------------------------------------


def _merged_metadata(found: list[_Source], held: list[int], missing: list[int]) -> dict[str, Any]:
    """metadata.json without ``results`` (filled in once the rows are written)."""
    count = found[0].count
    shards = [_shard(i, count) for i in held]
    first = found[0].metadata
    same = {
        k: v
        for k, v in first.items()
        if k not in _RUN_KEYS and all(s.metadata.get(k, _MISSING) == v for s in found)
    }
    differing = sorted(
        {k for s in found for k in s.metadata if k not in _RUN_KEYS and k not in same}
    )
    record = {
        "shards": shards,
        "of": count,
        "missing": [_shard(i, count) for i in missing],
        "sources": [
            {
                "path": str(s.path.resolve()),
                "shards": [_shard(i, count) for i in s.shards],
                "rows": len(s.scan.rows) if s.scan is not None else 0,
                "started_at": s.metadata.get("started_at"),
                "finished_at": s.metadata.get("finished_at"),
                "metadata": {k: s.metadata[k] for k in differing if k in s.metadata},
            }
            for s in found
        ],
        "merged_at": _now(),
    }
    starts = [
        s.metadata["started_at"] for s in found if isinstance(s.metadata.get("started_at"), str)
    ]
    return {
        **same,
        "config": {**found[0].config, MERGED_SHARDS_KEY: shards},
        "merge": record,
        "results_format": RESULTS_FORMAT,
        "started_at": min(starts) if starts else record["merged_at"],
        "finished_at": None,
        "results": None,
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _client_stats(found: list[_Source]) -> dict[str, Any] | None:
    """The client's counts summed over the sources that stored them (None if none did)."""
    stored = [
        client
        for s in found
        if isinstance(client := (s.metadata.get("results") or {}).get("client"), dict)
    ]
    if not stored:
        return None
    fallbacks: Counter[str] = Counter()
    for client in stored:
        fallbacks.update(client.get("fallbacks") or {})
    return {
        **{k: sum(int(c.get(k) or 0) for c in stored) for k in ("turns", "bridges", "renders")},
        "fallbacks": dict(fallbacks),
    }


def _aggregates(found: list[_Source], rows: list[dict[str, Any]]) -> dict[str, Any]:
    aggregates = summarize(rows)
    stopped = [
        f"shard {s.label}: {msg}"
        for s in found
        if (msg := (s.metadata.get("results") or {}).get("stopped"))
    ]
    aggregates["stopped"] = "; ".join(stopped) if stopped else None
    times = [
        float(t)
        for s in found
        if isinstance(t := (s.metadata.get("results") or {}).get("time_s"), (int, float))
        and math.isfinite(t)
    ]
    if times:  # the sharded run's wall time: its slowest shard's
        aggregates["time_s"] = max(times)
    client = _client_stats(found)
    if client is not None:
        aggregates["client"] = client
    return aggregates


def _publish(
    out: Path,
    found: list[_Source],
    rows: list[dict[str, Any]],
    metadata: dict[str, Any],
    *,
    policy: ImagePolicy | None,
    video_limits: VideoLimits | None,
) -> int:
    """Write the merged run into a hidden folder beside ``out``, check it, and rename it
    to ``out``: the outdir appears whole or not at all. Fills ``metadata["results"]``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _make_staging(out)
    try:
        copied = _copy_assets(staging, found, policy=policy, limits=video_limits)
        with open(staging / RESULTS_FILE, "xb") as f:  # the assets are in before the lines
            for row in rows:
                f.write(_dumps(row))
            f.flush()
            os.fsync(f.fileno())
        check = scan_results(staging, bad_lines="raise")
        if len(check.rows) != len(rows):  # pragma: no cover - a bug, not a user's fault
            raise ResultsError(f"{staging}: {len(check.rows)} rows read back of {len(rows)}")
        metadata["results"] = _aggregates(found, check.rows)
        metadata["finished_at"] = _now()
        atomic_write_bytes(staging / METADATA_FILE, _dumps(metadata, indent=2, separators=None))
        fsync_dir(staging)
        try:
            os.rename(staging, out)  # replaces an empty folder; refuses a non-empty one
        except OSError as exc:
            raise MergeError(
                f"outdir {out} could not be created ({exc.strerror or exc}): did something "
                "write into it during the merge?",
                path=str(out),
            ) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(out.parent)
    return copied


def _make_staging(out: Path) -> Path:
    """A new hidden folder beside ``out`` (permissions as a plain ``mkdir`` gives)."""
    while True:
        staging = out.parent / f".{out.name}.tmp-merge-{secrets.token_hex(6)}"
        try:
            staging.mkdir()
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
        return staging
