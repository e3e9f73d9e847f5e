"""``render`` equals the transformers processor, token for token and pixel for pixel."""

from __future__ import annotations

import numpy as np
import pytest

from tests._params import seeds
from tests.renderers.conftest import conversation
from vf_mm.models import load_processor
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm


def reference(processor, messages, **kwargs):
    return processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, add_generation_prompt=True,
        return_tensors="np", **kwargs,
    )  # fmt: skip


def assert_same(rendered, ref, image_token_id):
    assert rendered.token_ids == ref["input_ids"][0].tolist()
    data = rendered.multi_modal_data
    items = data.mm_items.get("image", [])
    if not items:
        assert "pixel_values" not in ref or ref["pixel_values"].size == 0
        return
    pixel_values = np.concatenate([item["pixel_values"] for item in items])
    grids = np.concatenate([item["image_grid_thw"] for item in items])
    assert pixel_values.dtype == ref["pixel_values"].dtype
    assert np.array_equal(pixel_values, ref["pixel_values"])  # bit-identical
    assert np.array_equal(grids, ref["image_grid_thw"])
    # the placeholders are exactly the pad runs
    ids = np.array(rendered.token_ids)
    pad_positions = np.flatnonzero(ids == image_token_id)
    covered = np.concatenate([np.arange(r.offset, r.end) for r in data.mm_placeholders["image"]])
    assert np.array_equal(pad_positions, covered)
    for r, grid in zip(data.mm_placeholders["image"], grids, strict=True):
        assert r.length == grid.prod() // 4
    data.validate(len(rendered.token_ids))


@pytest.mark.parametrize("seed", seeds(4, 8))
def test_generated_conversations_match_the_processor(renderer_and_processor, seed):
    renderer, processor = renderer_and_processor
    messages = conversation(seed)
    assert_same(
        renderer.render(messages), reference(processor, messages), renderer.vision.image_token_id
    )


def test_text_only_conversation(renderer_and_processor):
    renderer, processor = renderer_and_processor
    messages = [{"role": "user", "content": "Hello there, how many circles?"}]
    rendered = renderer.render(messages)
    assert rendered.token_ids == reference(processor, messages)["input_ids"][0].tolist()
    assert rendered.multi_modal_data.is_empty


def test_without_generation_prompt(renderer_and_processor):
    renderer, processor = renderer_and_processor
    messages = conversation(3)
    ours = renderer.render(messages, add_generation_prompt=False)
    ref = processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, add_generation_prompt=False, return_tensors="np"
    )
    assert ours.token_ids == ref["input_ids"][0].tolist()


def test_same_image_twice_is_two_entries_one_hash(renderer_and_processor):
    renderer, _ = renderer_and_processor
    import random

    from tests.renderers.conftest import random_image

    img = random_image(random.Random(0))
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": img},
                {"type": "image", "image": img},
                {"type": "text", "text": "same?"},
            ],
        }
    ]
    data = renderer.render(msgs).multi_modal_data
    assert len(data.mm_placeholders["image"]) == 2
    assert data.mm_hashes["image"][0] == data.mm_hashes["image"][1]
    assert data.mm_items["image"][0] is data.mm_items["image"][1]  # tensors held once


def test_cached_image_inputs_are_read_only(renderer_and_processor):
    renderer, _ = renderer_and_processor
    data = renderer.render(conversation(1)).multi_modal_data
    for item in data.mm_items.get("image", []):
        with pytest.raises(ValueError):
            item["pixel_values"][0, 0] = 1.0


def test_image_seen_before_is_not_processed_again(renderer_and_processor):
    renderer, _ = renderer_and_processor
    messages = conversation(5)
    renderer.render(messages)
    misses = renderer.vision.misses
    renderer.render(messages)
    assert renderer.vision.misses == misses


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8, 40))
def test_more_generated_conversations(renderer_and_processor, seed):
    renderer, processor = renderer_and_processor
    messages = conversation(seed)
    assert_same(
        renderer.render(messages), reference(processor, messages), renderer.vision.image_token_id
    )


def test_real_qwen_vocabulary(tmp_path):
    """Real Qwen2 token ids (<|image_pad|> is 151655) through the whole path."""
    path = build_tiny_vlm(tmp_path / "q", "qwen2_5_vl", vocab="qwen")
    renderer, processor = load_renderer(path), load_processor(path)
    assert renderer.vision.image_token_id == 151655
    for seed in range(3):
        messages = conversation(seed, max_turns=3)
        assert_same(renderer.render(messages), reference(processor, messages), 151655)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": "Crop a region of the image.",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            },
        },
    }
]


@pytest.mark.parametrize("seed", range(3))
def test_with_tools(renderer_and_processor, seed):
    renderer, processor = renderer_and_processor
    messages = conversation(seed, max_turns=3)
    ours = renderer.render(messages, tools=TOOLS)
    ref = reference(processor, messages, tools=TOOLS)
    assert_same(ours, ref, renderer.vision.image_token_id)


def test_reasoning_in_content_before_a_tool_call_and_an_image_tool_result(renderer_and_processor):
    """What a reasoning model writes on Qwen2/2.5-VL (``<think>`` inside the content, then a
    tool call) followed by a tool result with an image: rendered as the processor does."""
    import random

    from tests.renderers.conftest import random_image

    renderer, processor = renderer_and_processor
    rng = random.Random(11)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": random_image(rng)},
                                     {"type": "text", "text": "how many?"}]},
        {"role": "assistant", "content": "<think>\nzoom first\n</think>\n\n"
         '<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call>'},
        {"role": "tool", "tool_call_id": "call_0", "content": [
            {"type": "image", "image": random_image(rng)}, {"type": "text", "text": "zoomed"}]},
    ]  # fmt: skip
    assert_same(
        renderer.render(messages), reference(processor, messages), renderer.vision.image_token_id
    )
