"""``bridge_to_next_turn`` equals a full render with the sampled completion kept verbatim,
never mutates its inputs, and says None (with a reason) when it cannot guarantee that."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._params import UNICODE
from tests.renderers.conftest import content, conversation, random_image
from vf_mm.renderers import load_renderer


def sample(renderer, text: str, *, stop: bool = True) -> list[int]:
    """Completion ids as a model would sample them: the text's canonical tokens + stop."""
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + ([renderer.stop_token_ids[0]] if stop else [])


def bridge_or_reason(renderer, *args, **kwargs):
    """``bridge_to_next_turn``'s result, or the reason it gave to ``on_refusal``."""
    reasons = []
    out = renderer.bridge_to_next_turn(*args, on_refusal=reasons.append, **kwargs)
    assert (out is None) == (len(reasons) == 1)
    return out if out is not None else reasons[0]


# Qwen3-VL's default template (its Thinking checkpoints') opens a thought in the
# generation prompt: the model writes its reasoning, closes it, then answers, and the
# history writes that thought back only for the turns after the last user query. So its
# turns bridge across tool results, and a new user query is refused (the thought is
# dropped, a rewrite no bridge can equal), as for Qwen3.5.
THOUGHT = "let me look\n</think>\n\n"
DROPS_REASONING = "the template drops the reasoning of earlier turns"


def opens_a_thought(renderer) -> bool:
    prompt = renderer.render([{"role": "user", "content": "hi"}])
    return renderer.tokenizer.decode(prompt.token_ids).endswith("<think>\n")


def sampled(renderer, reply: str) -> tuple[str, str]:
    """(what the model writes after the prompt to give ``reply``, the assistant content
    that holds it): a thought first where the prompt opened one."""
    if opens_a_thought(renderer):
        return THOUGHT + reply, "<think>\n" + THOUGHT + reply
    return reply, reply


def split_turns(messages):
    """(history before the last assistant reply, that reply, the messages after it)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], messages[last], messages[last + 1 :]


def check_bridge(renderer, messages, *, stop=True):
    """The bridge equals the full render, or, where the template drops the sampled
    thought on a new user query, refuses saying so."""
    history, reply, tail = split_turns(messages)
    written, content = sampled(renderer, reply["content"])
    messages = [*history, {**reply, "content": content}, *tail]
    first = renderer.render(history)
    completion = sample(renderer, written, stop=stop)
    bridged = bridge_or_reason(
        renderer,
        first.token_ids,
        completion,
        tail,
        previous_multi_modal_data=first.multi_modal_data,
    )
    if written != content and any(m["role"] == "user" for m in tail):
        assert bridged == DROPS_REASONING
        return first, None
    assert not isinstance(bridged, str), bridged
    full = renderer.render(messages)
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    for a, b in zip(bridged.multi_modal_data.mm_items.get("image", []),
                    full.multi_modal_data.mm_items.get("image", []), strict=True):  # fmt: skip
        assert a is b  # the same cached inputs, carried forward, not reprocessed
    # the previous turn's tokens and completion are kept verbatim
    n = len(first.token_ids)
    assert bridged.token_ids[:n] == first.token_ids
    assert bridged.token_ids[n : n + len(completion)] == completion
    return first, bridged


def with_tail(seed, tail_kind):
    rng = random.Random(seed)
    pool = []
    msgs = conversation(seed, max_turns=3)
    msgs.append({"role": "assistant", "content": "I see three circles."})
    if tail_kind == "user":
        msgs.append({"role": "user", "content": content(rng, pool, 2, "And now?")})
    else:
        msgs.append(
            {"role": "tool", "tool_call_id": "t1", "content": content(rng, pool, 2, "crop")}
        )
        if tail_kind == "tools":
            msgs.append({"role": "tool", "tool_call_id": "t2", "content": "second result"})
    return msgs


def test_bridge_equals_full_render_after_user_turn(renderer_and_processor):
    renderer, _ = renderer_and_processor
    for seed in range(4):
        check_bridge(renderer, with_tail(seed, "user"))


def test_bridge_equals_full_render_after_tool_turns(renderer_and_processor):
    renderer, _ = renderer_and_processor
    for seed in range(4):
        check_bridge(renderer, with_tail(seed, "tool"))
        check_bridge(renderer, with_tail(seed, "tools"))


def test_bridge_after_a_completion_cut_by_max_tokens(renderer_and_processor):
    renderer, _ = renderer_and_processor
    check_bridge(renderer, with_tail(0, "user"), stop=False)
    check_bridge(renderer, with_tail(0, "tool"), stop=False)


def test_bridge_chain_of_turns_keeps_earlier_images_unchanged(renderer_and_processor):
    renderer, _ = renderer_and_processor
    rng = random.Random(7)
    pool = []
    messages = [{"role": "user", "content": content(rng, pool, 2, "start")}]
    rendered = renderer.render(messages)
    # a thought is kept only until the next user query: the chain goes on in tool results
    role = "tool" if opens_a_thought(renderer) else "user"
    for turn in range(5):
        written, reply = sampled(renderer, f"move {turn}")
        completion = sample(renderer, written)
        new = [{"role": role, "content": content(rng, pool, 1, f"state {turn}")}]
        before = rendered.multi_modal_data.copy()
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new, previous_multi_modal_data=rendered.multi_modal_data
        )
        assert bridged is not None
        k = before.num_items("image")
        assert bridged.multi_modal_data.mm_placeholders["image"][:k] == before.mm_placeholders.get(
            "image", []
        )
        messages += [{"role": "assistant", "content": reply}, *new]
        assert bridged.token_ids == renderer.render(messages).token_ids
        rendered = bridged


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), tail_kind=st.sampled_from(["user", "tool", "tools"]))
def test_bridge_never_mutates_its_inputs(renderer_and_processor, seed, tail_kind):
    renderer, _ = renderer_and_processor
    messages = with_tail(seed, tail_kind)
    history, reply, tail = split_turns(messages)
    first = renderer.render(history)
    written, _content = sampled(renderer, reply["content"])
    completion = sample(renderer, written)
    prompt_ids = list(first.token_ids)
    data = first.multi_modal_data
    snapshot = (
        copy.deepcopy(data.mm_hashes),
        copy.deepcopy(data.mm_placeholders),
        {m: [id(i) for i in items] for m, items in data.mm_items.items()},
    )
    tail_copy = copy.deepcopy([{k: v for k, v in m.items()} for m in tail])
    completion_copy = list(completion)
    bridged = renderer.bridge_to_next_turn(
        prompt_ids, completion, tail, previous_multi_modal_data=data
    )
    assert prompt_ids == first.token_ids and completion == completion_copy
    assert (data.mm_hashes, data.mm_placeholders) == snapshot[:2]
    assert {m: [id(i) for i in items] for m, items in data.mm_items.items()} == snapshot[2]
    assert [set(m) for m in tail] == [set(m) for m in tail_copy]
    if bridged is None:  # refused, and only where a new query drops the thought
        assert written != reply["content"] and tail_kind == "user"
        return
    assert bridged.multi_modal_data is not data
    assert bridged.token_ids is not prompt_ids


def test_refuses_an_assistant_message_in_the_tail(renderer_and_processor):
    renderer, _ = renderer_and_processor
    first = renderer.render([{"role": "user", "content": "hi"}])
    out = renderer.bridge_to_next_turn(
        first.token_ids, sample(renderer, "hello"),
        [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
        previous_multi_modal_data=first.multi_modal_data,
    )  # fmt: skip
    assert out is None
    assert renderer.bridge_refusals["an assistant message in the new messages"] >= 1


def test_refuses_image_tokens_without_their_data(renderer_and_processor):
    renderer, _ = renderer_and_processor
    image = {"type": "image", "image": random_image(random.Random(2))}
    first = renderer.render(
        [{"role": "user", "content": [image, {"type": "text", "text": "look"}]}]
    )
    out = renderer.bridge_to_next_turn(
        first.token_ids, sample(renderer, "ok"), [{"role": "user", "content": "next"}],
        previous_multi_modal_data=None,
    )  # fmt: skip
    assert out is None
    assert any("image tokens" in reason for reason in renderer.bridge_refusals)


def test_qwen3_refuses_after_reasoning_when_a_new_query_drops_it(checkpoints):
    from vf_mm.renderers import load_renderer

    renderer = load_renderer(checkpoints["qwen3_vl"])
    first = renderer.render([{"role": "user", "content": "count"}])
    completion = sample(renderer, THOUGHT + "three")  # the prompt opened the thought
    out = renderer.bridge_to_next_turn(
        first.token_ids, completion, [{"role": "user", "content": "and now?"}],
        previous_multi_modal_data=first.multi_modal_data,
    )  # fmt: skip
    assert out is None
    assert renderer.bridge_refusals["the template drops the reasoning of earlier turns"] == 1


def test_qwen3_bridges_tool_results_after_reasoning(checkpoints):
    """Within one query (tool results only), Qwen3 keeps the reasoning: bridging is exact."""
    from vf_mm.renderers import load_renderer

    renderer = load_renderer(checkpoints["qwen3_vl"])
    messages = [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": "", "reasoning_content": "let me zoom",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "zoom", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "crop"},
    ]  # fmt: skip
    first = renderer.render(messages[:1])
    full = renderer.render(messages)
    n = len(first.token_ids)
    completion = full.token_ids[n : full.token_ids.index(renderer.stop_token_ids[0], n) + 1]
    bridged = renderer.bridge_to_next_turn(
        first.token_ids, completion, messages[2:], previous_multi_modal_data=first.multi_modal_data
    )
    assert bridged is not None
    assert bridged.token_ids == full.token_ids


@pytest.mark.parametrize("tail_role", ["tool", "user"])
def test_reasoning_kept_in_content_is_bridged_where_the_template_keeps_content(
    checkpoints, tail_role
):
    """Qwen2-VL and Qwen2.5-VL render an assistant's content verbatim, ``<think>`` and all:
    a completion that reasons before its tool call bridges exactly, with no refusal."""
    from vf_mm.renderers import load_renderer

    for family in ("qwen2_vl", "qwen2_5_vl"):
        renderer = load_renderer(checkpoints[family])
        rng = random.Random(7)
        text = '<think>\nthe left half\n</think>\n\n<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call>'
        history = [{"role": "user", "content": [random_image(rng, max_w=300, max_h=200), "count"]}]
        history[0]["content"] = [{"type": "image", "image": history[0]["content"][0]},
                                 {"type": "text", "text": "count"}]  # fmt: skip
        first = renderer.render(history)
        completion = sample(renderer, text)
        reply = renderer.parse_response(completion).message
        assert "<think>" in reply["content"]  # kept in the content: the template renders it
        tail = [{"role": tail_role, "content": [{"type": "image", "image": random_image(rng)},
                                               {"type": "text", "text": "zoomed"}]}]  # fmt: skip
        if tail_role == "tool":
            tail[0]["tool_call_id"] = reply["tool_calls"][0]["id"]
        out = bridge_or_reason(
            renderer, first.token_ids, completion, tail,
            previous_multi_modal_data=first.multi_modal_data,
        )  # fmt: skip
        assert not isinstance(out, str), f"{family} refused: {out}"
        full = renderer.render([*history, reply, *tail])
        assert out.token_ids == full.token_ids
        assert out.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
        assert dict(renderer.bridge_refusals) == {}


def test_refuses_a_completion_with_a_stop_token_before_its_end(renderer_and_processor):
    renderer, _ = renderer_and_processor
    first = renderer.render([{"role": "user", "content": "hi"}])
    stop = renderer.stop_token_ids[0]
    completion = [*sample(renderer, "a", stop=True), *sample(renderer, "b", stop=True)]
    assert completion.count(stop) == 2
    out = bridge_or_reason(
        renderer, first.token_ids, completion, [{"role": "user", "content": "next"}]
    )
    assert out == "the completion has a stop token before its end"


def test_qwen3_checks_the_real_history_when_given(checkpoints):
    """Reasoning two turns back, a tool reply, a plain answer, then a new query: Qwen3
    drops the old reasoning, so the bridge must refuse or equal the full render."""
    from vf_mm.renderers import load_renderer

    renderer = load_renderer(checkpoints["qwen3_vl"])
    call = {"id": "c", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": "", "reasoning_content": "plan", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "crop"},
    ]
    prompt = renderer.render(history)
    completion = sample(renderer, "step one")
    reply = {"role": "assistant", "content": "step one"}
    new = [{"role": "user", "content": "and now?"}]
    out = bridge_or_reason(renderer, prompt.token_ids, completion, new, previous_multi_modal_data=prompt.multi_modal_data,
                           previous_messages=[*history, reply])  # fmt: skip
    full = renderer.render([*history, reply, *new])
    rewritten = (
        "the template renders earlier turns differently once this turn is added",
        "the template renders earlier turns differently once later turns exist",
    )
    assert out in rewritten or out.token_ids == full.token_ids
    # and without the messages, the reasoning in the prompt tokens is enough to refuse
    out = bridge_or_reason(
        renderer,
        prompt.token_ids,
        completion,
        new,
        previous_multi_modal_data=prompt.multi_modal_data,
    )
    assert out == "the template drops the reasoning of earlier turns"


def test_a_video_that_cannot_be_read_fails_naming_it(renderer_and_processor):
    from vf_mm.errors import VideoError

    renderer, _ = renderer_and_processor
    with pytest.raises(VideoError, match=r"x\.mp4.*message 0, part 0"):
        renderer.render(
            [
                {
                    "role": "user",
                    "content": [{"type": "video", "video": "x.mp4"}, {"type": "text", "text": "?"}],
                }
            ]
        )


def data_url_turn(seed: int, text: str) -> dict:
    """A user turn as users send it: a PNG data URL in an OpenAI-style part."""
    from vf_mm.images import png_data_url

    url = png_data_url(random_image(random.Random(seed), max_w=120, max_h=90))
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text},
        ],
    }


def test_with_the_real_history_one_render_of_the_sampled_turn_gives_the_tail(
    renderer_and_processor, monkeypatch
):
    """A completion closed by a stop token, with ``previous_messages``: the render of the
    real turn is the previous prompt, the completion verbatim and the tail, so the probe
    render is not needed; the result equals the full render, turn after turn."""
    renderer, _ = renderer_and_processor
    if renderer._facts[None].history_sensitive:
        pytest.skip("a template that rewrites earlier turns renders the whole history")
    messages = [data_url_turn(0, "start")]
    rendered = renderer.render(messages)
    monkeypatch.setattr(renderer._bridge, "_tail_text", None)  # the probe path would fail
    for turn in range(3):
        reply = {"role": "assistant", "content": f"move {turn}"}
        new = [data_url_turn(turn + 1, f"state {turn}")]
        out = bridge_or_reason(
            renderer, rendered.token_ids, sample(renderer, reply["content"]), new,
            previous_multi_modal_data=rendered.multi_modal_data,
            previous_messages=[*messages, reply],
        )  # fmt: skip
        assert not isinstance(out, str), out
        messages += [reply, *new]
        full = renderer.render(messages)
        assert out.token_ids == full.token_ids
        assert out.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
        rendered = out


def test_with_the_real_history_a_cut_off_or_edited_turn_takes_the_probe_path(
    renderer_and_processor,
):
    renderer, _ = renderer_and_processor
    history = [data_url_turn(5, "start")]
    prompt = renderer.render(history)
    new = [data_url_turn(6, "next")]
    # cut off by max_tokens: the render could continue the completion's last word, so the
    # tail comes from the probe render (the turn's closing), checked against the replay
    cut = sample(renderer, "I move le", stop=False)
    reply = {"role": "assistant", "content": "I move le"}
    out = bridge_or_reason(renderer, prompt.token_ids, cut, new, previous_multi_modal_data=prompt.multi_modal_data,
                           previous_messages=[*history, reply])  # fmt: skip
    full = renderer.render([*history, reply, *new])
    assert isinstance(out, str) or out.token_ids == full.token_ids
    # a reply whose content is not what was sampled ("left." was never generated): the
    # sampled text is a prefix of the render, but the bridge must not split a word there
    edited = {"role": "assistant", "content": "I move left."}
    out = bridge_or_reason(renderer, prompt.token_ids, cut, new, previous_multi_modal_data=prompt.multi_modal_data,
                           previous_messages=[*history, edited])  # fmt: skip
    assert isinstance(out, str)


# -- the previous prompt's embedding tokens are counted once ---------------------------


def test_a_chain_of_bridges_counts_only_each_turns_new_tokens(renderer_and_processor, monkeypatch):
    """Bridging onto a list the renderer returned does not scan the whole history again
    (the cost of a turn does not grow with the turns before it): every count covers at
    most the new turn's own tokens, and the chain still equals the full render."""
    renderer, _ = renderer_and_processor
    messages = [data_url_turn(10, "start")]
    rendered = renderer.render(messages)
    counted: list[int] = []
    count = renderer._count
    monkeypatch.setattr(renderer, "_count", lambda ids: counted.append(len(ids)) or count(ids))
    role = "tool" if opens_a_thought(renderer) else "user"  # as in the chain test above
    for turn in range(4):
        written, text = sampled(renderer, f"move {turn}")
        reply = {"role": "assistant", "content": text}
        new = [{**data_url_turn(turn + 11, f"state {turn}"), "role": role}]
        before = len(rendered.token_ids)
        out = renderer.bridge_to_next_turn(
            rendered.token_ids, sample(renderer, written), new,
            previous_multi_modal_data=rendered.multi_modal_data,
            previous_messages=[*messages, reply],
        )  # fmt: skip
        assert out is not None, f"not bridged: {dict(renderer.bridge_refusals)}"
        assert counted and max(counted) <= len(out.token_ids) - before
        counted.clear()
        messages += [reply, *new]
        assert out.token_ids == renderer.render(messages).token_ids
        counted.clear()  # the full render above counts its own tokens
        rendered = out


def test_a_returned_list_changed_afterwards_is_counted_again(renderer_and_processor):
    """The counts kept for a returned list hold only while it has the length it had: image
    tokens appended to it are found, and the bridge refuses what its data does not cover.
    A copy of the list (not the object the renderer returned) is counted from scratch."""
    renderer, _ = renderer_and_processor
    first = renderer.render([data_url_turn(20, "look")])
    pad = next(iter(renderer.vision.embed_token_ids))
    edited = first.token_ids
    edited += [pad, pad]
    out = bridge_or_reason(
        renderer, edited, sample(renderer, "ok"), [{"role": "user", "content": "next"}],
        previous_multi_modal_data=first.multi_modal_data,
    )  # fmt: skip
    assert isinstance(out, str) and "image" in out and "covers" in out
    copied = renderer.render([data_url_turn(21, "look")])
    out = bridge_or_reason(
        renderer, list(copied.token_ids), sample(renderer, "ok"),
        [{"role": "user", "content": "next"}], previous_multi_modal_data=None,
    )  # fmt: skip
    assert isinstance(out, str) and "covers 0" in out


def test_a_tokenizer_left_truncating_still_renders_every_token(renderer_and_processor):
    """The renderer calls a fast tokenizer's backend directly, except when a caller left
    it set to truncate or pad (state on a shared tokenizer): then the tokenizer's own call
    applies its settings, and the render is the same as ever."""
    renderer, _ = renderer_and_processor
    backend = getattr(renderer.tokenizer, "backend_tokenizer", None)
    if backend is None:
        pytest.skip("not a fast tokenizer")
    messages = [data_url_turn(30, "a few words of text that are longer than four tokens")]
    expected = renderer.render(messages).token_ids
    backend.enable_truncation(4)
    try:
        assert renderer.render(messages).token_ids == expected
    finally:
        backend.no_truncation()


def test_decoding_a_completion_is_the_tokenizers_own_decode(renderer_and_processor):
    """The bridge decodes the sampled completion through the Rust backend where that is
    exactly ``tokenizer.decode`` (a fast tokenizer without space clean-up): special
    tokens, image markers and bytes split across tokens decode the same either way."""
    renderer, _ = renderer_and_processor
    tokenizer = renderer.tokenizer
    rng = random.Random(7)
    special = list(tokenizer.all_special_ids)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(0, 30))]
        ids += rng.sample(special, min(2, len(special)))
        rng.shuffle(ids)
        assert renderer._decode(ids) == tokenizer.decode(ids, skip_special_tokens=False)


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_its_own_call(checkpoints, monkeypatch):
    renderer = load_renderer(checkpoints["qwen2_5_vl"])
    calls = []
    decode = renderer.tokenizer.decode
    monkeypatch.setattr(
        renderer.tokenizer, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k)
    )
    renderer._decode([1, 2, 3])
    assert calls == []  # the backend's own decode
    monkeypatch.setattr(renderer.tokenizer, "clean_up_tokenization_spaces", True)
    renderer._decode([1, 2, 3])
    assert calls == [1]  # the setting applies, through the tokenizer's call


# -- the ChatML tail: Qwen2-VL's and Qwen2.5-VL's templates without running them ------------

_TEXT = st.text(UNICODE, max_size=12) | st.sampled_from(
    ["", " ", "\n", " a \n", "<b>x</b>", "{{ x }}", "{% raw %}", "Picture 1:", "<|vision_start|>"]
)
_PART = st.one_of(
    st.just({"type": "image"}),
    st.just({"type": "video"}),
    st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
    st.builds(lambda t: {"type": "text", "text": t, "image_url": None}, _TEXT),  # Arrow rows
    st.just({"type": "text"}),  # no text: the template writes nothing for it
)
_MESSAGE = st.builds(
    lambda role, body: {"role": role, "content": body},
    st.sampled_from(["user", "tool", "system", "observation"]),
    _TEXT | st.lists(_PART, max_size=4),
)


@pytest.fixture(scope="module", params=["tiny", "published"])
def chatml_renderer(request, checkpoints):
    """The tiny Qwen2.5-VL's renderer with its own template, or with the published one."""
    from pathlib import Path

    renderer = load_renderer(checkpoints["qwen2_5_vl"])
    if request.param == "published":
        tokenizer = copy.deepcopy(renderer.tokenizer)
        golden = Path(__file__).with_name("golden") / "qwen2_5_vl.jinja"
        tokenizer.chat_template = golden.read_text()
        renderer = type(renderer)(tokenizer, vision=renderer.vision)
    assert renderer._facts[None].chatml  # recognised, and its probes rendered as built
    return renderer


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turn=_TEXT, new=st.lists(_MESSAGE, min_size=1, max_size=3))
def test_the_chatml_tail_is_what_the_template_writes(chatml_renderer, turn, new):
    from vf_mm.renderers._chatml import chatml_tail as _chatml_tail
    from vf_mm.renderers._facts import PROBE_USER as _USER

    r = chatml_renderer
    user, assistant = {"role": "user", "content": _USER}, {"role": "assistant", "content": turn}
    prompt = r._template([user], None, True)
    full = r._template([user, assistant, *new], None, True)
    sampled = turn + "<|im_end|>"
    assert full.startswith(prompt + sampled)
    assert _chatml_tail(assistant, new, sampled) == full[len(prompt) + len(sampled) :]


def test_the_chatml_tail_leaves_what_it_cannot_vouch_for_to_the_template():
    from vf_mm.renderers._chatml import chatml_tail as _chatml_tail

    user = [{"role": "user", "content": "next"}]
    turn = {"role": "assistant", "content": "ok"}
    assert _chatml_tail(turn, user, "ok<|im_end|>") is not None
    calls = {**turn, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    assert _chatml_tail(calls, user, "ok<|im_end|>") is None  # more than text in the turn
    assert _chatml_tail(turn, user, "ok!<|im_end|>") is None  # sampled is not the turn
    assert _chatml_tail(turn, user, "ok<|endoftext|>") is None  # closed by another token
    odd = [{"role": "user", "content": [{"type": "text", "text": 5}]}]
    assert _chatml_tail(turn, odd, "ok<|im_end|>") is None  # Jinja would write str(5)
    assert _chatml_tail(turn, [{"role": "user", "content": None}], "ok<|im_end|>") is None


def test_an_edited_chatml_template_runs_itself(checkpoints):
    renderer = load_renderer(checkpoints["qwen2_5_vl"])
    tokenizer = copy.deepcopy(renderer.tokenizer)
    tokenizer.chat_template = tokenizer.chat_template.replace("<|im_end|>", "<|im_end|> ")
    assert not type(renderer)(tokenizer, vision=renderer.vision)._facts[None].chatml
