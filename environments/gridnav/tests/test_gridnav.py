"""Tests of the ``gridnav`` example environment (run from the repo root: pytest environments)."""

from __future__ import annotations

import asyncio
import importlib.util
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


gridnav = _load_module("gridnav")

# . . . . .      S: start (1, 0), G: goal (1, 4), #: walls
# S # . . G
# . # . # .
# . . . # .
# . . . . .
LAYOUT = {"size": 5, "walls": [[1, 1], [2, 1], [2, 3], [3, 3]], "start": [1, 0], "goal": [1, 4],
          "optimal_moves": 6, "cell_size": 32, "split": "test", "index": 0}  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("gridnav") / "m", "qwen2_5_vl")


def _env(**kwargs):
    kwargs.setdefault("num_examples", 12)
    kwargs.setdefault("num_eval_examples", 6)
    return gridnav.load_environment(**kwargs)


def _row(info=LAYOUT):
    layout = gridnav.Layout.from_info(info)
    return {"question": "Go.", "image": gridnav.render(layout, layout.start), "info": dict(info)}


def _assistant(text):
    return {"role": "assistant", "content": text}


def _new_state(env, row):
    state = env.new_state(row, example_id=0, rollout_index=0)
    asyncio.run(env.setup_state(state))
    return state


def _respond(env, state, text):
    state["turn"] += 1
    return asyncio.run(env.env_response([*state["prompt"], _assistant(text)], state))


def _score(env, info, moves):
    completion = []
    for move in moves:
        completion += [_assistant(f"<move>{move}</move>"), {"role": "user", "content": "ok"}]
    state = {"prompt": [], "completion": completion, "answer": "", "info": info}
    return asyncio.run(env.rubric.score_rollout(state))


def test_dataset_is_deterministic_under_a_seed():
    def fingerprint(rows):
        return [(r["info"], r["image"].tobytes()) for r in rows]

    a, b = _env(seed=1), _env(seed=1)
    assert fingerprint(a.get_dataset()) == fingerprint(b.get_dataset())
    assert fingerprint(a.get_eval_dataset()) == fingerprint(b.get_eval_dataset())
    assert fingerprint(a.get_dataset()) != fingerprint(_env(seed=2).get_dataset())


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_layouts_are_solvable_within_the_configured_distance(difficulty):
    env = _env(difficulty=difficulty)
    config = gridnav.PRESETS[difficulty]
    assert env.max_turns == config["max_turns"]
    for row in [*env.get_dataset(), *env.get_eval_dataset()]:
        info = row["info"]
        layout = gridnav.Layout.from_info(info)
        assert len(layout.walls) == config["num_walls"] and layout.size == config["size"]
        assert layout.free(layout.start) and layout.free(layout.goal)
        path = layout.shortest_path()
        assert (
            config["min_distance"] <= len(path) == info["optimal_moves"] <= config["max_distance"]
        )
        assert row["answer"] == " ".join(path)
        side = config["size"] * 32
        assert isinstance(row["image"], Image.Image)
        assert row["image"].mode == "RGB" and row["image"].size == (side, side)


def test_render_shows_agent_goal_and_walls():
    layout = gridnav.Layout.from_info(LAYOUT)
    image = gridnav.render(layout, (3, 2), cell_size=20)
    assert image.size == (100, 100) and image.mode == "RGB"
    centre = lambda r, c: image.getpixel((c * 20 + 10, r * 20 + 10))  # noqa: E731
    assert centre(3, 2) == gridnav.AGENT and centre(1, 4) == gridnav.GOAL
    assert centre(1, 1) == gridnav.WALL and centre(0, 0) == gridnav.WHITE


def test_env_response_moves_hits_walls_refuses_bad_moves_and_ends_at_the_goal():
    env = _env()
    state = _new_state(env, _row())
    assert state["position"] == (1, 0)

    reply = _respond(env, state, "<move>right</move>")  # a wall at (1, 1)
    assert state["position"] == (1, 0) and state["wall_hits"] == 1 and state["moves"] == 1
    [message] = reply
    assert message["role"] == "user"
    image, text = message["content"]
    assert isinstance(image["image"], Image.Image) and "hit a wall" in text["text"]

    _respond(env, state, "<move>left</move>")  # the border
    assert state["position"] == (1, 0) and state["wall_hits"] == 2

    for bad in ["right", "<move>diagonal</move>", "<move>up"]:
        [message] = _respond(env, state, bad)
        assert "Invalid move" in vf.types.text_of(message)
    assert state["invalid_moves"] == 3 and state["position"] == (1, 0)
    [message] = _respond(env, state, "<move>up</move> <move")  # the complete <move> counts
    assert state["position"] == (0, 0) and "moved up" in vf.types.text_of(message)

    [message] = _respond(env, state, " <move> RIGHT </move> ")
    assert state["position"] == (0, 1) and "moved right" in vf.types.text_of(message)
    assert not state.get("done")
    before = message["content"][0]["image"]
    for move in ["right", "right", "right"]:
        [message] = _respond(env, state, f"<move>{move}</move>")
    assert state["position"] == (0, 4) and not state.get("done")
    assert message["content"][0]["image"].tobytes() != before.tobytes()  # a new picture each turn

    [message] = _respond(env, state, "<move>down</move>")
    assert state["position"] == (1, 4) and state["done"] and state["reached_goal"]
    assert message["content"].endswith("You reached the goal!")


def test_rubric_replays_the_moves():
    env = _env()
    path = gridnav.Layout.from_info(LAYOUT).shortest_path()
    assert len(path) == 6
    reward, metrics = _score(env, LAYOUT, path)
    assert reward == 1.0 and metrics["reached_goal"] == 1.0 and metrics["partial_progress"] == 0.0
    assert (
        metrics["moves"] == 6 and metrics["optimal_moves"] == 6 and metrics["format_reward"] == 1.0
    )

    # distance to the goal 6 -> 3 (at (0, 2)) -> 4 (back at (0, 1))
    reward, metrics = _score(env, LAYOUT, ["up", "right", "right", "nope", "left"])
    assert metrics["reached_goal"] == 0.0 and metrics["invalid_moves"] == 1
    assert metrics["partial_progress"] == pytest.approx(2 / 6)
    assert reward == pytest.approx(0.2 * 2 / 6)

    reward, metrics = _score(env, LAYOUT, ["right", "left", "down"])  # bumps, then away
    assert reward == 0.0 and metrics["wall_hits"] == 2

    # moves after the goal are ignored
    assert _score(env, LAYOUT, [*path, "left", "left"])[0] == 1.0


def test_scripted_rollout_following_the_shortest_path_gets_reward_one(model):
    env = _env()
    renderer = load_renderer(model)
    pad = renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    async def run(row, replies):
        backend = ScriptedBackend(renderer, replies)
        state = await env.rollout(vf.RendererClient(backend, renderer), row)
        [out] = await env.score([state])
        return state, out, backend

    for row in env.get_eval_dataset(3):
        path = row["answer"].split()
        state, out, backend = asyncio.run(run(row, [f"<move>{m}</move>" for m in path]))
        assert out.error is None and out.reward == 1.0, out.error
        assert state["done"] and state["turn"] == len(path)
        assert out.metrics["moves"] == len(path) and out.metrics["invalid_moves"] == 0
        # one more image per turn: the prompt's, then one per environment turn
        counts = [len(r.multi_modal_data.mm_placeholders["image"]) for r in backend.requests]
        assert counts == list(range(1, len(path) + 1))
        pads = [r.prompt_ids.count(pad) for r in backend.requests]
        assert pads == sorted(pads) and len(set(pads)) == len(pads)

    # a policy that never moves validly uses all turns and scores 0
    row = env.get_eval_dataset(1)[0]
    state, out, _ = asyncio.run(run(row, ["I am not sure."]))
    assert out.reward == 0.0 and state["turn"] == env.max_turns
    assert out.metrics["invalid_moves"] == env.max_turns and out.metrics["format_reward"] == 0.0


def test_the_last_allowed_move_counts(model):
    """No environment turn follows the final model turn; the rubric still counts its move."""
    env = _env(max_turns=6)
    path = gridnav.Layout.from_info(LAYOUT).shortest_path()
    renderer = load_renderer(model)

    async def run():
        backend = ScriptedBackend(renderer, [f"<move>{m}</move>" for m in path])
        state = await env.rollout(vf.RendererClient(backend, renderer), _row())
        return state, (await env.score([state]))[0]

    state, out = asyncio.run(run())
    assert state["turn"] == 6 and state["position"] != (1, 4)  # the 6th move was never applied
    assert out.reward == 1.0 and out.metrics["moves"] == 6


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="difficulty"):
        _env(difficulty="nightmare")
    with pytest.raises(ValueError, match="no layout"):
        _env(size=3, min_distance=7, max_distance=9)


def test_check_environment_passes(model):
    report = vf.check_environment(_env(), model_dir=model)
    assert report["rows"] == 2


def test_load_environment_from_the_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    env = vf.load_environment("gridnav", num_examples=3, num_eval_examples=2, difficulty="easy")
    assert isinstance(env, vf.MultiTurnEnv) and env.env_id == "gridnav"
    assert env.max_turns == 4 and len(env.get_dataset()) == 3
