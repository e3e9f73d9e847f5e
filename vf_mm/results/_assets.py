"""Content-addressed image and video assets.

``AssetStore(outdir)`` keeps each distinct image once, as ``OUTDIR/assets/<hash>.png``
where ``<hash>`` is ``vf_mm.images.image_hash`` of the RGB image that
``vf_mm.images.load_image`` makes of it: the same pixels from a PIL image, PNG bytes or a
``data:`` URL are one file. A source that is already a PNG showing exactly that image
(8-bit RGB, nothing converted in loading: ``vf_mm.images.load_image_with_png``) is
stored as its own bytes; any other is encoded (PNG, ``compress_level``). Each distinct video is kept once too, as
``OUTDIR/assets/<hash>.<ext>`` where ``<hash>`` is ``vf_mm.videos.video_hash`` of what
``vf_mm.videos.load_video`` makes of it (frames and frame rate): an encoded source as
the bytes it is (``.mp4``, ``.mov``, ``.webm``, ``.mkv``, ``.avi``, ``.ts``: a browser
plays an MP4 or WebM as stored), raw frames encoded losslessly (FFV1 in ``.mkv``); see
``vf_mm.videos.encode_lossless``. A file is written to a temporary name in the same folder, fsynced
and renamed into place (``os.replace``), so a reader (or a run killed mid-write) never
sees half an asset; a file that already exists is never written again.

``AssetStore.to_jsonable(messages)`` (its body: ``_asset_messages``) is what goes into ``results.jsonl``: a copy of
OpenAI-style messages in which every image part is ``{"type": "image_url", "image_url":
{"url": "assets/<hash>.png"}}`` and every video part ``{"type": "video_url",
"video_url": {"url": "assets/<hash>.<ext>"}, "frame_rate": fps, ...}`` (relative to
OUTDIR; a video part keeps its other JSON keys, its processing options among them).
The invariant for videos: ``load_video`` of the stored part (the asset path resolved in
OUTDIR) gives the frames, frame rate and ``video_hash`` of the original part, so a
resumed run or a re-render from ``results.jsonl`` sees exactly the clip the model saw.
http(s) image and video URLs are kept as given (never fetched). Every other value must
already be JSON (``str``, numbers, ``bool``, ``None``, lists and str-keyed dicts of
those); bytes, tensors, arrays, NaN and infinity are refused with a ``ResultsError``
naming the message and the field.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from PIL import Image

from vf_mm._asset_refs import (
    ASSETS_DIR,
    image_asset_hash,
    image_asset_ref,
    video_asset_hash,
    video_asset_ref,
)
from vf_mm._files import fsync_dir
from vf_mm._json import to_json_value
from vf_mm.errors import VideoDecodeError, VideoError
from vf_mm.images import ImagePolicy, encode_png, image_hash, load_image, load_image_with_png
from vf_mm.images._internal import describe_source
from vf_mm.results._asset_messages import messages_to_jsonable, well_formed_video_part
from vf_mm.types import image_part_source, video_part_source
from vf_mm.videos import (
    VIDEO_EXTENSIONS,
    Video,
    VideoLimits,
    encode_lossless,
    is_raw_video,
    load_video,
    read_video_bytes,
    video_extension,
    video_hash,
)

__all__ = [
    "ASSETS_DIR",
    "KNOWN_ASSETS_BYTES",
    "AssetStore",
    "atomic_write_bytes",
    "fsync_dir",
    "to_json_value",
]


_TMP_MARK = ".tmp-"


# -- files -------------------------------------------------------------------------


def _process_umask() -> int:
    """The process umask: from /proc on Linux (reading it there changes nothing), else by
    setting and restoring it (``os.umask`` can only be read that way)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: read once, at import
_UMASK = _process_umask()


def _temp_in(folder: Path, final_name: str) -> tuple[int, str]:
    """A new temporary file beside ``final_name``: ``.<final_name>.tmp-<random>``, with the
    permissions a plain ``open`` would give (mkstemp's 0600 would make a run directory's
    metadata and images unreadable to the colleagues it is shared with)."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{final_name}{_TMP_MARK}")
    with contextlib.suppress(OSError):  # a filesystem without permissions keeps its own
        os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, name


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temporary files (left behind by a killed writer)."""
    return name.startswith(".") and _TMP_MARK in name


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same folder, fsync,
    ``os.replace``, fsync the folder. A reader sees the old file or the new one."""
    path = Path(path)
    fd, tmp = _temp_in(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def stored_content_hash(
    data: bytes,
    *,
    video: bool,
    frame_rate: float | None = None,
    policy: ImagePolicy | None = None,
    limits: VideoLimits | None = None,
    where: str | None = None,
) -> str:
    """The content hash of an asset file's bytes, computed as ``AssetStore.add`` /
    ``add_video`` computed the one in its name (a video's at the ``frame_rate`` the row
    gives it), so a reader can check the file is what was stored. Raises the loaders'
    ``ImageError`` / ``VideoError`` for bytes that do not load."""
    if video:
        part: dict[str, Any] = {"type": "video", "video": data}
        if frame_rate is not None:
            part["frame_rate"] = frame_rate
        return video_hash(
            load_video(part, policy=policy or ImagePolicy(), limits=limits, where=where)
        )
    return image_hash(load_image(data, policy=policy, where=where))


def asset_name_hash(url: str) -> str:
    """The content hash an ``assets/<hash>.<ext>`` reference names."""
    return url.rsplit("/", 1)[1].split(".", 1)[0]


# -- the store ---------------------------------------------------------------------

#: what an ``AssetStore`` remembers of the assets it has seen (their hashes, so a repeated
#: image skips a stat of its file): 8 MiB, about 50k assets; older ones are looked up on disk
KNOWN_ASSETS_BYTES = 8 << 20
_KNOWN_ENTRY_COST = 160  # bytes of a remembered key and value with their dict slot, about


class _Recent:
    """A dict that forgets its least recently used entries past ``max_bytes`` (counted at
    about ``_KNOWN_ENTRY_COST`` an entry): what a store remembers is a shortcut, the
    files on disk are the truth, so forgetting costs a ``stat`` and never correctness.
    Not thread safe by itself (the store holds its lock)."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_bytes: int) -> None:
        self.max_entries = max(1, max_bytes // _KNOWN_ENTRY_COST)
        self._entries: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Any, value: Any = True) -> Any:
        """Remember ``key`` (first value wins, as ``dict.setdefault``); return its value."""
        held = self._entries.setdefault(key, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return held


class AssetStore:
    """Image and video files by content hash under ``root/assets/``.

    ``add(source)`` stores one image and returns its URL relative to ``root``
    (``"assets/<hash>.png"``); ``add_video(part)`` stores one video part's video and
    returns its URL (``"assets/<hash>.<ext>"``) and the loaded ``Video``;
    ``to_jsonable(messages)`` does it for every image and video part of a conversation.
    Thread safe. ``written`` counts the files this object wrote.

    Args:
        root: The OUTDIR.
        policy: Which image and video sources may be read (``ImagePolicy()`` when None).
        compress_level: PNG compression (0-9: speed against size, never quality).
        video_limits: What a video may cost to load (``VideoLimits()`` when None: pass the
            renderer's, so the store takes every clip the run took).
        known_bytes: Bounds what it remembers of the assets it has seen
            (``KNOWN_ASSETS_BYTES``), so a run of any length stores assets in constant
            memory; an asset it has forgotten is found on disk.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        policy: ImagePolicy | None = None,
        compress_level: int = 6,
        video_limits: VideoLimits | None = None,
        known_bytes: int = KNOWN_ASSETS_BYTES,
    ) -> None:
        self.root = Path(root)
        self.dir = self.root / ASSETS_DIR
        self.policy = policy
        self.compress_level = compress_level
        self.video_limits = video_limits
        self.written = 0
        # a third each: image hashes stored, video hash -> its URL, and (sha256 of encoded
        # bytes, frame_rate) -> (video hash, URL, fps), so that a clip read again (every
        # rollout of an example shows it) is not decoded again
        self._known = _Recent(known_bytes // 3)
        self._videos = _Recent(known_bytes // 3)
        self._encoded = _Recent(known_bytes // 3)
        self._lock = threading.Lock()
        self._dir_dirty = False
        self.dir.mkdir(parents=True, exist_ok=True)

    # -- single images

    def path(self, digest: str) -> Path:
        """Where the asset with this hash lives (it may not exist).

        Args:
            digest: The asset's content hash.
        """
        return self.dir / f"{digest}.png"

    @staticmethod
    def url(digest: str) -> str:
        """The asset's URL relative to OUTDIR, as results.jsonl holds it.

        Args:
            digest: The asset's content hash.
        """
        return image_asset_ref(digest)

    def __contains__(self, digest: object) -> bool:
        if not isinstance(digest, str):
            return False
        with self._lock:
            if self._known.get(digest) is not None:
                return True
        return self.path(digest).is_file()

    def add(
        self, source: Any, *, policy: ImagePolicy | None = None, where: str | None = None
    ) -> str:
        """Load ``source`` and store it; return its URL (``"assets/<hash>.png"``).

        A source that is already a PNG showing exactly the loaded image
        (``load_image_with_png``) is stored as its own bytes, not encoded again.

        Args:
            source: Anything ``load_image`` takes.
            policy: The policy it loads under (the store's when None).
            where: Its place in a conversation, for errors.

        Raises:
            ImageError: It does not load.
        """
        image, png = load_image_with_png(source, policy=policy or self.policy, where=where)
        return self.add_rgb(image, png=png)

    def add_rgb(self, image: Image.Image, *, png: bytes | None = None) -> str:
        """Store an RGB image (a ``load_image`` result); return its URL.

        Args:
            image: The image.
            png: PNG bytes that decode to exactly ``image`` (``load_image_with_png``'s),
                written as they are; None encodes the image (``compress_level``).
        """
        digest = image_hash(image)
        with self._lock:
            if self._known.get(digest) is not None:
                return self.url(digest)
        final = self.path(digest)
        if final.is_file():
            with self._lock:
                self._known.put(digest)
            return self.url(digest)

        def write(f: IO[bytes]) -> None:
            f.write(
                png if png is not None else encode_png(image, compress_level=self.compress_level)
            )

        self._write_new(final, write)
        with self._lock:
            self._known.put(digest)
        return self.url(digest)

    def _write_new(self, final: Path, write: Callable[[IO[bytes]], object]) -> bool:
        """Write ``final`` through a fsynced temporary file and a rename, unless another
        thread stored it meanwhile (theirs is kept); True when this call wrote it."""
        fd, tmp = _temp_in(self.dir, final.name)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            with self._lock:
                if final.is_file():  # another thread stored it meanwhile: keep theirs
                    os.unlink(tmp)
                    return False
                os.replace(tmp, final)
                self.written += 1
                self._dir_dirty = True
                return True
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- single videos

    def video_url(self, digest: str) -> str | None:
        """The URL of the stored video with this hash (whatever its container), or None.

        Args:
            digest: The video's content hash.
        """
        with self._lock:
            url = self._videos.get(digest)
        if url is not None:
            return url
        for ext in VIDEO_EXTENSIONS:
            if (self.dir / f"{digest}.{ext}").is_file():
                with self._lock:
                    return self._videos.put(digest, video_asset_ref(digest, ext))
        return None

    def add_video(
        self,
        part: Mapping[str, Any],
        *,
        policy: ImagePolicy | None = None,
        where: str | None = None,
    ) -> tuple[str, float | None]:
        """Store the video of a video part; return its URL and its frame rate.

        The URL is ``"assets/<hash>.<ext>"``; the frame rate is the ``fps`` of
        ``load_video(part)``, which the stored part must carry as ``"frame_rate"``. An encoded
        source is read once and stored as those bytes; raw frames are stored losslessly
        (``.mkv``). Either way ``load_video`` of the stored part gives the original's
        ``video_hash``. http(s) URLs are not read (``to_jsonable`` keeps them).

        Args:
            part: ``{"type": "video", "video": ...}`` or ``{"type": "video_url", "video_url":
                {"url": ...}}``, with its ``"frame_rate"``.
            policy: The policy it is read under (the store's when None).
            where: Its place in a conversation, for errors.

        Raises:
            VideoError: The video does not load (naming the source and ``where``).
        """
        policy = policy or self.policy or ImagePolicy()
        limits = self.video_limits or VideoLimits()
        if not well_formed_video_part(part):
            load_video(dict(part), policy=policy, limits=limits, where=where)  # raises
            raise VideoDecodeError("a video part without one video source", where=where)
        source = video_part_source(part)
        rate = part.get("frame_rate")
        if is_raw_video(source):
            video = load_video(dict(part), policy=policy, limits=limits, where=where)
            return self._store_raw(video), video.fps
        try:
            data = read_video_bytes(source, policy=policy, limits=limits)
        except VideoError as exc:
            exc.where = exc.where or where
            raise
        key = (hashlib.sha256(data).hexdigest(), rate if isinstance(rate, (int, float)) else None)
        with self._lock:
            known = self._encoded.get(key)
        if known is not None and self.video_url(known[0]) is not None:
            return known[1], known[2]
        inner: dict[str, Any] = {"type": "video", "video": data}
        if rate is not None:
            inner["frame_rate"] = rate
        try:
            video = load_video(inner, policy=policy, limits=limits, where=where)
        except VideoError as exc:
            exc.source = describe_source(source)  # the path or URL, not "<bytes ...>"
            raise
        digest = video_hash(video)
        url = self.video_url(digest)
        if url is None:
            url = video_asset_ref(digest, video_extension(data))
            self._write_new(self.root / url, lambda f: f.write(data))
            with self._lock:
                url = self._videos.put(digest, url)
        with self._lock:
            self._encoded.put(key, (digest, url, video.fps))
        return url, video.fps

    def _store_raw(self, video: Video) -> str:
        digest = video_hash(video)
        url = self.video_url(digest)
        if url is not None:
            return url
        data = encode_lossless(video, limits=self.video_limits)
        url = video_asset_ref(digest, "mkv")
        self._write_new(self.root / url, lambda f: f.write(data))
        with self._lock:
            return self._videos.put(digest, url)

    def sync(self) -> None:
        """Make the renames of new assets durable (fsync the folder) if there were any."""
        with self._lock:
            dirty, self._dir_dirty = self._dir_dirty, False
        if dirty:
            fsync_dir(self.dir)

    def remove_temp_files(self) -> int:
        """Delete temporary files a killed writer left in the assets folder; returns how
        many. Only call this while no other writer uses the folder."""
        removed = 0
        for entry in os.scandir(self.dir):
            if is_temp_name(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        return removed

    # -- conversations

    def to_jsonable(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        policy: ImagePolicy | None = None,
        where: str | None = None,
        on_error: str = "raise",
    ) -> list[dict[str, Any]]:
        """A JSON-ready copy of ``messages`` with every image and video stored as an asset.

        Image parts (``{"type": "image", "image": PIL | bytes | path}``, transformers'
        ``{"type": "image", "url" | "path": ...}``, ``{"type": "image_url", "image_url":
        {"url": "data:..." | path}}``) become ``{"type": "image_url", "image_url": {"url":
        "assets/<hash>.png"}}``, keeping ``detail`` and any other JSON keys of the part. Video
        parts (``{"type": "video", "video": frames | array | Video | bytes | path}``, ``"url"``
        / ``"path"`` instead of ``"video"``, ``{"type": "video_url", "video_url": {"url":
        "data:..." | "file://..." | path}}``) become ``{"type": "video_url", "video_url":
        {"url": "assets/<hash>.<ext>"}, "frame_rate": fps}`` (``frame_rate`` the loaded video's
        rate, left out when unknown), keeping the processing options (``fps``, ``num_frames``,
        ...) and any other JSON keys. http(s) URLs are kept as given (not fetched); an
        ``assets/<hash>.<ext>`` URL whose file is in this store is kept (so the output can be
        converted again). Everything else is copied (tool calls, ``reasoning_content``,
        ``name``, ...) and must be JSON. ``messages`` is never modified.

        Args:
            messages: The conversation.
            policy: Images and videos load with it (the store's when None; ``ImagePolicy()``
                then: any local path, no network), videos within the store's
                ``video_limits``.
            where: Put before the place in errors (``"example 3 rollout 0, prompt"`` ->
                ``"..., prompt, message 2"``).
            on_error: ``"raise"``, or ``"record"`` (for a rollout that failed): never raises
                for content: a part whose image or video does not load becomes ``{"type":
                "unavailable", "error": why, "source": the part's source if it is JSON (a path, a
                URL), else null}``, and any other value JSON cannot hold becomes
                ``{"unavailable": its type, "error": why}``, so the rest of the conversation is
                stored and the gap says what it was.

        Raises:
            ImageError: An image that does not load (``on_error="raise"``).
            VideoError: A video that does not load (``on_error="raise"``).
            ResultsError: A value JSON cannot hold (``on_error="raise"``).
        """
        return messages_to_jsonable(self, messages, policy=policy, where=where, on_error=on_error)


@dataclass(frozen=True, slots=True)
class AssetRef:
    """One asset reference in a results row: its URL, whether a video, the part's frame
    rate (part of a video's hash; ``None`` when the part holds no number) and where in
    the row it is (for errors)."""

    url: str
    video: bool
    frame_rate: int | float | None
    where: str


def asset_refs(row: Mapping[str, Any], *, prefix: str = "") -> Iterator[AssetRef]:
    """The ``assets/`` references of a row's messages in reading order (prompt, then
    completion; each message's parts in order), each ``where`` starting with ``prefix``."""
    for name in ("prompt", "completion"):
        messages = row.get(name)
        for m, message in enumerate(messages if isinstance(messages, list) else ()):
            content = message.get("content") if isinstance(message, dict) else None
            for p, part in enumerate(content if isinstance(content, list) else ()):
                if not isinstance(part, dict):
                    continue
                where = f"{prefix}{name}, message {m}, part {p}"
                kind = part.get("type")
                if kind == "image_url":
                    url = image_part_source(part)
                    if image_asset_hash(url) is not None:
                        yield AssetRef(url, False, None, where)
                elif kind == "video_url":
                    url = video_part_source(part)
                    if video_asset_hash(url) is not None:
                        rate = part.get("frame_rate")
                        number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
                        yield AssetRef(url, True, rate if number else None, where)
