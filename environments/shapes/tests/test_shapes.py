"""Tests of the ``shapes`` example environment (run from the repo root: pytest environments)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
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


shapes = _load_module("shapes")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("shapes") / "m", "qwen2_5_vl")


def _env(**kwargs):
    kwargs.setdefault("num_examples", 12)
    kwargs.setdefault("num_eval_examples", 6)
    return shapes.load_environment(**kwargs)


def _score(env, row, text):
    state = {
        "prompt": env.format_prompt(row),
        "completion": [{"role": "assistant", "content": text}],
        "answer": row["answer"],
        "info": row["info"],
    }
    return asyncio.run(env.rubric.score_rollout(state))


def _fingerprint(rows):
    return [(r["question"], r["answer"], r["image"].tobytes()) for r in rows]


def test_dataset_is_deterministic_under_a_seed():
    a, b = _env(seed=3), _env(seed=3)
    assert _fingerprint(a.get_dataset()) == _fingerprint(b.get_dataset())
    assert _fingerprint(a.get_eval_dataset()) == _fingerprint(b.get_eval_dataset())
    assert _fingerprint(a.get_dataset()) != _fingerprint(_env(seed=4).get_dataset())
    train = {r["image"].tobytes() for r in a.get_dataset()}
    assert not train & {r["image"].tobytes() for r in a.get_eval_dataset()}


@pytest.mark.parametrize(("size", "expected"), [(224, (224, 224)), ((200, 150), (200, 150))])
def test_images_are_rgb_of_the_asked_size(size, expected):
    env = _env(image_size=size)
    for row in env.get_dataset():
        assert isinstance(row["image"], Image.Image)
        assert row["image"].mode == "RGB" and row["image"].size == expected
    prompt = env.format_prompt(env.get_eval_dataset(1)[0])
    assert prompt[0]["role"] == "system"
    parts = prompt[1]["content"]
    assert parts[0]["type"] == "image" and isinstance(parts[0]["image"], Image.Image)
    assert parts[1]["type"] == "text"


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_answers_agree_with_the_drawn_shapes(difficulty):
    env = _env(
        difficulty=difficulty,
        question_types=None if difficulty != "hard" else shapes.QUESTION_TYPES,
    )
    for row in [*env.get_dataset(), *env.get_eval_dataset()]:
        drawn = [(s["shape"], s["colour"]) for s in row["info"]["shapes"]]
        q = row["question"]
        if m := re.fullmatch(r"How many (?:(\w+) )?(\w+)s are there\?", q):
            colour, shape = m.groups()
            count = sum(s == shape and (colour is None or c == colour) for s, c in drawn)
            assert row["answer"] == str(count)
        elif m := re.fullmatch(r"What colour is the (\w+)\?", q):
            [(_, colour)] = [d for d in drawn if d[0] == m.group(1)]
            assert row["answer"] == colour
        elif m := re.fullmatch(r"What shape is the (\w+) one\?", q):
            [(shape, _)] = [d for d in drawn if d[1] == m.group(1)]
            assert row["answer"] == shape
        else:
            m = re.fullmatch(r"Is there a (\w+) (\w+) in the image\? Answer yes or no\.", q)
            assert m, q
            assert row["answer"] == ("yes" if (m.group(2), m.group(1)) in drawn else "no")


def test_easy_setting_has_a_tiny_answer_set():
    env = _env(difficulty="easy", num_examples=60)
    rows = env.get_dataset()
    assert {r["question"] for r in rows} == {"How many circles are there?"}
    assert {r["answer"] for r in rows} == {"1", "2", "3"}


def test_reward_is_one_for_a_correct_answer_and_zero_otherwise():
    env = _env()
    row = next(r for r in env.get_dataset() if r["info"]["question_type"] == "count")
    words = {str(v): k for k, v in shapes.NUMBER_WORDS.items()}
    for text in [
        f"<answer>{row['answer']}</answer>",
        f"<answer> {words[row['answer']].title()}. </answer>",
    ]:
        reward, metrics = _score(env, row, text)
        assert reward == 1.0 and metrics["correct_answer"] == 1.0
    assert metrics["format_reward"] == 1.0
    wrong = str(int(row["answer"]) + 1)
    assert _score(env, row, f"<answer>{wrong}</answer>")[0] == 0.0
    reward, metrics = _score(env, row, row["answer"])  # right, but no tags
    assert reward == 0.0 and metrics["format_reward"] == 0.0

    row = next(r for r in env.get_dataset() if r["info"]["question_type"] == "shape")
    assert _score(env, row, f"<answer>The {row['answer'].upper()}s</answer>")[0] == 1.0
    assert _score(env, row, "<answer>hexagon</answer>")[0] == 0.0


def test_normalize_answer():
    n = shapes.normalize_answer
    assert n(" Three ") == n("3") == n("03") == "3"
    assert n("a Red.") == "red" and n("Triangles") == "triangle" and n(None) == ""


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="difficulty"):
        _env(difficulty="impossible")
    with pytest.raises(ValueError, match="question_types"):
        _env(question_types=["colour", "mood"])
    with pytest.raises(ValueError, match="colours"):
        _env(colours=["teal"])


def test_scripted_rollout_of_correct_answers_gets_reward_one(model):
    env = _env()
    renderer = load_renderer(model)

    async def run(row):
        backend = ScriptedBackend(renderer, [f"<answer>{row['answer']}</answer>"])
        state = await env.rollout(vf.RendererClient(backend, renderer), row)
        [out] = await env.score([state])
        return out, backend

    for row in env.get_eval_dataset(3):
        out, backend = asyncio.run(run(row))
        assert out.error is None and out.reward == 1.0
        assert out.metrics["format_reward"] == 1.0
        [request] = backend.requests
        assert len(request.multi_modal_data.mm_placeholders["image"]) == 1


def test_check_environment_passes(model):
    report = vf.check_environment(_env(), model_dir=model)
    assert report["rows"] == 2 and report["images"] == 2


def test_load_environment_from_the_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    env = vf.load_environment("shapes", num_examples=3, num_eval_examples=2, difficulty="easy")
    assert isinstance(env, vf.SingleTurnEnv) and env.env_id == "shapes"
    assert len(env.get_dataset()) == 3 and len(env.get_eval_dataset()) == 2
    assert "shapes" in vf.envs.list_environments()
