"""Images and videos of the single-file report: each distinct one embedded once.

An image is embedded once as a CSS class (a ``data:`` URI) that every use refers to. A
video is embedded once as its strip frames (PNG images, embedded as images are, so a
frame equal to an image or another clip's frame costs nothing more) and, when a browser
plays the file (``_videos.browser_mime``), once as the file itself in one player that
every use opens.

``_Asset`` and ``_Video`` are also what the paged report draws (``_links``): there they
carry ``src``, a relative URL, instead of embedded bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vf_mm._text import shorten
from vf_mm.errors import ImageError, MissingDependencyError, VideoError
from vf_mm.images import decode_data_url, encode_png
from vf_mm.report._videos import (
    STRIP_MAX_H,
    STRIP_MAX_W,
    browser_mime,
    data_url_bytes,
    strip_indices,
)
from vf_mm.videos import Video, VideoLimits, load_video, video_extension

#: assets bigger than this are not embedded (a placeholder says so)
ASSET_MAX_BYTES = 32 * 1024 * 1024
#: thumbnails fit this box; tiny images are scaled up to MIN on their long side
THUMB_MAX_W, THUMB_MAX_H, THUMB_MIN = 320, 240, 64
#: the enlarged view shows at least this many pixels on the long side (viewport permitting)
FULL_MIN = 640

_BROWSER_MIME = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
}
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass
class _Asset:
    """One distinct image: embedded (``b64``, drawn through its CSS class ``cls``) or, in a
    paged report, linked (``src``: a relative URL the report checked, ``b64`` empty)."""

    cls: str
    mime: str
    b64: str
    width: int
    height: int
    digest: str
    src: str = ""

    @property
    def full_style(self) -> str:
        w, h = self.width, self.height
        scale = max(1.0, FULL_MIN / max(w, h))
        return f"width:min({round(w * scale)}px,94vw,calc(86vh * {w} / {h}));aspect-ratio:{w} / {h}"

    @property
    def full_pixelated(self) -> bool:
        return max(self.width, self.height) < FULL_MIN


@dataclass
class _Video:
    """One distinct video: its strip (``frames``: index, image asset, thumbnail size) and,
    when a browser plays it (``mime``), the file as base64 for the one player."""

    cls: str
    num_frames: int
    fps: float | None
    width: int
    height: int
    container: str
    frames: list[dict[str, Any]]
    mime: str | None
    b64: str
    digest: str
    src: str = ""  # a paged report's player plays this relative URL (b64 is then empty)

    @property
    def rate_text(self) -> str:
        return "frame rate unknown" if self.fps is None else f"{self.fps:.4g} fps"

    @classmethod
    def of(
        cls,
        video: Video,
        data: bytes,
        frame_asset: Callable[[bytes], _Asset | str],
        *,
        name: str,
        digest: str,
        embed: bool = False,
        src: str = "",
    ) -> _Video | str:
        """The view of ``video`` (decoded from the file ``data``): its strip, each frame's
        PNG made an image asset by ``frame_asset`` (a ``str`` it returns is why not, and
        is returned), and its player where a browser plays ``data``: the file embedded
        as base64 (``embed``) or linked (``src``)."""
        frames = []
        w, h, pix = _fit(video.width, video.height, STRIP_MAX_W, STRIP_MAX_H)
        for index, png in _strip_pngs(video):
            asset = frame_asset(png)
            if isinstance(asset, str):
                return asset
            frames.append({"index": index, "asset": asset, "w": w, "h": h, "pixelated": pix})
        mime = browser_mime(data)
        return cls(
            cls=name,
            num_frames=video.num_frames,
            fps=video.fps,
            width=video.width,
            height=video.height,
            container=video_extension(data),
            frames=frames,
            mime=mime,
            b64=base64.b64encode(data).decode("ascii") if embed and mime else "",
            digest=digest,
            src=src if mime else "",
        )


class AssetViews(Protocol):
    """What a rollout's card needs of its assets: the view of an image or a video
    reference. ``_Assets`` embeds them (one file), ``_LinkedAssets`` links them (pages)."""

    def view(self, ref: Any) -> dict[str, Any]: ...
    def video_view(self, ref: Any, *, frame_rate: Any = None) -> dict[str, Any]: ...


class _Assets:
    """Resolves image and video references to embedded assets (deduplicated by content)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._by_ref: dict[str, _Asset | str] = {}  # reference -> asset, or why it failed
        self._by_digest: dict[str, _Asset] = {}
        # (reference, frame_rate) -> video, or why it failed; videos by content
        self._videos_by_ref: dict[tuple[str, float | None], _Video | str] = {}
        self._videos: dict[tuple[str, float | None], _Video] = {}

    def embedded(self) -> list[_Asset]:
        return list(self._by_digest.values())

    def videos(self) -> list[_Video]:
        """Every distinct video shown, in the order first seen."""
        return list(self._videos.values())

    def css(self) -> str:
        # only our class names, a MIME type from a fixed table and base64: nothing to escape
        return "\n".join(
            f'.{a.cls}{{background-image:url("data:{a.mime};base64,{a.b64}")}}'
            for a in self._by_digest.values()
        )

    def view(self, ref: Any) -> dict[str, Any]:
        """What to draw for an image reference: an embedded asset, a remote link or a placeholder."""
        ref = unresolved_view(ref, "image")
        if isinstance(ref, dict):
            return ref
        if ref not in self._by_ref:
            self._by_ref[ref] = self._load(ref)
        got = self._by_ref[ref]
        if isinstance(got, str):
            return {"type": "missing", "ref": shorten(ref, 200), "reason": got}
        tw, th, pix = _fit(got.width, got.height)
        return {"type": "asset", "asset": got, "w": tw, "h": th, "pixelated": pix}

    def _load(self, ref: str) -> _Asset | str:
        data_or_err: bytes | str
        if ref.lower().startswith("data:"):
            try:
                data_or_err = decode_data_url(ref, max_bytes=ASSET_MAX_BYTES)
            except ImageError as exc:
                data_or_err = str(exc)
        else:
            data_or_err = self._read_local(ref)
        if isinstance(data_or_err, str):
            return data_or_err
        return self._image_from_bytes(data_or_err)

    def _image_from_bytes(self, data: bytes) -> _Asset | str:
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._by_digest:
            return self._by_digest[digest]
        try:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                im.load()
                width, height, fmt = im.width, im.height, im.format
                mime = _BROWSER_MIME.get(fmt or "")
                if mime is None:  # a format browsers do not show: convert it to PNG
                    data, mime = encode_png(im, compress_level=6), "image/png"
        except Exception as exc:  # any decoder failure means: unreadable, show a placeholder
            return f"unreadable image ({type(exc).__name__}: {shorten(str(exc), 120)})"
        if width < 1 or height < 1:
            return "empty image (0 pixels)"
        asset = _Asset(
            cls=f"a{len(self._by_digest)}",
            mime=mime,
            b64=base64.b64encode(data).decode("ascii"),
            width=width,
            height=height,
            digest=digest[:12],
        )
        self._by_digest[digest] = asset
        return asset

    # -- videos

    def video_view(self, ref: Any, *, frame_rate: Any = None) -> dict[str, Any]:
        """What to draw for a video reference (and its part's ``frame_rate``, which gives
        the rate of a file that states none): its strip, a remote link or a placeholder."""
        ref = unresolved_view(ref, "video")
        if isinstance(ref, dict):
            return ref
        rate = _rate(frame_rate)
        key = (ref, rate)
        if key not in self._videos_by_ref:
            self._videos_by_ref[key] = self._load_video(ref, rate)
        got = self._videos_by_ref[key]
        if isinstance(got, str):
            return {"type": "missing", "ref": shorten(ref, 200), "reason": got}
        return {"type": "asset", "video": got}

    def _load_video(self, ref: str, rate: float | None) -> _Video | str:
        if ref.lower().startswith("data:"):
            data = data_url_bytes(ref, max_bytes=ASSET_MAX_BYTES)
        else:
            data = self._read_local(ref)
        if isinstance(data, str):
            return data
        key = (hashlib.sha256(data).hexdigest(), rate)
        if key in self._videos:
            return self._videos[key]
        video = _decode_video(data, rate)
        if isinstance(video, str):
            return video
        # our own PNGs: an image asset never fails, a placeholder would hide nothing
        found = _Video.of(
            video,
            data,
            self._image_from_bytes,
            name=f"v{len(self._videos)}",
            digest=key[0][:12],
            embed=True,
        )
        if isinstance(found, str):
            return found
        self._videos[key] = found
        return found

    def _read_local(self, ref: str) -> bytes | str:
        if ref.lower().startswith("file://"):
            rel = urllib.parse.unquote(urllib.parse.urlparse(ref).path)
        elif _SCHEME.match(ref) and not re.match(r"^[a-zA-Z]:[\\/]", ref):
            return f"unsupported URL scheme {ref.split(':', 1)[0]!r}"
        else:
            rel = ref
        try:
            path = (self.root / rel).resolve()
        except (OSError, RuntimeError, ValueError) as exc:
            return f"bad path ({exc})"
        if not path.is_relative_to(self.root):
            return "outside the run directory; not embedded"
        try:
            size = path.stat().st_size
            if size > ASSET_MAX_BYTES:
                return f"too large to embed ({size / 2**20:.1f} MiB)"
            return path.read_bytes()
        except FileNotFoundError:
            return "asset not found"
        except OSError as exc:
            return f"could not read it ({exc.strerror or exc})"


def _decode_video(data: bytes, rate: float | None) -> Video | str:
    """The clip in ``data`` (with ``rate`` as its frame rate when the file states none), or
    why it could not be read: the one decode both kinds of report use."""
    part: dict[str, Any] = {"type": "video", "video": data}
    if rate is not None:
        part["frame_rate"] = rate
    try:
        return load_video(part, limits=VideoLimits(max_bytes=ASSET_MAX_BYTES))
    except (VideoError, MissingDependencyError) as exc:
        reason = exc.reason if isinstance(exc, VideoError) else str(exc)
        return f"unreadable video ({type(exc).__name__}: {shorten(reason, 160)})"


def _strip_pngs(video: Video) -> list[tuple[int, bytes]]:
    """The strip of ``video``: ``(frame index, PNG bytes)`` for each frame it shows."""
    from PIL import Image

    return [
        (index, encode_png(Image.fromarray(video.frames[index]), compress_level=6))
        for index in strip_indices(video.num_frames)
    ]


def unresolved_view(ref: Any, what: str) -> dict[str, Any] | str:
    """The view of a reference that names no file of ours (none at all: a placeholder; an
    http(s) URL: a remote link, never fetched), else the reference, stripped, to resolve.

    Args:
        ref: An image or video part's URL, as the row holds it.
        what: ``"image"`` or ``"video"``, for the placeholder's reason.
    """
    if not isinstance(ref, str) or not ref.strip():
        return {"type": "missing", "ref": shorten(repr(ref), 200), "reason": f"no {what} URL"}
    ref = ref.strip()
    if ref.lower().startswith(("http://", "https://")):
        return {"type": "remote", "url": ref}
    return ref


def _fit(
    w: int, h: int, max_w: int = THUMB_MAX_W, max_h: int = THUMB_MAX_H
) -> tuple[int, int, bool]:
    """A thumbnail's size: within ``max_w`` x ``max_h``, tiny images scaled up to
    ``THUMB_MIN`` on their long side; and whether it is scaled up (drawn pixelated)."""
    scale = min(1.0, max_w / w, max_h / h)
    if max(w, h) * scale < THUMB_MIN:
        scale = THUMB_MIN / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale)), scale > 1


def _rate(value: Any) -> float | None:
    """A part's ``frame_rate`` when it is a positive finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    rate = float(value)
    return rate if 0 < rate < float("inf") else None
