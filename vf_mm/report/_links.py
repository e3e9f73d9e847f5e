"""Images and videos of the paged report: linked from the run's ``assets/``, never embedded.

The rule (the report's security rule, the same as the single file's): a page refers to
a file only by a URL the report built, never by one a row holds. An image or video is
drawn only when its reference is exactly ``assets/<hex>.<ext>`` (the names the results
store writes: ``vf_mm.results.ASSETS_DIR``) and the file, symlinks followed, lies inside
the run's ``assets/`` folder; the page then shows it by a relative URL (``../assets/<hex>.png``
from ``OUTDIR/report/``) with ``loading="lazy"``. Any other reference (a path, ``..``,
a ``file://`` or ``data:`` URL, another scheme) is shown as text, with why, never as an
``<img src>``: the page must not make a browser read an arbitrary file or URL, and the
CSP (``img-src 'self'``) is the second wall, not the first. ``http(s)`` URLs are links,
as in the single file. Why relative links and not ``data:`` URIs: each image is read by
the browser once, when it scrolls into view, instead of being copied into every page.

A video's strip frames are PNGs the report makes from the decoded clip; they are written
once each, by content hash, under the report's own ``frames/`` folder (the run directory
is never written to). A clip a browser plays (``_videos.browser_mime``) is linked for the
player as an image is, with ``preload="none"``.

Only an image's header is read (its size and format: the thumbnail's box is known before
the browser loads it, so lazy loading has something to lay out). What each reference
resolved to is remembered for the last ``MEMO_ENTRIES`` references only, and the assets a
page shows (its lightboxes) are handed over and forgotten per page (``take_page``): the
memory stays bounded however many distinct images a run holds.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from vf_mm._asset_refs import image_asset_hash, video_asset_hash
from vf_mm._text import shorten
from vf_mm.report._assets import (
    _BROWSER_MIME,
    ASSET_MAX_BYTES,
    _Asset,
    _decode_video,
    _fit,
    _rate,
    _Video,
    unresolved_view,
)
from vf_mm.results import ASSETS_DIR

#: references whose resolution is remembered (a repeat within them costs no file access)
MEMO_ENTRIES = 4096
#: the folder (inside the report's folder) that holds the videos' strip frames
FRAMES_DIR = "frames"

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")


class _LinkedAssets:
    """Resolves image and video references to linked assets (``_Asset`` / ``_Video`` with
    ``src``), or to why they are shown as text. ``run_url`` is the run directory's URL
    relative to the pages (``"../"``); ``frames`` the folder strip frames are written to,
    ``frames_url`` its URL relative to the pages."""

    def __init__(self, root: Path, *, run_url: str, frames: Path, frames_url: str) -> None:
        self.root = root.resolve()
        self._assets = (self.root / ASSETS_DIR).resolve()
        self._run_url, self._frames, self._frames_url = run_url, frames, frames_url
        self._memo: OrderedDict[tuple[Any, ...], _Asset | _Video | str] = OrderedDict()
        self._page_assets: dict[str, _Asset] = {}
        self._page_videos: dict[str, _Video] = {}
        self.images_resolved = (
            0  # image files read (a file read again after the memo forgot it counts again)
        )
        self.videos_resolved = 0

    def take_page(self) -> tuple[list[_Asset], list[_Video]]:
        """The distinct images and videos shown since the last call (one page's
        lightboxes and players), in the order first shown; then forgets them."""
        assets, videos = list(self._page_assets.values()), list(self._page_videos.values())
        self._page_assets, self._page_videos = {}, {}
        return assets, videos

    def view(self, ref: Any) -> dict[str, Any]:
        """What to draw for an image reference: a linked asset, a remote link or text."""
        ref = unresolved_view(ref, "image")
        if isinstance(ref, dict):
            return ref
        got = self._remember(("image", ref), lambda: self._load_image(ref))
        if isinstance(got, str):
            return {"type": "missing", "ref": shorten(ref, 200), "reason": got}
        assert isinstance(got, _Asset)
        self._page_assets.setdefault(got.cls, got)
        tw, th, pix = _fit(got.width, got.height)
        return {"type": "asset", "asset": got, "w": tw, "h": th, "pixelated": pix}

    def video_view(self, ref: Any, *, frame_rate: Any = None) -> dict[str, Any]:
        """What to draw for a video reference: its strip (frames written under
        ``frames/``), a remote link or text."""
        ref = unresolved_view(ref, "video")
        if isinstance(ref, dict):
            return ref
        rate = _rate(frame_rate)
        got = self._remember(("video", ref, rate), lambda: self._load_video(ref, rate))
        if isinstance(got, str):
            return {"type": "missing", "ref": shorten(ref, 200), "reason": got}
        assert isinstance(got, _Video)
        for frame in got.frames:
            self._page_assets.setdefault(frame["asset"].cls, frame["asset"])
        self._page_videos.setdefault(got.cls, got)
        return {"type": "asset", "video": got}

    def _remember(self, key: tuple[Any, ...], load: Any) -> _Asset | _Video | str:
        got = self._memo.get(key)
        if got is not None:
            self._memo.move_to_end(key)
            return got
        got = load()
        self._memo[key] = got
        if len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return got

    def _confined(self, ref: str) -> Path | str:
        """The file ``ref`` names, when it lies inside the run's ``assets/`` (symlinks
        followed), else why it is not shown."""
        try:
            path = (self.root / ref).resolve(strict=True)
        except FileNotFoundError:
            return "asset not found"
        except (OSError, RuntimeError) as exc:
            return f"bad path ({exc})"
        if not path.is_relative_to(self._assets) or not path.is_file():
            return f"outside the run's {ASSETS_DIR}/ folder (a link out of it); not shown"
        return path

    def _load_image(self, ref: str) -> _Asset | str:
        digest = image_asset_hash(ref)
        if digest is None:
            return _not_linked(ref, "image")
        path = self._confined(ref)
        if isinstance(path, str):
            return path
        self.images_resolved += 1
        try:
            from PIL import Image

            with Image.open(path) as im:  # the header only: no pixels are decoded
                width, height, fmt = im.width, im.height, im.format
        except Exception as exc:  # any decoder failure means: unreadable, show text
            return f"unreadable image ({type(exc).__name__}: {shorten(str(exc), 120)})"
        mime = _BROWSER_MIME.get(fmt or "")
        if mime is None:
            return f"a {fmt} image, which browsers do not show (--single-file converts it)"
        if width < 1 or height < 1:
            return "empty image (0 pixels)"
        return _Asset(
            cls=f"i{digest}png",
            mime=mime,
            b64="",
            width=width,
            height=height,
            digest=digest[:12],
            src=self._run_url + ref,
        )

    def _load_video(self, ref: str, rate: float | None) -> _Video | str:
        found = video_asset_hash(ref)
        if found is None:
            return _not_linked(ref, "video")
        digest = found[0]
        path = self._confined(ref)
        if isinstance(path, str):
            return path
        self.videos_resolved += 1
        try:
            size = path.stat().st_size
            if size > ASSET_MAX_BYTES:
                return f"too large to show ({size / 2**20:.1f} MiB)"
            data = path.read_bytes()
        except OSError as exc:
            return f"could not read it ({exc.strerror or exc})"
        video = _decode_video(data, rate)
        if isinstance(video, str):
            return video
        return _Video.of(
            video,
            data,
            lambda png: self._frame_asset(png, video.width, video.height),
            name=f"v{digest}{'' if rate is None else str(rate).replace('.', '_')}",
            digest=digest[:12],
            src=self._run_url + ref,
        )

    def _frame_asset(self, png: bytes, width: int, height: int) -> _Asset:
        """A strip frame's PNG (``width`` x ``height``), written once by its hash beside
        the pages, linked."""
        name = hashlib.sha256(png).hexdigest()[:32]
        file = self._frames / f"{name}.png"
        if not file.exists():
            self._frames.mkdir(parents=True, exist_ok=True)
            file.write_bytes(png)
        return _Asset(
            cls=f"f{name}",
            mime="image/png",
            b64="",
            width=width,
            height=height,
            digest=name[:12],
            src=f"{self._frames_url}{name}.png",
        )


def _not_linked(ref: str, kind: str) -> str:
    """Why a reference that is not ``assets/<hex>.<ext>`` is shown as text."""
    scheme = _SCHEME.match(ref)
    if scheme and scheme.group(1).lower() == "data":
        return (
            f"an inline data: URL; a paged report links only the run's {kind} files "
            "(vf-mm view --single-file embeds it)"
        )
    if scheme and not re.match(r"^[a-zA-Z]:[\\/]", ref):
        return f"a {scheme.group(1)!r} URL, not one of the run's assets; shown as text"
    return (
        f"not one of the run's assets ({ASSETS_DIR}/<hash>.<ext>); a paged report links "
        "nothing else, so it is shown as text"
    )
