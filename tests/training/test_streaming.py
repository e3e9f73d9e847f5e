"""stream_rollouts: who computes the advantages a trainer receives."""

from __future__ import annotations

import asyncio

import pytest

import vf_mm as vf
from vf_mm.errors import TrajectoryError
from vf_mm.testing import ScriptedChatBackend
from vf_mm.training import build_samples, group_advantages, stream_rollouts, unpack_group


def reward(state) -> float:
    """Rollout i of each example scores i; example 0's rollout 1 fails instead."""
    if state["example_id"] == 0 and state["rollout_index"] == 1:
        raise RuntimeError("the judge is down")
    return float(state["rollout_index"])


class Collect:
    def __init__(self) -> None:
        self.groups: list[dict] = []

    async def asend(self, group) -> int:
        self.groups.append(group)
        return 1


def stream(**options) -> list[dict]:
    rows = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(2)]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([reward]))
    sender = Collect()
    client = vf.RendererClient(ScriptedChatBackend(["2"]))
    asyncio.run(stream_rollouts(env, client, sender, rollouts_per_example=3, **options))
    return sorted(sender.groups, key=lambda g: g["example_id"])


def test_groups_carry_group_normalised_advantages_by_default():
    """Groups streamed by vf-mm rollout once carried advantage None, which build_samples
    turned into NaN; now the producer fills them (a failed rollout's is None)."""
    for frame in stream():
        assert frame["advantage_method"] == "grpo"
        rollouts = unpack_group(frame)
        rewards = [r.reward for r in rollouts]
        assert [r.advantage for r in rollouts] == group_advantages(rewards)
        assert {r.advantage_method for r in rollouts} == {"grpo"}
    first = unpack_group(stream()[0])
    assert first[1].error is not None and first[1].advantage is None
    assert first[0].advantage == pytest.approx(-1, abs=1e-3)  # rewards 0 and 2: -1, +1
    assert first[2].advantage == pytest.approx(1, abs=1e-3)


def test_advantages_none_leaves_them_to_the_trainer_and_build_samples_says_so():
    for frame in stream(advantages="none"):
        assert "advantage_method" not in frame
        for rollout in unpack_group(frame):
            assert rollout.advantage is None
            with pytest.raises(TrajectoryError, match=r"group_advantages|rollout failed"):
                build_samples(rollout, advantage=rollout.advantage, image_token_id=5)


def test_an_unknown_advantage_method_is_refused():
    with pytest.raises(ValueError, match=r"advantages must be one of \['grpo', 'none'\]"):
        stream(advantages="rloo")


def test_groups_whose_rewards_are_all_equal_are_counted():
    """A rubric with no reward function scores every rollout 0.0: GRPO's advantages are
    then all 0 and the run trains on nothing; the progress counts such groups."""
    rows = [{"question": f"{i} + 1?"} for i in range(2)]
    client = vf.RendererClient(ScriptedChatBackend(["2"]))
    flat = asyncio.run(
        stream_rollouts(vf.SingleTurnEnv(dataset=rows), client, Collect(), rollouts_per_example=2)
    )
    assert flat.groups == 2 and flat.flat_groups == 2
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([reward]))
    spread = asyncio.run(stream_rollouts(env, client, Collect(), rollouts_per_example=3))
    assert spread.flat_groups == 0
