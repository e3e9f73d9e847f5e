"""Tests of the ``motion`` example environment (run from the repo root: pytest environments)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import vf_mm as vf
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.videos import Video

ENV_DIR = Path(__file__).resolve().parents[1]
REPO = ENV_DIR.parents[1]


def _load_module(name: str):
    """The environment module, loaded from its file as ``load_environment`` loads it."""
    path = ENV_DIR / f"{name}.py"
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(path):
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


motion = _load_module("motion")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("motion") / "m", "qwen2_5_vl")


@pytest.fixture(scope="module")
def env():
    return _env()


def _env(**kwargs):
    kwargs.setdefault("num_examples", 6)
    kwargs.setdefault("num_eval_examples", 4)
    return motion.load_environment(**kwargs)


def _rows(difficulty: str, n: int = 24, **overrides):
    """``n`` eval rows of a difficulty preset (the kinds take turns)."""
    config = {**motion.PRESETS[difficulty], "width": 112, "height": 112, "num_frames": 16,
              "fps": 4.0, **overrides}  # fmt: skip
    return [motion.make_example(7, "eval", i, config) for i in range(n)]


def _call(name, **args):
    return {
        "id": "call_0",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _state(env, row):
    state = env.new_state(row, example_id=0, rollout_index=0)
    asyncio.run(env.setup_state(state))
    return state


def _tool_call_text(name, **args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def _mask(frame: np.ndarray, colour: str) -> np.ndarray:
    return np.all(frame == motion.COLOURS[colour], axis=-1)


# -- the data ---------------------------------------------------------------------------------


def test_dataset_is_deterministic_under_a_seed(env):
    def fingerprint(rows):
        return [
            (r["question"], r["answer"], r["info"], motion.render_clip(r["info"]).frames.tobytes())
            for r in rows
        ]

    assert fingerprint(env.get_dataset()) == fingerprint(_env().get_dataset())
    assert fingerprint(env.get_eval_dataset()) == fingerprint(_env().get_eval_dataset())
    assert fingerprint(env.get_dataset()) != fingerprint(_env(seed=1).get_dataset())
    assert fingerprint(env.get_dataset())[:4] != fingerprint(
        env.get_eval_dataset()
    )  # splits differ


def test_rows_hold_no_frames_and_the_prompt_holds_the_clip(env):
    row = env.get_eval_dataset(1)[0]
    assert set(row) == {"question", "answer", "info"}  # the frames are drawn from info
    prompt = env.format_prompt(row)
    assert [m["role"] for m in prompt] == ["system", "user"]
    video_part, text_part = prompt[1]["content"]
    assert video_part["type"] == "video" and text_part == {"type": "text", "text": row["question"]}
    clip = video_part["video"]
    assert isinstance(clip, Video) and clip.frames.shape == (16, 112, 112, 3) and clip.fps == 4.0
    assert np.array_equal(clip.frames, motion.render_clip(row["info"]).frames)

    options = {"do_sample_frames": False}
    small = _env(width=96, height=64, num_frames=12, fps=6, kinds=["direction"],
                 video_options=options, num_examples=1, num_eval_examples=1)  # fmt: skip
    part = small.format_prompt(small.get_eval_dataset()[0])[1]["content"][0]
    assert part["video"].frames.shape == (12, 64, 96, 3) and part["video"].fps == 6.0
    assert part["do_sample_frames"] is False
    assert "12 frames of 96x64 pixels at 6 fps (2.0 s)" in small.get_eval_dataset()[0]["question"]


def test_every_kind_is_asked():
    for difficulty, kinds in [("easy", {"direction", "blinks"}), ("medium", set(motion.KINDS))]:
        assert {r["info"]["kind"] for r in _rows(difficulty, 6)} == kinds
    assert {r["info"]["kind"] for r in _rows("medium", 6, kinds=("blinks",))} == {"blinks"}


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_direction_answers_match_the_balls_in_the_frames(difficulty):
    seen = set()
    for row in _rows(difficulty, 40, kinds=("direction",)):
        frames = motion.render_clip(row["info"]).frames
        ball = row["info"]["objects"][0]
        assert ball["shape"] == "ball" and ball["colour"] in row["question"]
        first, last = _mask(frames[0], ball["colour"]), _mask(frames[-1], ball["colour"])
        assert first.sum() > 20 and first.sum() == last.sum()  # the whole ball, on top
        (y0, x0), (y1, x1) = np.argwhere(first).mean(0), np.argwhere(last).mean(0)
        dx, dy = x1 - x0, y1 - y0
        way = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")
        assert way == row["answer"] and max(abs(dx), abs(dy)) > 20 and min(abs(dx), abs(dy)) == 0
        for other in row["info"]["objects"][1:]:  # distractors move other ways
            (ox0, oy0), (ox1, oy1) = other["start"], other["end"]
            other_way = ("right" if ox1 > ox0 else "left") if ox1 != ox0 else (
                "down" if oy1 > oy0 else "up")  # fmt: skip
            assert other_way != row["answer"]
        seen.add(row["answer"])
    assert seen == set(motion.DIRECTIONS)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_blink_answers_count_the_lights_switching_on_in_the_frames(difficulty):
    seen = set()
    preset = motion.PRESETS[difficulty]
    for row in _rows(difficulty, 40, kinds=("blinks",)):
        frames = motion.render_clip(row["info"]).frames
        counts = []
        for light in row["info"]["objects"]:
            x, y = light["start"]
            pixels = [tuple(int(v) for v in frame[y, x]) for frame in frames]
            assert set(pixels) <= {motion.COLOURS[light["colour"]], motion.LIGHT_OFF}
            on = [p == motion.COLOURS[light["colour"]] for p in pixels]
            assert not on[0]  # off at the start
            counts.append(sum(not a and b for a, b in itertools.pairwise(on)))
            runs = [len(list(run)) for _, run in itertools.groupby(on)]
            assert len(runs) == 2 * counts[-1] + 1 and min(runs) >= preset["min_phase_frames"]
        assert str(counts[0]) == row["answer"] and 1 <= counts[0] <= preset["max_blinks"]
        assert all(c != counts[0] for c in counts[1:])  # distractors blink other numbers
        seen.add(counts[0])
    assert seen == set(range(1, preset["max_blinks"] + 1))


@pytest.mark.parametrize("difficulty", ["medium", "hard"])
def test_which_first_answers_match_the_frames(difficulty):
    for row in _rows(difficulty, 30, kinds=("which_first",)):
        frames = motion.render_clip(row["info"]).frames
        first, other = row["info"]["objects"][:2]
        assert row["answer"] == f"{first['colour']} {first['shape']}"
        assert first["colour"] != other["colour"] and first["shape"] != other["shape"]
        for obj in (first, other):
            assert f"the {obj['colour']} {obj['shape']}" in row["question"]
        appear = [
            next(i for i, f in enumerate(frames) if _mask(f, obj["colour"]).any())
            for obj in (first, other)
        ]
        assert appear[0] >= 1 and appear[0] + 2 <= appear[1] <= len(frames) - 2
        assert not _mask(frames[0], first["colour"]).any()
        assert all(_mask(f, first["colour"]).any() for f in frames[appear[0] :])  # it stays


# -- the tools -------------------------------------------------------------------------------


def test_slow_clip_draws_the_same_motion_at_a_finer_step(env):
    for row in env.get_eval_dataset():
        clip = motion.render_clip(row["info"])
        for factor in (2, 3, 4):
            video, used, note = motion.slow_clip(row["info"], factor)
            assert used == factor and video.fps == clip.fps == 4.0
            assert video.frames.shape == (15 * factor + 1, 112, 112, 3)
            assert np.array_equal(video.frames[::factor], clip.frames)
            assert f"{factor}x slower: {15 * factor + 1} frames at 4 fps" in note
    row = next(r for r in env.get_dataset() if r["info"]["kind"] == "direction")
    video, _, _ = motion.slow_clip(row["info"], 4)
    colour = row["info"]["objects"][0]["colour"]
    xs = [np.argwhere(_mask(f, colour))[:, ::-1].mean(0) for f in video.frames]
    steps = np.diff(xs, axis=0)
    assert (np.abs(steps).sum(1) > 0).sum() > 15  # the ball moves in between the clip's frames

    for factor, max_factor in [(1, 4), (5, 4), (9, 8), ("fast", 4), (2.5, 4), (True, 4), (None, 4)]:
        out = motion.slow_clip(row["info"], factor, max_factor=max_factor)
        assert isinstance(out, str) and out.startswith("Error: factor must be a whole number")
    assert isinstance(motion.slow_clip(row["info"], "3")[0], Video)


def test_zoom_frames_crops_clips_and_enlarges(env):
    clip = motion.render_clip(env.get_dataset()[0]["info"])
    video, region, note = motion.zoom_frames(clip, 10, 20, 56, 28, output_size=224)
    assert region == (10, 20, 56, 28) and video.frames.shape == (16, 112, 224, 3)
    assert video.fps == 4.0 and "4x enlarged: 16 frames at 4 fps" in note
    assert np.array_equal(video.frames[:, ::4, ::4], clip.frames[:, 20:48, 10:66])
    assert np.array_equal(video.frames[:, 3::4, 3::4], clip.frames[:, 20:48, 10:66])

    video, region, note = motion.zoom_frames(clip, 0, 0, 112, 112, output_size=200)
    assert region == (0, 0, 112, 112) and np.array_equal(video.frames, clip.frames)
    assert "enlarged" not in note

    video, region, note = motion.zoom_frames(clip, 100, -10, "40", 30.0)
    assert region == (100, 0, 12, 20) and "clipped to the 112x112 frame" in note

    for args, message in [
        ((200, 0, 10, 10), "outside the frames"),
        ((0, 0, 4, 50), "at least 8"),
        ((0, 0, -10, 50), "at least 8"),
        (("left", 0, 10, 10), "x must be an integer"),
        ((0, True, 10, 10), "y must be an integer"),
        ((0, 0, 10.5, 10), "w must be an integer"),
    ]:
        out = motion.zoom_frames(clip, *args)
        assert isinstance(out, str) and out.startswith("Error") and message in out


def test_the_tools_answer_with_a_video_or_an_error(env):
    row = env.get_eval_dataset(1)[0]
    state = _state(env, row)
    assert state["clip"].frames.shape == (16, 112, 112, 3)
    parts = asyncio.run(env.call_tool(_call("slow_replay", factor=2), state))
    assert [p["type"] for p in parts] == ["video", "text"] and "2x slower" in parts[1]["text"]
    assert parts[0]["video"].frames.shape == (31, 112, 112, 3) and parts[0]["video"].fps == 4.0
    parts = asyncio.run(env.call_tool(_call("zoom_clip", x=8, y=8, w=48, h=48), state))
    assert [p["type"] for p in parts] == ["video", "text"] and "4x enlarged" in parts[1]["text"]
    assert parts[0]["video"].frames.shape == (16, 192, 192, 3)
    assert state["replays"] == [["slow", 2], ["zoom", 8, 8, 48, 48]]

    bad = [
        (_call("slow_replay", factor=10), "factor must be a whole number from 2 to 4"),
        (_call("slow_replay"), "missing 1 required"),
        (_call("slow_replay", factor=2, speed=3), "unexpected keyword argument 'speed'"),
        (_call("zoom_clip", x=1, y=2, w=3), "missing 1 required"),
        (_call("zoom_clip", x=500, y=0, w=30, h=30), "outside the frames"),
        ({"function": {"name": "zoom_clip", "arguments": "{not json"}}, "JSONDecodeError"),
        ({"function": {"name": "zoom_clip", "arguments": "[1, 2]"}}, "must be a JSON object"),
        (_call("rewind", seconds=2), "unknown tool 'rewind'; available: slow_replay, zoom_clip"),
    ]
    for call, message in bad:
        out = asyncio.run(env.call_tool(call, state))
        assert isinstance(out, str) and out.startswith("Error") and message in out, out
    assert state["tool_errors"] == len(bad) and len(state["replays"]) == 2

    message = {"role": "assistant", "content": "", "tool_calls": [_call("slow_replay", factor=3)]}
    (reply,) = asyncio.run(env.env_response([message], state))
    assert reply["role"] == "tool" and reply["name"] == "slow_replay"
    assert reply["content"][0]["video"].num_frames == 46

    names = [t["function"]["name"] for t in env.tools]
    assert names == ["slow_replay", "zoom_clip"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["factor"]
    assert set(env.tools[1]["function"]["parameters"]["required"]) == {"x", "y", "w", "h"}
    assert "state" not in env.tools[0]["function"]["parameters"]["properties"]


def test_video_options_go_in_the_tools_clips_too():
    env = _env(video_options={"fps": 4}, num_examples=1, num_eval_examples=1)
    state = _state(env, env.get_eval_dataset()[0])
    parts = asyncio.run(env.call_tool(_call("zoom_clip", x=0, y=0, w=56, h=56), state))
    assert parts[0]["fps"] == 4 and state["prompt"][1]["content"][0]["fps"] == 4


def test_the_system_prompt_names_the_largest_slow_factor():
    env = _env(max_slow_factor=6, num_examples=1, num_eval_examples=1)
    assert (
        "(factor 2 to 6)" in env.system_prompt and "{" + "max_slow_factor}" not in env.system_prompt
    )
    state = _state(env, env.get_eval_dataset()[0])
    parts = asyncio.run(env.call_tool(_call("slow_replay", factor=6), state))
    assert parts[0]["video"].num_frames == 91
    assert "from 2 to 6" in asyncio.run(env.call_tool(_call("slow_replay", factor=7), state))
    assert _env(system_prompt=None, num_examples=1, num_eval_examples=1).system_prompt is None


# -- scoring ---------------------------------------------------------------------------------


def test_normalize_answer():
    n = motion.normalize_answer
    assert n("Left.") == n("left") == n("It moved to the LEFT!") == n("leftwards") == "left"
    assert n("3") == n("three") == n("Three times.") == n("03") == "3"
    assert n("twice") == "2" and n("once") == "1" and n("Upward") == "up"
    assert n("The Red circle") == "red circle" and n(None) == ""


def test_reward_is_one_for_a_correct_answer_and_zero_otherwise(env):
    def score(row, completion):
        state = {"prompt": [], "completion": completion, "answer": row["answer"],
                 "info": row["info"]}  # fmt: skip
        return asyncio.run(env.rubric.score_rollout(state))

    def said(text):
        return [{"role": "assistant", "content": f"<answer>{text}</answer>"}]

    for row in _rows("hard", 12):
        answer, info = row["answer"], row["info"]
        call = {"role": "assistant", "content": "", "tool_calls": [_call("slow_replay", factor=2)]}
        reward, metrics = score(row, [call, {"role": "tool", "content": "..."}, *said(answer)])
        assert reward == 1.0 and metrics["tool_calls"] == metrics["answer_format"] == 1.0
        if info["kind"] == "direction":
            right = [f"{answer.title()}.", f"It moved to the {answer}"]
            wrong = [d for d in motion.DIRECTIONS if d != answer] + [f"{answer} then back"]
        elif info["kind"] == "blinks":
            words = {v: k for k, v in motion.NUMBER_WORDS.items() if len(k) > 3}
            right = [words.get(answer, answer), f"{answer} times"]
            wrong = [str(int(answer) + 1), "0", "many"]
        else:
            first, other = info["objects"][:2]
            right = [first["colour"], first["shape"].title(), f"The {answer}."]
            wrong = [other["colour"], f"the {other['colour']} {other['shape']}",
                     f"{first['colour']} {other['shape']}", "neither"]  # fmt: skip
        for text in right:
            assert score(row, said(text))[0] == 1.0, text
        for text in wrong:
            assert score(row, said(text))[0] == 0.0, text
        reward, metrics = score(row, [{"role": "assistant", "content": answer}])  # no tags
        assert reward == 0.0 and metrics["answer_format"] == 0.0


# -- rollouts --------------------------------------------------------------------------------


def _rollout(env, model, row, replies):
    renderer = load_renderer(model)
    backend = ScriptedBackend(renderer, replies)

    async def run():
        state = await env.rollout(vf.RendererClient(backend, renderer), row)
        return state, (await env.score([state]))[0]

    state, out = asyncio.run(run())
    return state, out, backend.requests, renderer


def test_scripted_rollout_replays_slowly_then_answers_correctly(env, model):
    row = env.get_eval_dataset(1)[0]
    state, out, requests, renderer = _rollout(
        env, model, row,
        [_tool_call_text("slow_replay", factor=2), f"<answer>{row['answer']}</answer>"],
    )  # fmt: skip
    assert out.error is None, out.error
    assert out.reward == 1.0 and out.metrics["tool_calls"] == out.metrics["answer_format"] == 1.0
    assert state["turn"] == 2 and [m["role"] for m in out.completion] == [
        "assistant",
        "tool",
        "assistant",
    ]
    assert out.completion[1]["content"][0]["video"].num_frames == 31
    first, second = requests
    pad = renderer.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert len(first.multi_modal_data.mm_placeholders["video"]) == 1
    assert len(second.multi_modal_data.mm_placeholders["video"]) == 2
    assert second.prompt_ids.count(pad) > 2 * first.prompt_ids.count(pad)  # 31 frames vs 16
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids  # bridged


def test_scripted_rollout_zooms_then_answers_wrongly(env, model):
    row = next(r for r in env.get_eval_dataset() if r["info"]["kind"] == "direction")
    wrong = next(d for d in motion.DIRECTIONS if d != row["answer"])
    state, out, requests, _ = _rollout(
        env, model, row,
        [_tool_call_text("zoom_clip", x=0, y=0, w=56, h=56), f"<answer>{wrong}</answer>"],
    )  # fmt: skip
    assert out.error is None, out.error
    assert out.reward == 0.0 and out.metrics["tool_calls"] == out.metrics["answer_format"] == 1.0
    assert state["replays"] == [["zoom", 0, 0, 56, 56]]
    assert len(requests[1].multi_modal_data.mm_placeholders["video"]) == 2


def test_check_environment_passes(env, model):
    report = vf.check_environment(env, model_dir=model)
    assert report["rows"] == 2 and report["warnings"] == []
    # the schema's smallest arguments are refused (and said so); real ones show a clip
    assert "factor must be a whole number" in report["tool_errors"]["slow_replay"]
    assert "at least 8 pixels" in report["tool_errors"]["zoom_clip"]
    args = {"slow_replay": {"factor": 2}, "zoom_clip": {"x": 0, "y": 0, "w": 56, "h": 56}}
    report = vf.check_environment(env, model_dir=model, tool_args=args)
    # the prompt's clip on turn 1, then one tool clip per later turn
    assert report["videos"] == 2 and report["images_per_turn"][0][0] == 0
    assert all(turns[0] == 1 and all(n <= 1 for n in turns[1:])
               for turns in report["videos_per_turn"])  # fmt: skip
    assert report["tool_errors"] == {} and report["tool_calls"] == {
        "slow_replay": 4,
        "zoom_clip": 4,
    }
    assert (
        report["rewards"] == [0.0] * 4
    )  # the default reply, "I think the answer is 1.", has no tags


def test_bad_arguments_are_refused():
    for kwargs, message in [
        (dict(difficulty="extreme"), "difficulty"),
        (dict(kinds=["colour"]), "kinds"),
        (dict(num_distractors=9), "num_distractors"),
        (dict(max_blinks=6), "max_blinks"),
        (dict(num_frames=8), "num_frames must be in 11..256"),
        (dict(difficulty="easy", num_frames=12), "num_frames must be in 14..256"),
        (dict(width=16), "width and height"),
        (dict(fps=0), "fps"),
        (dict(max_slow_factor=1), "max_slow_factor"),
        (dict(zoom_output_size="big"), "zoom_output_size"),
        (dict(video_options={"fsp": 2}), r"video_options may set .*; not \['fsp'\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            _env(**kwargs)
    assert _env(kinds=["direction"], num_frames=8, num_examples=1, num_eval_examples=1)


def test_load_environment_from_the_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    env = vf.load_environment("motion", num_examples=2, num_eval_examples=1, difficulty="easy")
    assert isinstance(env, vf.ToolEnv) and env.env_id == "motion"
    assert env.get_dataset()[0]["info"]["kind"] == "direction"
