"""Small clips made offline with numpy and PyAV, for the tests of video assets (results
and report): raw frames, and the same frames encoded in each container vf_mm stores."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

#: (container format, codec, pixel format, extension the store gives it)
ENCODINGS = {
    "mp4": ("mp4", "libx264", "yuv420p"),
    "webm": ("webm", "libvpx-vp9", "yuv420p"),
    "mkv": ("matroska", "mpeg4", "yuv420p"),
    "avi": ("avi", "mpeg4", "yuv420p"),
    "ts": ("mpegts", "mpeg2video", "yuv420p"),
    "mov": ("mov", "mpeg4", "yuv420p"),
}


def frames(seed: int = 0, t: int = 8, h: int = 24, w: int = 32) -> np.ndarray:
    """``(t, h, w, 3)`` uint8: smooth gradients that move, so lossy codecs keep them
    recognisable, plus a little noise so that every seed is a different clip."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    out = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        out[i, ..., 0] = (x * 8 + i * 16 + seed * 7) % 256
        out[i, ..., 1] = (y * 10 + i * 8) % 256
        out[i, ..., 2] = ((x + y) * 4 + seed * 31) % 256
    out ^= rng.integers(0, 4, out.shape, dtype=np.uint8)
    return out


def encode(pixels: np.ndarray, ext: str = "mp4", *, rate: int | Fraction = 10) -> bytes:
    """``pixels`` encoded as a file the store names ``.<ext>``."""
    fmt, codec, pix_fmt = ENCODINGS[ext]
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.height, stream.width = pixels.shape[1:3]
        stream.pix_fmt = pix_fmt
        if codec == "libx264":
            stream.options = {"preset": "ultrafast"}
        for frame in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
