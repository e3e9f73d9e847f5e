"""Videos for the tests, all written here with PyAV (no files from outside).

``libx264rgb`` at ``qp=0`` stores RGB losslessly, so an MP4 of it decodes to exactly
the frames written: the tests that compare pixels use it. VP9 (WebM) is lossy and is
compared with a tolerance where its pixels matter at all. Every clip is made once per
session (``functools.cache``) and is a few kilobytes.
"""

from __future__ import annotations

import fractions
import functools
import io

import av
import httpx
import numpy as np

from vf_mm.images import Fetcher

WIDTH, HEIGHT, COUNT, RATE = 64, 48, 12, 10


def moving_square(count: int = COUNT, width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """``(count, height, width, 3)`` uint8: a coloured background that changes every
    frame, a white square that moves, and a gradient row (so a flip or a swapped frame
    shows)."""
    frames = np.zeros((count, height, width, 3), dtype=np.uint8)
    for i in range(count):
        frames[i, :, :] = ((i * 20) % 256, 100, (200 + i * 5) % 256)
        x = (i * 4) % (width - 8)
        frames[i, 8:16, x : x + 8] = 255
        frames[i, -1, :, 0] = np.arange(width) * 255 // max(width - 1, 1)
    return frames


class _NotSeekable(io.RawIOBase):
    """A write-only stream: muxers that cannot seek back write no duration or index,
    as a live recording does."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data) -> int:  # type: ignore[override]
        return self.buffer.write(data)


def encode(
    frames: np.ndarray,
    *,
    fmt: str = "mp4",
    codec: str = "libx264rgb",
    rate: int | fractions.Fraction = RATE,
    pix_fmt: str | None = "rgb24",
    options: dict[str, str] | None = None,
    seekable: bool = True,
    rotation: int | None = None,
) -> bytes:
    """``frames`` encoded in one video stream of ``fmt``."""
    target = io.BytesIO() if seekable else _NotSeekable()
    with av.open(target, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.height, stream.width = frames.shape[1:3]
        if pix_fmt:
            stream.pix_fmt = pix_fmt
        stream.options = {"qp": "0"} if options is None and codec.startswith("libx264") else {}
        if options:
            stream.options = options
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return target.getvalue() if isinstance(target, io.BytesIO) else target.buffer.getvalue()


@functools.cache
def mp4(count: int = COUNT, rate: int = RATE) -> bytes:
    """A lossless MP4 of ``moving_square(count)`` (the moov box at the end, as written)."""
    return encode(moving_square(count), rate=rate)


@functools.cache
def webm(count: int = COUNT) -> bytes:
    """A lossy VP9 WebM of ``moving_square(count)``; its header states the duration."""
    return encode(moving_square(count), fmt="webm", codec="libvpx-vp9", pix_fmt=None)


@functools.cache
def live_mkv(count: int = COUNT) -> bytes:
    """A lossless FFV1 Matroska written as a live recording: no duration, no frame
    count in the header, so every limit can only be found while decoding."""
    return encode(
        moving_square(count), fmt="matroska", codec="ffv1", pix_fmt="bgr0", seekable=False
    )


@functools.cache
def faststart_mp4(tmp_dir: str, count: int = 30) -> bytes:
    """An MP4 with the moov box first (as streamed files have it), of noise frames large
    enough that a cut lands inside the sample data. FFmpeg's faststart pass needs a file."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (count, HEIGHT, WIDTH, 3), dtype=np.uint8)
    path = f"{tmp_dir}/faststart.mp4"
    with av.open(path, mode="w", format="mp4", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=RATE)
        stream.height, stream.width = HEIGHT, WIDTH
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with open(path, "rb") as handle:
        return handle.read()


def _audio_frames(stream, count: int = 5, samples: int = 1024):
    for i in range(count):
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, samples), np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 8000
        frame.pts = i * samples
        yield from stream.encode(frame)
    yield from stream.encode()


@functools.cache
def audio_only_mp4() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        audio = container.add_stream("aac", rate=8000)
        for packet in _audio_frames(audio):
            container.mux(packet)
    return buffer.getvalue()


@functools.cache
def no_frames_mkv() -> bytes:
    """A Matroska with a video stream that holds no frame (and an audio stream that does)."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="matroska") as container:
        video = container.add_stream("ffv1", rate=RATE)
        video.width, video.height = WIDTH, HEIGHT
        audio = container.add_stream("aac", rate=8000)
        for packet in _audio_frames(audio):
            container.mux(packet)
    return buffer.getvalue()


@functools.cache
def resolution_change_ts() -> bytes:
    """One MPEG-TS video stream whose frames change size after frame 4 (two encoders'
    packets in one stream, each keyframe carrying its own parameter sets)."""
    buffer = io.BytesIO()
    base = fractions.Fraction(1, RATE)
    with av.open(buffer, mode="w", format="mpegts") as container:
        stream = container.add_stream("libx264", rate=RATE)
        stream.width, stream.height = WIDTH, HEIGHT
        offset = 0
        for height, width, value in ((HEIGHT, WIDTH, 90), (32, 32, 200)):
            encoder = av.CodecContext.create("libx264", "w")
            encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
            encoder.time_base, encoder.framerate = base, fractions.Fraction(RATE, 1)
            packets = []
            for i in range(4):
                rgb = np.full((height, width, 3), value, np.uint8)
                frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
                frame.pts, frame.time_base = i, base
                packets += encoder.encode(frame)
            packets += encoder.encode(None)
            for packet in packets:
                packet.stream = stream
                packet.pts += offset
                packet.dts += offset
                packet.time_base = base
                container.mux(packet)
            offset += 4
    return buffer.getvalue()


PUBLIC_IP = "93.184.216.34"


def serving(body: bytes, status: int = 200, **headers: str) -> Fetcher:
    """A ``Fetcher`` whose every request is answered with ``body`` by a mock transport,
    and whose resolver knows example.com only (no real DNS, no real connection)."""

    def resolver(host: str, port: int) -> list[str]:
        if host != "example.com":
            raise OSError(f"[fake DNS] no such host {host!r}")
        return [PUBLIC_IP]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers=headers)

    return Fetcher(transport=httpx.MockTransport(answer), resolver=resolver)
