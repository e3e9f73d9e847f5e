"""pack_group / unpack_group with videos: each distinct clip's tensors once per group, in
the same item table as the images, through the real wire; message clips become
``video_ref`` s whose hash is the renderer's ``mm_hash``, so a trainer finds their tensors.
"""

from __future__ import annotations

import asyncio
import base64
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.results._clips import encode, frames
from vf_mm import RendererClient
from vf_mm.errors import GroupFrameError
from vf_mm.images import image_hash, load_image
from vf_mm.renderers import load_renderer
from vf_mm.results import AssetStore
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import pack_group, unpack_group
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutOutput,
    TrajectoryStep,
)
from vf_mm.videos import Video, load_video, video_hash, video_mm_hash
from vf_mm.wire import packb, read_stream, unpackb, write_stream

IMAGE_PAD, VIDEO_PAD, TEXT = 151655, 151656, 7


# -- a synthetic group of images and videos -------------------------------------------------


class Mixed:
    """Items of two modalities (video items: Qwen-VL's keys and shapes) and steps whose
    prompts show some of them, in any order, repeats included."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.items: dict[str, tuple[str, dict[str, np.ndarray]]] = {}

    def new(self, modality: str) -> str:
        h = self.rng.bytes(16).hex()
        rows = 4 * int(self.rng.integers(1, 6))
        if modality == "video":
            item = {
                "pixel_values_videos": self.rng.standard_normal((rows, 48), dtype=np.float32),
                "video_grid_thw": np.array([[2, 2, rows // 4]], dtype=np.int64),
                "second_per_grid_ts": np.array([0.5], dtype=np.float32),
            }
        else:
            item = {
                "pixel_values": self.rng.standard_normal((rows, 48), dtype=np.float32),
                "image_grid_thw": np.array([[1, 2, rows // 2]], dtype=np.int64),
            }
        self.items[h] = (modality, item)
        return h

    def step(self, shown: list[str]) -> TrajectoryStep:
        ids: list[int] = [TEXT]
        hashes: dict[str, list[str]] = {}
        ranges: dict[str, list[PlaceholderRange]] = {}
        items: dict[str, list[dict]] = {}
        for h in shown:
            modality, item = self.items[h]
            n = min(len(next(iter(item.values()))) // 4, 8)  # placeholder tokens
            ranges.setdefault(modality, []).append(PlaceholderRange(len(ids), n))
            ids += [VIDEO_PAD if modality == "video" else IMAGE_PAD] * n + [TEXT]
            hashes.setdefault(modality, []).append(h)
            items.setdefault(modality, []).append(item)
        mm = MultiModalData(hashes, ranges, items) if hashes else None
        completion = self.rng.integers(10, 1000, int(self.rng.integers(1, 4))).tolist()
        tokens = ResponseTokens(ids, completion, [-0.25] * len(completion), [1] * len(completion),
                                "stop", mm)  # fmt: skip
        return TrajectoryStep(prompt=[], completion=[], tokens=tokens, reward=None)


def distinct(outputs: list[RolloutOutput]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for o in outputs:
        for step in o.trajectory:
            mm = step.tokens.multi_modal_data if step.tokens else None
            for m, hashes in (mm.mm_hashes if mm else {}).items():
                for h, item in zip(hashes, mm.mm_items[m], strict=True):
                    found.setdefault(h, item)
    return found


def tensor_bytes(items: dict[str, dict]) -> int:
    return sum(np.asarray(v).nbytes for item in items.values() for v in item.values())


def assert_same_group(got, outputs) -> None:
    """Every step's sidecar as packed, and one read-only item object per hash."""
    by_hash: dict[str, Any] = {}
    for g, o in zip(got, outputs, strict=True):
        for gs, os_ in zip(g.trajectory, o.trajectory, strict=True):
            a, b = gs.tokens.multi_modal_data, os_.tokens.multi_modal_data
            assert gs.tokens.prompt_ids == os_.tokens.prompt_ids
            if b is None:
                assert a is None
                continue
            assert a.mm_hashes == b.mm_hashes and a.mm_placeholders == b.mm_placeholders
            for m, items in b.mm_items.items():
                for h, gi, ri in zip(b.mm_hashes[m], a.mm_items[m], items, strict=True):
                    assert by_hash.setdefault(h, gi) is gi
                    assert gi.keys() == ri.keys()
                    for key in ri:
                        got_array = np.asarray(gi[key])
                        assert got_array.dtype == ri[key].dtype
                        assert got_array.tobytes() == ri[key].tobytes()
                        assert not got_array.flags.writeable


shows = st.lists(st.tuples(st.sampled_from(["image", "video", "old"]), st.booleans()), max_size=5)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.lists(shows, min_size=1, max_size=4), shows)
def test_images_and_videos_round_trip_each_once_per_group(seed, rollouts, shared):
    world = Mixed(seed)

    def play(plan: list, seen: list[str], steps: list) -> None:
        for kind, keep in plan:
            if kind == "old" and seen:
                h = seen[int(world.rng.integers(len(seen)))]
            else:
                h = world.new("video" if kind == "old" else kind)
            shown = [*seen, h] if keep else [h, h]  # extension, or a compaction with a repeat
            seen[:] = shown
            steps.append(world.step(shown))

    base_seen: list[str] = []
    base_steps: list = []
    play(shared, base_seen, base_steps)
    outputs = []
    for plan in rollouts:
        seen, steps = list(base_seen), list(base_steps)
        play(plan, seen, steps)
        # a prompt: a plan may add no step, and a rollout with nothing in it is refused
        outputs.append(
            RolloutOutput("ex", [{"role": "user", "content": "go"}], [], trajectory=steps)
        )
    frame = pack_group(outputs)
    items = distinct(outputs)
    assert set(frame["images"]) == set(items)  # images and videos: one table, each once
    message = packb(frame)
    steps = sum(len(o.trajectory) for o in outputs)
    assert len(message) <= 1.05 * tensor_bytes(items) + 400 * len(items) + 600 * steps + 1024
    assert_same_group(unpack_group(unpackb(message)), outputs)


def test_a_video_shown_in_every_turn_of_every_rollout_travels_once(tmp_path):
    world = Mixed(1)
    clip = world.new("video")
    big = world.items[clip][1]
    big["pixel_values_videos"] = np.ones((512, 1176), np.float32)  # 2.4 MB
    outputs = []
    for _ in range(4):
        steps = [world.step([clip] * (t + 1)) for t in range(6)]  # 24 steps, 84 references
        outputs.append(RolloutOutput("ex", [], [], trajectory=steps))
    message = packb(pack_group(outputs))
    assert len(message) <= 1.01 * tensor_bytes({clip: big}) + 64 * 1024
    path = tmp_path / "groups.vfmm"
    write_stream(path, [pack_group(outputs)])
    (frame,) = read_stream(path)
    assert_same_group(unpack_group(frame), outputs)


# -- refusals ------------------------------------------------------------------------------


def one_step(modality: str, item: dict, h: str = "h1") -> RolloutOutput:
    mm = MultiModalData({modality: [h]}, {modality: [PlaceholderRange(1, 2)]}, {modality: [item]})
    tokens = ResponseTokens([TEXT, VIDEO_PAD, VIDEO_PAD, TEXT], [5], [-0.1], [1], "stop", mm)
    return RolloutOutput(0, [], [], trajectory=[TrajectoryStep([], [], tokens)])


def video_item(value: float) -> dict:
    return {"pixel_values_videos": np.full((8, 6), value, np.float32),
            "video_grid_thw": np.array([[2, 2, 2]], dtype=np.int64)}  # fmt: skip


def test_two_different_tensors_claiming_one_video_hash_are_refused():
    with pytest.raises(GroupFrameError, match="two different tensors claim video hash h1") as exc:
        pack_group([one_step("video", video_item(1)), one_step("video", video_item(2))])
    assert "rollout 1, step 0, video 0" in str(exc.value)
    frame = pack_group([one_step("video", video_item(1)), one_step("video", video_item(1))])
    assert list(frame["images"]) == ["h1"]  # equal tensors: stored once


def test_one_hash_for_an_image_and_a_video_is_refused_packing_and_unpacking():
    image = {"pixel_values": np.ones((8, 6), np.float32)}
    with pytest.raises(GroupFrameError, match="names a video here but an image elsewhere"):
        pack_group([one_step("image", image), one_step("video", video_item(1))])
    frame = unpackb(packb(pack_group([one_step("video", video_item(1), "v"),
                                      one_step("image", image, "i")])))  # fmt: skip
    step = frame["rollouts"][1]["steps"][0]["mm"]
    step["image"]["hashes"] = ["v"]  # the image entry now names the video's item
    with pytest.raises(GroupFrameError, match=r"rollout 1, step 0, image 0: hash v names an image"):
        unpack_group(frame)


def test_a_step_referring_to_a_missing_video_is_refused():
    frame = unpackb(packb(pack_group([one_step("video", video_item(1), "v")])))
    del frame["images"]["v"]
    with pytest.raises(GroupFrameError, match=r"rollout 0, step 0: video 0 refers to video 'v'"):
        unpack_group(frame)


# -- message parts: video_ref with the renderer's mm_hash ----------------------------------------


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    return load_renderer(build_tiny_vlm(tmp_path_factory.mktemp("vid") / "m", "qwen2_5_vl"))


def clip(seed: int) -> np.ndarray:
    return frames(seed, t=4, h=28, w=28)


def test_video_mm_hash_is_the_renderers(renderer):
    pixels = clip(1)
    parts = [
        {"type": "video", "video": pixels, "frame_rate": 4.0},
        {"type": "video", "video": pixels, "frame_rate": 4.0, "num_frames": 2},
        {"type": "video", "video": pixels, "frame_rate": 4.0, "fps": 2.0, "max_pixels": 50_000},
        {"type": "video", "video": pixels, "frame_rate": 4.0, "do_sample_frames": False},
    ]
    content = [*parts, {"type": "text", "text": "?"}]
    rendered = renderer.render([{"role": "user", "content": content}]).multi_modal_data
    content_hash = video_hash(load_video(parts[0]))
    assert [video_mm_hash(content_hash, p) for p in parts] == rendered.mm_hashes["video"]
    assert video_mm_hash(content_hash, parts[0]) == content_hash
    assert len(set(rendered.mm_hashes["video"])) == 4


def test_message_videos_become_hash_references(tmp_path: Path):
    pixels = clip(2)
    part = {"type": "video", "video": pixels, "frame_rate": 4.0}
    h = video_hash(load_video(part))
    data = encode(pixels, "mp4")
    hm = video_hash(load_video(data))
    path = tmp_path / "c.mp4"
    path.write_bytes(data)
    http = {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}
    data_url = {"type": "video_url",
                "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}}  # fmt: skip
    asset = f"assets/{'ab' * 16}.mkv"
    content = [
        part,
        {"type": "video", "video": list(pixels), "frame_rate": 4.0},
        {"type": "video", "video": [Image.fromarray(f) for f in pixels], "frame_rate": 4.0},
        {"type": "video", "video": Video(pixels, fps=4.0)},
        {"type": "video", "video": pixels, "frame_rate": 4.0, "num_frames": 2},
        {"type": "video", "video": data},
        {"type": "video", "video": str(path)},
        {"type": "video_url", "video_url": {"url": path.as_uri()}},
        {"type": "video_url", "video_url": {"url": asset}, "frame_rate": 4.0},
        {"type": "video_url", "video_url": {"url": asset}, "num_frames": 2},
        http,
        data_url,
        {"type": "text", "text": "and"},
        {"type": "image", "image": Image.fromarray(pixels[0])},
    ]
    outputs = [RolloutOutput(1, [{"role": "user", "content": content}], []) for _ in range(2)]
    frame = pack_group(outputs)
    got = frame["rollouts"][1]["prompt"][0]["content"]

    def ref(x: str) -> dict:
        return {"type": "video_ref", "hash": x}

    assert got == [
        ref(h), ref(h), ref(h), ref(h), ref(video_mm_hash(h, {"num_frames": 2})),
        ref(hm), ref(hm), ref(hm), ref("ab" * 16), ref(video_mm_hash("ab" * 16, {"num_frames": 2})),
        http, data_url, {"type": "text", "text": "and"},
        {"type": "image_ref", "hash": image_hash(load_image(Image.fromarray(pixels[0])))},
    ]  # fmt: skip
    assert content[0]["video"] is pixels  # the caller's messages are untouched
    assert unpack_group(unpackb(packb(frame)))[0].prompt[0]["content"] == got


def test_a_clip_is_loaded_once_per_group_however_often_messages_show_it(monkeypatch):
    import vf_mm.training._groups as groups

    calls = []
    real = groups.load_video
    monkeypatch.setattr(groups, "load_video", lambda *a, **k: calls.append(1) or real(*a, **k))
    pixels = clip(3)
    part = {"type": "video", "video": pixels, "frame_rate": 4.0}
    message = {"role": "user", "content": [part, dict(part), {**part, "num_frames": 2}]}
    pack_group([RolloutOutput(0, [message], []) for _ in range(3)])
    assert len(calls) == 1


def test_a_video_that_does_not_load_names_its_place(tmp_path):
    bad = {"role": "user", "content": [{"type": "video", "video": str(tmp_path / "gone.mp4")}]}
    with pytest.raises(Exception, match="no such file") as exc:
        pack_group([RolloutOutput(0, [bad], [])])
    assert any("rollout 0, prompt, message 0, part 0" in note for note in exc.value.__notes__)


# -- the real renderer: two rollouts share a clip ------------------------------------------------


def run(client: RendererClient, messages: list, turns: list) -> tuple[list, list]:
    async def main():
        msgs, steps = list(messages), []
        for nxt in turns:
            turn = await client.generate(msgs, trajectory=steps)
            steps.append(turn.step(msgs))
            msgs = [*msgs, turn.message, nxt]
        return msgs, steps

    return asyncio.run(main())


def watch(pixels: np.ndarray, **keys) -> dict:
    return {"role": "user", "content": [{"type": "video", "video": pixels, "frame_rate": 4.0,
                                         **keys}, {"type": "text", "text": "what now?"}]}  # fmt: skip


def test_two_rollouts_sharing_a_clip_carry_its_tensors_once(renderer, tmp_path):
    shared = frames(10, t=8, h=56, w=56)
    client = RendererClient(ScriptedBackend(renderer, ["left", "right"]), renderer)
    start = [{"role": "system", "content": "watch"}, watch(shared)]
    outputs = []
    for r in range(2):  # each rollout: the shared clip, then a clip of its own, then again
        mine = frames(20 + r, t=4, h=56, w=56)
        messages, steps = run(client, start, [watch(mine), watch(shared, num_frames=4)])
        outputs.append(RolloutOutput(0, messages[:2], messages[2:], trajectory=steps))
    items = distinct(outputs)
    hashes = [s.tokens.multi_modal_data.mm_hashes.get("video", []) for s in outputs[0].trajectory]
    h_shared = video_hash(load_video(watch(shared)["content"][0]))
    assert hashes[0] == [h_shared] and hashes[1][0] == h_shared
    assert len(items) == 3  # the shared clip, and each rollout's own
    references = sum(len(h) for o in outputs for s in o.trajectory
                     for h in s.tokens.multi_modal_data.mm_hashes.values())  # fmt: skip
    assert references == 6
    frame = pack_group(outputs)
    assert set(frame["images"]) == set(items)
    message = packb(frame)
    assert len(message) <= 1.05 * tensor_bytes(items) + 8192
    # the shared clip's bytes are in the message once, however many rollouts show it
    pixels_bytes = items[h_shared]["pixel_values_videos"].tobytes()
    assert bytes(message).count(pixels_bytes[:4096]) == 1
    got = unpack_group(unpackb(message))
    assert_same_group(got, outputs)
    first = [g.trajectory[0].tokens.multi_modal_data.mm_items["video"][0] for g in got]
    assert first[0] is first[1]  # one item object for the whole group
    # every clip in the messages is a reference a trainer finds in the table, or a clip
    # the model was never shown (the last user turn): the renderer's hash either way
    last = video_mm_hash(h_shared, {"num_frames": 4})
    for rollout in frame["rollouts"]:
        refs = [p["hash"] for m in [*rollout["prompt"], *rollout["completion"]]
                if isinstance(m["content"], list) for p in m["content"]
                if p.get("type") == "video_ref"]  # fmt: skip
        assert refs[0] == h_shared and refs[-1] == last
        assert all(h in frame["images"] for h in refs[:-1])


def test_a_results_file_and_a_group_name_a_clip_alike(renderer, tmp_path):
    """A clip stored by the results writer and packed from results.jsonl's messages is
    the same reference as the clip in memory: the renderer's hash, without reading it."""
    part = watch(frames(30))["content"][0]
    (stored,) = AssetStore(tmp_path).to_jsonable([{"role": "user", "content": [part]}])
    rendered = renderer.render([{"role": "user", "content": [part]}]).multi_modal_data
    from_file = pack_group([RolloutOutput(0, [stored], [])])["rollouts"][0]["prompt"]
    from_memory = pack_group([RolloutOutput(0, [{"role": "user", "content": [part]}], [])])
    assert from_file[0]["content"] == from_memory["rollouts"][0]["prompt"][0]["content"]
    assert from_file[0]["content"][0]["hash"] == rendered.mm_hashes["video"][0]
    assert math.isfinite(stored["content"][0]["frame_rate"])
    # re-rendering the stored part gives the very item: the same content hash (and so the
    # same tensors: a fresh renderer computes them from the same frames and rate)
    (again,) = stored["content"]
    again = {**again, "video_url": {"url": str(tmp_path / again["video_url"]["url"])}}
    rerendered = renderer.render([{"role": "user", "content": [again]}]).multi_modal_data
    assert rerendered.mm_hashes == rendered.mm_hashes
    for key, value in rendered.mm_items["video"][0].items():
        assert np.array_equal(rerendered.mm_items["video"][0][key], value)
