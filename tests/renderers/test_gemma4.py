"""Gemma 4: what its templates drop is refused, its completions parse, its turns bridge.

The tiny checkpoints carry vf_mm's rendition of each real template variant (the golden
tests hold them equal to the real ones); these tests pin the behaviour a user of each
variant sees:

- images in a tool result: rendered and exact from 905e84b on (and at the release, where
  a tool message is a turn of its own); refused by name at b446025 and 6b7e72c, whose
  templates write only the result's text;
- a tool message that answers no call (dropped by every template after the release), an
  image in the system message (dropped by all), a system message given as parts (Python
  text before 6b7e72c), audio: refused by name, never rendered empty;
- the thought channel and the ``call:NAME{...}`` dialect parse back into the message that
  re-renders as sampled, and a tool turn bridges to exactly a full render (images in the
  results included); the 26B/31B template's empty thought block in the generation prompt
  is a rewrite of history, which the bridge names.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import RenderError
from vf_mm.models import load_processor
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm, chat_template

from .test_family_parity import assert_matches, image, reference


@pytest.fixture(scope="module")
def variant_paths(gemma4_variants):
    """A tiny Gemma 4 checkpoint per template variant (the session's, conftest.py)."""
    return gemma4_variants


@pytest.fixture(scope="module")
def renderer_of(variant_paths):
    cache: dict[tuple[str, str], Any] = {}

    def get(variant: str = "8995379", **template_kwargs: Any) -> Any:
        key = (variant, json.dumps(template_kwargs, sort_keys=True))
        if key not in cache:
            cache[key] = load_renderer(
                variant_paths(variant), image_backend="pil", template_kwargs=template_kwargs
            )
        return cache[key]

    return get


def picture(seed: int, size: tuple[int, int] = (200, 90)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def call(call_id: str, name: str = "zoom", **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_turn(content: Any) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": picture(1)},
                {"type": "text", "text": "Zoom in."},
            ],
        },
        {"role": "assistant", "content": "", "tool_calls": [call("c1", x=1)]},
        {"role": "tool", "tool_call_id": "c1", "name": "zoom", "content": content},
    ]


# -- the released checkpoints' ids ----------------------------------------------------------

# google/gemma-4-*'s tokenizer.json and config.json (bos 2, eos [1, 106], pad 0)
RELEASED_IDS = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<|tool>": 46, "<tool|>": 47,
    "<|tool_call>": 48, "<tool_call|>": 49, "<|tool_response>": 50, "<tool_response|>": 51,
    '<|"|>': 52, "<|think|>": 98, "<|channel>": 100, "<channel|>": 101, "<|turn>": 105,
    "<turn|>": 106, "\n": 107,
}  # fmt: skip


def test_the_tiny_checkpoint_has_the_released_ids_and_pads_with_0(variant_paths, renderer_of):
    """Engines assume the released layout: vLLM 0.32 takes id 0 for Gemma 4's per-layer
    embeddings at image positions, where transformers takes the config's pad id; with
    any other pad id the sampler and the trainer disagree at every image."""
    tokenizer = renderer_of().tokenizer
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in RELEASED_IDS} == RELEASED_IDS
    config = json.loads((variant_paths("8995379") / "config.json").read_text())
    assert config["text_config"]["pad_token_id"] == tokenizer.pad_token_id == 0
    media = ["boi_token_id", "boa_token_id", "image_token_id", "audio_token_id",
             "eoi_token_id", "eoa_token_index", "video_token_id"]  # fmt: skip
    ids = [config[name] for name in media]  # the released order: 255999, 256000, 258880...
    assert ids == sorted(ids) and max(ids) == len(tokenizer) - 1
    assert config["text_config"]["vocab_size"] == len(tokenizer) == len(tokenizer.get_vocab())


# -- what each template variant drops ------------------------------------------------------


@pytest.mark.parametrize("variant", ["905e84b", "8995379", "31b", "4742fe8"])
def test_images_in_tool_results_render_exactly_where_the_template_writes_them(
    variant_paths, renderer_of, variant
):
    """From 905e84b on an image in a tool result follows the result block; at the
    release a tool message is a turn of its own, images included. Ids and every input
    equal the processor's."""
    renderer = renderer_of(variant)
    processor = load_processor(variant_paths(variant), image_backend="pil")
    rng = random.Random(3)
    messages = tool_turn([{"type": "image", "image": image(rng)}, {"type": "text", "text": "zoomed"},
                          {"type": "image", "image": image(rng)}])  # fmt: skip
    rendered = renderer.render(messages)
    assert len(rendered.multi_modal_data.mm_placeholders["image"]) == 3
    assert_matches("gemma4", rendered, reference(processor, messages), processor)


@pytest.mark.parametrize("variant", ["b446025", "6b7e72c"])
def test_images_in_tool_results_are_refused_where_the_template_drops_them(renderer_of, variant):
    renderer = renderer_of(variant)
    messages = tool_turn([{"type": "image", "image": picture(2)}, "zoomed"])
    with pytest.raises(RenderError, match=r"message 2 \(tool\).*drops from tool results.*905e84b"):
        renderer.render(messages)
    # the text of a tool result is rendered as before
    assert "zoomed" in renderer.tokenizer.decode(renderer.render(tool_turn("zoomed")).token_ids)


@pytest.mark.parametrize("variant", ["b446025", "6b7e72c", "905e84b", "8995379", "31b"])
def test_a_tool_message_that_answers_no_call_is_refused_not_dropped(renderer_of, variant):
    """After the release every template writes a tool message only as the result of
    the call before it; one after a user message would vanish from the prompt."""
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "a result"}]
    with pytest.raises(RenderError, match=r"message 1 \(tool\) does not answer an assistant"):
        renderer_of(variant).render(messages)


def test_the_release_template_writes_a_tool_message_as_a_turn_of_its_own(renderer_of):
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "a result"}]
    text = renderer_of("4742fe8").tokenizer.decode(
        renderer_of("4742fe8").render(messages).token_ids
    )
    assert "<|turn>tool\na result<turn|>" in text


@pytest.mark.parametrize("variant", ["4742fe8", "6b7e72c", "8995379", "31b"])
def test_an_image_in_the_system_message_is_refused(renderer_of, variant):
    messages = [
        {"role": "system", "content": ["Count.", {"type": "image", "image": picture(3)}]},
        {"role": "user", "content": "How many?"},
    ]
    with pytest.raises(RenderError, match=r"message 0 \(system\)"):
        renderer_of(variant).render(messages)


@pytest.mark.parametrize(
    ("variant", "refused"),
    [("4742fe8", True), ("b446025", True), ("6b7e72c", False), ("8995379", False)],
)
def test_a_system_message_of_parts_is_refused_where_it_would_be_python_text(
    renderer_of, variant, refused
):
    messages = [{"role": "system", "content": ["You count."]}, {"role": "user", "content": "Hi"}]
    renderer = renderer_of(variant)
    if refused:
        with pytest.raises(RenderError, match="as Python text"):
            renderer.render(messages)
    else:
        assert "You count." in renderer.tokenizer.decode(renderer.render(messages).token_ids)


@pytest.mark.parametrize("kind", ["audio", "input_audio"])
def test_audio_is_refused_by_name(renderer_of, kind):
    part = {"type": kind, kind: {"data": "", "format": "wav"}}
    with pytest.raises(RenderError, match=f"unknown content part '{kind}'"):
        renderer_of().render([{"role": "user", "content": [part, "what is said?"]}])


# -- completions: parse, stop, re-render as sampled ----------------------------------------


def test_stop_tokens_are_the_turn_end_the_tool_response_and_eos(renderer_of):
    renderer = renderer_of()
    assert renderer.tokenizer.convert_ids_to_tokens(list(renderer.stop_token_ids)) == [
        "<turn|>", "<|tool_response>", "<eos>",
    ]  # fmt: skip


def completion(renderer: Any, text: str, stop: str) -> list[int]:
    """``text``'s ids closed by ``stop`` (unless the text ends with it)."""
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    stop_id = renderer.tokenizer.convert_tokens_to_ids(stop)
    return ids if ids and ids[-1] == stop_id else [*ids, stop_id]


def test_a_thought_and_calls_parse_into_reasoning_and_tool_calls(renderer_of):
    renderer = renderer_of()
    text = (
        "<|channel>thought\nzoom, then crop\n<channel|>"
        '<|tool_call>call:crop{boxes:[{label:<|"|>a, b<|"|>,x:1}],deep:true,scale:2.5,'
        "skip:null}<tool_call|><|tool_call>call:zoom{x:-3}<tool_call|>"
    )
    parsed = renderer.parse_response(completion(renderer, text, "<|tool_response>"))
    assert parsed.stopped and parsed.reasoning == "zoom, then crop" and parsed.content == ""
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["crop", "zoom"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {
        "boxes": [{"label": "a, b", "x": 1}], "deep": True, "scale": 2.5, "skip": None,
    }  # fmt: skip
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"x": -3}
    assert not parsed.tool_call_errors


def test_a_completion_that_opens_inside_the_channel_keeps_its_reasoning(renderer_of):
    """After tool results with thinking on, the current template's generation prompt
    opens the thought channel: the completion holds only its end."""
    renderer = renderer_of()
    parsed = renderer.parse_response(
        completion(renderer, "it is a cat\n<channel|>A cat.", "<turn|>")
    )
    assert (parsed.reasoning, parsed.content) == ("it is a cat", "A cat.")


@pytest.mark.parametrize(
    "raw", ["<|tool_call>zoom{x:1}<tool_call|>", "<|tool_call>call:zoom{x:<|\"|>open}<tool_call|>",
            "<|tool_call>call:{x:1}<tool_call|>", "<|tool_call>call:zoom{x:1}}<tool_call|>"],
)  # fmt: skip
def test_a_malformed_call_is_reported_not_raised(renderer_of, raw):
    renderer = renderer_of()
    parsed = renderer.parse_response(completion(renderer, raw, "<|tool_response>"))
    assert not parsed.tool_calls and len(parsed.tool_call_errors) == 1


def test_format_tool_calls_writes_what_parse_reads(renderer_of):
    renderer = renderer_of()
    calls = [("zoom", {"where": "top, left", "Deep": {"b": [1, None], "A": False}, "n": 1.5})]
    text = renderer.format_tool_calls(calls)
    assert text == ('<|tool_call>call:zoom{Deep:{A:false,b:[1,null]},n:1.5,'
                    'where:<|"|>top, left<|"|>}<tool_call|><|tool_response>')  # fmt: skip
    parsed = renderer.parse_response(completion(renderer, text, "<|tool_response>"))
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == calls[0][1]


# -- bridging ------------------------------------------------------------------------------


def sampled(renderer: Any, messages: list[dict[str, Any]], text: str, stop: str, new, **kw):
    """Render, 'sample' ``text`` + ``stop``, parse as RendererClient does, bridge with the
    history; the bridge (or None) and the full render."""
    first = renderer.render(messages, **kw)
    ids = completion(renderer, text, stop)
    message = renderer.parse_response(ids).message
    bridged = renderer.bridge_to_next_turn(
        first.token_ids, ids, new, previous_multi_modal_data=first.multi_modal_data,
        previous_messages=[*messages, message], **kw,
    )  # fmt: skip
    return bridged, renderer.render([*messages, message, *new], **kw), message


TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                         "required": ["x"]}}}]  # fmt: skip


@pytest.mark.parametrize("thinking", [False, True])
def test_a_tool_turn_with_images_in_its_result_bridges_to_a_full_render(renderer_of, thinking):
    """Reasoning, a call stopped at <|tool_response>, a result with an image, the model
    going on inside its turn: the bridges equal a full render. A new user message then
    bridges too, unless the turn holds reasoning, which the template drops once a later
    user message exists (the bridge says so)."""
    renderer = renderer_of(enable_thinking=thinking)
    messages = [{"role": "user", "content": [{"type": "image", "image": picture(4)}, "Zoom."]}]
    lead = "<|channel>thought\nlook closer\n<channel|>" if thinking else ""
    text = lead + renderer.format_tool_calls([("zoom", {"x": 2})])
    result = {"role": "tool", "tool_call_id": "call_0", "name": "zoom",
              "content": [{"type": "image", "image": picture(5)}, "zoomed"]}  # fmt: skip
    bridged, full, message = sampled(
        renderer, messages, text, "<|tool_response>", [result], tools=TOOLS
    )
    assert message["tool_calls"][0]["id"] == "call_0"
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    # the answer, inside the same model turn, then a new question
    messages = [*messages, message, result]
    answer = ("it is a cat\n<channel|>" if thinking else "") + "A cat."
    new = [{"role": "user", "content": "Sure?"}]
    bridged, full, _ = sampled(renderer, messages, answer, "<turn|>", new, tools=TOOLS)
    if thinking:
        assert bridged is None
        assert set(renderer.bridge_refusals) == {
            "the template drops the reasoning of earlier turns"
        }
        return
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids


def test_the_large_checkpoints_empty_thought_in_the_prompt_is_a_rewrite_the_bridge_names(
    renderer_of,
):
    """The 26B/31B generation prompt ends with an empty thought block when thinking is
    off; the history writes the turn without it, so no bridge can equal a full render.
    With thinking on there is none, and a turn without reasoning bridges."""
    messages = [{"role": "user", "content": "Hi"}]
    new = [{"role": "user", "content": "And?"}]
    off = renderer_of("31b")
    bridged, _, _ = sampled(off, messages, "Hello.", "<turn|>", new)
    assert bridged is None
    assert set(off.bridge_refusals) == {
        "the template renders earlier turns differently once later turns exist"
    }
    on = renderer_of("31b", enable_thinking=True)
    bridged, full, _ = sampled(on, messages, "Hello.", "<turn|>", new)
    assert bridged is not None and bridged.token_ids == full.token_ids


def test_a_sampled_answer_with_earlier_reasoning_is_rendered_in_full_on_a_new_question(
    renderer_of,
):
    """The current template keeps an answer's reasoning only while no later user message
    exists: a new question rewrites the turn, and the bridge says so."""
    renderer = renderer_of(enable_thinking=True)
    messages = [{"role": "user", "content": "Hi"}]
    bridged, _, _ = sampled(renderer, messages, "<|channel>thought\nhm\n<channel|>Hello.",
                            "<turn|>", [{"role": "user", "content": "And?"}])  # fmt: skip
    assert bridged is None and renderer.bridge_refusals


def test_a_loaded_processor_gives_the_gemma4_renderer(variant_paths):
    renderer = load_renderer(load_processor(variant_paths("8995379"), image_backend="pil"))
    assert (renderer.name, renderer.tool_format) == ("gemma4", "gemma4")


def test_a_checkpoint_without_the_feature_extractor_settings_is_refused_by_name(
    variant_paths, tmp_path
):
    path = Path(shutil.copytree(variant_paths("8995379"), tmp_path / "g"))
    config = json.loads((path / "processor_config.json").read_text())
    del config["feature_extractor"]
    (path / "processor_config.json").write_text(json.dumps(config))
    from vf_mm.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="audio feature extractor"):
        load_renderer(path, image_backend="pil")


def test_a_tool_env_rollout_bridges_every_turn_and_shows_the_tools_image(variant_paths):
    """End to end through RendererClient, as a scripted policy (``check_environment``'s)
    samples: a call written by ``format_tool_calls`` (closed by ``<|tool_response>``, as
    the model closes it), the tool's image in its result, the answer inside the same
    model turn. Every turn after the first bridges, and the image reaches the prompt."""
    import asyncio

    import vf_mm as vf
    from vf_mm.testing import ScriptedBackend

    def zoom(x: int) -> list:
        """Zoom in.

        Args:
            x: where
        """
        return [picture(7, (60, 40)), f"zoomed at {x}"]

    renderer = load_renderer(variant_paths("8995379"), image_backend="pil")
    env = vf.ToolEnv(tools=[zoom], dataset=[{"question": "look", "image": picture(8)}],
                     max_turns=3)  # fmt: skip
    backend = ScriptedBackend(renderer, [renderer.format_tool_calls([("zoom", {"x": 1})]), "Done."])
    client = vf.RendererClient(backend, renderer)
    state = asyncio.run(env.rollout(client, env.get_dataset()[0]))
    assert [m["role"] for m in state["completion"]] == ["assistant", "tool", "assistant"]
    assert client.stats.bridges == 1 and dict(renderer.bridge_refusals) == {}
    last = backend.requests[-1]
    assert len(last.multi_modal_data.mm_placeholders["image"]) == 2  # the question's, the tool's


def test_build_tiny_vlm_refuses_a_variant_by_name(tmp_path):
    """An unknown variant, or one for a family without variants, is refused before
    anything is written, naming the choices."""
    with pytest.raises(ValueError, match="no template variant 'v2'; choose one of 8995379"):
        build_tiny_vlm(tmp_path / "a", "gemma4", variant="v2")
    with pytest.raises(ValueError, match="qwen2_vl has no variants"):
        build_tiny_vlm(tmp_path / "b", "qwen2_vl", variant="think")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_variant_checkpoint_carries_that_variants_template(tmp_path):
    path = build_tiny_vlm(tmp_path / "q", "qwen3_5", variant="qwen3.8")
    assert (path / "chat_template.jinja").read_text() == chat_template("qwen3_5", "qwen3.8")
    assert load_renderer(path, image_backend="pil").tokenizer.chat_template == chat_template(
        "qwen3_5", "qwen3.8"
    )


def test_the_image_audio_and_video_markup_is_never_sampled(renderer_of):
    """Every token of an image's, a clip's or an audio's markup is banned from sampling
    (``banned_token_ids``, sent with every request): the soft tokens, the begin/end
    markers, the video and audio placeholders; the audio placeholder is also refused in
    text (vf_mm renders no audio, so it would be a position no audio explains)."""
    renderer = renderer_of()
    names = ["<|image>", "<image|>", "<|image|>", "<|video|>", "<|audio>", "<audio|>", "<|audio|>"]
    ids = set(renderer.tokenizer.convert_tokens_to_ids(names))
    assert ids <= renderer.vision.banned_token_ids
    audio = renderer.tokenizer.convert_tokens_to_ids("<|audio|>")
    assert audio in renderer.vision.reserved_token_ids
