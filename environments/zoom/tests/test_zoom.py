"""Tests of the ``zoom`` example environment (run from the repo root: pytest environments)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

import vf_mm as vf
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm

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


zoom = _load_module("zoom")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("zoom") / "m", "qwen2_5_vl")


@pytest.fixture(scope="module")
def env():
    return _env()


def _env(**kwargs):
    kwargs.setdefault("num_examples", 6)
    kwargs.setdefault("num_eval_examples", 4)
    return zoom.load_environment(**kwargs)


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


def test_dataset_is_deterministic_under_a_seed(env):
    def fingerprint(rows):
        return [(r["question"], r["answer"], r["info"], r["image"].tobytes()) for r in rows]

    assert fingerprint(env.get_dataset()) == fingerprint(_env().get_dataset())
    assert fingerprint(env.get_eval_dataset()) == fingerprint(_env().get_eval_dataset())
    assert fingerprint(env.get_dataset()) != fingerprint(_env(seed=1).get_dataset())


def test_images_and_boxes(env):
    kinds = set()
    for row in [*env.get_dataset(), *env.get_eval_dataset()]:
        image, info = row["image"], row["info"]
        assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (1024, 768)
        boxes = info["boxes"]
        assert len(boxes) == 1 + zoom.PRESETS["medium"]["num_distractors"]
        assert boxes[0]["box"] == info["target_box"] and boxes[0]["content"] == row["answer"]
        assert (
            boxes[0]["colour"] == info["target_colour"] and info["target_colour"] in row["question"]
        )
        assert len({b["colour"] for b in boxes}) == len(boxes)
        for b in boxes:
            x, y, w, h = b["box"]
            assert 0 <= x <= 1024 - w and 0 <= y <= 768 - h and w <= 64 and h <= 32
            # the box outline is drawn in its colour
            assert image.getpixel((x, y + h // 2)) == zoom.BOX_COLOURS[b["colour"]]
        if info["kind"] == "code":
            assert len(row["answer"]) == 4 and set(row["answer"]) <= set(zoom.CODE_CHARS)
        else:
            assert row["answer"] in zoom.SYMBOLS
        kinds.add(info["kind"])
    assert kinds == {"code", "symbol"}


def test_overview_size_downscales_the_prompt_but_not_the_zoom():
    env = _env(overview_size=512, num_examples=2, num_eval_examples=1)
    row = env.get_dataset()[0]
    assert row["image"].size == (512, 384) and "downscaled to 512x384" in row["question"]
    state = _state(env, row)
    assert state["zoom_image"].size == (1024, 768)
    assert state["zoom_image"].tobytes() == _env(num_examples=2).get_dataset()[0]["image"].tobytes()


def test_crop_region_crops_clips_and_enlarges(env):
    image = env.get_dataset()[0]["image"]
    crop, region, note = zoom.crop_region(image, 100, 50, 300, 200, output_size=300)
    assert region == (100, 50, 300, 200) and crop.size == (300, 200) and "enlarged" not in note
    assert crop.tobytes() == image.crop((100, 50, 400, 250)).tobytes()

    crop, region, note = zoom.crop_region(image, 10, 20, 40, 30, output_size=448)  # 8x at most
    assert crop.size == (320, 240) and "8x enlarged" in note
    assert (
        crop.resize((40, 30), Image.Resampling.NEAREST).tobytes()
        == image.crop((10, 20, 50, 50)).tobytes()
    )

    crop, region, note = zoom.crop_region(image, 1000, -10, "100", 40.0)
    assert region == (1000, 0, 24, 30) and "clipped" in note

    for args, message in [
        ((2000, 0, 10, 10), "outside the image"),
        ((0, 0, 2, 50), "at least 4"),
        ((0, 0, -10, 50), "at least 4"),
        (("left", 0, 10, 10), "x must be an integer"),
        ((0, True, 10, 10), "y must be an integer"),
        ((0, 0, 10.5, 10), "w must be an integer"),
    ]:
        out = zoom.crop_region(image, *args)
        assert isinstance(out, str) and out.startswith("Error") and message in out


def test_the_zoom_tool_answers_with_an_image_or_an_error(env):
    row = env.get_eval_dataset(1)[0]
    state = _state(env, row)
    x, y, w, h = row["info"]["target_box"]
    parts = asyncio.run(env.call_tool(_call("zoom", x=x - 8, y=y - 8, w=w + 16, h=h + 16), state))
    assert [p["type"] for p in parts] == ["image", "text"]
    assert isinstance(parts[0]["image"], Image.Image) and parts[0]["image"].width > w + 16
    assert state["zooms"] == [[x - 8, y - 8, w + 16, h + 16]]

    bad = [
        _call("zoom", x=1, y=2, w=3),
        _call("zoom", x=1, y=2, w=30, h=30, scale=2),
        _call("zoom", x=5000, y=0, w=30, h=30),
        {"function": {"name": "zoom", "arguments": "{not json"}},
        {"function": {"name": "zoom", "arguments": "[1, 2, 3, 4]"}},
        _call("rotate", angle=90),
    ]
    for call in bad:
        out = asyncio.run(env.call_tool(call, state))
        assert isinstance(out, str) and out.startswith("Error"), out
    assert state["tool_errors"] == len(bad) and len(state["zooms"]) == 1

    replies = asyncio.run(
        env.env_response(
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_call("zoom", x=0, y=0, w=64, h=64)],
                }
            ],
            state,
        )
    )
    assert replies[0]["role"] == "tool" and replies[0]["content"][0]["type"] == "image"
    assert env.tools[0]["function"]["name"] == "zoom"
    assert set(env.tools[0]["function"]["parameters"]["required"]) == {"x", "y", "w", "h"}


def test_reward_is_one_for_a_correct_answer_and_zero_otherwise(env):
    def score(row, completion, zooms=()):
        state = {"prompt": [], "completion": completion, "answer": row["answer"], "info": row["info"],
                 "zooms": [list(z) for z in zooms]}  # fmt: skip
        return asyncio.run(env.rubric.score_rollout(state))

    for row in [*env.get_dataset(), *env.get_eval_dataset()]:
        answer = row["answer"]
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("zoom", x=0, y=0, w=9, h=9)],
        }
        reward, metrics = score(row, [call, {"role": "tool", "content": "..."},
                                      {"role": "assistant", "content": f"<answer>{answer}</answer>"}])  # fmt: skip
        assert reward == 1.0 and metrics["tool_calls"] == 1.0 and metrics["zoomed_on_target"] == 0.0
        assert metrics["answer_format"] == 1.0  # the tool-call turn needs no <answer>
        if answer in zoom.SYMBOLS:
            spaced = f"<answer> the {answer.upper()}{'es' if answer == 'cross' else 's'}. </answer>"
        else:
            spaced = f"<answer>{' '.join(answer.lower())}</answer>"
        assert score(row, [{"role": "assistant", "content": spaced}])[0] == 1.0
        wrong = (
            "CROSS"
            if answer == "circle"
            else ("circle" if answer in zoom.SYMBOLS else answer[::-1] + "Z")
        )
        assert score(row, [{"role": "assistant", "content": f"<answer>{wrong}</answer>"}])[0] == 0.0
        reward, metrics = score(row, [{"role": "assistant", "content": answer}])  # no tags
        assert reward == 0.0 and metrics["answer_format"] == 0.0
        x, y, w, h = row["info"]["target_box"]
        assert score(row, [], zooms=[(x - 1, y - 1, w + 2, h + 2)])[1]["zoomed_on_target"] == 1.0


def test_scripted_rollout_zooms_then_answers_correctly(env, model):
    renderer = load_renderer(model)
    pad = renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    row = env.get_eval_dataset(1)[0]
    x, y, w, h = row["info"]["target_box"]
    backend = ScriptedBackend(
        renderer,
        [
            _tool_call_text("zoom", x=x - 10, y=y - 10, w=w + 20, h=h + 20),
            f"<answer>{row['answer']}</answer>",
        ],
    )

    async def run():
        state = await env.rollout(vf.RendererClient(backend, renderer), row)
        return state, (await env.score([state]))[0]

    state, out = asyncio.run(run())
    assert out.error is None, out.error
    assert (
        out.reward == 1.0
        and out.metrics["tool_calls"] == 1.0
        and out.metrics["zoomed_on_target"] == 1.0
    )
    assert state["turn"] == 2 and [m["role"] for m in out.completion] == [
        "assistant",
        "tool",
        "assistant",
    ]
    first, second = backend.requests
    assert len(first.multi_modal_data.mm_placeholders["image"]) == 1
    assert len(second.multi_modal_data.mm_placeholders["image"]) == 2
    assert second.prompt_ids.count(pad) > first.prompt_ids.count(pad)
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids  # bridged


def test_normalize_answer():
    n = zoom.normalize_answer
    assert n("a Circle.") == n("circles") == "CIRCLE" and n("The crosses") == n("plus") == "CROSS"
    assert n(" a 7k-3p ") == "A7K3P" and n("A 2 C") == "A2C" and n(None) == ""


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="difficulty"):
        _env(difficulty="extreme")
    with pytest.raises(ValueError, match="kinds"):
        _env(kinds=["emoji"])
    with pytest.raises(ValueError, match="num_distractors"):
        _env(num_distractors=20)


def test_check_environment_passes(env, model):
    report = vf.check_environment(env, model_dir=model)
    assert report["rows"] == 2 and report["images"] == 2
    # the schema's smallest arguments are refused (and said so); a real crop shows an image
    assert "at least 4 pixels" in report["tool_errors"]["zoom"]
    crop = {"x": 0, "y": 0, "w": 32, "h": 32}
    report = vf.check_environment(env, model_dir=model, tool_args={"zoom": crop})
    assert report["tool_errors"] == {} and report["tool_calls"] == {"zoom": 4}
    assert report["images_per_turn"] == [[1, 1]] * 4  # the row's image, then the crop


def test_load_environment_from_the_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    env = vf.load_environment("zoom", num_examples=2, num_eval_examples=1, difficulty="easy")
    assert isinstance(env, vf.ToolEnv) and env.env_id == "zoom"
    assert env.get_dataset()[0]["info"]["kind"] == "symbol"
