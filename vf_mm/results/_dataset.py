"""``to_dataset``: a run directory as a ``datasets.Dataset``, one row per stored rollout.

The invariant: every value of every row the reader gives (``scan_results``) is in the
dataset and comes back exactly after ``Dataset.to_parquet`` / ``Dataset.from_parquet`` or
``save_to_disk`` / ``load_from_disk``, and every image or clip a row's messages refer to
is in the dataset as the bytes of its asset file, so an exported dataset needs neither
the run directory nor vf_mm to be read. The columns, in order:

=====================  ==========================  ==========================================
column                 feature                     holds
=====================  ==========================  ==========================================
``example_id``         int64 or string             the row's id (see below)
``rollout_index``      int64
``prompt``             string (JSON text)          the prompt messages, as results.jsonl holds
``completion``         string (JSON text)          them (asset URLs kept)
``answer``             string (JSON text) or null  any JSON value
``info``               string (JSON text) or null
``reward``             float64 or null             null: the rollout failed
``metrics``            string (JSON text) or null  ``{name: float | null}``
``error``              string (JSON text) or null  ``{"type", "message", "where"}``; null: none
``truncated``          bool or null                ran out of context (null: a file from
                                                   before the field)
``num_turns``          int64 or null
``prompt_tokens``      int64 or null               token counts (sums over the turns); null
``completion_tokens``  int64 or null               when the backend gave no tokens
``timing``             string (JSON text) or null
``extra``              string (JSON text) or null  the row's keys beyond ``ROW_KEYS``, as one
                                                   object; null when it has none
``images``             list of ``datasets.Image``  the row's image assets, in reference order
``image_urls``         list of string              their URLs, in the same order
``videos``             list of {url, frame_rate,   the row's video assets, in reference order,
                       bytes}                      each file's bytes
=====================  ==========================  ==========================================

**Messages (and every other free-form value) are JSON text.** A message's ``content`` is
a string or a list of parts of different shapes (text, image, video, ``unavailable``
records), messages carry tool calls and keys of their own, and ``answer`` / ``info`` may
be any JSON. An Arrow struct schema would have to unify all of that into one type per
column: a key one part lacks would come back as null (a key that was not there), a
string-or-list ``content`` has no Arrow type, and an int answer in one row and a string
in the next cannot share a column. JSON text keeps every value as it was written (key
order included): ``json.loads(row["prompt"]) == stored_row["prompt"]``. A JSON null is an
Arrow null (so ``row["error"] is None`` selects the rollouts that did not fail), and a key
missing from a row (a file another tool wrote) reads as null.

**Images.** ``images[k]`` is the k-th image part of the row that refers to an asset
(``{"type": "image_url", "image_url": {"url": "assets/<hash>.png"}}``), counting the
prompt's messages and then the completion's, each message's parts in order, and
``image_urls[k]`` is that part's URL: ``zip(row["image_urls"], row["images"])`` maps each
reference in the messages to its picture. An image shown twice is listed twice (the
positions stay aligned with the references). Each is a ``datasets.Image`` holding the
asset file's PNG bytes (and its URL as ``path``), which decodes to the pixels
``vf_mm.images.load_image`` gives of the asset. Image parts with http(s) URLs are kept in
the messages as they are but never fetched, so they are not in ``images``.

**Videos** are a list of ``{"url", "frame_rate", "bytes"}`` in the same reference order
(``video_url`` parts): the asset file's own bytes (an encoded clip as it was, raw frames
as the lossless ``.mkv``), so the export stands alone; ``load_video({"type": "video",
"video": v["bytes"], "frame_rate": v["frame_rate"]})`` gives the clip the model saw.
Bytes rather than ``datasets.Video``: decoding that feature needs torchcodec, and bytes
keep the exact file.

**example_id** is an int64 column when every id is an int, a string column when every id
is a str, and for a run that mixes them, a string column of each id's JSON text (``3``,
``"a"``), so that no id changes type silently.

**Tokens.** ``results.jsonl`` stores token *counts* per rollout (``prompt_tokens``,
``completion_tokens``, columns of every export), never token ids, logprobs or masks:
those travel to a trainer in group frames (``vf-mm rollout --stream``,
``vf_mm.training.read_groups``). ``tokens=True`` therefore refuses with a
``ResultsError`` saying so, rather than handing back a dataset without what was asked.

**What can go wrong.** Bad lines are the reader's business: ``bad_lines`` is passed to
``scan_results`` (the default leaves out only a torn last line, with a warning). A
failed rollout is a row like any other (its ``error`` set, ``reward`` null). An asset a
row refers to that is missing, unreadable, undecodable or not what its name's content
hash says raises ``vf_mm.errors.AssetError`` naming the asset and the row; with
``bad_assets="skip"`` that entry is null instead (its URL stays in ``image_urls`` /
``videos``, so the positions hold) and a warning names it.

**Memory.** An export holds the same few things whatever the run's length: the keys of
its rows (what the reader's first pass keeps, about 150 bytes a rollout), a verdict on
each distinct asset file (a digest of the checked bytes, or why the file cannot be used)
and the one batch of rows being written. The rows are read one at a time (the reader's
second pass), each built with its images' and clips' bytes and handed to
``datasets.Dataset.from_generator``, which writes them to Arrow files in ``cache_dir``
batch by batch; the returned dataset memory-maps those files, so its bytes stay on disk.
Two passes over ``results.jsonl``, as ``iter_results`` makes them: what a writer
appends after the first is left out (the next export has it); a file rewritten in
between raises ``ResultsError``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import math
import numbers
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vf_mm.errors import AssetError, ImageError, ResultsError, VideoError
from vf_mm.images import ImagePolicy
from vf_mm.results._assets import (
    AssetRef,
    asset_name_hash,
    asset_refs,
    stored_content_hash,
)
from vf_mm.results._format import RESULTS_FILE, ROW_KEYS
from vf_mm.results._reader import BadLinePolicy, ResultsScan, _final_records, scan_results
from vf_mm.videos import VideoLimits

if TYPE_CHECKING:
    import datasets

__all__ = ["to_dataset"]

logger = logging.getLogger("vf_mm.results")

BadAssetPolicy = Literal["raise", "skip"]
_BAD_ASSETS = ("raise", "skip")
#: the dataset's columns, in order
_COLUMNS = (
    *ROW_KEYS,
    "extra",
    "images",
    "image_urls",
    "videos",
)
#: row keys stored as JSON text (JSON null: an Arrow null)
_JSON_COLUMNS = ("prompt", "completion", "answer", "info", "metrics", "error", "timing")
#: row keys stored as int64 or null
_INT_COLUMNS = ("num_turns", "prompt_tokens", "completion_tokens")
#: rows per Arrow record batch: what the writer holds before it writes them to disk. A
#: row carries its images' and clips' bytes (a multi-image tool rollout, or one clip, can
#: be several MB), so datasets' 100 for image data could hold hundreds of MB at once; 16
#: keeps a batch to tens of MB, while Arrow's cost per batch (a little metadata per
#: column) stays small against rows that size.
_WRITER_BATCH_SIZE = 16
_CACHE_PREFIX = "vf-mm-dataset-"
_NO_TOKENS = (
    "{path} holds no token ids, logprobs or masks: results.jsonl stores only each "
    "rollout's token counts (prompt_tokens, completion_tokens), which every export "
    "includes. For exact tokens, stream the rollouts to a trainer (vf-mm rollout --stream "
    "PATH; vf_mm.training.read_groups reads them)"
)


def to_dataset(
    outdir: str | os.PathLike[str],
    *,
    tokens: bool = False,
    bad_lines: BadLinePolicy = "torn-tail",
    bad_assets: BadAssetPolicy = "raise",
    check_assets: bool = True,
    policy: ImagePolicy | None = None,
    video_limits: VideoLimits | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> datasets.Dataset:
    """The run directory ``outdir`` as a ``datasets.Dataset``, images and clips embedded.

    One row per rollout the reader gives, in file order (the module docstring lists the
    columns and why they are what they are).

    The invariant: decoding a record by the documented rules gives back the reader's row
    exactly, before and after a save and reload, and its ``images`` are the pixels of the
    assets its messages name, in their order. Why: an export that rounds a value, drops a
    key or shifts an image against its reference would train or score on something the run
    never produced, and nobody would notice.

    Why JSON text for messages: it is the one representation that both Arrow stores and
    that gives back every message exactly (``json.loads(row["prompt"])`` equals the row
    that ``read_results`` returns); the images beside them are real ``datasets.Image``
    values, lined up with the references by ``image_urls``.

    Memory stays bounded for a run of any length (module docstring): the rows go to Arrow
    files on disk in batches, and the dataset returned memory-maps them. A run with no rows
    gives an empty dataset in memory, with every column, and writes nothing.

    Args:
        outdir: The run directory.
        tokens: True refuses (``ResultsError``): a run directory stores token counts, not
            ids (module docstring).
        bad_lines: Goes to ``scan_results``.
        bad_assets: ``"raise"`` (``AssetError`` naming the asset and the row) or ``"skip"``
            (a null entry and a warning).
        check_assets: Load each image and clip and compare its content hash with its name
            (what ``AssetStore`` computed), so a changed file is found here rather than by
            whoever trains on it; False only reads the files.
        policy: What loading an asset may cost (``ImagePolicy()`` when None).
        video_limits: What loading a clip may cost (``VideoLimits()`` when None; pass the
            run's limits for clips larger than the defaults).
        cache_dir: Where the Arrow files go. None (the default): a new temporary folder
            (``tempfile.gettempdir()``, that is ``TMPDIR``; where that is a tmpfs the files
            are in RAM, so pass a folder on disk for a large run), removed when the Python
            process exits; the dataset, and every dataset derived from it, reads from it
            until then. A folder you pass is created if missing and never cleaned: the
            dataset reads from it for as long as it is used, and removing it is yours once
            that is over (or once the dataset is saved elsewhere, with ``save_to_disk`` or
            ``to_parquet``). Each call writes its own subfolder under a fingerprint unique to
            the call, so an export never reuses what an earlier export of a run changed
            since left there.

    Raises:
        ResultsError: ``outdir`` is not a run directory, or ``tokens=True``.
        AssetError: An asset missing, unreadable or not matching its hash
            (``bad_assets="raise"``).
    """
    if bad_assets not in _BAD_ASSETS:
        raise ValueError(f"bad_assets must be one of {_BAD_ASSETS}, not {bad_assets!r}")
    folder = Path(outdir)
    file = folder / RESULTS_FILE
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        raise ResultsError(f"{folder} is not a run directory: it {what}", path=str(folder))
    if not file.is_file():
        raise ResultsError(
            f"{folder} is not a run directory: it has no {RESULTS_FILE} (vf-mm eval -o "
            "OUTDIR writes one)",
            path=str(folder),
        )
    if tokens:
        raise ResultsError(_NO_TOKENS.format(path=folder), path=str(file))
    # the first pass: bad lines decided and the keys of the final records learnt
    scan = scan_results(folder, bad_lines=bad_lines, keep_rows=False)
    for bad in scan.bad_lines:
        state = "torn last line" if bad is scan.torn_tail else "bad line"
        logger.warning("%s: line %d is a %s (%s); left out", file, bad.line, state, bad.reason)
    assets = _AssetReader(
        folder,
        file=file,
        check=check_assets,
        skip=bad_assets == "skip",
        policy=policy,
        limits=video_limits,
    )
    id_kind = _id_kind([key[0] for key in scan.keys])
    import datasets

    features = _features(id_kind)
    if not scan.keys:
        # by columns: an empty run still has every column (a generator of no rows is
        # refused by datasets: "corresponds to no data")
        return datasets.Dataset.from_dict({name: [] for name in _COLUMNS}, features=features)
    return _write(scan, id_kind, assets, features, cache_dir)


# -- writing ------------------------------------------------------------------------


def _write(
    scan: ResultsScan,
    id_kind: str,
    assets: _AssetReader,
    features: datasets.Features,
    cache_dir: str | os.PathLike[str] | None,
) -> datasets.Dataset:
    """The second pass: each final record read, made a row and handed to
    ``from_generator``, which writes batches of ``_WRITER_BATCH_SIZE`` rows to Arrow files
    in ``cache_dir`` (a new temporary folder when None)."""
    import datasets
    from datasets.exceptions import DatasetGenerationError

    failed: list[BaseException] = []  # what our own code raised inside the generator

    def rows(**_token: str) -> Iterator[dict[str, Any]]:  # _token: see _unique
        try:  # the reader refuses a file rewritten between its two passes
            for row in _final_records(scan):
                yield _record(row, id_kind, assets)
        except Exception as exc:
            failed.append(exc)
            raise

    made = cache_dir is None
    folder = Path(tempfile.mkdtemp(prefix=_CACHE_PREFIX)) if cache_dir is None else Path(cache_dir)
    try:
        with _no_progress_bars():
            dataset = datasets.Dataset.from_generator(
                rows,
                features=features,
                cache_dir=str(folder),
                writer_batch_size=_WRITER_BATCH_SIZE,
                **_unique(datasets.Dataset.from_generator),
            )
    except BaseException as exc:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, DatasetGenerationError):
            # datasets wraps what the generator raised: the caller gets ours as it was
            # raised (an AssetError naming the asset and the row), or the OSError of a
            # cache folder that cannot be written
            cause = failed[0] if failed else exc.__cause__
            if failed or isinstance(cause, OSError):
                raise cause from cause.__cause__
        raise
    if made:  # the dataset reads from it for as long as the process lives
        atexit.register(functools.partial(shutil.rmtree, folder, ignore_errors=True))
    return dataset


@functools.cache
def _fingerprint_argument(from_generator: Callable[..., Any]) -> bool:
    return "fingerprint" in inspect.signature(from_generator).parameters


def _unique(from_generator: Callable[..., Any]) -> dict[str, Any]:
    """The arguments that give this call its own fingerprint, so that its Arrow files are
    new ones: never those of an earlier call over a run that has changed since.
    ``fingerprint`` (datasets >= 4.3: the generator is not hashed), else a unique
    ``gen_kwargs`` value, which the hash that names the cache folder covers."""
    token = f"vf-mm-export-{uuid.uuid4().hex}"
    if _fingerprint_argument(from_generator):
        return {"fingerprint": token}
    return {"gen_kwargs": {"export": token}}


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """datasets' progress bar hidden while it writes (an export prints nothing of its
    own), unless ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` asks for them."""
    from datasets import config
    from datasets.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if are_progress_bars_disabled() or config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# -- columns ------------------------------------------------------------------------


def _features(id_kind: str) -> datasets.Features:
    import datasets

    def listed(feature: Any) -> Any:
        # datasets >= 4 spells a list feature List(...); 3.x takes [feature]
        make = getattr(datasets, "List", None)
        return make(feature) if make is not None else [feature]

    text = datasets.Value("string")
    columns: dict[str, Any] = {
        "example_id": datasets.Value("int64" if id_kind == "int" else "string"),
        "rollout_index": datasets.Value("int64"),
        "prompt": text,
        "completion": text,
        "answer": text,
        "info": text,
        "reward": datasets.Value("float64"),
        "metrics": text,
        "error": text,
        "truncated": datasets.Value("bool"),
        "num_turns": datasets.Value("int64"),
        "prompt_tokens": datasets.Value("int64"),
        "completion_tokens": datasets.Value("int64"),
        "timing": text,
        "extra": text,
        "images": listed(datasets.Image()),
        "image_urls": listed(datasets.Value("string")),
        "videos": listed(
            {
                "url": datasets.Value("string"),
                "frame_rate": datasets.Value("float64"),
                "bytes": datasets.Value("binary"),
            }
        ),
    }
    return datasets.Features(columns)


def _id_kind(ids: list[Any]) -> str:
    """``"int"`` / ``"str"`` when every id is one type (a str that UTF-8 cannot hold, as a
    lone surrogate, counts as mixed), else ``"json"``."""
    if all(isinstance(i, int) for i in ids):
        return "int"
    if all(isinstance(i, str) and _utf8(i) for i in ids):
        return "str"
    return "json"


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_text(value: Any) -> str | None:
    """``value`` as compact JSON text (None for JSON null), UTF-8 where it can be and
    ``\\u`` escapes where it cannot (a lone surrogate), so ``json.loads`` gives it back."""
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text if _utf8(text) else json.dumps(value, allow_nan=False, separators=(",", ":"))


def _record(row: Mapping[str, Any], id_kind: str, assets: _AssetReader) -> dict[str, Any]:
    key = (row["example_id"], row["rollout_index"])
    label = f"example {key[0]!r} rollout {key[1]}"
    out: dict[str, Any] = {
        "example_id": _json_text(key[0]) if id_kind == "json" else key[0],
        "rollout_index": key[1],
    }
    for name in _JSON_COLUMNS:
        out[name] = _json_text(row.get(name))
    out["reward"] = _real(row.get("reward"), label, "reward", assets.file)
    for name in _INT_COLUMNS:
        out[name] = _count(row.get(name), label, name, assets.file)
    out["truncated"] = _flag(row.get("truncated"), label, "truncated", assets.file)
    extra = {k: v for k, v in row.items() if k not in ROW_KEYS}
    out["extra"] = _json_text(extra) if extra else None
    images, urls, videos = [], [], []
    for ref in asset_refs(row):
        if ref.video:
            rate = None if ref.frame_rate is None else float(ref.frame_rate)
            videos.append({"url": ref.url, "frame_rate": rate, "bytes": assets.get(ref, key)})
        else:
            data = assets.get(ref, key)
            images.append(None if data is None else {"bytes": data, "path": ref.url})
            urls.append(ref.url)
    out["images"], out["image_urls"], out["videos"] = images, urls, videos
    return out


def _flag(value: Any, label: str, name: str, file: Path) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ResultsError(
        f"{file}: {label}, field {name!r}: {value!r} is not true, false or null", path=str(file)
    )


def _real(value: Any, label: str, name: str, file: Path) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ResultsError(
        f"{file}: {label}, field {name!r}: {value!r} is not a finite number or null",
        path=str(file),
    )


def _count(value: Any, label: str, name: str, file: Path) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ResultsError(
        f"{file}: {label}, field {name!r}: {value!r} is not a count (an int >= 0) or null",
        path=str(file),
    )


# -- assets -------------------------------------------------------------------------


@dataclass(slots=True)
class _AssetReader:
    """The asset files of one export, each checked once however many rows refer to it,
    and what failed remembered, so each bad file is reported once.

    The bytes are not kept: a run's assets together can be far larger than memory. What
    is kept per file is its verdict, the digest of the bytes that passed the check (or
    True when nothing is checked) or why the file cannot be used; a later reference
    reads the file again and uses it only when it is the file that was checked (the same
    digest), else checks it again. So every image and clip exported is one that passed
    the check, as when it was read once, at about 100 bytes of memory per distinct file.
    """

    root: Path
    file: Path
    check: bool
    skip: bool
    policy: ImagePolicy | None
    limits: VideoLimits | None
    _done: dict[tuple[str, int | float | None], bytes | bool | str] = field(default_factory=dict)

    def get(self, ref: AssetRef, key: tuple[Any, int]) -> bytes | None:
        """The asset's bytes; None when it cannot be used and ``skip`` is set, else
        ``AssetError``."""
        # a clip's hash covers its frame rate: each (file, rate) is checked
        slot = (ref.url, ref.frame_rate)
        verdict = self._done.get(slot)
        again = None if verdict is None or isinstance(verdict, str) else self._again(ref, verdict)
        if isinstance(again, bytes):
            return again
        if not isinstance(verdict, str):  # not seen yet, or changed since its check
            data = self._read(ref)
            if isinstance(data, bytes):
                self._done[slot] = _digest(data) if self.check else True
                return data
            verdict = self._done[slot] = data
            if self.skip:
                logger.warning(
                    "%s: %s (first referred to by example %r rollout %d, %s) %s; left out",
                    self.file,
                    ref.url,
                    key[0],
                    key[1],
                    ref.where,
                    verdict,
                )
        if self.skip:
            return None
        raise AssetError(
            f"{self.file}: {ref.url}, referred to by example {key[0]!r} rollout {key[1]} "
            f"({ref.where}), {verdict}; export without it with bad_assets='skip' "
            "(vf-mm export --skip-bad-assets)",
            asset=ref.url,
            example_id=key[0],
            rollout_index=key[1],
            where=ref.where,
            path=str(self.file),
        )

    def _again(self, ref: AssetRef, verdict: bytes | bool) -> bytes | None:
        """A file that passed, read again: its bytes when they are the ones that passed
        (any bytes when nothing is checked), else None (changed, or gone, since)."""
        try:
            data = (self.root / ref.url).read_bytes()
        except OSError:
            return None
        return data if verdict is True or _digest(data) == verdict else None

    def _read(self, ref: AssetRef) -> bytes | str:
        """The file's bytes, or why it cannot be used."""
        try:
            data = (self.root / ref.url).read_bytes()
        except FileNotFoundError:
            return "is missing from the run directory"
        except OSError as exc:
            return f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})"
        if not self.check:
            return data
        want = asset_name_hash(ref.url)
        try:
            got = stored_content_hash(
                data, video=ref.video, frame_rate=ref.frame_rate, policy=self.policy,
                limits=self.limits,
            )  # fmt: skip
        except (ImageError, VideoError) as exc:
            return f"does not load ({type(exc).__name__}: {exc})"
        if got != want:
            return (
                f"does not match its content hash (its content hashes to {got}): the file "
                "was changed after it was stored"
            )
        return data


def _digest(data: bytes) -> bytes:
    """A file's bytes in 16 (BLAKE2b): enough to tell them from what the file is changed
    to, without keeping them."""
    return hashlib.blake2b(data, digest_size=16).digest()
