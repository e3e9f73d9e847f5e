"""RendererClient: bridges from the newest step that prefixes the prompt, falls back to a
full render (and says why), and returns tokens parallel to their logprobs and mask."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import numpy as np
import pytest
from PIL import Image

from vf_mm import RendererClient
from vf_mm.inference import SamplingParams
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, ScriptedChatBackend, build_tiny_vlm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("client") / "m", "qwen2_5_vl")


@pytest.fixture(scope="module")
def renderer(model_dir):
    return load_renderer(model_dir)


def image(seed):
    return Image.fromarray(
        np.random.default_rng(seed).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    )


def user(seed, text="where now?"):
    return {
        "role": "user",
        "content": [{"type": "image", "image": image(seed)}, {"type": "text", "text": text}],
    }


def rollout(client, turns, *, edit=None):
    """A navigation-like rollout: each turn appends the model's message and a new image."""

    async def main():
        messages, trajectory, outs = [user(0)], [], []
        for t in range(turns):
            turn = await client.generate(messages, trajectory=trajectory)
            trajectory.append(turn.step(messages))
            outs.append(turn)
            messages = [*messages, turn.message, user(t + 1)]
            if edit is not None:
                messages = edit(t, messages)
        return messages, trajectory, outs

    return asyncio.run(main())


def test_later_turns_bridge_and_equal_a_render_with_sampled_tokens(renderer):
    backend = ScriptedBackend(renderer, ["left", "up  up", "right!"])
    client = RendererClient(backend, renderer)
    _, trajectory, outs = rollout(client, 4)
    assert [o.bridged for o in outs] == [False, True, True, True]
    assert client.stats.bridges == 3 and client.stats.renders == 1
    assert dict(client.stats.fallbacks) == {"no earlier step": 1}
    # each prompt extends the previous step's prompt + completion, verbatim
    for prev, step in itertools.pairwise(trajectory):
        head = prev.tokens.prompt_ids + prev.tokens.completion_ids
        assert step.tokens.prompt_ids[: len(head)] == head
        assert (
            step.tokens.multi_modal_data.num_items("image")
            == prev.tokens.multi_modal_data.num_items("image") + 1
        )
    # and the backend received exactly those prompts with their images
    assert [r.prompt_ids for r in backend.requests] == [s.tokens.prompt_ids for s in trajectory]


def test_tokens_logprobs_and_mask_are_parallel(renderer):
    client = RendererClient(ScriptedBackend(renderer, ["a reply"]), renderer)
    _, trajectory, _ = rollout(client, 2)
    for step in trajectory:
        step.tokens.validate()
        assert step.tokens.completion_mask == [1] * len(step.tokens.completion_ids)
        assert step.tokens.completion_ids[-1] == renderer.stop_token_ids[0]


def test_edited_history_falls_back_to_a_full_render(renderer):
    def drop_first_image(t, messages):
        return [{"role": "user", "content": "text only now"}, *messages[1:]] if t == 1 else messages

    client = RendererClient(ScriptedBackend(renderer, ["ok"]), renderer)
    rollout(client, 3, edit=drop_first_image)
    assert client.stats.fallbacks["no earlier step is a prefix of the prompt"] == 1
    assert client.stats.renders == 2 and client.stats.bridges == 1


def test_a_refused_bridge_is_rendered_and_the_reason_counted(renderer):
    def add_assistant(t, messages):
        return [*messages, {"role": "assistant", "content": "injected"}, user(99)]

    client = RendererClient(ScriptedBackend(renderer, ["ok"]), renderer)
    rollout(client, 2, edit=add_assistant)
    assert client.stats.fallbacks["an assistant message in the new messages"] == 1


def test_chat_backend_turns_carry_no_tokens():
    backend = ScriptedChatBackend(["hello"])
    client = RendererClient(backend)

    async def main():
        return await client.generate(
            [{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=3)
        )

    turn = asyncio.run(main())
    assert turn.tokens is None and turn.message["content"] == "hello"
    assert backend.calls[0][1].max_tokens == 3


def test_token_backend_needs_a_renderer(renderer):
    with pytest.raises(ValueError, match="pass a renderer"):
        RendererClient(ScriptedBackend(renderer, ["x"]))


def test_the_backend_is_told_the_renderers_stop_tokens(renderer):
    backend = ScriptedBackend(renderer, ["ok"])
    rollout(RendererClient(backend, renderer, sampling=SamplingParams(stop_token_ids=(5,))), 1)
    assert set(backend.requests[0].sampling.stop_token_ids) == {5, *renderer.stop_token_ids}


def test_in_place_edits_of_messages_do_not_rewrite_stored_steps(renderer):
    def strip_images(t, messages):
        for m in messages:  # an environment compacting its history in place
            if isinstance(m["content"], list):
                m["content"][:] = [p for p in m["content"] if p["type"] == "text"]
        return messages

    client = RendererClient(ScriptedBackend(renderer, ["ok"]), renderer)
    _, trajectory, _ = rollout(client, 2, edit=strip_images)
    first_prompt = trajectory[0].prompt
    assert any(p["type"] == "image" for p in first_prompt[-1]["content"])
    assert client.stats.bridges == 0  # the edited history is not a prefix: rendered in full


def test_tool_call_ids_are_unique_in_a_conversation_and_stable_across_runs(renderer):
    call = '<tool_call>\n{"name": "look", "arguments": {"x": 1}}\n</tool_call>'
    twice = f"{call}\n{call}"

    def ids():
        client = RendererClient(ScriptedBackend(renderer, [twice, call, call]), renderer)
        _, _, outs = rollout(client, 3)
        return [c["id"] for o in outs for c in o.message["tool_calls"]]

    first = ids()
    assert len(first) == 4 and len(set(first)) == 4  # same call, same text: still distinct
    assert all(i.startswith("call_") for i in first)
    assert ids() == first  # the same tokens give the same ids


class CoreRenderer:
    """A renderer written to the promised core signature only (no extensions)."""

    def __init__(self, inner):
        self.inner = inner
        self.bridged = 0

    @property
    def stop_token_ids(self):
        return self.inner.stop_token_ids

    @property
    def tokenizer(self):  # what ScriptedBackend tokenizes its replies with
        return self.inner.tokenizer

    def render(self, messages, *, tools=None, add_generation_prompt=True):
        return self.inner.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def bridge_to_next_turn(
        self,
        previous_prompt_ids,
        previous_completion_ids,
        new_messages,
        *,
        tools=None,
        previous_multi_modal_data=None,
    ):
        self.bridged += 1
        return self.inner.bridge_to_next_turn(
            previous_prompt_ids,
            previous_completion_ids,
            new_messages,
            tools=tools,
            previous_multi_modal_data=previous_multi_modal_data,
        )

    def parse_response(self, completion_ids):
        return self.inner.parse_response(completion_ids)


@pytest.mark.parametrize("pooled", [False, True])
def test_a_renderer_with_the_core_bridge_signature_works_alone_and_in_a_pool(renderer, pooled):
    from vf_mm.renderers import RendererPool

    core = CoreRenderer(renderer)
    used = RendererPool(lambda: core, size=1) if pooled else core
    client = RendererClient(ScriptedBackend(renderer, ["left", "up"]), used)
    _, _, outs = rollout(client, 3)
    assert [o.bridged for o in outs] == [False, True, True] and core.bridged == 2


# -- tokens the family reserves for images and videos -----------------------------------


@pytest.fixture(scope="module")
def family_renderers(tmp_path_factory):
    """Every family the project renders with PIL image processing, one tiny checkpoint each
    (LFM2-VL's image processor is torchvision's alone: tests/renderers/test_lfm2_vl.py)."""
    from vf_mm.models import VISION_FAMILIES, family_info

    root = tmp_path_factory.mktemp("families")
    return {
        f: load_renderer(build_tiny_vlm(root / f, f), image_backend="pil")
        for f in VISION_FAMILIES
        if family_info(f).pil_backend
    }


def reserved_token(renderer):
    """The literal a model of this family may sample by mistake: its video placeholder
    (a random SmolVLM wrote <video>, a Qwen3-VL run sampled <|video_pad|>), else its
    image one."""
    placeholders = renderer.vision.placeholders
    return placeholders.get("video", placeholders["image"])


def ask(text="What now?"):
    return {"role": "user", "content": [{"type": "text", "text": text}]}


@pytest.mark.parametrize(
    "family",
    ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "smolvlm", "llava_onevision"],
)
def test_a_sampled_reserved_token_fails_its_turn_naming_token_turn_and_reason(
    family_renderers, family
):
    """A completion holding the family's placeholder (a backend that ignored the ban, a
    scripted or recorded reply) fails the turn that sampled it, naming the token, the turn
    and why; no later turn is rendered, so none crashes on it or trains on it."""
    from vf_mm.errors import ReservedTokenError

    renderer = family_renderers[family]
    token = reserved_token(renderer)
    backend = ScriptedBackend(renderer, ["Two circles.", f"I see {token} here"])
    client = RendererClient(backend, renderer)

    async def main():
        messages, trajectory = [ask()], []
        first = await client.generate(messages, trajectory=trajectory)
        trajectory.append(first.step(messages))
        messages = [*messages, first.message, ask("And now?")]
        return await client.generate(messages, trajectory=trajectory)

    with pytest.raises(ReservedTokenError) as caught:
        asyncio.run(main())
    message = str(caught.value)
    assert caught.value.token == token
    assert message.startswith("turn 2: ") and f"sampled {token}" in message
    assert "ignored the ban" in message and renderer.vision.family_label in message
    assert len(backend.requests) == 2  # nothing was asked after the refused turn


@pytest.mark.parametrize(
    "family",
    ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "smolvlm", "llava_onevision"],
)
def test_every_request_bans_the_familys_image_and_video_tokens(family_renderers, family):
    renderer = family_renderers[family]
    backend = ScriptedBackend(renderer, ["ok"])
    asyncio.run(RendererClient(backend, renderer).generate([ask()]))
    banned = set(backend.requests[0].banned_token_ids)
    tokens = set(renderer.tokenizer.convert_ids_to_tokens(sorted(banned)))
    assert set(renderer.vision.placeholders.values()) <= tokens
    assert renderer.vision.reserved_token_ids <= banned
    markers = {
        "qwen2_vl": {"<|vision_start|>", "<|vision_end|>"},
        "gemma3": {"<end_of_image>", "<image_soft_token>"},
        "smolvlm": {"<fake_token_around_image>", "<global-img>", "<row_1_col_1>"},
        "llava_onevision": set(),
    }.get(family, {"<|vision_start|>", "<|vision_end|>"})
    assert markers <= tokens
    assert not banned & set(renderer.stop_token_ids)  # the turn can still end


def test_a_completion_spelling_a_placeholder_in_ordinary_tokens_fails_its_turn(renderer):
    """Ordinary tokens can spell <|video_pad|> without sampling its id: the bridge keeps
    the ids, but any render of the history would read the text as a video placeholder."""
    from vf_mm.errors import ReservedTokenError
    from vf_mm.inference import GenerateResult, Usage

    tokenizer = renderer.tokenizer
    pieces = [tokenizer("<|video", add_special_tokens=False)["input_ids"],
              tokenizer("_pad|>", add_special_tokens=False)["input_ids"]]  # fmt: skip
    ids = [*pieces[0], *pieces[1], renderer.stop_token_ids[0]]
    assert not set(ids) & renderer.vision.banned_token_ids
    assert tokenizer.decode(ids[:-1]) == "<|video_pad|>"

    class Spelling:
        name, max_model_len = "spelling", None

        async def generate(self, request):
            return GenerateResult(ids, [-0.5] * len(ids), "stop", Usage(1, len(ids)))

        async def aclose(self):
            return None

    client = RendererClient(Spelling(), renderer)
    with pytest.raises(
        ReservedTokenError, match=r"^turn 1: the completion's text spells <\|video_pad\|>"
    ):
        asyncio.run(client.generate([ask()]))


# -- make_client: the one-call factory ------------------------------------------------


def test_make_client_builds_the_embedded_local_client_and_closes_it():
    import vf_mm as vf
    from vf_mm.inference import LocalBackend
    from vf_mm.renderers import RendererPool

    async def main():
        async with vf.make_client(renderers=1) as client:
            assert isinstance(client.backend, LocalBackend)
            assert isinstance(client.renderer, RendererPool)
            turn = await client.generate([user(0)], sampling=SamplingParams(max_tokens=3))
            assert turn.tokens is not None and len(turn.tokens.completion_ids) <= 3

    asyncio.run(main())


def test_make_client_takes_a_backend_object_and_renders_for_it(renderer, model_dir):
    import vf_mm as vf

    backend = ScriptedBackend(renderer, ["ok"])
    client = vf.make_client(model_dir, backend=backend, renderers=1)
    assert client.backend is backend and client.token_level
    chat = vf.make_client("gpt-x", backend=ScriptedChatBackend(["hi"]))
    assert chat.renderer is None and not chat.token_level


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "vlm"}, "backend must be one of local, vllm, openai"),
        ({"backend": "vllm"}, "needs model="),
        ({"model": "m", "backend": "local", "base_url": "http://x"}, "base_url is for"),
    ],
)
def test_make_client_refuses_arguments_that_do_not_go_together(kwargs, match):
    import vf_mm as vf

    with pytest.raises(ValueError, match=match):
        vf.make_client(**kwargs)


def test_make_client_vllm_needs_a_server(model_dir):
    import vf_mm as vf

    with pytest.raises(ValueError, match="needs base_url="):
        vf.make_client(model_dir, backend="vllm", renderers=1)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl"])
def test_a_content_parts_vllm_client_checks_the_servers_ids_against_the_renderers(
    family, family_renderers, tmp_path
):
    """A content_parts backend built by make_client takes the renderer's embedding ids
    (without them it refuses every clip) and InternVL3's <video> -> <IMG_CONTEXT> swap;
    options the caller gives win."""
    import vf_mm as vf

    vision = family_renderers[family].vision
    model = build_tiny_vlm(tmp_path / family, family)
    client = vf.make_client(model, backend="vllm", base_url="http://127.0.0.1:9", renderers=1,
                            backend_options={"mode": "content_parts"})  # fmt: skip
    backend = client.backend
    assert backend.embed_token_ids == {
        m: frozenset(vision.embed_ids(m)) for m in ("image", "video")
    }
    assert backend.embed_swaps == (
        {"video": vision.vllm_embed_swaps("video")} if family == "internvl" else None
    )
    assert family != "internvl" or backend.embed_swaps["video"]  # the one known swap
    asyncio.run(client.aclose())
    mine = {"image": [1]}
    own = vf.make_client(model, backend="vllm", base_url="http://127.0.0.1:9", renderers=1,
                         backend_options={"mode": "content_parts", "embed_token_ids": mine})  # fmt: skip
    assert own.backend.embed_token_ids == {"image": frozenset([1])}
    asyncio.run(own.aclose())
    plain = vf.make_client(model, backend="vllm", base_url="http://127.0.0.1:9", renderers=1)
    assert plain.backend.embed_token_ids is None  # features mode renders on the client
    asyncio.run(plain.aclose())


def test_the_embedded_models_served_name_renders_from_its_checkpoint(tmp_path, monkeypatch):
    """`vf-mm serve --model embedded` serves the name "embedded": a vllm client named so
    renders from the embedded checkpoint (it was "not a checkpoint directory")."""
    import vf_mm
    from vf_mm.models import embedded_model

    monkeypatch.chdir(tmp_path)  # no ./embedded folder here
    client = vf_mm.make_client("embedded", backend="vllm", base_url="http://127.0.0.1:9")
    assert client.backend.model == "embedded"
    assert client.vision is not None and embedded_model().is_dir()
    asyncio.run(client.aclose())


# -- the tokenizer, loaded once: copied per renderer, sent to workers ------------------


def count_tokenizer_loads(monkeypatch, *, refuse=False):
    """Counts ``AutoTokenizer.from_pretrained`` calls (every tokenizer read from disk);
    ``refuse``: any such call fails the test."""
    from transformers import AutoTokenizer

    loads = []
    load = AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        loads.append(args[0] if args else kwargs)
        assert not refuse, "the tokenizer was read from disk again"
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    return loads


def two_turns():
    return [user(0), {"role": "assistant", "content": "left"}, user(1, "and now?")]


def rendered_ids(client):
    """Every renderer the client's pool can hold (all borrowed at once, so each is built)
    renders a two-turn image prompt; their ids."""
    pool = client.renderer
    with contextlib.ExitStack() as borrowed:
        held = [borrowed.enter_context(pool.renderer()) for _ in range(pool.size)]
        return [r.render(two_turns()).token_ids for r in held]


def test_make_client_reads_the_tokenizer_once_and_gives_each_renderer_its_own(
    model_dir, renderer, monkeypatch
):
    import vf_mm as vf

    loads = count_tokenizer_loads(monkeypatch)
    client = vf.make_client(model_dir, backend=ScriptedBackend(renderer, ["ok"]), renderers=3)
    expected = renderer.render(two_turns()).token_ids
    assert rendered_ids(client) == [expected] * 3
    assert len(loads) == 1  # not once per renderer
    tokenizers = {id(r.tokenizer) for r in client.renderer.renderers}
    assert len(tokenizers) == 3  # a tokenizer is not shared between threads


def test_a_worker_given_the_parents_tokenizer_renders_as_one_that_read_it_from_disk(
    model_dir, renderer, monkeypatch
):
    """What a worker process receives (the snapshot, pickled) builds its whole pool
    without reading tokenizer.json again, and renders the ids a renderer loaded from disk
    renders."""
    import pickle

    import vf_mm as vf
    from vf_mm.models import TokenizerSnapshot

    shipped = pickle.loads(pickle.dumps(TokenizerSnapshot.from_pretrained(model_dir)))
    count_tokenizer_loads(monkeypatch, refuse=True)
    client = vf.make_client(
        model_dir, backend=ScriptedBackend(renderer, ["ok"]), renderers=2, tokenizer=shipped
    )
    expected = renderer.render(two_turns()).token_ids
    assert rendered_ids(client) == [expected] * 2


def test_make_client_refuses_the_tokenizer_of_another_checkpoint(model_dir, renderer, tmp_path):
    import vf_mm as vf
    from vf_mm.models import TokenizerSnapshot

    other = TokenizerSnapshot(renderer.tokenizer, path=tmp_path)
    with pytest.raises(ValueError, match=f"tokenizer of {tmp_path}, not of {model_dir}"):
        vf.make_client(model_dir, backend=ScriptedBackend(renderer, ["ok"]), tokenizer=other)
