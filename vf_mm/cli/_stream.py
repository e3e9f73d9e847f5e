"""``vf-mm inspect`` (summarise a trajectory stream) and ``vf-mm demo`` (write one, read it back).

``demo`` is the Quickstart's main job until environments and ``vf-mm eval`` land: it
writes synthetic rollouts shaped like real Qwen-VL training data (token ids,
logprobs, per-image ``pixel_values`` and ``image_grid_thw``) to a framed stream, reads
them back, checks every tensor bit for bit, and prints what the stream holds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vf_mm._text import shorten
from vf_mm.cli._console import cli_console
from vf_mm.errors import StreamError
from vf_mm.wire import StreamReader, packb, write_stream


def register(sub: Any) -> None:
    inspect = sub.add_parser("inspect", help="summarise a vf_mm trajectory stream file")
    inspect.add_argument("path", type=Path)
    inspect.add_argument("--frames", type=int, default=20, help="frames to list (default 20)")
    inspect.set_defaults(run=run_inspect)

    demo = sub.add_parser(
        "demo", help="write synthetic multimodal rollouts to a stream and read them back"
    )
    demo.add_argument("-o", "--out", type=Path, default=Path("out/demo"), help="output directory")
    demo.add_argument("-n", "--rollouts", type=int, default=16)
    demo.add_argument("--images", type=int, default=4, help="images per rollout")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=run_demo)


def _tensors(obj: Any) -> list[Any]:
    """Every tensor or array inside ``obj``, depth first."""
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list):
        return [t for v in obj for t in _tensors(v)]
    if hasattr(obj, "dtype") and hasattr(obj, "shape"):
        return [obj]
    return []


def _nbytes(t: Any) -> int:
    return (
        int(t.nbytes)
        if hasattr(t, "nbytes") and not callable(t.nbytes)
        else t.numel() * t.element_size()
    )


def _image_summary(item: Any) -> tuple[str, int, int] | None:
    """A group frame's image mode (``tensors``, ``encoded``, ``ref``), its distinct items
    (images and videos) and their bytes on the wire (each item's entry as packed); None
    for a frame that is no group."""
    if not isinstance(item, dict) or not str(item.get("format", "")).startswith("vf_mm.group/"):
        return None
    tables = [item.get("images"), item.get("sources")]
    entries = [e for table in tables if isinstance(table, dict) for e in table.values()]
    return str(item.get("image_mode", "tensors")), len(entries), sum(len(packb(e)) for e in entries)


def run_inspect(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or cli_console()
    table = Table(title=str(args.path))
    columns = ("frame", "offset", "keys", "tensors", "tensor bytes", "images", "bytes/image")
    for col in columns:
        table.add_column(col, justify="right" if col not in ("keys", "images") else "left")
    frames = tensor_count = tensor_bytes = 0
    status = 0
    try:
        with StreamReader(args.path, errors="skip") as reader:
            for item in reader:
                tensors = _tensors(item)
                size = sum(_nbytes(t) for t in tensors)
                if frames < args.frames:
                    keys = shorten(
                        ", ".join(map(str, item))
                        if isinstance(item, dict)
                        else type(item).__name__,
                        48,
                    )
                    table.add_row(
                        str(frames),
                        f"{reader.frame_offset:,}",
                        keys,
                        str(len(tensors)),
                        f"{size:,}",
                        *_image_columns(_image_summary(item)),
                    )
                frames += 1
                tensor_count += len(tensors)
                tensor_bytes += size
            end = reader.offset
            ending = _ending(reader)
            for index, offset, error in reader.skipped:
                console.print(f"[red]frame {index} at byte offset {offset} skipped:[/] {error}")
                status = 1
    except StreamError as exc:
        console.print(table)
        console.print(f"[red]{type(exc).__name__}:[/] {exc}")
        return 1
    if frames > args.frames:
        table.add_row("…", "", f"{frames - args.frames} more frames", "", "", "", "")
    console.print(table)
    console.print(
        f"{frames} frames, {tensor_count} tensors, {tensor_bytes / 1e6:.1f} MB of tensor data, "
        f"{end:,} bytes read"
    )
    console.print(ending)
    return status


def _ending(reader: StreamReader) -> str:
    """How the stream ends: its writer's end marker (red when it says the writer stopped
    early), or none after the last frame."""
    if not reader.ended:
        return (
            "no end marker after the last frame: its writer was cut off, is still writing, "
            "or writes none"
        )
    marker = reader.ends[-1]
    text = escape(shorten(repr(marker), 200))
    if isinstance(marker, dict) and marker.get("error") is not None:
        return f"[red]ends with its writer's end marker, which says it stopped early:[/] {text}"
    return f"ends with its writer's end marker: {text}"


def _image_columns(summary: tuple[str, int, int] | None) -> tuple[str, str]:
    """The "images" and "bytes/image" cells: ``encoded x3`` and the mean bytes a distinct
    image costs on the wire; blank for a frame that is no group, or holds no image."""
    if summary is None:
        return "", ""
    mode, count, nbytes = summary
    return f"{mode} x{count}", f"{nbytes // count:,}" if count else "-"


def _synthetic_rollout(rng: np.random.Generator, index: int, images: int) -> dict[str, Any]:
    """One rollout shaped like Qwen2-VL training data: 224x224 images are 256 patches of
    1176 values (3 channels x 2 frames x 14 x 14) and 64 image pad tokens each."""
    prompt = rng.integers(0, 151_643, size=200 + 64 * images).tolist()
    completion = rng.integers(0, 151_643, size=int(rng.integers(20, 120))).tolist()
    return {
        "example_id": index,
        "prompt_ids": prompt,
        "completion_ids": completion,
        "completion_logprobs": (-rng.random(len(completion))).tolist(),
        "reward": float(rng.random()),
        "images": [
            {
                "mm_hash": f"{index:04d}-{k}",
                "pixel_values": rng.standard_normal((256, 1176), dtype=np.float32),
                "image_grid_thw": np.array([1, 16, 16], dtype=np.int64),
            }
            for k in range(images)
        ],
    }


def run_demo(args: argparse.Namespace) -> int:
    console = cli_console()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rollouts.vfmm"
    rng = np.random.default_rng(args.seed)
    rollouts = [_synthetic_rollout(rng, i, args.images) for i in range(args.rollouts)]

    start = time.perf_counter()
    write_stream(path, rollouts)
    wrote = time.perf_counter() - start
    start = time.perf_counter()
    back = list(StreamReader(path))
    read = time.perf_counter() - start

    for sent, got in zip(rollouts, back, strict=True):
        for a, b in zip(_tensors(sent), _tensors(got), strict=True):
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                console.print(f"[red]rollout {sent['example_id']}: a tensor changed on the wire[/]")
                return 1
        if {k: v for k, v in sent.items() if k != "images"} != {
            k: v for k, v in got.items() if k != "images"
        }:
            console.print(f"[red]rollout {sent['example_id']}: tokens changed on the wire[/]")
            return 1
    size = path.stat().st_size
    console.print(
        f"wrote {len(rollouts)} rollouts ({size / 1e6:.1f} MB) to {path} in {wrote:.2f} s, "
        f"read and checked them bit for bit in {read:.2f} s"
    )
    return run_inspect(argparse.Namespace(path=path, frames=5), console)
