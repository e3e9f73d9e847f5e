"""Images for the tests, all generated with PIL (no files from outside)."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping

import httpx
import numpy as np
from PIL import Image

from vf_mm.images import Fetcher

PUBLIC_IP = "93.184.216.34"


def gradient(width: int = 16, height: int = 12, mode: str = "RGB") -> Image.Image:
    """An image whose every pixel differs from its neighbours (so a rotation or flip
    shows)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack(
        [(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), (x + y) % 256], axis=-1
    ).astype(np.uint8)
    image = Image.fromarray(rgb, "RGB")
    return image if mode == "RGB" else image.convert(mode)


def encode(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def png_bytes(image: Image.Image | None = None) -> bytes:
    return encode(image if image is not None else gradient(), "PNG")


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width x height`` and holds no pixel data: decoding it
    fails, so an error about its size proves the size was checked first."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


class FakeResolver:
    """Answers from a table; records every question; unknown names fail like DNS."""

    def __init__(self, table: Mapping[str, Iterable[str]] | None = None) -> None:
        self.table = {k: list(v) for k, v in (table or {}).items()}
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        if host not in self.table:
            raise OSError(f"[fake DNS] no such host {host!r}")
        return self.table[host]


class Recorder:
    """An ``httpx.MockTransport`` handler that records requests and answers by a
    function of the request."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)

    @property
    def hosts(self) -> list[str]:
        return [r.url.host for r in self.requests]


def serving(body: bytes, **headers: str) -> Recorder:
    return Recorder(lambda request: httpx.Response(200, content=body, headers=headers))


def fetcher(handler: Recorder, resolver: FakeResolver | None = None) -> Fetcher:
    resolver = resolver if resolver is not None else FakeResolver({"example.com": [PUBLIC_IP]})
    return Fetcher(transport=httpx.MockTransport(handler), resolver=resolver)
