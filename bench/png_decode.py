"""PNG encode and decode: Pillow's writer (adaptive row filters) against
``encode_png(filtered=False)`` (every row unfiltered), side by side in one process.

The trainer rebuilds an image given as pixels (a PIL image, an array) from the PNG the
sampler wrote of it; decoding Pillow's adaptive filters (Paeth above all) was most of
that rebuild, and unfiltered rows decode at close to zlib's own speed. Images (made here, no files):
  scene 1024x768   a synthetic scene: a sky-to-ground gradient, 40 filled shapes,
                   outlines and lines (what the shapes environment draws, larger)
  board 448x448    a 14x14 grid board: walls, grid lines, a goal and an agent (gridnav)
  photo 1280x720   a photo-like image: smooth colour fields, edges and sensor noise,
                   through JPEG quality 90 and decoded (the pixels a PIL source holds)

Contenders, for each image:
  pillow L1        ``encode_png(image)``: Pillow's writer at level 1 (adaptive filters),
                   the baseline; decoded by ``load_image`` (what the trainer runs)
  ours L1          ``encode_png(image, filtered=False)``: every row filter 0, level 1;
                   decoded by ``load_image``
  floor            ``zlib.decompress`` of our zlib stream, then ``Image.frombytes`` of
                   rows already without filter bytes: what no decoder of it can beat

Each contender runs round-robin with the others (``--repeat`` rounds after one warm-up
round) and keeps its best time. Every decode is checked to give the image's pixels,
bit for bit. "x base" is a time over the baseline's (decode: ``load_image`` of
Pillow's file; encode: Pillow's writer).

    python bench/png_decode.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import time
import zlib
from collections.abc import Callable

import numpy as np
import PIL
from _machine import cpu_name
from image_modes import photo as jpeg_photo
from PIL import Image, ImageDraw

import vf_mm
from vf_mm.images import ImagePolicy, encode_png, load_image

POLICY = ImagePolicy()


def decode(data: bytes) -> Image.Image:
    return load_image(data, policy=POLICY)


# -- images --------------------------------------------------------------------------------


def scene(width: int = 1024, height: int = 768, seed: int = 0) -> Image.Image:
    """A synthetic scene: gradient sky and ground, filled shapes with outlines, lines."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    sky, ground = np.array([120, 170, 235.0]), np.array([90, 140, 60.0])
    rows = np.where(y < 0.6, sky * (1 - 0.5 * y), ground * (1.4 - 0.5 * y))
    image = Image.fromarray(np.broadcast_to(rows, (height, width, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 60))
        r = int(rng.integers(15, 90))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        box = (x0, y0, x0 + r, y0 + r)
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.ellipse(box, fill=fill, outline=(0, 0, 0), width=2)
        elif kind == 1:
            draw.rectangle(box, fill=fill, outline=(30, 30, 30), width=3)
        else:
            draw.polygon([(x0, y0 + r), (x0 + r // 2, y0), (x0 + r, y0 + r)], fill=fill)
    for _ in range(12):
        points = [tuple(int(v) for v in rng.integers(0, (width, height))) for _ in range(2)]
        draw.line(points, fill=(255, 255, 255), width=2)
    return image


def board(cells: int = 14, cell: int = 32, seed: int = 0) -> Image.Image:
    """A gridnav-like board: white cells, grey walls, grid lines, a goal and an agent."""
    rng = np.random.default_rng(seed)
    side = cells * cell
    image = Image.new("RGB", (side, side), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for r, c in rng.integers(0, cells, (30, 2)):
        draw.rectangle((c * cell, r * cell, (c + 1) * cell, (r + 1) * cell), fill=(60, 60, 70))
    for i in range(cells + 1):
        x = min(i * cell, side - 1)
        draw.line((x, 0, x, side - 1), fill=(200, 200, 200))
        draw.line((0, x, side - 1, x), fill=(200, 200, 200))
    draw.rectangle((10 * cell + 5, 11 * cell + 5, 11 * cell - 5, 12 * cell - 5), fill=(40, 170, 60))
    draw.ellipse((2 * cell + 6, 3 * cell + 6, 3 * cell - 6, 4 * cell - 6), fill=(220, 40, 40))
    return image


def photo(width: int = 1280, height: int = 720, seed: int = 0) -> Image.Image:
    """Photo-like pixels: ``bench/image_modes.py``'s photo JPEG (quality 90), decoded."""
    return Image.open(io.BytesIO(jpeg_photo(seed, (width, height)))).convert("RGB")


# -- timing --------------------------------------------------------------------------------


def idat_stream(data: bytes) -> bytes:
    """The zlib stream of a PNG's IDAT chunks."""
    out, pos = [], 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] == b"IDAT":
            out.append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    return b"".join(out)


def floor_decode(stream: bytes, size: tuple[int, int]) -> Image.Image:
    width, height = size
    rows = np.frombuffer(zlib.decompress(stream), np.uint8).reshape(height, width * 3 + 1)
    return Image.frombytes("RGB", size, rows[:, 1:].tobytes())


def best_of(contenders: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each contender's best time in ms, run round-robin (one warm-up round first)."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(repeat + 1):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * min(t) for name, t in times.items()}


def measure(name: str, image: Image.Image, repeat: int) -> None:
    expected = np.asarray(image)
    pillows = encode_png(image)
    ours = encode_png(image, filtered=False)
    stream = idat_stream(ours)
    checks = {
        "pillow L1 by load_image": decode(pillows),
        "ours L1 by load_image": decode(ours),
        "floor": floor_decode(stream, image.size),
    }
    for label, decoded in checks.items():
        assert np.array_equal(np.asarray(decoded), expected), f"{name}: {label}"
    decoded = best_of(
        {
            "pillow": lambda: decode(pillows),
            "ours": lambda: decode(ours),
            "floor": lambda: floor_decode(stream, image.size),
        },
        repeat,
    )
    encode = best_of(
        {"pillow": lambda: encode_png(image), "ours": lambda: encode_png(image, filtered=False)},
        repeat,
    )
    base = decoded["pillow"]
    print(f"\n{name}  ({image.width * image.height * 3:,} bytes of pixels)")
    print(f"{'':<34}{'bytes':>11}{'encode ms':>11}{'x base':>8}{'decode ms':>11}{'x base':>8}")
    rows = [
        ("pillow L1 (baseline)", len(pillows), encode["pillow"], base),
        ("ours L1, unfiltered", len(ours), encode["ours"], decoded["ours"]),
        ("floor: inflate + frombytes", len(stream), None, decoded["floor"]),
    ]
    for label, size, enc, dec in rows:
        enc_text = f"{enc:>11.2f}{enc / encode['pillow']:>8.2f}" if enc is not None else " " * 19
        print(f"{label:<34}{size:>11,}{enc_text}{dec:>11.2f}{dec / base:>8.2f}")
    print(
        f"  unfiltered: {base / decoded['ours']:.1f}x faster to decode than the baseline; "
        f"file {len(ours) / len(pillows):.2f}x the size; "
        f"encode + decode {(encode['ours'] + decoded['ours']):.2f} ms against "
        f"{(encode['pillow'] + base):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed rounds (best kept)")
    args = parser.parse_args()
    print(
        f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, Pillow {PIL.__version__}, numpy {np.__version__}, "
        f"zlib {zlib.ZLIB_RUNTIME_VERSION} | best of {args.repeat}, one thread"
    )
    for name, image in (
        ("scene 1024x768", scene()),
        ("board 448x448", board()),
        ("photo 1280x720", photo()),
    ):
        measure(name, image, args.repeat)
    print("\nevery decode gives the image's pixels, bit for bit")


if __name__ == "__main__":
    main()
