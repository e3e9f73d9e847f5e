"""prime-rl's path, for real: a vf_mm environment run as a verifiers 0.4 (v1) environment,
rendered by vf_mm through ``renderers`` 0.1.12's ``custom`` hook, sampled by ``vf-mm
serve`` (the embedded engine, in its own process), on tiny checkpoints, on the CPU.

What is checked against what: an episode's trace, flattened by verifiers' own
``trace.branches`` (token ids, ``sampled_mask``, logprobs, ``mm_token_type_ids``: what
prime-rl's orchestrator trains on), against vf_mm's own ``build_samples`` of the same
rollout: the environment's rollout run again by vf_mm's client and renderer with the very
completions the trace sampled (replayed), so every prompt token, bridge and image is
vf_mm's. And the adapter against ``renderers``' own Qwen3-VL and Qwen3.5 renderers, token
for token. And the mistakes: what cannot work is refused by name.

The verifiers1 tier (``python3 dev.py verifiers1``): verifiers and renderers are imported
by the fixtures, never at collection.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verifiers1

ROOT = Path(__file__).resolve().parents[2]
#: the families prime-rl trains that vf_mm's adapter serves through verifiers (and Qwen2.5-VL)
FAMILIES = ("qwen3_vl", "qwen3_5")
ENV_ARGS = {"difficulty": "easy", "num_examples": 2, "max_turns": 2}


@pytest.fixture(scope="session")
def vf1():
    """``verifiers.v1`` and ``vf_mm.integrations.verifiers`` (which imports it)."""
    pytest.importorskip("renderers")
    v1 = pytest.importorskip("verifiers.v1")
    import vf_mm.integrations.verifiers as integration

    return v1, integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def serve(checkpoints):
    """``serve(family)``: the base URL of ``vf-mm serve`` on that family's tiny checkpoint
    (one process per family, stopped at the module's end)."""
    import httpx

    servers: dict[str, tuple[subprocess.Popen, str]] = {}

    def get(family: str) -> str:
        if family not in servers:
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "vf_mm.cli._main", "serve", "--model",
                 str(checkpoints(family)), "--port", str(port), "--log-level", "warning"],
                cwd=ROOT, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 240  # a bound on the wait for the model to load
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    if httpx.get(f"{base}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "vf-mm serve did not come up"
                time.sleep(0.2)
            servers[family] = (proc, base)
        return servers[family][1]

    yield get
    for proc, _ in servers.values():
        proc.terminate()
        proc.wait(timeout=60)


def _env_config(v1, **taskset):
    return v1.resolve_env_config(
        {
            "agent": {"runtime": {"type": "subprocess"}},
            "taskset": {"id": "vf-mm-verifiers", "env": "gridnav", "env_args": ENV_ARGS,
                        "num_examples": 2, **taskset},
        }
    )  # fmt: skip


def _run_episodes(v1, env, base: str, checkpoint: Path, n: int = 2):
    """Every task of ``env`` once, as verifiers' eval runs them (in process, the
    interception server up), through the train client and the vf_mm renderer."""
    from renderers import CustomRendererConfig

    client = v1.TrainClientConfig(
        base_url=f"{base}/v1",
        api_key_var="VF_MM_TEST_NO_KEY",
        renderer=CustomRendererConfig(import_path="vf_mm.integrations.verifiers.VfMMRenderer"),
        renderer_model_name=str(checkpoint),
    )
    ctx = v1.ModelContext(
        model=str(checkpoint), client=client,
        sampling=v1.SamplingConfig(max_tokens=8, temperature=1.0),
    )  # fmt: skip
    tasks = list(env.taskset)[:n]

    async def run():
        async with env.serving():
            return [await env.run_slot(env.slots(task, 1)[0], ctx) for task in tasks]

    return tasks, asyncio.run(run())


class Replay:
    """A ``vf_mm`` ``Backend`` answering each turn with the completion a trace sampled
    (its ids and logprobs, in order): vf_mm's own rollout of the same row then renders,
    bridges and processes every prompt itself."""

    name = "replay"
    max_model_len = None

    def __init__(self, turns: list[tuple[list[int], list[float]]]) -> None:
        self.turns = list(turns)

    async def generate(self, request):
        from vf_mm.inference import GenerateResult, Usage

        ids, logprobs = self.turns.pop(0)
        return GenerateResult(
            completion_ids=list(ids), logprobs=list(logprobs), finish_reason="stop",
            usage=Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=len(ids)),
        )  # fmt: skip

    async def aclose(self) -> None:
        return None


def _sampled_turns(trace) -> list[tuple[list[int], list[float]]]:
    """The trace's model turns in order: each sampled node's completion and logprobs."""
    out = []
    for node in trace.nodes:
        if node.sampled:
            n = sum(node.mask)
            out.append((list(node.token_ids[len(node.token_ids) - n :]), list(node.logprobs)))
    return out


# -- verifiers' loader ---------------------------------------------------------------------


def test_verifiers_own_loader_finds_the_taskset_and_its_harness(vf1):
    v1, integration = vf1
    env = v1.load_environment(_env_config(v1))
    assert isinstance(env.taskset, integration.VfMMTaskset)
    assert isinstance(env._harnesses["agent"], integration.VfMMHarness)
    tasks = list(env.taskset)
    assert [t.data.example_id for t in tasks] == [0, 1]
    assert all(isinstance(t, integration.VfMMTask) for t in tasks)
    assert "Reach the green square" in tasks[0].data.prompt  # gridnav's prompt, as text


def test_a_taskset_without_an_environment_is_refused_naming_the_flag(vf1):
    v1, _ = vf1
    env = v1.load_environment(_env_config(v1, env=""))
    with pytest.raises(ValueError, match=r"--env\.taskset\.env"):
        list(env.taskset)


def test_a_rubric_with_group_reward_functions_is_refused_by_name(vf1, monkeypatch):
    import vf_mm as vf
    from vf_mm.errors import UnsupportedEnvironmentError
    from vf_mm.integrations.verifiers import _taskset

    def rank(completions):
        return [0.0] * len(completions)

    rubric = vf.Rubric()
    rubric.add_group_reward_func(rank)
    grouped = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}], rubric=rubric)
    monkeypatch.setattr(vf, "load_environment", lambda env_id, **kw: grouped)
    with pytest.raises(UnsupportedEnvironmentError, match=r"group reward functions \(rank\)"):
        _taskset.environment("grouped-env", {})


# -- an episode, flattened two ways ----------------------------------------------------------


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", FAMILIES)
def test_an_episode_flattens_as_vf_mm_builds_samples_of_the_same_rollout(
    vf1, checkpoints, serve, family
):
    """gridnav, two turns, the second with the environment's new image: verifiers' own
    flattening of each trace equals ``build_samples`` of vf_mm's rollout of the same row
    with the same completions: token ids, loss mask, logprobs, token types, and each image's
    model inputs and placeholder."""
    import vf_mm as vf
    from vf_mm.client import RendererClient
    from vf_mm.renderers import load_renderer
    from vf_mm.training import build_samples

    v1, integration = vf1
    checkpoint = checkpoints(family)
    env = v1.load_environment(_env_config(v1))
    tasks, episodes = _run_episodes(v1, env, serve(family), checkpoint)
    adapter = integration.VfMMRenderer(None, integration.VfMMRendererConfig(model=str(checkpoint)))
    vision = adapter.renderer.vision
    vf_env = vf.load_environment("gridnav", **ENV_ARGS)
    rows = vf_env.get_dataset(2)
    compared_images = 0
    for task, episode in zip(tasks, episodes, strict=True):
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        assert trace.ok, trace.errors
        got = [integration.branch_sample(b, adapter) for b in trace.branches]

        replay = RendererClient(Replay(_sampled_turns(trace)), load_renderer(str(checkpoint)))
        state = asyncio.run(vf_env.rollout(replay, rows[task.data.example_id]))
        (output,) = asyncio.run(vf_env.score([state]))
        assert output.error is None, output.error
        assert trace.info["vf_mm"]["reward"] == output.reward  # the rubric, the same rollout
        assert trace.rewards["reward"].score == output.reward
        want = build_samples(output, advantage=0.0, image_token_id=vision.image_token_id)

        assert len(got) == len(want)  # a turn bridged in one is bridged in the other
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.input_ids, w.input_ids)
            np.testing.assert_array_equal(g.loss_mask, w.loss_mask)
            np.testing.assert_array_equal(g.logprobs, w.logprobs)
            np.testing.assert_array_equal(g.mm_token_type_ids, w.mm_token_type_ids)
            assert g.placeholders == w.placeholders
            assert len(g.images) == len(w.images) >= 1
            for gi, wi in zip(g.images, w.images, strict=True):
                assert sorted(gi) == sorted(wi)
                for key in gi:
                    np.testing.assert_array_equal(gi[key], wi[key])
                    assert gi[key].dtype == wi[key].dtype
            compared_images += len(g.images)
    assert compared_images >= 3  # two rows, the second turn's image included somewhere
