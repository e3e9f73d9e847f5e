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
#: the checkpoints an episode runs for against vf-mm serve: (family, chat template variant;
#: None the family's default, Qwen3.5's with thinking off)
EPISODES = (
    ("qwen2_vl", None), ("qwen2_5_vl", None), ("qwen3_vl", None), ("qwen3_5", None),
    ("qwen3_5", "think"), ("llava_onevision", None),
)  # fmt: skip
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
def variant_checkpoint(checkpoints, tmp_path_factory):
    """``variant_checkpoint(family, variant)``: the family's shared tiny checkpoint
    (``variant`` None), or one with that chat template variant, built once."""
    from vf_mm.testing import build_tiny_vlm

    built: dict[tuple[str, str], Path] = {}

    def get(family: str, variant: str | None) -> Path:
        if variant is None:
            return checkpoints(family)
        if (family, variant) not in built:
            root = tmp_path_factory.mktemp(f"{family}-{variant}")
            built[family, variant] = build_tiny_vlm(root / "m", family, variant=variant)
        return built[family, variant]

    return get


@pytest.fixture(scope="module")
def serve():
    """``serve(checkpoint)``: the base URL of ``vf-mm serve`` on that checkpoint (one
    process per checkpoint, stopped at the module's end)."""
    import httpx

    servers: dict[Path, tuple[subprocess.Popen, str]] = {}

    def get(checkpoint: Path) -> str:
        if checkpoint not in servers:
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "vf_mm.cli._main", "serve", "--model",
                 str(checkpoint), "--port", str(port), "--log-level", "warning"],
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
            servers[checkpoint] = (proc, base)
        return servers[checkpoint][1]

    yield get
    for proc, _ in servers.values():
        proc.terminate()
        proc.wait(timeout=60)


def _noise(seed: int, h: int, w: int):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _turns(state) -> float:
    return float(state["turn"])


def pictures_env():
    """Three turns, a new picture each (noise: every image differs, in size too), so a
    sample's images cannot be swapped, dropped or repeated unseen; two rows."""
    import vf_mm as vf

    class Pictures(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            turn = int(state["turn"])
            picture = _noise(100 + turn, 32 + 16 * turn, 64)
            text = {"type": "text", "text": f"And picture {turn}?"}
            return [{"role": "user", "content": [{"type": "image", "image": picture}, text]}]

    rows = [
        {"question": f"What is in picture {i}?", "images": [_noise(i, 64, 64)], "answer": "x"}
        for i in range(2)
    ]
    return Pictures(dataset=rows, rubric=vf.Rubric([_turns]), max_turns=3)


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
@pytest.mark.parametrize(
    ("family", "variant"), EPISODES, ids=[f + (f"-{v}" if v else "") for f, v in EPISODES]
)
def test_an_episode_flattens_as_vf_mm_builds_samples_of_the_same_rollout(
    vf1, variant_checkpoint, serve, family, variant, monkeypatch
):
    """Three turns, a new picture in each: verifiers' own flattening of each trace equals
    ``build_samples`` of vf_mm's rollout of the same row with the same completions: token
    ids, loss mask, logprobs, token types, and each image's model inputs and placeholder.
    Qwen3.5 with thinking off and on (its think template writes the sampled turn's
    reasoning block, its nothink one an empty one). And the adapter's own image sidecar of
    each branch, concatenated as prime-rl's orchestrator concatenates
    ``branch.multi_modal_data``, equals ``build_samples``' tensors bit for bit."""
    from verifiers.v1.dialects.chat import message_to_wire

    import vf_mm as vf
    from vf_mm.client import RendererClient
    from vf_mm.renderers import load_renderer
    from vf_mm.training import build_samples

    v1, integration = vf1
    vf_env = pictures_env()
    monkeypatch.setattr(vf, "load_environment", lambda env_id, **kw: vf_env)
    checkpoint = variant_checkpoint(family, variant)
    env = v1.load_environment(_env_config(v1, env="pictures", env_args={}))
    tasks, episodes = _run_episodes(v1, env, serve(checkpoint), checkpoint)
    adapter = integration.VfMMRenderer(None, integration.VfMMRendererConfig(model=str(checkpoint)))
    vision = adapter.renderer.vision
    rows = vf_env.get_dataset(2)
    images = 0
    for task, episode in zip(tasks, episodes, strict=True):
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        assert trace.ok, trace.errors
        got = integration.trace_samples(trace, adapter)
        branches = {f"verifiers branch {b.index}": b for b in trace.branches}

        replay = RendererClient(Replay(_sampled_turns(trace)), load_renderer(str(checkpoint)))
        state = asyncio.run(vf_env.rollout(replay, rows[task.data.example_id]))
        (output,) = asyncio.run(vf_env.score([state]))
        assert output.error is None, output.error
        assert len(output.trajectory) == trace.num_turns == 3
        assert trace.info["vf_mm"]["reward"] == output.reward == 3.0  # the rubric's
        assert trace.rewards["reward"].score == output.reward
        want = build_samples(output, advantage=0.0, image_token_id=vision.image_token_id)

        if _carries_images(v1):
            images += _assert_branch_images(trace, got, want)
            continue
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
            images += len(g.images)
        for g, w in zip(got, want, strict=True):
            # what prime-rl trains on with the verifiers it pins (main, a60a606): the
            # renderer's own sidecar of the branch (``process_multimodal=True``), each key's
            # items concatenated along dim 0 in token order; verifiers 0.4.0 asks for none
            branch = branches[g.source]
            ours = adapter.render([message_to_wire(m) for m in branch.messages])
            assert ours.multi_modal_data is not None
            mm_kwargs = _concatenated(ours.multi_modal_data.mm_items["image"])
            assert mm_kwargs.keys() == _concatenated(w.images).keys()
            for key, value in _concatenated(w.images).items():
                np.testing.assert_array_equal(mm_kwargs[key], value, err_msg=key)
                assert mm_kwargs[key].dtype == value.dtype, key
    assert images >= 6  # every picture of both rollouts, in one sample or several


def _carries_images(v1) -> bool:
    """Whether the installed verifiers' ``Branch`` carries its images' model inputs
    (``multi_modal_data``: the unreleased verifiers prime-rl pins, a60a606; 0.4.0's does not)."""
    return "multi_modal_data" in dir(v1.Branch)


def _assert_branch_images(trace, got, want) -> int:
    """With the verifiers prime-rl pins: what its orchestrator trains on, measured. It
    concatenates each branch's ``multi_modal_data`` items per key along dim 0; that must
    equal, bit for bit and dtype included, vf_mm's processing of the same branch's images
    (``trace_samples``, which places each on its pad run); and the last branch (the whole
    history) holds exactly the images of ``build_samples``' last sample (the whole history
    too). This verifiers renders every prompt holding an image in full, never bridging it:
    where vf_mm does not bridge either (as many samples as branches) the branches are
    vf_mm's samples token for token; where vf_mm bridges they are not (docs/trainers.md
    gives what differs), and images are what is compared."""
    branches = {f"verifiers branch {b.index}": b for b in trace.branches}
    for g in got:
        mmd = branches[g.source].multi_modal_data
        assert mmd is not None, g.source
        _assert_same_tensors(_concatenated([i for v in mmd.mm_items.values() for i in v]), g.images)
    _assert_same_tensors(
        _concatenated(
            [i for v in branches[got[-1].source].multi_modal_data.mm_items.values() for i in v]
        ),
        want[-1].images,
    )
    if len(got) == len(want):  # where vf_mm does not bridge either (Qwen3.5, LLaVA-OneVision)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.input_ids, w.input_ids)
            np.testing.assert_array_equal(g.loss_mask, w.loss_mask)
            np.testing.assert_array_equal(g.logprobs, w.logprobs)
            np.testing.assert_array_equal(g.mm_token_type_ids, w.mm_token_type_ids)
    return len(got[-1].images)


def _assert_same_tensors(theirs: dict[str, np.ndarray], images: list[dict]) -> None:
    ours = _concatenated(images)
    assert theirs.keys() == ours.keys()
    for key, value in ours.items():
        np.testing.assert_array_equal(theirs[key], value, err_msg=key)
        assert theirs[key].dtype == value.dtype, key


def _concatenated(items) -> dict[str, np.ndarray]:
    """Images' model inputs as one array per key, concatenated along dim 0 in order (the
    form a trainer's forward takes, and prime-rl's orchestrator sends it)."""
    keys = {key for item in items for key in item}
    return {key: np.concatenate([np.asarray(item[key]) for item in items]) for key in keys}


# -- the adapter against renderers' own renderers --------------------------------------------


class _EndOfText:
    """A tokenizer that answers ``<|endoftext|>`` with ``<|im_end|>``'s id: the tiny
    Qwen3.5 vocabulary has no ``<|endoftext|>``, which renderers' Qwen3.5 renderer looks up
    at construction and uses only as a stop token (nothing it renders holds it)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def convert_tokens_to_ids(self, token):
        return self._tokenizer.convert_tokens_to_ids(
            "<|im_end|>" if token == "<|endoftext|>" else token
        )


def _picture(seed: int, h: int, w: int) -> dict:
    from PIL import Image

    from vf_mm.images import png_data_url

    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return {"type": "image_url", "image_url": {"url": png_data_url(Image.fromarray(pixels))}}


TOOLS = [{"type": "function", "function": {"name": "look", "description": "Look again.",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                         "required": ["x"]}}}]  # fmt: skip


def _conversations() -> dict[str, tuple[list[dict], list[dict] | None]]:
    first, second = _picture(0, 64, 64), _picture(1, 48, 96)
    call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}
    return {
        "text": ([{"role": "user", "content": "hello there"}], None),
        "system and image": ([{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": [first, {"type": "text", "text": "What?"}]}],
                             None),
        "two turns, two images": ([{"role": "user", "content": [first, {"type": "text", "text": "What?"}]},
                                   {"role": "assistant", "content": "A square."},
                                   {"role": "user", "content": [{"type": "text", "text": "And?"}, second]}],
                                  None),
        "a tool result with an image": ([{"role": "user", "content": "Look."},
                                         {"role": "assistant", "content": "", "tool_calls": [call]},
                                         {"role": "tool", "tool_call_id": "c1",
                                          "content": [{"type": "text", "text": "seen"}, second]}],
                                        TOOLS),
    }  # fmt: skip


def _theirs(family: str, checkpoint: Path, **config):
    import renderers
    from renderers.base import load_tokenizer

    from vf_mm.models import load_processor

    tokenizer = load_tokenizer(str(checkpoint))
    processor = load_processor(checkpoint)  # without transformers' video processor (torchvision)
    if family == "qwen3_vl":
        return renderers.Qwen3VLRenderer(
            tokenizer, renderers.Qwen3VLRendererConfig(**config), processor=processor
        )
    return renderers.Qwen35Renderer(
        _EndOfText(tokenizer), renderers.Qwen35RendererConfig(**config), processor=processor
    )


def _assert_same(theirs, ours, where: str) -> None:
    assert ours.token_ids == theirs.token_ids, where
    if theirs.multi_modal_data is None:
        assert ours.multi_modal_data is None, where
        return
    a, b = theirs.multi_modal_data, ours.multi_modal_data
    assert [(p.offset, p.length) for p in b.mm_placeholders["image"]] == [
        (p.offset, p.length) for p in a.mm_placeholders["image"]
    ], where
    for x, y in zip(a.mm_items["image"], b.mm_items["image"], strict=True):
        for key in ("pixel_values", "image_grid_thw"):
            np.testing.assert_array_equal(np.asarray(x[key]), np.asarray(y[key]), err_msg=where)


# the conversations where renderers' Qwen3.5 renderer departs from the chat template on
# purpose (its module docstring): with thinking off it writes the empty
# ``<think>\n\n</think>\n\n`` its generation prompt opened into an earlier assistant turn
# that has no reasoning, where the template (and so vf_mm) writes the turn without it
QWEN35_NOTHINK_DEPARTS = {"two turns, two images"}


@pytest.mark.parametrize(
    ("family", "variant", "config"),
    [
        ("qwen3_vl", "instruct", {}),
        ("qwen3_5", "nothink", {"enable_thinking": False}),
        ("qwen3_5", "think", {"enable_thinking": True}),
    ],
    ids=["qwen3_vl-instruct", "qwen3_5-nothink", "qwen3_5-think"],
)
def test_the_adapter_renders_what_renderers_own_renderer_renders(
    vf1, tmp_path_factory, checkpoints, family, variant, config
):
    """Token for token, images and their placeholders included, processed and collapsed
    (``process_multimodal=False``, what verifiers sends), with and without the generation
    prompt; the one departure is renderers' own, stated and checked. (renderers' Qwen3-VL
    renderer writes the Instruct checkpoints' format, so the tiny Qwen3-VL is built with
    that template; its default is the Thinking checkpoints'.)"""
    from vf_mm.testing import build_tiny_vlm

    _, integration = vf1
    if variant in (None, "nothink"):
        checkpoint = checkpoints(family)
    else:
        checkpoint = build_tiny_vlm(tmp_path_factory.mktemp("qwen35-think") / "m", family,
                                    variant=variant)  # fmt: skip
    theirs = _theirs(family, checkpoint, **config)
    ours = integration.VfMMRenderer(None, integration.VfMMRendererConfig(model=str(checkpoint)))
    assert ours.mm_token_type_id_map == theirs.mm_token_type_id_map
    departed = 0
    for name, (messages, tools) in _conversations().items():
        for prompt in (True, False):
            where = f"{family} {variant}: {name}, add_generation_prompt={prompt}"
            a = theirs.render(messages, tools=tools, add_generation_prompt=prompt)
            b = ours.render(messages, tools=tools, add_generation_prompt=prompt)
            if variant == "nothink" and name in QWEN35_NOTHINK_DEPARTS:
                empty = "<|im_start|>assistant\n<think>\n\n</think>\n\nA square.<|im_end|>"
                assert empty in ours.renderer.tokenizer.decode(a.token_ids), where
                assert "<|im_start|>assistant\nA square.<|im_end|>" in (
                    ours.renderer.tokenizer.decode(b.token_ids)
                ), where
                departed += 1
                continue
            _assert_same(a, b, where)
            collapsed = ours.render(messages, tools=tools, add_generation_prompt=prompt,
                                    process_multimodal=False)  # fmt: skip
            assert (
                collapsed.token_ids
                == theirs.render(
                    messages, tools=tools, add_generation_prompt=prompt, process_multimodal=False
                ).token_ids
            ), where
            assert collapsed.multi_modal_data is None
    assert departed == (2 if variant == "nothink" else 0)


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_the_adapter_bridges_what_renderers_own_renderer_bridges(
    vf1, checkpoints, variant_checkpoint, family
):
    """A sampled turn (a reply, or a tool call), then the environment's answer with a new
    image: both renderers bridge onto the same previous tokens (collapsed, as verifiers
    hands them) to the same next prompt. Except where renderers' Qwen3.5 departs from the
    template (``QWEN35_NOTHINK_DEPARTS``): after a new user message the template writes the
    sampled turn without the empty reasoning block its generation prompt opened, so vf_mm
    declines the bridge (verifiers renders the conversation again: a new branch, as vf_mm's
    own client makes a new sample) where renderers extends its own rendering."""
    _, integration = vf1
    # renderers' Qwen3-VL renderer writes the Instruct checkpoints' format
    checkpoint = variant_checkpoint(family, "instruct" if family == "qwen3_vl" else None)
    config = {} if family == "qwen3_vl" else {"enable_thinking": False}
    theirs = _theirs(family, checkpoint, **config)
    ours = integration.VfMMRenderer(None, integration.VfMMRendererConfig(model=str(checkpoint)))
    tokenizer = ours.renderer.tokenizer
    stop = ours.get_stop_token_ids()[0]
    first = [{"role": "user", "content": [_picture(0, 64, 64), {"type": "text", "text": "Move?"}]}]
    answer = [{"role": "user", "content": [_picture(1, 48, 96), {"type": "text", "text": "Next?"}]}]
    result = [{"role": "tool", "tool_call_id": "c1", "content": [_picture(1, 48, 96)]}]
    call = ours.renderer.format_tool_calls([("look", {"x": 1})])
    for tools, sampled, new in ((None, "up", answer), (TOOLS, call, result)):
        a = theirs.render(first, tools=tools, add_generation_prompt=True, process_multimodal=False)
        b = ours.render(first, tools=tools, add_generation_prompt=True, process_multimodal=False)
        assert a.token_ids == b.token_ids
        completion = [*tokenizer(sampled, add_special_tokens=False)["input_ids"], stop]
        theirs_bridge = theirs.bridge_to_next_turn(
            a.token_ids, completion, new, tools=tools, process_multimodal=False
        )
        ours_bridge = ours.bridge_to_next_turn(
            b.token_ids, completion, new, tools=tools, process_multimodal=False
        )
        where = f"{family}, after {sampled!r}"
        if family == "qwen3_5" and new is answer:
            assert ours_bridge is None
            assert ours.renderer.bridge_refusals[
                "the template drops the reasoning of earlier turns"
            ]
            assert theirs_bridge is not None
            continue
        assert ours_bridge is not None, (where, dict(ours.renderer.bridge_refusals))
        assert theirs_bridge is not None, where
        assert ours_bridge.token_ids == theirs_bridge.token_ids, where
        assert ours_bridge.token_ids[: len(b.token_ids) + len(completion)] == [
            *b.token_ids,
            *completion,
        ]


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "smolvlm", "internvl"])
def test_a_family_whose_image_range_holds_markers_is_refused_in_content_parts_form(
    vf1, checkpoints, family
):
    """Gemma 3 and Gemma 4 write an image as markers around the embeddings (Gemma 3 blank
    lines beside them), SmolVLM its tiles' row text and tags, InternVL3 ``<img>`` tags: a
    server expanding one pad writes that text on its side, so the collapsed form is
    refused by name (the full render is vf_mm's, as ever)."""
    from vf_mm.errors import UnsupportedModelError

    _, integration = vf1
    ours = integration.VfMMRenderer(
        None, integration.VfMMRendererConfig(model=str(checkpoints(family)))
    )
    messages = [{"role": "user", "content": [_picture(0, 64, 64), {"type": "text", "text": "?"}]}]
    assert ours.render(messages, add_generation_prompt=True).multi_modal_data is not None
    with pytest.raises(UnsupportedModelError, match="content_parts"):
        ours.render(messages, add_generation_prompt=True, process_multimodal=False)


def test_a_rollout_that_fails_fails_its_trace_with_vf_mm_error_never_a_reward(vf1, monkeypatch):
    """A row whose prompt the environment cannot make: the harness exits non-zero with
    vf_mm's error (its stage named), verifiers records it on the trace (not ok, no reward),
    and a trainer leaves the trace out."""
    import vf_mm as vf

    v1, _ = vf1
    broken = vf.SingleTurnEnv(dataset=[{"answer": "a"}], rubric=vf.Rubric())  # no question
    monkeypatch.setattr(vf, "load_environment", lambda env_id, **kw: broken)
    env = v1.load_environment(
        v1.resolve_env_config(
            {"agent": {"runtime": {"type": "subprocess"}},
             "taskset": {"id": "vf-mm-verifiers", "env": "broken-env"}}
        )
    )  # fmt: skip
    client = v1.TrainClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var="VF_MM_NO_KEY")
    ctx = v1.ModelContext(model="m", client=client, sampling=v1.SamplingConfig(max_tokens=4))
    (task,) = list(env.taskset)

    async def run():
        async with env.serving():
            return await env.run_slot(env.slots(task, 1)[0], ctx)

    episode = asyncio.run(run())
    (trace,) = episode.traces
    assert not episode.ok and not trace.ok
    assert trace.rewards.get("reward") is None
    (error,) = trace.errors
    assert error.type == "HarnessError"
    assert "making the prompt" in error.message and "question" in error.message
    assert trace.info["vf_mm"]["reward"] is None


def test_a_sampled_node_two_branches_share_is_trained_once(vf1):
    """A trace that forks after its first model turn (a history rendered again): both
    branches hold that turn; it is trained in the first only, the second keeps it as
    context (mask 0, no logprob), as prime-rl's orchestrator trains it."""
    v1, integration = vf1

    def node(parent, role, ids, mask=None, logprobs=(), sampled=False):
        message = {"role": role, "content": f"{role} {ids}"}
        return v1.MessageNode(parent=parent, message=message, token_ids=list(ids),
                              mask=list(mask or [False] * len(ids)), logprobs=list(logprobs),
                              sampled=sampled)  # fmt: skip

    trace = v1.Trace(
        task=v1.TraceTask(type="Task", data=v1.TaskData(prompt="p")),
        agent=v1.AgentInfo(config=v1.AgentConfig()),
        nodes=[
            node(None, "user", [1, 2]),
            node(0, "assistant", [3, 4], [False, True], [-0.5], sampled=True),
            node(1, "user", [5]),
            node(2, "assistant", [6, 7], [False, True], [-0.25], sampled=True),
            node(1, "user", [8]),
            node(4, "assistant", [9], [True], [-0.125], sampled=True),
        ],
    )

    class Text:
        is_multimodal = False

    first, second = integration.trace_samples(trace, Text(), advantage=2.0)
    assert first.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert first.loss_mask.tolist() == [0, 0, 0, 1, 0, 0, 1]
    assert first.logprobs.tolist() == [0, 0, 0, -0.5, 0, 0, -0.25]
    assert second.input_ids.tolist() == [1, 2, 3, 4, 8, 9]
    assert second.loss_mask.tolist() == [0, 0, 0, 0, 0, 1]  # turn 1 trained in the first
    assert second.logprobs.tolist() == [0, 0, 0, 0, 0, -0.125]
    assert second.advantages.tolist() == [0, 0, 0, 0, 0, 2.0]
