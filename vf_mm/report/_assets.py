"""Images: each distinct one embedded once, as a CSS class (``data:`` URI)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vf_mm._text import shorten
from vf_mm.errors import ImageError
from vf_mm.images import decode_data_url, encode_png

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
    cls: str
    mime: str
    b64: str
    width: int
    height: int
    digest: str

    @property
    def full_style(self) -> str:
        w, h = self.width, self.height
        scale = max(1.0, FULL_MIN / max(w, h))
        return f"width:min({round(w * scale)}px,94vw,calc(86vh * {w} / {h}));aspect-ratio:{w} / {h}"

    @property
    def full_pixelated(self) -> bool:
        return max(self.width, self.height) < FULL_MIN


class _Assets:
    """Resolves image references to embedded assets (deduplicated by content)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._by_ref: dict[str, _Asset | str] = {}  # reference -> asset, or why it failed
        self._by_digest: dict[str, _Asset] = {}

    def embedded(self) -> list[_Asset]:
        return list(self._by_digest.values())

    def css(self) -> str:
        # only our class names, a MIME type from a fixed table and base64: nothing to escape
        return "\n".join(
            f'.{a.cls}{{background-image:url("data:{a.mime};base64,{a.b64}")}}'
            for a in self._by_digest.values()
        )

    def view(self, ref: Any) -> dict[str, Any]:
        """What to draw for an image reference: an embedded asset, a remote link or a placeholder."""
        if not isinstance(ref, str) or not ref.strip():
            return {"type": "missing", "ref": shorten(repr(ref), 200), "reason": "no image URL"}
        ref = ref.strip()
        if ref.lower().startswith(("http://", "https://")):
            return {"type": "remote", "url": ref}
        if ref not in self._by_ref:
            self._by_ref[ref] = self._load(ref)
        got = self._by_ref[ref]
        if isinstance(got, str):
            return {"type": "missing", "ref": shorten(ref, 200), "reason": got}
        tw, th, pix = _fit(got.width, got.height)
        return {"type": "asset", "asset": got, "w": tw, "h": th, "pixelated": pix}

    def _load(self, ref: str) -> _Asset | str:
        if ref.lower().startswith("data:"):
            try:
                data_or_err = decode_data_url(ref, max_bytes=ASSET_MAX_BYTES)
            except ImageError as exc:
                data_or_err = str(exc)
        else:
            data_or_err = self._read_local(ref)
        if isinstance(data_or_err, str):
            return data_or_err
        data = data_or_err
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


def _fit(w: int, h: int) -> tuple[int, int, bool]:
    scale = min(1.0, THUMB_MAX_W / w, THUMB_MAX_H / h)
    if max(w, h) * scale < THUMB_MIN:
        scale = THUMB_MIN / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale)), scale > 1
