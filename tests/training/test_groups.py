"""pack_group / unpack_group: each distinct image's tensors once per group, every step's
multi-modal sidecar rebuilt exactly, through the real wire (packb, framed stream files).

Random groups mix the four shapes that broke "keep only the last step's images" elsewhere:
plain extension (each turn adds an image), branching (rollouts of a group, and steps of
one rollout, that share a prefix), compaction (a step that drops earlier images) and
repeats (the same image twice in one prompt). A few cases use the real tiny renderer.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vf_mm import RendererClient
from vf_mm.errors import GroupFrameError, TornFrameError, VfMmError
from vf_mm.images import image_hash, load_image
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import (
    GROUP_FORMAT,
    TrainingRollout,
    group_advantages,
    pack_group,
    unpack_group,
)
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutError,
    RolloutOutput,
    TrajectoryStep,
)
from vf_mm.wire import packb, read_stream, unpackb, write_stream

VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653

# -- a synthetic world of images and trajectories -------------------------------------


class World:
    """Images (random small arrays per hash) and a renderer-like prompt builder."""

    def __init__(self, seed: int, *, copies: bool = False, rows=(1, 9), dim: int = 24):
        self.rng = np.random.default_rng(seed)
        self.copies = copies  # hand out equal-but-distinct item objects at times
        self.rows = rows  # pixel_values rows are 4 x this (pads = rows // merge**2)
        self.dim = dim
        self.items: dict[str, dict[str, np.ndarray]] = {}

    def new_image(self) -> str:
        h = self.rng.bytes(16).hex()
        rows = 4 * int(self.rng.integers(*self.rows))
        pixels = self.rng.standard_normal((rows, self.dim), dtype=np.float32)
        if self.rng.random() < 0.2:
            pixels[0, 0] = np.nan  # bytes, not float equality, decide sameness
        grid = np.array([[1, 2, rows // 2]], dtype=np.int64)
        for a in (pixels, grid):
            a.flags.writeable = False
        self.items[h] = {"pixel_values": pixels, "image_grid_thw": grid}
        return h

    def item(self, h: str) -> dict[str, np.ndarray]:
        item = self.items[h]
        if self.copies and self.rng.random() < 0.4:
            return {k: v.copy() for k, v in item.items()}
        return item

    def tokens(self, lo: int = 1, hi: int = 6) -> list[int]:
        return self.rng.integers(10, 151_000, size=int(self.rng.integers(lo, hi))).tolist()

    def render(self, context: list[tuple[str, Any]]) -> tuple[list[int], MultiModalData | None]:
        ids: list[int] = []
        hashes, ranges, items = [], [], []
        for kind, value in context:
            if kind == "text":
                ids += value
                continue
            n = len(self.items[value]["pixel_values"]) // 4  # pads = rows // merge**2
            if int(value[:2], 16) % 3 == 0:  # a third of the images: markers inside the range
                mask = (False, *[True] * n, False)  # (Gemma-style begin/end tokens)
                ranges.append(PlaceholderRange(len(ids), n + 2, mask))
                ids += [VISION_START, *[IMAGE_PAD] * n, VISION_END]
            else:
                ids.append(VISION_START)
                ranges.append(PlaceholderRange(len(ids), n))
                ids += [IMAGE_PAD] * n
                ids.append(VISION_END)
            hashes.append(value)
            items.append(self.item(value))
        if hashes:
            return ids, MultiModalData({"image": hashes}, {"image": ranges}, {"image": items})
        choice = self.rng.integers(3)  # a text-only prompt: None, or empty in two shapes
        if choice == 0:
            return ids, None
        if choice == 1:
            return ids, MultiModalData()
        return ids, MultiModalData({"image": []}, {"image": []}, {"image": []})

    def step(self, context: list[tuple[str, Any]]) -> TrajectoryStep:
        prompt_ids, mm = self.render(context)
        completion = self.tokens(1, 5)
        logprobs = (-self.rng.random(len(completion))).tolist()
        if self.rng.random() < 0.2:
            logprobs[0] = math.nan  # what the client records when logprobs were off
        tokens = ResponseTokens(
            prompt_ids=prompt_ids,
            completion_ids=completion,
            completion_logprobs=logprobs,
            completion_mask=self.rng.integers(0, 2, len(completion)).tolist(),
            finish_reason=["stop", "length", None][int(self.rng.integers(3))],
            multi_modal_data=mm,
        )
        reward = None if self.rng.random() < 0.5 else float(self.rng.random())
        return TrajectoryStep(prompt=[], completion=[], tokens=tokens, reward=reward)

    def user_turn(self, seen: list[str], *, repeat: bool = False) -> list[tuple[str, Any]]:
        turn: list[tuple[str, Any]] = [("text", self.tokens())]
        if repeat and seen:
            old = seen[int(self.rng.integers(len(seen)))]
            turn += [("image", old), ("text", self.tokens()), ("image", old)]  # twice in a turn
        else:
            h = self.new_image()
            seen.append(h)
            turn.append(("image", h))
        return [*turn, ("text", self.tokens())]


def grow(world: World, ops: list[str], steps: list, contexts: list, seen: list[str]) -> None:
    """Append one step per op to ``steps`` (and its context to ``contexts``)."""
    for op in ops:
        last = contexts[-1] if contexts else None
        completion = [("text", steps[-1].tokens.completion_ids)] if steps else []
        if last is None:
            context = [("text", world.tokens()), *world.user_turn(seen)]
        elif op == "extend":
            context = [*last, *completion, *world.user_turn(seen)]
        elif op == "repeat":
            context = [*last, *completion, *world.user_turn(seen, repeat=True)]
        elif op == "compact":  # summary text + the tail: earlier images are gone
            keep = int(world.rng.integers(0, len(last) + 1))
            context = [("text", world.tokens()), *last[len(last) - keep :], *completion]
            context += world.user_turn(seen)
        else:  # "branch": back to an earlier step's prompt, then a new turn
            j = int(world.rng.integers(len(contexts)))
            context = [*contexts[j], ("text", world.tokens()), *world.user_turn(seen)]
        contexts.append(context)
        steps.append(world.step(context))


def make_group(world: World, base_ops: list[str], rollout_ops: list[list[str]], *, api=False):
    """Rollouts of one example sharing ``base_ops`` steps (the same step objects), then
    diverging; ``api`` adds a rollout from a message-level backend (no tokens)."""
    base_steps: list = []
    base_contexts: list = []
    seen: list[str] = []
    grow(world, base_ops, base_steps, base_contexts, seen)
    outputs = []
    for r, ops in enumerate(rollout_ops):
        steps, contexts = list(base_steps), list(base_contexts)
        grow(world, ops, steps, contexts, list(seen))
        outputs.append(
            RolloutOutput(
                example_id="ex-7",
                prompt=[{"role": "user", "content": f"rollout {r}"}],
                completion=[{"role": "assistant", "content": "..."}],
                answer=3,
                info={"r": r},
                trajectory=steps,
                reward=float(r),
                metrics={"m": 0.5},
                error=None if r else RolloutError("RuntimeError", "boom", "turn 1: model"),
            )
        )
    if api:
        step = TrajectoryStep(prompt=[], completion=[], tokens=None, reward=1.0)
        outputs.append(RolloutOutput("ex-7", [], [], trajectory=[step, step]))
    return outputs


ops = st.sampled_from(["extend", "extend", "repeat", "compact", "branch"])
groups = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "base_ops": st.lists(ops, max_size=4),
        "rollout_ops": st.lists(st.lists(ops, max_size=5), min_size=1, max_size=4),
        "copies": st.booleans(),
        "api": st.booleans(),
    }
)


# -- checks -------------------------------------------------------------------------


def as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def assert_same_array(got: Any, ref: np.ndarray) -> None:
    got = as_numpy(got)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert got.tobytes() == ref.tobytes()


def assert_same_mm(got: MultiModalData | None, ref: MultiModalData | None) -> None:
    if ref is None:
        assert got is None
        return
    assert isinstance(got, MultiModalData)
    assert got.mm_hashes == ref.mm_hashes
    assert got.mm_placeholders == ref.mm_placeholders
    assert got.mm_items.keys() == ref.mm_items.keys()
    for m, items in ref.mm_items.items():
        assert len(got.mm_items[m]) == len(items)
        for g, r in zip(got.mm_items[m], items, strict=True):
            assert g.keys() == r.keys()
            for key in r:
                assert_same_array(g[key], r[key])


def assert_same_step(got: TrajectoryStep, ref: TrajectoryStep) -> None:
    assert got.reward == ref.reward
    if ref.tokens is None:
        assert got.tokens is None
        return
    g, r = got.tokens, ref.tokens
    assert g.prompt_ids == r.prompt_ids and type(g.prompt_ids) is list
    assert g.completion_ids == r.completion_ids
    assert g.completion_mask == r.completion_mask
    assert len(g.completion_logprobs) == len(r.completion_logprobs)
    for a, b in zip(g.completion_logprobs, r.completion_logprobs, strict=True):
        assert type(a) is float and (a == b or (math.isnan(a) and math.isnan(b)))
    assert g.finish_reason == r.finish_reason
    assert_same_mm(g.multi_modal_data, r.multi_modal_data)


def assert_same_group(got: list[TrainingRollout], outputs: list[RolloutOutput]) -> None:
    assert len(got) == len(outputs)
    for i, (g, o) in enumerate(zip(got, outputs, strict=True)):
        assert isinstance(g, TrainingRollout) and isinstance(g, RolloutOutput)
        assert g.rollout_index == i and g.example_id == o.example_id
        assert (g.reward, g.metrics, g.error, g.answer) == (o.reward, o.metrics, o.error, o.answer)
        assert g.info == o.info
        assert len(g.trajectory) == len(o.trajectory)
        for gs, os_ in zip(g.trajectory, o.trajectory, strict=True):
            assert_same_step(gs, os_)
    # one item object per distinct image, shared by every step that shows it, read-only
    by_hash: dict[str, Any] = {}
    for rollout in got:
        for step in rollout.trajectory:
            mm = step.tokens.multi_modal_data if step.tokens else None
            for m, hashes in (mm.mm_hashes if mm else {}).items():
                for h, item in zip(hashes, mm.mm_items[m], strict=True):
                    assert by_hash.setdefault(h, item) is item
                    pixels = item["pixel_values"]
                    assert not isinstance(pixels, np.ndarray) or not pixels.flags.writeable


def distinct_images(outputs: list[RolloutOutput]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for o in outputs:
        for step in o.trajectory:
            mm = step.tokens.multi_modal_data if step.tokens else None
            for m, hashes in (mm.mm_hashes if mm else {}).items():
                for h, item in zip(hashes, mm.mm_items[m], strict=True):
                    found.setdefault(h, item)
    return found


def tensor_bytes(images: dict[str, dict]) -> int:
    return sum(v.nbytes for item in images.values() for v in item.values())


def size_bound(outputs: list[RolloutOutput]) -> float:
    """1.05 x the distinct images' tensor bytes, plus fixed costs: per image (its hash key
    and two tensor headers with alignment), per step (field names and four token arrays'
    headers, 4 bytes a prompt token, 13 a completion token, a hash and a placeholder per
    image entry), per rollout, per group. Nothing scales with turns x image *bytes*."""
    images = distinct_images(outputs)
    bound = 1.05 * tensor_bytes(images) + 256 * len(images) + 1024
    for o in outputs:
        bound += 512
        for step in o.trajectory:
            bound += 64
            if step.tokens is not None:
                t = step.tokens
                entries = t.multi_modal_data.num_items() if t.multi_modal_data else 0
                bound += 512 + 4 * len(t.prompt_ids) + 13 * len(t.completion_ids) + 48 * entries
    return bound


# -- property tests -------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups)
def test_round_trip_rebuilds_every_step_and_stores_each_image_once(params):
    world = World(params["seed"], copies=params["copies"])
    outputs = make_group(world, params["base_ops"], params["rollout_ops"], api=params["api"])
    frame = pack_group(outputs)
    assert frame["format"] == GROUP_FORMAT and frame["example_id"] == "ex-7"
    images = distinct_images(outputs)
    assert set(frame["images"]) == set(images)  # every referenced image, each once
    message = packb(frame)
    assert len(message) <= size_bound(outputs)
    got = unpack_group(unpackb(message))
    assert_same_group(got, outputs)
    assert [g.trainable for g in got] == [
        all(s.tokens is not None for s in o.trajectory) for o in outputs
    ]


@settings(max_examples=15, deadline=None)
@given(st.lists(groups, min_size=1, max_size=3))
def test_groups_through_a_stream_file(tmp_path_factory, many):
    path = tmp_path_factory.mktemp("stream") / "groups.vfmm"
    made = []
    for params in many:
        world = World(params["seed"], copies=params["copies"])
        made.append(make_group(world, params["base_ops"], params["rollout_ops"], api=True))
    assert write_stream(path, (pack_group(outputs) for outputs in made)) == len(made)
    frames = list(read_stream(path))
    assert len(frames) == len(made)
    for frame, outputs in zip(frames, made, strict=True):
        assert_same_group(unpack_group(frame), outputs)


# -- the size rule on realistic shapes --------------------------------------------------


def plain_group(world: World, turns: int, rollouts: int = 1, shared: int = 0, ops=None):
    ops = ops or ["extend"] * turns
    return make_group(world, ops[:shared], [ops[shared:]] * rollouts)


@pytest.mark.parametrize(
    "case",
    ["plain", "branching group", "branch in a rollout", "compaction", "repeats"],
)
def test_bytes_follow_distinct_images_not_turns(case):
    # (64, 1176) float32 per image: the Qwen2-VL row width, 16 pads, 300 KB an image
    world = World(1, rows=(16, 17), dim=1176)
    if case == "plain":
        outputs = plain_group(world, 16)
    elif case == "branching group":
        outputs = plain_group(world, 16, rollouts=4, shared=8)
    elif case == "branch in a rollout":
        outputs = plain_group(world, 16, ops=["extend"] * 8 + ["branch"] + ["extend"] * 7)
    elif case == "compaction":
        outputs = plain_group(world, 16, ops=["extend"] * 8 + ["compact"] + ["extend"] * 7)
    else:
        outputs = plain_group(world, 16, ops=["extend", "repeat"] * 8)
    images = distinct_images(outputs)
    refs = sum(
        s.tokens.multi_modal_data.num_items() for o in outputs for s in o.trajectory if s.tokens
    )
    assert refs > 2 * len(images)  # turns x images references ...
    message = packb(pack_group(outputs))
    assert len(message) <= 1.05 * tensor_bytes(images)  # ... but bytes of distinct images only
    assert_same_group(unpack_group(unpackb(message)), outputs)


def test_equal_copies_under_one_hash_are_stored_once():
    world = World(2, copies=True)
    outputs = plain_group(world, 6, rollouts=3, shared=3)
    objects: dict[str, set[int]] = {}
    for o in outputs:
        for step in o.trajectory:
            mm = step.tokens.multi_modal_data
            for h, it in zip(mm.mm_hashes["image"], mm.mm_items["image"], strict=True):
                objects.setdefault(h, set()).add(id(it))
    assert max(len(ids) for ids in objects.values()) > 1  # equal bytes, distinct objects
    frame = pack_group(outputs)
    assert len(frame["images"]) == len(objects)
    assert len(packb(frame)) <= size_bound(outputs)
    assert_same_group(unpack_group(unpackb(packb(frame))), outputs)


def test_decoding_as_torch_tensors_rebuilds_too():
    outputs = plain_group(World(3), 4, rollouts=2, shared=2)
    got = unpack_group(unpackb(packb(pack_group(outputs)), tensors="torch"))
    assert_same_group(got, outputs)
    item = got[0].trajectory[-1].tokens.multi_modal_data.mm_items["image"][0]
    assert isinstance(item["pixel_values"], torch.Tensor)


# -- the frame's fields -----------------------------------------------------------------


def test_frame_schema_and_group_fields():
    world = World(4)
    outputs = plain_group(world, 2, rollouts=2)
    outputs[0].trajectory.append(TrajectoryStep(prompt=[], completion=[], tokens=None, reward=2.0))
    frame = pack_group(outputs, rollout_indices=[4, 9], advantages=[0.25, -0.25])
    assert set(frame) == {"format", "example_id", "images", "rollouts"}
    rollout = frame["rollouts"][0]
    assert set(rollout) == {
        "rollout_index", "reward", "metrics", "error", "truncated", "answer", "info",
        "advantage", "prompt", "completion", "steps",
    }  # fmt: skip
    step = rollout["steps"][1]
    assert set(step) == {
        "prompt_ids", "completion_ids", "completion_logprobs", "completion_mask",
        "finish_reason", "reward", "mm",
    }  # fmt: skip
    mm = outputs[0].trajectory[1].tokens.multi_modal_data
    assert step["mm"] == {
        "image": {
            "hashes": mm.mm_hashes["image"],
            "placeholders": [
                [r.offset, r.length]
                if r.is_embed is None  # contiguous; else the mask, one bit a position
                else [r.offset, r.length, np.packbits(r.is_embed).tobytes()]
                for r in mm.mm_placeholders["image"]
            ],
        }
    }
    assert rollout["steps"][2] == {"tokens": None, "reward": 2.0}  # says it has no tokens
    got = unpack_group(unpackb(packb(frame)))
    assert [g.rollout_index for g in got] == [4, 9]
    assert [g.advantage for g in got] == [0.25, -0.25]
    assert got[0].trajectory[2].tokens is None and not got[0].trainable and got[1].trainable
    assert "advantage" not in pack_group(outputs)["rollouts"][0]
    assert unpack_group(unpackb(packb(pack_group(outputs))))[0].advantage is None


def test_a_truncated_rollout_is_marked_in_its_group_and_old_frames_read_as_not():
    outputs = plain_group(World(4), 1, rollouts=2)
    outputs[1].truncated = True
    frame = pack_group(outputs)
    assert [r["truncated"] for r in frame["rollouts"]] == [False, True]
    assert [r.truncated for r in unpack_group(unpackb(packb(frame)))] == [False, True]
    for entry in frame["rollouts"]:  # a frame written before the field
        del entry["truncated"]
    assert [r.truncated for r in unpack_group(frame)] == [False, False]


def test_a_failed_rollouts_advantage_travels_as_none_and_nan_is_refused():
    """group_advantages gives None for a failed rollout: the frame carries it as None (a
    float() of it once failed the whole group); a NaN advantage never reaches a trainer."""
    outputs = plain_group(World(4), 1, rollouts=3)
    outputs[1].reward, outputs[1].error = None, RolloutError("BackendError", "down", "turn 1")
    outputs[0].reward, outputs[2].reward = 1.0, 0.0
    advantages = group_advantages([o.reward for o in outputs])
    frame = pack_group(outputs, advantages=advantages, advantage_method="grpo")
    assert frame["advantage_method"] == "grpo"
    got = unpack_group(unpackb(packb(frame)))
    assert [g.advantage is None for g in got] == [False, True, False]
    assert got[0].advantage == pytest.approx(1, abs=1e-3)
    assert {g.advantage_method for g in got} == {"grpo"}
    assert unpack_group(unpackb(packb(pack_group(outputs))))[0].advantage_method is None
    for bad in (math.nan, math.inf, "0.5"):
        with pytest.raises(GroupFrameError, match="advantage 2 is"):
            pack_group(outputs, advantages=[1.0, None, bad])
    with pytest.raises(GroupFrameError, match="pass both"):
        pack_group(outputs, advantage_method="grpo")


def test_empty_sidecars_keep_their_shape():
    world = World(5)
    steps = []
    for mm in (None, MultiModalData(), MultiModalData({"image": []}, {"image": []}, {"image": []})):
        step = world.step([("text", [1, 2, 3])])
        step.tokens.multi_modal_data = mm
        steps.append(step)
    outputs = [RolloutOutput(0, [], [], trajectory=steps)]
    got = unpack_group(unpackb(packb(pack_group(outputs))))[0].trajectory
    assert got[0].tokens.multi_modal_data is None
    assert got[1].tokens.multi_modal_data.mm_hashes == {}
    assert got[2].tokens.multi_modal_data.mm_hashes == {"image": []}
    assert got[2].tokens.multi_modal_data.mm_items == {"image": []}


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_message_images_become_hash_references(tmp_path: Path):
    pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    h = image_hash(load_image(image))
    path = tmp_path / "x.png"
    path.write_bytes(png_bytes(image))
    data_url = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
    http = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    data = {"type": "image_url", "image_url": {"url": data_url}}
    prompt = [
        {"role": "system", "content": "look"},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image},
                {"type": "text", "text": "and"},
                {"type": "image", "image": png_bytes(image)},
                {"type": "image", "image": str(path)},
                {"type": "image_url", "image_url": {"url": path.as_uri()}},
                {"type": "image_url", "image_url": {"url": f"assets/{'ab' * 16}.png"}},
                http,
                data,
            ],
        },
    ]
    tool = {"role": "tool", "tool_call_id": "1", "content": [{"type": "image", "image": image}]}
    outputs = [RolloutOutput(1, prompt, [tool]) for _ in range(3)]
    frame = pack_group(outputs)
    ref = {"type": "image_ref", "hash": h}
    content = frame["rollouts"][0]["prompt"][1]["content"]
    assert content == [ref, {"type": "text", "text": "and"}, ref, ref, ref,
                       {"type": "image_ref", "hash": "ab" * 16}, http, data]  # fmt: skip
    assert frame["rollouts"][2]["completion"][0]["content"] == [ref]
    assert frame["rollouts"][0]["prompt"][0] == {"role": "system", "content": "look"}
    assert prompt[1]["content"][0]["image"] is image  # the caller's messages are untouched
    got = unpack_group(unpackb(packb(frame)))
    assert got[1].prompt[1]["content"][0] == ref


# -- refusals ---------------------------------------------------------------------------


def one_step_rollout(items: list[dict], hashes: list[str], example_id=0) -> RolloutOutput:
    ids = [1]
    ranges = []
    for _ in hashes:
        ranges.append(PlaceholderRange(len(ids), 2))
        ids += [IMAGE_PAD, IMAGE_PAD, 1]
    mm = MultiModalData({"image": hashes}, {"image": ranges}, {"image": items})
    tokens = ResponseTokens(ids, [5], [-0.1], [1], "stop", mm)
    return RolloutOutput(example_id, [], [], trajectory=[TrajectoryStep([], [], tokens)])


def item(pixels: np.ndarray) -> dict[str, np.ndarray]:
    return {"pixel_values": pixels, "image_grid_thw": np.array([[1, 2, 2]], dtype=np.int64)}


@pytest.mark.parametrize(
    "other",
    [
        np.ones((4, 6), np.float32) * 2,  # same shape and dtype, other bytes
        np.ones((8, 3), np.float32),  # same bytes, other shape
        np.ones((4, 6), np.float64),  # other dtype
        torch.ones(4, 6, dtype=torch.bfloat16),  # a tensor of another dtype
    ],
    ids=["bytes", "shape", "dtype", "torch"],
)
def test_two_tensors_claiming_one_hash_are_refused(other):
    first = one_step_rollout([item(np.ones((4, 6), np.float32))], ["h1"])
    second = one_step_rollout([item(other)], ["h1"])
    with pytest.raises(GroupFrameError, match=r"two different tensors claim image hash h1") as exc:
        pack_group([first, second])
    assert "rollout 1, step 0" in str(exc.value)
    assert isinstance(exc.value, VfMmError) and isinstance(exc.value, ValueError)
    # within one step too
    with pytest.raises(GroupFrameError, match="h1"):
        pack_group([one_step_rollout([item(np.ones((4, 6), np.float32)), item(other)], ["h1"] * 2)])


def test_equal_tensors_of_two_kinds_under_one_hash_are_accepted():
    pixels = np.arange(24, dtype=np.float32).reshape(4, 6)
    twin = {
        "pixel_values": torch.from_numpy(pixels.copy()),
        "image_grid_thw": item(pixels)["image_grid_thw"],
    }
    frame = pack_group([one_step_rollout([item(pixels)], ["h"]), one_step_rollout([twin], ["h"])])
    assert list(frame["images"]) == ["h"]


def packed_frame() -> dict:
    outputs = plain_group(World(6), 3, rollouts=2)
    return unpackb(packb(pack_group(outputs)))


def test_a_step_referring_to_a_missing_image_is_refused():
    frame = packed_frame()
    missing = frame["rollouts"][1]["steps"][2]["mm"]["image"]["hashes"][2]
    del frame["images"][missing]
    with pytest.raises(
        GroupFrameError, match=rf"rollout 1, step 2: image 2 refers to image '{missing}'"
    ):
        unpack_group(frame)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda p: p.__setitem__(-1, [10_000, 4]), "past the prompt"),
        (lambda p: p.__setitem__(1, [p[0][0] + 1, 4]), "overlaps"),
        (lambda p: p.reverse(), "not sorted"),
        (lambda p: p.pop(), "3 hashes and 2 placeholders"),
        (lambda p: p.__setitem__(0, [3, 0]), "length must be > 0"),
        (lambda p: p.__setitem__(0, [3]), r"must be \[offset, length\]"),
        (lambda p: p.__setitem__(0, [p[0][0], 9, b"\xff"]), "needs a 2-byte mask, got 1"),
        (lambda p: p.__setitem__(0, [p[0][0], 8, b"\x00"]), "marks no position"),
        (lambda p: p.__setitem__(0, [p[0][0], 8, "ff"]), "mask must be bytes"),
    ],
    ids=[
        "past-end",
        "overlap",
        "unsorted",
        "count",
        "zero-length",
        "shape",
        "mask-size",
        "mask-empty",
        "mask-type",
    ],
)
def test_bad_placeholders_are_refused(tamper, message):
    frame = packed_frame()
    tamper(frame["rollouts"][0]["steps"][2]["mm"]["image"]["placeholders"])
    with pytest.raises(GroupFrameError, match=message) as exc:
        unpack_group(frame)
    assert "rollout 0, step 2" in str(exc.value)


def test_bad_frames_are_refused():
    with pytest.raises(GroupFrameError, match=r"not a vf_mm\.group/1 frame"):
        unpack_group({"format": "vf_mm.group/0"})
    with pytest.raises(GroupFrameError, match=r"not a vf_mm\.group/1 frame"):
        unpack_group([1, 2])
    frame = packed_frame()
    frame["rollouts"][0]["steps"][0]["completion_mask"] = np.zeros(9, np.uint8)
    with pytest.raises(GroupFrameError, match="rollout 0, step 0: completion_ids has"):
        unpack_group(frame)
    frame = packed_frame()
    del frame["rollouts"][1]["steps"][0]["prompt_ids"]
    with pytest.raises(GroupFrameError, match="rollout 1, step 0: the frame has no 'prompt_ids'"):
        unpack_group(frame)


def test_bad_groups_are_refused_when_packing():
    world = World(7)
    a, b = plain_group(world, 1), plain_group(world, 1)
    b[0].example_id = "other"
    with pytest.raises(GroupFrameError, match="one example"):
        pack_group([*a, *b])
    with pytest.raises(GroupFrameError, match="example_id=5"):
        pack_group(a, example_id=5)
    assert pack_group(a, example_id="ex-7")["example_id"] == "ex-7"
    with pytest.raises(GroupFrameError, match="1 advantages for 2 rollouts"):
        pack_group([*a, *a], advantages=[1.0])
    with pytest.raises(GroupFrameError, match="distinct"):
        pack_group([*a, *a], rollout_indices=[1, 1])
    bad = plain_group(world, 2)
    mm = bad[0].trajectory[1].tokens.multi_modal_data
    mm.mm_placeholders["image"][1] = PlaceholderRange(mm.mm_placeholders["image"][0].offset, 1)
    with pytest.raises(GroupFrameError, match=r"rollout 0, step 1: .*overlaps"):
        pack_group(bad)


def test_an_empty_group_is_refused_by_name_whoever_builds_it():
    """No rollouts, or a rollout with nothing in it (an agent's session whose every call
    was refused): never a frame a trainer would receive. A rollout that failed before its
    first turn still goes, with its error."""
    with pytest.raises(GroupFrameError, match=r"no rollouts \(example 'agent-1'\)"):
        pack_group([], example_id="agent-1")
    with pytest.raises(GroupFrameError, match=r"example 'agent-1', rollout 3 is empty"):
        pack_group([RolloutOutput("agent-1", [], [])], rollout_indices=[3])
    failed = RolloutOutput(0, [], [], error=RolloutError("ValueError", "no", "making the prompt"))
    assert pack_group([failed])["rollouts"][0]["steps"] == []


def test_a_stream_cut_mid_frame_gives_every_whole_group_then_a_torn_frame_error(tmp_path):
    world = World(8)
    made = [plain_group(world, 3, rollouts=2) for _ in range(3)]
    path = tmp_path / "groups.vfmm"
    write_stream(path, (pack_group(outputs) for outputs in made))
    whole = path.read_bytes()
    frame_sizes = [16 + len(packb(pack_group(outputs))) for outputs in made]
    third = 16 + frame_sizes[0] + frame_sizes[1]  # where the third frame starts
    for cut in (third + 7, third + 16 + frame_sizes[2] // 2, len(whole) - 1):
        path.write_bytes(whole[:cut])
        got = []
        with pytest.raises(TornFrameError) as exc:
            for frame in read_stream(path):
                got.append(unpack_group(frame))
        assert exc.value.index == 2 and exc.value.offset == third
        assert len(got) == 2
        for rollouts, outputs in zip(got, made, strict=False):
            assert_same_group(rollouts, outputs)


# -- the real tiny renderer ---------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    return load_renderer(build_tiny_vlm(tmp_path_factory.mktemp("sidecar") / "m", "qwen2_5_vl"))


def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8))


def user(*images: Image.Image, text: str = "where now?") -> dict:
    parts: list[dict] = [{"type": "image", "image": im} for im in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def run(client: RendererClient, messages: list, turns: list, trajectory=None):
    """Play ``turns`` (each: the user message to add after the model's reply, or a function
    of the messages giving the next prompt); returns (messages, trajectory)."""

    async def main():
        msgs, steps = list(messages), list(trajectory or [])
        for nxt in turns:
            turn = await client.generate(msgs, trajectory=steps)
            steps.append(turn.step(msgs))
            msgs = [*msgs, turn.message]
            msgs = nxt(msgs) if callable(nxt) else [*msgs, nxt]
        return msgs, steps

    return asyncio.run(main())


def rollout_of(messages: list, steps: list, n_prompt: int = 2) -> RolloutOutput:
    return RolloutOutput(
        example_id=0, prompt=messages[:n_prompt], completion=messages[n_prompt:], trajectory=steps
    )


def check_real(outputs: list[RolloutOutput]) -> tuple[dict, list[TrainingRollout]]:
    frame = pack_group(outputs)
    images = distinct_images(outputs)
    assert set(frame["images"]) == set(images)
    message = packb(frame)
    steps = sum(len(o.trajectory) for o in outputs)
    assert len(message) <= 1.05 * tensor_bytes(images) + 2048 * steps
    got = unpack_group(unpackb(message))
    assert_same_group(got, outputs)
    return frame, got


def message_refs(rollout: dict) -> set[str]:
    return {
        part["hash"]
        for m in [*rollout["prompt"], *rollout["completion"]]
        for part in (m["content"] if isinstance(m["content"], list) else [])
        if part.get("type") == "image_ref"
    }


def test_real_renderer_extension_repeat_and_compaction(renderer):
    client = RendererClient(ScriptedBackend(renderer, ["left", "up up"]), renderer)
    system = {"role": "system", "content": "navigate"}
    a, b, c = picture(1), picture(2), picture(3)

    def compact(msgs):  # drop the history (and its images), keep a summary and go on
        return [system, {"role": "user", "content": "summary: went left"}, user(c)]

    turns = [user(b), user(a, a), compact, user(b), user(c)]
    messages, steps = run(client, [system, user(a)], turns)
    assert client.stats.renders >= 2  # the compaction could not bridge
    hashes = [s.tokens.multi_modal_data.mm_hashes["image"] for s in steps]
    ha, hb, hc = (image_hash(load_image(im)) for im in (a, b, c))
    assert hashes == [
        [ha],
        [ha, hb],
        [ha, hb, ha, ha],  # a repeated: entries by position, one hash
        [hc],  # compaction: not a superset of the previous step
        [hc, hb],
    ]
    frame, _ = check_real([rollout_of(messages, steps)])
    assert list(frame["images"]) == [ha, hb, hc]
    assert message_refs(frame["rollouts"][0]) == {hb, hc}  # as the messages now stand


def test_real_renderer_branching_group(renderer):
    client = RendererClient(ScriptedBackend(renderer, ["ok", "go on"]), renderer)
    pictures = {seed: picture(seed) for seed in (10, 11, 20, 21, 22, 30, 31, 32)}
    h = {seed: image_hash(load_image(im)) for seed, im in pictures.items()}
    start = [{"role": "system", "content": "navigate"}, user(pictures[10])]
    shared_msgs, shared = run(client, start, [user(pictures[11])])
    outputs = []
    for r in range(3):
        turns = [user(pictures[20 + r]), user(pictures[30 + r])]
        msgs, steps = run(client, shared_msgs, turns, trajectory=shared)
        outputs.append(rollout_of(msgs, steps))
    frame, got = check_real(outputs)
    # the shared images once for the whole group; the last user turn's image was never
    # shown to the model, so only the messages refer to it
    assert set(frame["images"]) == {h[10], h[11], h[20], h[21], h[22]}
    for r in range(3):
        assert message_refs(frame["rollouts"][r]) == {h[10], h[11], h[20 + r], h[30 + r]}
    # the shared steps' items are one object in every rollout
    first = [g.trajectory[0].tokens.multi_modal_data.mm_items["image"][0] for g in got]
    assert first[0] is first[1] is first[2]


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("answer", "caf\udce9", "answer"),
        ("info", {"source": {"notes": ["ok", "\ud800"]}}, "info.source.notes[1]"),
        ("metrics", {"\udce9": 1.0}, "metrics.\udce9 (the key)"),
    ],
)
def test_a_lone_surrogate_in_a_rollouts_text_is_refused_naming_the_field(field, value, path):
    """msgpack's strings are UTF-8: the codec failed with "surrogates not allowed",
    naming neither the rollout nor the field, and stream_rollouts stripped the group."""
    outputs = plain_group(World(4), 1, rollouts=2)
    setattr(outputs[1], field, value)
    with pytest.raises(GroupFrameError) as info:
        pack_group(outputs)
    message = str(info.value)
    assert message.startswith(f"example 'ex-7', rollout 1, field {path!r}: the text holds a lone")
    assert 'raw.decode("utf-8")' in message
