"""Bridge benchmark: the cost of producing turn k's prompt, k = 1..16, one new 448x448 image a turn.

Side by side in one process, on the same conversation (a tiny Qwen2.5-VL checkpoint
built offline; its processor gives a 448x448 image 256 tokens, like the real one):

  bridge        vf_mm: ``bridge_to_next_turn`` onto the previous turn's tokens (the new
                image is processed; earlier images are carried forward untouched)
  vf_mm render  vf_mm: a full ``render`` of the whole conversation (earlier images hit
                the renderer's cache, the text is re-templated and re-tokenized)
  HF processor  transformers: ``processor.apply_chat_template(..., tokenize=True)`` of the
                whole conversation, every image processed again (what a framework
                without bridging does each turn)

Targets: bridging turn 16 costs at most 1.5x bridging turn 2 (cost follows new content,
not history), and at least 20x less than the HF processor's full re-render at turn 16.
SmolVLM's ``apply_chat_template`` needs a video processor (torchvision), so for it the HF
column is the same two steps by hand: its chat template, then ``processor(text, images)``.

    python bench/bridge.py [--turns 16] [--repeat 5] [--family qwen2_5_vl|gemma3|smolvlm]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image

import vf_mm
from vf_mm.models import build_tiny_vlm, load_processor
from vf_mm.renderers import load_renderer


def image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8))


def user_turn(k: int, salt: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image", "image": image(salt * 1000 + k)},
            {"type": "text", "text": f"Turn {k}: the board after your move. Where next?"},
        ],
    }


# What the model writes after the generation prompt before its answer (SmolVLM's template
# puts "Assistant:" in the prompt and "Assistant: " + content in the history).
LEAD = {"smolvlm": " "}


def hf_full_render(processor: Any, messages: list[dict[str, Any]]) -> Any:
    if not type(processor).__name__.startswith("SmolVLM"):
        return processor.apply_chat_template(
            messages, tokenize=True, return_dict=True, add_generation_prompt=True
        )
    images = [p["image"] for m in messages if isinstance(m["content"], list)
              for p in m["content"] if p["type"] == "image"]  # fmt: skip
    shown = [
        {**m, "content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else {**m, "content": [{"type": "text", "text": m["content"]}]}
        for m in messages
    ]
    text = processor.tokenizer.apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True
    )
    return processor(text=[text], images=[images])


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
    parser.add_argument("--family", default="qwen2_5_vl")
    args = parser.parse_args()
    print(
        f"{platform.processor() or platform.machine()} | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm(f"{tmp}/m", args.family)
        processor = load_processor(path)
        renderer = load_renderer(path, cache_size=4096)
        sampled = LEAD.get(args.family, "") + "I move left."
        reply = renderer.tokenizer(sampled, add_special_tokens=False)["input_ids"]
        completion = [*reply, renderer.stop_token_ids[0]]

        print(
            f"\n{'turn':>4} {'bridge ms':>10} {'vf_mm render ms':>16} {'HF processor ms':>16} {'HF / bridge':>12}"
        )
        bridge_ms: dict[int, float] = {}
        hf_ms: dict[int, float] = {}
        for k in range(1, args.turns + 1):
            # Each repeat uses fresh images for the new turn (salt), so the bridge always
            # processes a never-seen image, as in a real rollout.
            def history(salt: int, k: int = k) -> list[dict[str, Any]]:
                msgs: list[dict[str, Any]] = []
                for t in range(1, k):
                    msgs += [user_turn(t, 0), {"role": "assistant", "content": "I move left."}]
                return msgs

            # turn k - 1's prompt ends on its user turn; the sampled reply closes it, and
            # the bridge gets the history as RendererClient passes it (prompt + reply)
            prev_msgs = history(0)
            prev = renderer.render(prev_msgs[:-1]) if prev_msgs else None
            fresh = iter([[user_turn(k, salt)] for salt in range(1, args.repeat + 2)])

            def bridge(prev: Any = prev, fresh: Any = fresh, prev_msgs: Any = prev_msgs) -> Any:
                new = next(fresh)
                if prev is None:
                    return renderer.render(new)
                return renderer.bridge_to_next_turn(
                    prev.token_ids,
                    completion,
                    new,
                    previous_multi_modal_data=prev.multi_modal_data,
                    previous_messages=prev_msgs,
                )

            full_msgs = [*prev_msgs, user_turn(k, 0)]
            renderer.render(full_msgs)  # warm the cache with every image of the conversation
            t_bridge = best(bridge, args.repeat)
            t_render = best(lambda m=full_msgs: renderer.render(m), args.repeat)
            t_hf = best(lambda m=full_msgs: hf_full_render(processor, m), max(1, args.repeat // 2))
            if k > 1 and bridge() is None:
                reasons = ", ".join(renderer.bridge_refusals)
                raise SystemExit(
                    f"{args.family}: a new user turn is not bridged ({reasons}): the template "
                    "rewrites earlier turns, so every turn is a full render (see docs/models.md)"
                )
            bridge_ms[k], hf_ms[k] = t_bridge * 1e3, t_hf * 1e3
            print(
                f"{k:>4} {t_bridge * 1e3:>10.2f} {t_render * 1e3:>16.2f} {t_hf * 1e3:>16.2f} {t_hf / t_bridge:>12.1f}"
            )

        last = args.turns
        print(
            f"\nbridge turn {last} / bridge turn 2: {bridge_ms[last] / bridge_ms[2]:.2f}x (target <= 1.5x); "
            f"HF full re-render / bridge at turn {last}: {hf_ms[last] / bridge_ms[last]:.1f}x (target >= 20x)"
        )


if __name__ == "__main__":
    main()
