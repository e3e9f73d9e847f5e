"""The pool engine on a GPU against one full forward of the model, for every family it
serves, with the prefill's text stack replayed as a CUDA graph and run eagerly.

Each family's tiny offline checkpoint (``build_tiny_vlm``; ``build_tiny_lm`` for a text
model) in ``--dtype`` on ``--device``: three concurrent conversations of three turns with
new images every turn, greedy, 4 tokens a turn (``tests/inference/test_local_history``'s
workload), once with ``prefill_graph_tokens`` at its CUDA default and once with 0. Each
turn's logprobs are compared with one full forward of the model over the whole sequence
(its own attention, on the same device and dtype): the largest difference, and whether
the two runs sampled the same ids. bfloat16 keeps 8 bits of mantissa, so a difference of
a few 1e-3 on a logprob of order 1 is rounding, not a different computation. ``--clips``:
a clip beside each later turn's image, for the families with video (GLM-4.6V's go in as
images, one per temporal group).

    python bench/pool_exactness.py [--device cuda] [--dtype bfloat16] [--clips]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from tests.inference.test_local_history import full_forward_logprobs, run_conversations
from vf_mm.errors import RenderError
from vf_mm.models import VIDEO_FAMILIES
from vf_mm.testing import build_tiny_lm, build_tiny_vlm

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "smolvlm", "llava_onevision",
            "llava_next", "internvl", "glm46v", "text")  # fmt: skip


def measure(path: Path, args: argparse.Namespace, tokens: int | None) -> tuple[float, list, dict]:
    """The largest logprob difference to a full forward, the ids, the engine's counters."""
    backend, conversations = run_conversations(
        path, device=args.device, dtype=getattr(torch, args.dtype), kv_pool=True,
        prefill_graph_tokens=tokens, clips=args.clips,
    )  # fmt: skip
    worst, ids = 0.0, []
    for conversation in conversations:
        for prompt, result in conversation:
            reference = full_forward_logprobs(backend, prompt, result.completion_ids)
            worst = max(worst, *(abs(a - b) for a, b in zip(result.logprobs, reference, strict=True)))  # fmt: skip
            ids.append(result.completion_ids)
    return worst, ids, backend._pool.describe() if backend._pool is not None else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--clips", action="store_true", help="a clip in every later turn")
    args = parser.parse_args()
    families = [f for f in FAMILIES if f in VIDEO_FAMILIES] if args.clips else FAMILIES
    print(f"{'family':<16}{'graphed':>10}{'eager':>10}  same ids  prefills replayed / captured")
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            root = Path(tmp) / family
            path = build_tiny_lm(root) if family == "text" else build_tiny_vlm(root, family)
            try:
                graphed, ids_g, pool = measure(path, args, None)
                eager, ids_e, _ = measure(path, args, 0)
            except RenderError as exc:  # a clip this torch cannot process (named)
                print(f"{family:<16}refused: {exc}", flush=True)
                continue
            print(f"{family:<16}{graphed:>10.2e}{eager:>10.2e}  {ids_g == ids_e!s:<8}  "
                  f"{pool.get('prefills_replayed')} / {pool.get('prefill_graphs_captured')}"
                  f"{'; refused: ' + pool['prefill_graphs_refused'] if pool.get('prefill_graphs_refused') else ''}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
