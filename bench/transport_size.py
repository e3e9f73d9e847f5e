"""Bytes on the wire for multi-turn image rollouts: vf_mm's group frames against the
schemes that carried images per step.

Each rollout has 16 turns; each turn shows one new 448x448 image, whose model inputs are
``pixel_values`` (1024, 1176) float32 (Qwen2-VL: 448 / 14 = 32, so 32 x 32 patches of
3 x 2 x 14 x 14 = 1176 features; 4.8 MB) and ``image_grid_thw`` [[1, 32, 32]], and take
256 image pad tokens in the prompt. Every step's prompt holds the images it shows (a
bridge carries the earlier turns' images forward), so step k refers to about k images.

Cases
  plain                1 rollout, each turn adds an image (16 distinct images)
  branching group      4 rollouts of one example share the first 8 turns, then diverge
                       with their own images (8 + 4 x 8 = 40 distinct images)
  branch in a rollout  1 rollout that goes back to turn 4's prompt after turn 8 and
                       continues from there (16 distinct images)
  compaction           1 rollout whose context is compacted at turn 9: a summary and the
                       last two images are kept, earlier images are dropped (16 distinct)
  repeats              each turn shows a new image and the first image again (16 distinct)

Schemes (every byte count is ``len(vf_mm.wire.packb(...))`` of what the scheme sends)
  vf_mm                ``pack_group``: one frame per group, each distinct image once,
                       steps refer to images by hash and position
  full every step      each step is sent with all of its images' tensors (one message a step)
  keep last step       every step's tokens, hashes and placeholders, but tensors only for
                       each rollout's last step (what verifiers did first); a step whose
                       images the last step no longer holds cannot be rebuilt: compaction,
                       a branch inside a rollout
  per-step deltas      each step sends the tensors of images the rollout's previous step
                       did not hold; a step that is not an extension of the previous one
                       re-sends all of its images (verifiers' later fix, modelled here
                       generously: deduplicated by hash within a rollout, not across a group)

"ratio" is bytes / the distinct images' tensor bytes (1.00 = each image once, no
overhead); vf_mm's target is <= 1.05 in every case. "rebuilds" decodes what was sent and
checks every step's hashes, placeholders and tensor bytes against the originals.

The arrays are random numpy data, made without a model: the codec stores tensor bytes raw
(no compression), so their content does not change any size here, only their shapes do.

    python bench/transport_size.py
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
from _machine import cpu_name

import vf_mm
from vf_mm.training import pack_group, unpack_group
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutOutput,
    TrajectoryStep,
)
from vf_mm.wire import packb, unpackb

TURNS = 16
PIXEL_SHAPE = (1024, 1176)
PADS = 256  # 32 x 32 patches merged 2 x 2
VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653

Segment = tuple[str, Any]  # ("text", [ids]) or ("image", hash)


class Maker:
    """Random images and a renderer-like prompt builder (no model)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.items: dict[str, dict[str, np.ndarray]] = {}

    def image(self) -> str:
        h = self.rng.bytes(16).hex()
        pixels = self.rng.standard_normal(PIXEL_SHAPE, dtype=np.float32)
        grid = np.array([[1, 32, 32]], dtype=np.int64)
        pixels.flags.writeable = grid.flags.writeable = False  # as the renderer's cache
        self.items[h] = {"pixel_values": pixels, "image_grid_thw": grid}
        return h

    def text(self, n: int) -> Segment:
        return ("text", self.rng.integers(10, 151_000, size=n).tolist())

    def user_turn(self, *images: str) -> list[Segment]:
        out = [self.text(24)]
        for h in images:
            out += [("image", h), self.text(4)]
        return out

    def step(self, context: list[Segment]) -> TrajectoryStep:
        ids: list[int] = []
        hashes, ranges, items = [], [], []
        for kind, value in context:
            if kind == "text":
                ids += value
                continue
            ids.append(VISION_START)
            ranges.append(PlaceholderRange(len(ids), PADS))
            ids += [IMAGE_PAD] * PADS
            ids.append(VISION_END)
            hashes.append(value)
            items.append(self.items[value])
        completion = self.rng.integers(10, 151_000, size=48).tolist()
        tokens = ResponseTokens(
            prompt_ids=ids,
            completion_ids=completion,
            completion_logprobs=(-self.rng.random(48)).tolist(),
            completion_mask=[1] * 48,
            finish_reason="stop",
            multi_modal_data=MultiModalData({"image": hashes}, {"image": ranges}, {"image": items}),
        )
        return TrajectoryStep(prompt=[], completion=[], tokens=tokens)


def play(maker: Maker, turns: list[Callable[[list[list[Segment]], list], list[Segment]]]):
    """Steps from a list of turn functions (previous contexts, steps) -> the next context."""
    contexts: list[list[Segment]] = []
    steps: list[TrajectoryStep] = []
    for turn in turns:
        contexts.append(turn(contexts, steps))
        steps.append(maker.step(contexts[-1]))
    return contexts, steps


def extend(maker: Maker, *images: str | None):
    def turn(contexts, steps):
        new = maker.user_turn(*(maker.image() if h is None else h for h in images or [None]))
        if not contexts:
            return [maker.text(32), *new]
        return [*contexts[-1], ("text", steps[-1].tokens.completion_ids), *new]

    return turn


def rollout(steps: list[TrajectoryStep], index: int = 0) -> RolloutOutput:
    return RolloutOutput(
        example_id=0,
        prompt=[{"role": "user", "content": "navigate"}],
        completion=[{"role": "assistant", "content": f"rollout {index}"}],
        trajectory=steps,
        reward=1.0,
    )


def case_plain(maker: Maker) -> list[RolloutOutput]:
    return [rollout(play(maker, [extend(maker) for _ in range(TURNS)])[1])]


def case_branching_group(maker: Maker) -> list[RolloutOutput]:
    contexts, shared = play(maker, [extend(maker) for _ in range(TURNS // 2)])
    outputs = []
    for r in range(4):
        ctx, steps = list(contexts), list(shared)  # the same step objects: shared prefix
        for _ in range(TURNS // 2):
            ctx.append(extend(maker)(ctx, steps))
            steps.append(maker.step(ctx[-1]))
        outputs.append(rollout(steps, r))
    return outputs


def case_branch_in_rollout(maker: Maker) -> list[RolloutOutput]:
    def rewind(contexts, steps):  # back to turn 4's prompt and answer, then a new turn
        answer = ("text", steps[3].tokens.completion_ids)
        return [*contexts[3], answer, *maker.user_turn(maker.image())]

    turns = [extend(maker) for _ in range(8)] + [rewind] + [extend(maker) for _ in range(7)]
    return [rollout(play(maker, turns)[1])]


def case_compaction(maker: Maker) -> list[RolloutOutput]:
    def compact(contexts, steps):  # a summary, the last two turns' images, a new turn
        kept = [seg for seg in contexts[-1] if seg[0] == "image"][-2:]
        summary = [maker.text(32), maker.text(64), *maker.user_turn(*(h for _, h in kept))]
        return [*summary, *maker.user_turn(maker.image())]

    turns = [extend(maker) for _ in range(8)] + [compact] + [extend(maker) for _ in range(7)]
    return [rollout(play(maker, turns)[1])]


def case_repeats(maker: Maker) -> list[RolloutOutput]:
    first = maker.image()
    turns = [extend(maker, first)] + [extend(maker, None, first) for _ in range(TURNS - 1)]
    return [rollout(play(maker, turns)[1])]


CASES = {
    "plain": case_plain,
    "branching group": case_branching_group,
    "branch in a rollout": case_branch_in_rollout,
    "compaction": case_compaction,
    "repeats": case_repeats,
}

# -- schemes: what is sent, and what a reader rebuilds from it ---------------------------


def token_fields(tokens: ResponseTokens) -> dict[str, Any]:
    mm = tokens.multi_modal_data
    return {
        "prompt_ids": tokens.prompt_ids,
        "completion_ids": tokens.completion_ids,
        "completion_logprobs": tokens.completion_logprobs,
        "completion_mask": tokens.completion_mask,
        "hashes": mm.mm_hashes["image"],
        "placeholders": [[r.offset, r.length] for r in mm.mm_placeholders["image"]],
    }


def rebuilt(step: dict[str, Any], items: list[Any]) -> MultiModalData:
    return MultiModalData(
        {"image": list(step["hashes"])},
        {"image": [PlaceholderRange(o, n) for o, n in step["placeholders"]]},
        {"image": items},
    )


Check = Callable[[int, int, "MultiModalData | None"], bool]


def send_vf_mm(outputs: list[RolloutOutput], check: Check) -> tuple[int, bool]:
    message = packb(pack_group(outputs))
    got = unpack_group(unpackb(message))
    ok = all(
        check(r, s, step.tokens.multi_modal_data)
        for r, rollout in enumerate(got)
        for s, step in enumerate(rollout.trajectory)
    )
    return len(message), ok


def send_full(outputs: list[RolloutOutput], check: Check) -> tuple[int, bool]:
    size, ok = 0, True
    for r, o in enumerate(outputs):
        for s, step in enumerate(o.trajectory):
            mm = step.tokens.multi_modal_data
            message = packb({**token_fields(step.tokens), "items": mm.mm_items})
            size += len(message)
            got = unpackb(message)  # checked at once: a decoded step holds 77 MB
            ok = check(r, s, rebuilt(got, got["items"]["image"])) and ok
    return size, ok


def send_last_only(outputs: list[RolloutOutput], check: Check) -> tuple[int, bool]:
    size, ok = 0, True
    for r, o in enumerate(outputs):
        last = o.trajectory[-1].tokens.multi_modal_data
        message = packb(
            {
                "steps": [token_fields(step.tokens) for step in o.trajectory],
                "last_items": dict(
                    zip(last.mm_hashes["image"], last.mm_items["image"], strict=True)
                ),
            }
        )
        size += len(message)
        got = unpackb(message)
        table = got["last_items"]
        for s, step in enumerate(got["steps"]):
            if all(h in table for h in step["hashes"]):
                ok = check(r, s, rebuilt(step, [table[h] for h in step["hashes"]])) and ok
            else:
                ok = False  # the step shows an image the last step no longer holds: lost
    return size, ok


def send_deltas(outputs: list[RolloutOutput], check: Check) -> tuple[int, bool]:
    size, ok = 0, True
    for r, o in enumerate(outputs):
        previous: list[str] = []
        table: dict[str, Any] = {}  # the reader's: the previous step's images
        for s, step in enumerate(o.trajectory):
            mm = step.tokens.multi_modal_data
            hashes, items = mm.mm_hashes["image"], mm.mm_items["image"]
            extends = hashes[: len(previous)] == previous
            held = set(previous) if extends else set()
            delta = {h: item for h, item in zip(hashes, items, strict=True) if h not in held}
            message = packb({**token_fields(step.tokens), "extends": extends, "new_items": delta})
            size += len(message)
            got = unpackb(message)
            table = {h: table[h] for h in held} | got["new_items"]
            ok = check(r, s, rebuilt(got, [table[h] for h in got["hashes"]])) and ok
            previous = list(hashes)
    return size, ok


SCHEMES = {
    "vf_mm": send_vf_mm,
    "full every step": send_full,
    "keep last step": send_last_only,
    "per-step deltas": send_deltas,
}


def checker(outputs: list[RolloutOutput], *, memo: bool) -> Check:
    """A step's rebuilt hashes, placeholders and tensor bytes equal the original's.

    ``memo`` skips item pairs already compared, by object id: only for a scheme whose
    rebuilt items all stay alive until the check ends (vf_mm's), or an id could be reused.
    """
    compared: set[tuple[int, int]] = set()

    def check(r: int, s: int, mm: MultiModalData | None) -> bool:
        ref = outputs[r].trajectory[s].tokens.multi_modal_data
        if mm is None or mm.mm_hashes != ref.mm_hashes:
            return False
        if mm.mm_placeholders != ref.mm_placeholders:
            return False
        for g, want in zip(mm.mm_items["image"], ref.mm_items["image"], strict=True):
            if (id(g), id(want)) in compared:
                continue
            for key in want:
                a, b = np.asarray(g[key]), want[key]
                if a.shape != b.shape or a.dtype != b.dtype:
                    return False
                if not np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)):
                    return False
            if memo:
                compared.add((id(g), id(want)))
        return True

    return check


def machine() -> str:
    cpu = cpu_name()
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()} | "
        f"Python {platform.python_version()}, vf_mm {vf_mm.__version__}, "
        f"numpy {np.__version__}, msgspec {msgspec.__version__}"
    )


def main() -> None:
    print(f"machine: {machine()}")
    print(
        f"{TURNS} turns, one new image a turn: pixel_values {PIXEL_SHAPE} float32 "
        f"({np.prod(PIXEL_SHAPE) * 4 / 1e6:.2f} MB) + image_grid_thw (1, 3) int64, {PADS} pads\n"
    )
    header = f"{'case':<20} {'scheme':<16} {'bytes':>14} {'ratio':>7}  rebuilds every step"
    print(header)
    print("-" * len(header))
    notes = []
    for case, make in CASES.items():
        maker = Maker(seed=len(case))
        outputs = make(maker)
        distinct = {
            h: item
            for o in outputs
            for s in o.trajectory
            for h, item in zip(
                s.tokens.multi_modal_data.mm_hashes["image"],
                s.tokens.multi_modal_data.mm_items["image"],
                strict=True,
            )
        }
        base = sum(v.nbytes for item in distinct.values() for v in item.values())
        refs = sum(s.tokens.multi_modal_data.num_items() for o in outputs for s in o.trajectory)
        for scheme, send in SCHEMES.items():
            size, ok = send(outputs, checker(outputs, memo=scheme == "vf_mm"))
            label = case if scheme == "vf_mm" else ""
            print(
                f"{label:<20} {scheme:<16} {size:>14,} {size / base:>7.3f}  {'yes' if ok else 'NO'}"
            )
            if scheme == "vf_mm" and size / base > 1.05:
                notes.append(f"vf_mm over its 1.05 target in {case}: {size / base:.3f}")
        print(
            f"{'':<20} ({len(outputs)} rollout{'s' * (len(outputs) > 1)}, "
            f"{sum(len(o.trajectory) for o in outputs)} steps, {refs} image references, "
            f"{len(distinct)} distinct images = {base:,} tensor bytes)"
        )
    print(
        "\nkeep last step: only the last step's images travel, so a rollout whose later steps"
        "\n  dropped images (compaction) or went back to an earlier prompt (a branch inside a"
        "\n  rollout) cannot be rebuilt: its earlier steps refer to images nobody sent. Across"
        "\n  a branching group it rebuilds, but pays for the shared prefix once per rollout."
        "\nper-step deltas: correct, but a non-extending step re-sends every image it holds,"
        "\n  and rollouts of a group each send their shared prefix."
    )
    for note in notes:
        print(f"NOTE: {note}")


if __name__ == "__main__":
    main()
