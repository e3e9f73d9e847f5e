"""Families beyond Qwen-VL: ``render`` equals the family's transformers processor.

For each family, over generated conversations shaped the way the family's chat template
allows (Gemma 3: alternating turns, the system text folded into the first user turn),
with tiny, huge and extreme-aspect images in modes RGB, L, RGBA, P and LA, several per turn
(and files whose EXIF says to rotate them):

- token ids equal ``processor.apply_chat_template(..., tokenize=True)``'s;
- every model input tensor is bit-identical (the processor's ``pixel_values``, and its
  token-type ids against ``vf_mm.models.model_inputs``);
- each placeholder spans exactly one image's tokens, ``is_embed`` marks exactly the image
  tokens, and together they cover every image token of the prompt.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests._params import seeds
from vf_mm.errors import RenderError
from vf_mm.models import (
    VISION_FAMILIES,
    family_info,
    image_token_ids,
    load_processor,
    model_inputs,
)
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

FAMILIES = (
    "qwen3_5", "gemma3", "smolvlm", "llava_onevision", "gemma4", "llava_next", "internvl",
    "glm46v",
)  # fmt: skip
MODES = ("RGB", "L", "RGBA", "P", "LA")
# a P image's 16-colour palette by fast octree: the default (median cut) takes ~1 CPU-s
# on a large noise image, and the mode, not how its palette was chosen, is what is tested
FAST_OCTREE = Image.Quantize.FASTOCTREE
SIZES = ((1, 1), (3, 500), (500, 3), (64, 64), (97, 501), (1000, 120), (640, 480), (1500, 1300))


def image(rng: random.Random) -> Image.Image:
    if rng.random() < 0.5:
        w, h = rng.choice(SIZES)
    else:
        w, h = rng.randint(1, 900), rng.randint(1, 900)
    arr = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (h, w, 3), dtype=np.uint8)
    picture = Image.fromarray(arr)
    mode = rng.choice(MODES)
    return picture.convert(mode) if mode != "P" else picture.quantize(16, method=FAST_OCTREE)


def user_content(rng: random.Random, turn: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image", "image": image(rng)} for _ in range(rng.choice((0, 1, 1, 2, 3)))
    ]
    text = rng.choice((f"How many circles in {turn}?", "  Count them.\n", "Describe\n\nthis"))
    parts.insert(rng.randint(0, len(parts)), {"type": "text", "text": text})
    return parts


def conversation(family: str, seed: int) -> list[dict[str, Any]]:
    """Alternating user / assistant turns ending on a user turn (the shape every family's
    template takes), sometimes after a system message; SmolVLM's and LLaVA-OneVision's
    templates also take images in system and tool messages, so their conversations have
    them. Gemma 4 writes a tool message only as the result of the call before it, so its
    assistant turns before a tool message make that call (and may end a conversation on
    it: the model turn stays open for the model to go on)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    system_images = family in ("smolvlm", "llava_onevision", "internvl", "glm46v")
    tool_turns = family in (
        "smolvlm", "llava_onevision", "qwen3_5", "gemma4", "internvl", "glm46v"
    )  # fmt: skip
    if rng.random() < 0.5:
        system = user_content(rng, 0) if system_images else "You count shapes.  "
        messages.append({"role": "system", "content": system})
    for turn in range(rng.randint(1, 4)):
        tool = tool_turns and turn and rng.random() < 0.3
        if turn and tool and family == "gemma4":  # a call, as the model writes it: no text
            call = {"id": f"c{turn}", "type": "function",
                    "function": {"name": "zoom", "arguments": {"x": turn}}}  # fmt: skip
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif turn:
            messages.append({"role": "assistant", "content": f"There are {turn} circles."})
        if tool:
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "name": "zoom",
                             "content": user_content(rng, turn)})  # fmt: skip
        else:
            messages.append({"role": "user", "content": user_content(rng, turn)})
    return messages


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: build_tiny_vlm(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    return request.param


def reference(processor: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    """The processor's own output. SmolVLM's and LLaVA-OneVision's ``apply_chat_template``
    need a video processor (torchvision), and LLaVA-NeXT's template reads only lists of
    parts, so for them the same two steps are taken by hand: the chat template (string
    content as one text part, as vf_mm gives it), then the processor. LLaVA-OneVision's images go to the processor as a flat list: every
    image in single-image (anyres) mode, which is what vLLM computes (given as one
    sample's list, transformers switches a multi-image prompt to its multi-image mode)."""
    name = type(processor).__name__
    if name.startswith(("SmolVLM", "LlavaOnevision", "LlavaNext")):
        flat = name.startswith("LlavaOnevision")
        return by_hand(processor, messages, flat=flat, **kwargs.get("processor_kwargs", {}))
    return processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, add_generation_prompt=True,
        return_tensors="np", **kwargs,
    )  # fmt: skip


def by_hand(
    processor: Any, messages: list[dict[str, Any]], *, flat: bool = False, **options: Any
) -> Any:
    images, shown = [], []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts = []
        for part in content:
            if part["type"] == "image":
                images.append(part["image"])
                part = {"type": "image"}
            parts.append(part)
        shown.append({**message, "content": parts})
    text = processor.tokenizer.apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True
    )
    batch = images if flat else [images]
    return processor(text=[text], images=batch if images else None, return_tensors="np", **options)


def assert_matches(family: str, rendered: Any, ref: Any, processor: Any) -> None:
    ids = rendered.token_ids
    assert ids == ref["input_ids"][0].tolist()
    data = rendered.multi_modal_data
    images = data.mm_items.get("image", [])
    embed_ids = image_token_ids(processor)
    inputs = model_inputs(family, torch.tensor([ids]), images, image_token_ids=embed_ids)
    skip = {"input_ids", "attention_mask"}
    for name, expected in ref.items():
        if name in skip:
            continue
        if not images and name not in inputs:
            assert np.asarray(expected).size == 0
            continue
        got = inputs[name].numpy()
        assert got.dtype == np.asarray(expected).dtype, name
        assert np.array_equal(got, expected), name  # bit-identical
    assert set(inputs) <= set(ref) | {family_info(family).token_types}
    # placeholders: each one image's span; together exactly the image tokens
    array = np.asarray(ids)
    marked = np.isin(array, embed_ids)
    covered = np.zeros(len(ids), dtype=bool)
    for placeholder in data.mm_placeholders.get("image", []):
        positions = placeholder.embed_positions()
        assert marked[positions].all()
        span = np.zeros(placeholder.length, dtype=bool)
        span[np.asarray(positions) - placeholder.offset] = True
        assert np.array_equal(marked[placeholder.offset : placeholder.end], span)
        covered[positions] = True
    assert np.array_equal(covered, marked)
    data.validate(len(ids))


def test_only_the_models_image_token_takes_embeddings(tiny, family):
    """The ids that placeholders mark as embeddings are the one id the model's forward
    puts image features on (its config's): InternVL's processor also lists its <img> and
    </img> markers among its image tokens, which must not be marked."""
    config = json.loads((tiny[family] / "config.json").read_text())
    model_token = config.get("image_token_id", config.get("image_token_index"))
    processor = load_processor(tiny[family], image_backend="pil")
    assert image_token_ids(processor) == (model_token,)
    renderer = load_renderer(tiny[family], image_backend="pil")
    picture = Image.new("RGB", (300, 90), "red")
    rendered = renderer.render([{"role": "user", "content": [{"type": "image", "image": picture}]}])
    ids = np.asarray(rendered.token_ids)
    for placeholder in rendered.multi_modal_data.mm_placeholders["image"]:
        assert set(ids[placeholder.embed_positions()].tolist()) == {model_token}


@pytest.mark.parametrize("seed", seeds(3, 10))
def test_generated_conversations_match_the_processor(tiny, family, seed):
    renderer = load_renderer(tiny[family], image_backend="pil")
    processor = load_processor(tiny[family], image_backend="pil")
    messages = conversation(family, seed)
    assert_matches(family, renderer.render(messages), reference(processor, messages), processor)


def test_files_are_read_upright_as_transformers_loads_them(tiny, family, tmp_path):
    """A JPEG whose EXIF orientation says to turn it (as phones write them) and an LA PNG,
    given as paths; ids and every tensor agree. The processor gets the JPEG through
    transformers' own ``load_image`` (which applies the EXIF rotation) and the PNG as the
    file's own PIL image, whose transparency its ``convert_to_rgb`` composites over white,
    as vLLM's image loader does (transformers' ``load_image`` would drop the alpha)."""
    from transformers.image_utils import load_image as hf_load_image

    rng = np.random.default_rng(3)
    turned = Image.fromarray(rng.integers(0, 256, (60, 140, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 clockwise to view
    turned.save(tmp_path / "turned.jpg", exif=exif.tobytes(), quality=95)
    grey = Image.fromarray(rng.integers(0, 256, (50, 30, 2), dtype=np.uint8), mode="LA")
    grey.save(tmp_path / "grey.png")
    paths = [str(tmp_path / "turned.jpg"), str(tmp_path / "grey.png")]
    text = {"type": "text", "text": "Which way is up?"}
    ours = [{"role": "user", "content": [*({"type": "image", "image": p} for p in paths), text]}]
    upright = [hf_load_image(paths[0]), Image.open(paths[1])]
    assert upright[0].size == (60, 140)  # transformers turned it: 60 wide, 140 high
    theirs = [
        {"role": "user", "content": [*({"type": "image", "image": i} for i in upright), text]}
    ]
    renderer = load_renderer(tiny[family], image_backend="pil")
    processor = load_processor(tiny[family], image_backend="pil")
    assert_matches(family, renderer.render(ours), reference(processor, theirs), processor)


def test_gemma3_pan_and_scan_crops_match_the_processor(tiny, tmp_path):
    """With pan-and-scan on, a wide image becomes the original plus crops, each with its
    own begin/end markers, inside one placeholder."""
    pan = {"do_pan_and_scan": True}
    renderer = load_renderer(tiny["gemma3"], image_backend="pil", processor_kwargs=pan)
    processor = load_processor(tiny["gemma3"], image_backend="pil")
    rng = random.Random(1)
    wide = Image.fromarray(
        np.random.default_rng(0).integers(0, 256, (300, 1200, 3), dtype=np.uint8)
    )
    messages = [
        {"role": "user", "content": [{"type": "image", "image": wide}, {"type": "text", "text": "hi"},
                                     {"type": "image", "image": image(rng)}]},
    ]  # fmt: skip
    rendered = renderer.render(messages)
    assert_matches(
        "gemma3", rendered, reference(processor, messages, processor_kwargs=pan), processor
    )
    first = rendered.multi_modal_data.mm_placeholders["image"][0]
    assert rendered.multi_modal_data.mm_items["image"][0]["pixel_values"].shape[0] > 1  # crops
    boi = processor.tokenizer.boi_token_id
    assert rendered.token_ids[first.offset : first.end].count(boi) > 1


def test_smolvlm_with_image_splitting_off_matches_the_processor(tiny):
    """Without splitting every image is one global tile: one run of image tokens between
    its begin and end markers."""
    off = {"do_image_splitting": False}
    renderer = load_renderer(tiny["smolvlm"], image_backend="pil", processor_kwargs=off)
    processor = load_processor(tiny["smolvlm"], image_backend="pil")
    messages = conversation("smolvlm", 4)
    rendered = renderer.render(messages)
    assert_matches("smolvlm", rendered, reference(processor, messages, processor_kwargs=off),
                   processor)  # fmt: skip
    for item in rendered.multi_modal_data.mm_items.get("image", []):
        assert item["pixel_values"].shape[1] == 1


def test_smolvlm_string_content_is_rendered_not_dropped(tiny):
    """SmolVLM's template renders only lists of parts; a string's text must still reach
    the prompt."""
    renderer = load_renderer(tiny["smolvlm"], image_backend="pil")
    ids = renderer.render([{"role": "user", "content": "count the circles"}]).token_ids
    assert "count the circles" in renderer.tokenizer.decode(ids)


def test_gemma3_template_refuses_a_tool_turn_by_name(tiny):
    renderer = load_renderer(tiny["gemma3"], image_backend="pil")
    messages = [
        {"role": "user", "content": "zoom"},
        {"role": "assistant", "content": "calling"},
        {"role": "tool", "content": "done"},
    ]
    with pytest.raises(Exception, match="alternate"):
        renderer.render(messages)


@pytest.mark.parametrize("name", VISION_FAMILIES)
def test_the_registry_says_which_templates_take_a_tool_message(tiny, checkpoints, name, tmp_path):
    """``VisionFamily.tool_role`` (what ``vf-mm init --tools`` relies on) is what the
    family's template does with a tool result (LFM2-VL's, whose images need torchvision,
    through its tokenizer: the template is what is asked)."""
    path = tiny.get(name) or checkpoints.get(name) or build_tiny_vlm(tmp_path / name, name)
    if family_info(name).pil_backend:
        renderer = load_renderer(path, image_backend="pil")
    else:
        from transformers import AutoTokenizer

        renderer = load_renderer(AutoTokenizer.from_pretrained(path))
    call = {"id": "c", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "zoom"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    if family_info(name).tool_role:
        assert renderer.render(messages).token_ids
    else:  # the template's own refusal (Gemma 3's, LLaVA-NeXT's)
        with pytest.raises(RenderError, match=r"alternate|Only user and assistant"):
            renderer.render(messages)


@pytest.mark.parametrize("seed", seeds(2, 6))
def test_bridging_equals_a_full_render_and_mutates_nothing(tiny, family, seed):
    """Turn after turn, the bridged prompt equals rendering the whole conversation, with
    the earlier images' inputs carried forward; no input is changed."""
    import copy

    renderer = load_renderer(tiny[family], image_backend="pil")
    rng = random.Random(seed)
    messages = conversation(family, seed)
    rendered = renderer.render(messages)
    stop = renderer.stop_token_ids[0]
    stable = family not in NOT_PREFIX_STABLE
    for turn in range(3):
        reply = f"There are {turn} circles."
        sampled = SAMPLED_LEAD.get(family, "") + reply  # what the model writes after the prompt
        completion = renderer.tokenizer(sampled, add_special_tokens=False)["input_ids"] + [stop]
        new = [{"role": "user", "content": user_content(rng, turn)}]
        before = copy.deepcopy((rendered.token_ids, completion, new))
        data_before = _snapshot(rendered.multi_modal_data)
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new,
            previous_multi_modal_data=rendered.multi_modal_data,
        )  # fmt: skip
        assert (rendered.token_ids, completion, new) == before
        assert _snapshot(rendered.multi_modal_data) == data_before
        messages = [*messages, {"role": "assistant", "content": reply}, *new]
        full = renderer.render(messages)
        if not stable:  # declined, saying why; the caller renders in full
            assert bridged is None
            assert list(renderer.bridge_refusals) == [NOT_PREFIX_STABLE[family]]
            rendered = full
            continue
        if family == "gemma4" and turn == 0 and messages[-3]["role"] == "tool":
            # the model went on inside its turn after tool results: without the messages
            # the bridge cannot see how the template closes it, and says so
            assert bridged is None
            assert list(renderer.bridge_refusals)[-1].startswith("the previous prompt ends inside")
            renderer.bridge_refusals.clear()
            rendered = full
            continue
        assert bridged is not None, dict(renderer.bridge_refusals)
        assert bridged.token_ids == full.token_ids
        assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
        assert bridged.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
        rendered = bridged
    assert stable == (not renderer.bridge_refusals)


# SmolVLM's generation prompt is "Assistant:" and its history "Assistant: " + content,
# LLaVA-NeXT's " [/INST]" and " " + content: the model writes the space, and a
# completion that does not is not bridged.
SAMPLED_LEAD = {"smolvlm": " ", "llava_next": " ", "glm46v": "<think></think>\n"}

# Templates that rewrite earlier turns once a new user query comes: LLaVA-OneVision's
# generation prompt is "<|im_start|>assistant\n", its history "<|im_start|>assistant \n"
# + text; Qwen3.5's prompt ends in an empty think block that its history drops before
# the last user query. No bridge can equal a full render there.
NOT_PREFIX_STABLE = {
    "llava_onevision": "the template renders earlier turns differently once later turns exist",
    "qwen3_5": "the template drops the reasoning of earlier turns",
    # GLM-4.6V rewrites every answer's reasoning before the last user query to <think></think>
    "glm46v": "the template drops the reasoning of earlier turns",
}


def test_qwen3_5_tool_turns_bridge_to_a_full_render(tiny):
    """Tool results keep the assistant turn after the last user query, so Qwen3.5's
    history is unchanged and its tool turns bridge: XML calls parsed back to arguments,
    a tool result with an image, the same tokens as a full render."""
    renderer = load_renderer(tiny["qwen3_5"], image_backend="pil")
    tools = [{"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
              "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]  # fmt: skip
    rng = random.Random(5)
    messages = [{"role": "user", "content": user_content(rng, 0)}]
    rendered = renderer.render(messages, tools=tools)
    for turn in range(3):
        text = renderer.format_tool_calls([("zoom", {"x": turn, "where": "top left"})])
        completion = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
        completion.append(renderer.stop_token_ids[0])
        parsed = renderer.parse_response(completion)
        assert not parsed.tool_call_errors
        assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {
            "x": turn,
            "where": "top left",
        }
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"],
                "content": user_content(rng, turn)}]  # fmt: skip
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new, tools=tools,
            previous_multi_modal_data=rendered.multi_modal_data,
        )  # fmt: skip
        assert bridged is not None, dict(renderer.bridge_refusals)
        messages = [*messages, parsed.message, *new]
        full = renderer.render(messages, tools=tools)
        assert bridged.token_ids == full.token_ids
        assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
        rendered = bridged


def test_smolvlm_completion_without_the_templates_space_is_not_bridged(tiny):
    renderer = load_renderer(tiny["smolvlm"], image_backend="pil")
    first = renderer.render([{"role": "user", "content": "hi"}])
    completion = renderer.tokenizer("no space", add_special_tokens=False)["input_ids"]
    out = renderer.bridge_to_next_turn(
        first.token_ids, [*completion, renderer.stop_token_ids[0]],
        [{"role": "user", "content": "next"}],
    )  # fmt: skip
    assert out is None
    assert renderer.bridge_refusals == {"the template rewrites the assistant turn (adds ' ')": 1}


def _snapshot(data: Any) -> Any:
    if data is None:
        return None
    return (
        {m: list(v) for m, v in data.mm_hashes.items()},
        {m: list(v) for m, v in data.mm_placeholders.items()},
        {m: [id(item) for item in v] for m, v in data.mm_items.items()},
    )


# -- what a user's data may hold -----------------------------------------------------------


def test_a_loaded_qwen3_5_processor_is_told_from_qwen3_vl(tiny):
    """Both use Qwen3VLProcessor; Qwen3.5's renderer (XML tool calls) is chosen by its
    tokenizer."""
    renderer = load_renderer(load_processor(tiny["qwen3_5"], image_backend="pil"))
    assert (renderer.name, renderer.tool_format) == ("qwen3_5", "xml")


@pytest.mark.parametrize(
    ("family", "text"),
    [("gemma3", "look: <image_soft_token>"), ("llava_onevision", "a <video> here"),
     ("llava_next", "an <image> here"),
     ("qwen3_5", "a <|video_pad|> here"), ("smolvlm", "a <video> here"),
     ("gemma4", "a <|video|> here"), ("gemma4", "say <|audio|>")],
)  # fmt: skip
def test_a_reserved_token_written_in_text_is_refused(tiny, family, text):
    """Written literally, an image or video token would be an embedding position no image
    explains (the processor refuses some, silently miscounts others)."""
    renderer = load_renderer(tiny[family], image_backend="pil")
    with pytest.raises(RenderError, match="literally"):
        renderer.render([{"role": "user", "content": [{"type": "text", "text": text}]}])


@pytest.mark.parametrize(
    ("family", "token", "label"),
    [("gemma3", "<start_of_image>", "Gemma 3"), ("llava_onevision", "<image>", "LLaVA-OneVision"),
     ("qwen3_5", "<|video_pad|>", "Qwen3.5"), ("smolvlm", "<video>", "SmolVLM")],
)  # fmt: skip
def test_a_placeholder_in_a_message_names_the_message_its_role_the_token_and_the_family(
    tiny, family, token, label
):
    """The error names what the user must fix: which message (index and role), where in
    it, the literal placeholder, and the family at hand only (SmolVLM's once spoke of
    Gemma 3's system message). An assistant reply holding one (a model that sampled it)
    is refused the same way when the history is rendered again."""
    from vf_mm.errors import ReservedTokenError

    renderer = load_renderer(tiny[family], image_backend="pil")
    history = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]},
               {"role": "assistant", "content": f"I see {token} there."},
               {"role": "user", "content": [{"type": "text", "text": "Sure?"}]}]  # fmt: skip
    with pytest.raises(ReservedTokenError) as caught:
        renderer.render(history)
    message = str(caught.value)
    assert message.startswith(f"message 1 (assistant), field 'content': the text holds {token} ")
    assert label in message and caught.value.token == token
    others = {"Gemma 3", "SmolVLM", "LLaVA-OneVision", "Qwen3.5"} - {label}
    assert not any(other in message for other in others)
    user = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": f"b {token}"}]}]  # fmt: skip
    with pytest.raises(ReservedTokenError, match=r"^message 0 \(user\), content part 1: "):
        renderer.render(user)


@pytest.mark.parametrize("family", FAMILIES)
def test_shorthand_text_parts_are_rendered_not_dropped(tiny, family):
    """A bare string and an untyped {"text": ...} in a content list are text parts, for
    every template (some read only typed parts and would drop them)."""
    renderer = load_renderer(tiny[family], image_backend="pil")
    content = ["first words", {"text": "second words"}]
    text = renderer.tokenizer.decode(
        renderer.render([{"role": "user", "content": content}]).token_ids
    )
    assert "first words" in text and "second words" in text


def test_content_a_template_cannot_handle_is_a_render_error(tiny):
    renderer = load_renderer(tiny["llava_onevision"], image_backend="pil")
    with pytest.raises(RenderError, match="refused the conversation"):
        renderer.render([{"role": "user", "content": [{"type": "text", "text": 5}]}])


# -- bridging with the real history (what RendererClient passes) ---------------------------


def sampled_turn(renderer, messages, text, new, **kwargs):
    """Render, 'sample' ``text``, parse it as RendererClient does, bridge with the
    history; returns the bridge (or None) and the full render."""
    first = renderer.render(messages, **kwargs)
    completion = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    completion.append(renderer.stop_token_ids[0])
    message = renderer.parse_response(completion).message
    bridged = renderer.bridge_to_next_turn(
        first.token_ids, completion, new, previous_multi_modal_data=first.multi_modal_data,
        previous_messages=[*messages, message], **kwargs,
    )  # fmt: skip
    return bridged, renderer.render([*messages, message, *new], **kwargs)


@pytest.mark.parametrize(
    ("family", "text"),
    [("gemma3", "Two circles.\n"), ("gemma3", " Two circles."), ("qwen3_5", "Two circles.  "),
     ("smolvlm", "Two circles."), ("gemma4", " Two circles.")],
)  # fmt: skip
def test_a_sampled_turn_the_template_rewrites_is_not_bridged(tiny, family, text):
    """Gemma 3 and Qwen3.5 trim the content; SmolVLM writes a space the completion lacks:
    the full render differs from what was sampled, so the bridge declines, saying why."""
    renderer = load_renderer(tiny[family], image_backend="pil")
    messages = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
    # a tool result keeps Qwen3.5's turn after the last query (a new query would be
    # declined earlier, for dropping the think block)
    role = "tool" if family == "qwen3_5" else "user"
    new = [{"role": role, "content": [{"type": "text", "text": "Sure?"}]}]
    bridged, _ = sampled_turn(renderer, messages, text, new)
    assert bridged is None
    assert set(renderer.bridge_refusals) == {
        "the template renders the sampled turn differently from what was sampled"
    }


def test_a_smolvlm_completion_with_the_templates_space_bridges_exactly(tiny):
    """SmolVLM's model writes the space after "Assistant:"; parsing leaves it out of the
    message, so the history re-renders as sampled and the bridge equals a full render."""
    renderer = load_renderer(tiny["smolvlm"], image_backend="pil")
    messages = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
    new = [{"role": "user", "content": [{"type": "text", "text": "Sure?"}]}]
    bridged, full = sampled_turn(renderer, messages, " Two circles.", new)
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids


def test_qwen3_5_tool_arguments_the_template_rewrites_are_not_bridged(tiny):
    """The model wrote `true`; the template writes a parsed True as `True`."""
    renderer = load_renderer(tiny["qwen3_5"], image_backend="pil")
    tools = [{"type": "function", "function": {"name": "zoom", "description": "Zoom.",
              "parameters": {"type": "object", "properties": {"deep": {"type": "boolean"}}}}}]  # fmt: skip
    messages = [{"role": "user", "content": "zoom in"}]
    text = "<tool_call>\n<function=zoom>\n<parameter=deep>\ntrue\n</parameter>\n</function>\n</tool_call>"
    new = [{"role": "tool", "content": "done"}]
    bridged, _ = sampled_turn(renderer, messages, text, new, tools=tools)
    assert bridged is None
    assert "the template renders the sampled turn differently from what was sampled" in (
        renderer.bridge_refusals
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_malformed_messages_are_render_errors_not_silent(tiny, family):
    """Templates that read only typed parts would render these as nothing: a message
    without a role and an unknown part type are refused, and one part given without its
    list is that part."""
    renderer = load_renderer(tiny[family], image_backend="pil")
    with pytest.raises(RenderError, match="has no role"):
        renderer.render([{"content": "hi"}])
    with pytest.raises(RenderError, match="unknown content part 'img'"):
        renderer.render([{"role": "user", "content": [{"type": "img", "image": "x"}]}])
    part = {"type": "text", "text": "count the circles"}
    assert (
        renderer.render([{"role": "user", "content": part}]).token_ids
        == renderer.render([{"role": "user", "content": [part]}]).token_ids
    )


# -- Qwen3.5's template variants (Qwen3.5 small / large, Qwen3.6, Qwen3.8) ------------------


@pytest.fixture(scope="module")
def qwen3_5_variant(tiny, tmp_path_factory):
    """A renderer of the tiny Qwen3.5 checkpoint carrying one template variant (the
    checkpoint copied, its template swapped: the tokenizer and processor are shared)."""
    import shutil

    from vf_mm.testing import chat_template

    root = tmp_path_factory.mktemp("qwen3_5_variants")
    made: dict[tuple[str, str], Any] = {}

    def get(variant: str, **template_kwargs: Any) -> Any:
        key = (variant, json.dumps(template_kwargs, sort_keys=True))
        if key not in made:
            path = root / f"{variant}-{len(made)}"
            shutil.copytree(tiny["qwen3_5"], path)
            (path / "chat_template.jinja").write_text(chat_template("qwen3_5", variant))
            made[key] = load_renderer(path, image_backend="pil", template_kwargs=template_kwargs)
        return made[key]

    return get


@pytest.mark.parametrize(
    ("variant", "options", "bridges"),
    [("nothink", {"enable_thinking": True}, False), ("think", {}, False),
     ("qwen3.6", {}, False), ("qwen3.6", {"preserve_thinking": True}, True),
     ("qwen3.8", {}, True), ("qwen3.8", {"preserve_thinking": False}, False),
     ("qwen3.8", {"enable_thinking": False}, True)],
)  # fmt: skip
def test_a_new_question_bridges_where_the_variant_keeps_earlier_reasoning(
    qwen3_5_variant, variant, options, bridges
):
    """Qwen3.5's templates drop a turn's reasoning (or empty think block) once a later
    user query exists, so a new question is rendered in full; Qwen3.6 keeps it with
    ``preserve_thinking``, Qwen3.8 unless ``preserve_thinking`` is false: there the
    bridge equals a full render."""
    renderer = qwen3_5_variant(variant, **options)
    thinking = options.get("enable_thinking", variant != "nothink")
    text = "count them\n</think>\n\nThree." if thinking else "Three."
    messages = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
    new = [{"role": "user", "content": [{"type": "text", "text": "Sure?"}]}]
    bridged, full = sampled_turn(renderer, messages, text, new)
    if bridges:
        assert bridged is not None, dict(renderer.bridge_refusals)
        assert bridged.token_ids == full.token_ids
    else:
        assert bridged is None
        assert set(renderer.bridge_refusals) <= {
            "the template drops the reasoning of earlier turns",
            "the template renders earlier turns differently once later turns exist",
        }


@pytest.mark.parametrize(
    ("variant", "bridges"), [("think", False), ("qwen3.6", True), ("qwen3.8", True)]
)
def test_json_argument_values_bridge_from_qwen3_6_on(qwen3_5_variant, variant, bridges):
    """Qwen3.6 and 3.8 write argument values other than strings as JSON (``true``,
    ``null``, ``2.5``), as their models do: a call sampled that way parses back and
    re-renders as sampled. Qwen3.5 writes them as Python (``True``): not bridged."""
    renderer = qwen3_5_variant(variant)
    tools = [{"type": "function", "function": {"name": "zoom", "description": "Zoom.",
              "parameters": {"type": "object", "properties": {"deep": {"type": "boolean"}}}}}]  # fmt: skip
    text = ("<tool_call>\n<function=zoom>\n<parameter=deep>\ntrue\n</parameter>\n"
            "<parameter=skip>\nnull\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
    messages = [{"role": "user", "content": "zoom in"}]
    bridged, full = sampled_turn(renderer, messages, "\n</think>\n\n" + text, [
        {"role": "tool", "content": "done"}], tools=tools)  # fmt: skip
    parsed = renderer.parse_response(
        renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"deep": True, "skip": None}
    assert (bridged is not None) == bridges, dict(renderer.bridge_refusals)
    if bridges:
        assert bridged.token_ids == full.token_ids


def test_qwen3_8_writes_its_reasoning_effort_unless_thinking_is_off(qwen3_5_variant):
    user = [{"role": "user", "content": "Hi"}]
    decode = lambda r: r.tokenizer.decode(r.render(user).token_ids)  # noqa: E731
    assert "Reasoning effort is set to xhigh" in decode(qwen3_5_variant("qwen3.8"))
    assert "Reasoning effort is set to low" in decode(
        qwen3_5_variant("qwen3.8", reasoning_effort="low")
    )
    assert "Reasoning effort" not in decode(qwen3_5_variant("qwen3.8", enable_thinking=False))
    with pytest.raises(RenderError, match="Unexpected reasoning effort"):
        qwen3_5_variant("qwen3.8", reasoning_effort="max").render(user)


# -- the MoE siblings: Qwen3-VL-MoE (Qwen3-VL-Instruct's template), Qwen3.5-MoE ----------


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {f: build_tiny_vlm(root / f, f) for f in ("qwen3_vl_moe", "qwen3_5_moe")}


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
@pytest.mark.parametrize("seed", seeds(1, 3))
def test_the_moe_families_match_the_processor(moe, family, seed):
    """Their processor and vision tower are their dense siblings'; ids, every input and
    the placeholders equal the processor's on generated conversations (tool results
    with images, a system message, modes and sizes that force a resize)."""
    renderer = load_renderer(moe[family], image_backend="pil")
    processor = load_processor(moe[family], image_backend="pil")
    messages = conversation("qwen3_5", seed + 3)
    assert_matches(family, renderer.render(messages), reference(processor, messages), processor)


def test_qwen3_vl_instruct_writes_content_verbatim_so_a_new_question_bridges(moe):
    """Qwen3-VL-Instruct's template writes an assistant's content as it is, ``<think>``
    and all, and no empty think block: every turn bridges to exactly a full render."""
    renderer = load_renderer(moe["qwen3_vl_moe"], image_backend="pil")
    messages = [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
    new = [{"role": "user", "content": [{"type": "text", "text": "Sure?"}]}]
    bridged, full = sampled_turn(renderer, messages, "<think>\ncount\n</think>\n\nThree.", new)
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids
    assert "<think>\ncount\n</think>" in renderer.tokenizer.decode(full.token_ids)


def test_qwen3_vl_instruct_refuses_what_it_would_drop(moe):
    """It writes only a system message that opens the conversation, and only its text."""
    renderer = load_renderer(moe["qwen3_vl_moe"], image_backend="pil")
    later = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "system", "content": "Be brief."}, {"role": "user", "content": "?"}]  # fmt: skip
    with pytest.raises(RenderError, match=r"message 2 \(system\) is not the first message"):
        renderer.render(later)
    picture = Image.fromarray(np.zeros((40, 40, 3), dtype=np.uint8))
    first = [{"role": "system", "content": [{"type": "image", "image": picture}]},
             {"role": "user", "content": "hi"}]  # fmt: skip
    with pytest.raises(RenderError, match=r"message 0 \(system\) holds an image"):
        renderer.render(first)


def test_the_tiny_qwen3_vl_moe_is_saved_as_the_released_checkpoints_are(moe):
    """vLLM 0.32 loads Qwen3-VL-MoE's fused experts only in the released layout
    (``gate_up_proj`` (experts, hidden, 2 x intermediate), ``down_proj`` (experts,
    intermediate, hidden)) and reads ``norm_topk_prob`` from the text config; transformers
    reads that file back to the weights it computes with (each the transpose)."""
    from safetensors.torch import load_file

    from vf_mm.models import model_class

    config = json.loads((moe["qwen3_vl_moe"] / "config.json").read_text())["text_config"]
    assert config["norm_topk_prob"] is True
    hidden, inner = config["hidden_size"], config["moe_intermediate_size"]
    saved = load_file(str(moe["qwen3_vl_moe"] / "model.safetensors"))
    prefix = "model.language_model.layers.0.mlp.experts."
    assert saved[prefix + "gate_up_proj"].shape[1:] == (hidden, 2 * inner)
    assert saved[prefix + "down_proj"].shape[1:] == (inner, hidden)
    model = model_class("qwen3_vl_moe").from_pretrained(moe["qwen3_vl_moe"], dtype=torch.float32)
    experts = model.model.language_model.layers[0].mlp.experts
    assert torch.equal(experts.gate_up_proj, saved[prefix + "gate_up_proj"].transpose(1, 2))
    assert torch.equal(experts.down_proj, saved[prefix + "down_proj"].transpose(1, 2))
