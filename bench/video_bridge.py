"""Video bridge benchmark: what a new video turn costs beyond processing its own clip.

Each turn k = 1..16 brings one new clip, sent as users send it: an H.264 MP4 in a
``data:video/mp4;base64,...`` URL inside an OpenAI-style ``video_url`` part (16 frames of
320x240 at 8 fps by default). Side by side, in one process, on the same conversation
(a tiny Qwen2.5-VL or Qwen3-VL checkpoint built offline):

  own clip      the new clip alone: ``load_video`` (base64 + decode), ``video_hash``
                (the content hash every clip is cached and deduplicated by) and
                ``expand_video`` (sampling, resize, normalise, patches): the cost the
                bridge cannot avoid
  bridge        ``bridge_to_next_turn`` onto the previous turn's tokens (the new clip is
                decoded and processed, earlier clips are carried forward untouched)
  text bridge   ``bridge_to_next_turn`` of a new turn with no clip: the bridge's own work
                (template probes, replay check, tokenizing the tail), measured alone
  full render   vf_mm's ``render`` of the whole conversation (earlier clips hit the
                renderer's cache but are decoded again to find their hash)

Target: the bridge adds at most 1 ms to the new clip's own processing, at every turn
(its own work follows the new message, not the history). "bridge - own" is the
difference of two ~35 ms timings (noise of a few ms either way); "text bridge" measures
the bridge's own work directly.

    python bench/video_bridge.py [--turns 16] [--repeat 5] [--family qwen2_5_vl|qwen3_vl]
                                 [--frames 16] [--size 320x240]
"""

from __future__ import annotations

import argparse
import base64
import io
import platform
import tempfile
import time
from collections.abc import Callable
from typing import Any

import av
import numpy as np
import torch
import transformers

import vf_mm
from vf_mm.models import (
    expand_video,
    load_video_settings,
)
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm
from vf_mm.videos import load_video, video_hash


def clip_url(seed: int, frames: int, width: int, height: int, rate: int = 8) -> str:
    """A moving-square clip as an H.264 MP4 data URL (yuv420p, what cameras and
    screen recorders write)."""
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for t in range(frames):
            frame = background.copy()
            x = (t * width // frames) % (width - 32)
            frame[height // 2 - 16 : height // 2 + 16, x : x + 32] = (255, 40, 40)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buffer.getvalue()).decode()


def user_turn(k: int, url: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": f"Turn {k}: the replay. Which way did it move?"},
    ]}  # fmt: skip


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl"])
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", default="320x240")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    print(
        f"{platform.processor() or platform.machine()} | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}, av {av.__version__} | {args.family}, clips of "
        f"{args.frames} frames {width}x{height} as MP4 data URLs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm(f"{tmp}/m", args.family)
        renderer = load_renderer(path)
        settings = load_video_settings(path, args.family)
        tokens = {"video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                  "vision_end_token": "<|vision_end|>"}  # fmt: skip
        reply = renderer.tokenizer("Left.", add_special_tokens=False)["input_ids"]
        completion = [*reply, renderer.stop_token_ids[0]]
        history_urls = [clip_url(t, args.frames, width, height) for t in range(1, args.turns + 1)]

        print(f"\n{'turn':>4} {'own clip ms':>12} {'bridge ms':>10} {'bridge - own':>13} "
              f"{'text bridge ms':>15} {'full render ms':>15}")  # fmt: skip
        worst = 0.0
        differences = []
        for k in range(2, args.turns + 1):
            prev_msgs: list[dict[str, Any]] = []
            for t in range(1, k):
                prev_msgs += [user_turn(t, history_urls[t - 1]),
                              {"role": "assistant", "content": "Left."}]  # fmt: skip
            prev = renderer.render(prev_msgs[:-1])
            # every repeat brings a clip never seen before, as in a rollout
            fresh = iter([clip_url(1000 * k + s, args.frames, width, height)
                          for s in range(2 * args.repeat + 2)])  # fmt: skip

            def own(fresh: Any = fresh) -> Any:
                url = next(fresh)
                video = load_video({"type": "video_url", "video_url": {"url": url}})
                video_hash(video)
                return expand_video(settings, video.frames, fps=video.fps, tokens=tokens)

            def bridge(prev: Any = prev, fresh: Any = fresh, prev_msgs: Any = prev_msgs,
                       k: int = k) -> Any:  # fmt: skip
                out = renderer.bridge_to_next_turn(
                    prev.token_ids, completion, [user_turn(k, next(fresh))],
                    previous_multi_modal_data=prev.multi_modal_data, previous_messages=prev_msgs,
                )  # fmt: skip
                if out is None:
                    raise SystemExit(f"not bridged: {dict(renderer.bridge_refusals)}")
                return out

            full_msgs = [*prev_msgs, user_turn(k, history_urls[k - 1])]
            renderer.render(full_msgs)  # warm the cache with every clip of the conversation
            t_own = best(own, args.repeat)
            t_bridge = best(bridge, args.repeat)
            text_turn = {"role": "user", "content": f"Turn {k}: which way now?"}
            t_text = best(
                lambda p=prev, m=prev_msgs, t=text_turn: renderer.bridge_to_next_turn(
                    p.token_ids, completion, [t], previous_multi_modal_data=p.multi_modal_data,
                    previous_messages=m,
                ),
                args.repeat,
            )  # fmt: skip
            t_full = best(lambda m=full_msgs: renderer.render(m), max(1, args.repeat // 2))
            overhead = (t_bridge - t_own) * 1e3
            differences.append(overhead)
            worst = max(worst, t_text * 1e3)
            print(f"{k:>4} {t_own * 1e3:>12.2f} {t_bridge * 1e3:>10.2f} {overhead:>13.2f} "
                  f"{t_text * 1e3:>15.2f} {t_full * 1e3:>15.2f}")  # fmt: skip
        differences.sort()
        print(f"\nbridge - own clip, median over turns: {differences[len(differences) // 2]:.2f} ms; "
              f"the bridge's own work (text bridge), worst turn: {worst:.2f} ms (target <= 1 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
