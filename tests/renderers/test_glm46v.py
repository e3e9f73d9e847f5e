"""GLM-4.6V (``glm46v``): the tiny checkpoint, its completions, bridging and refusals.

Rendering itself is held to ``Glm46VProcessor`` by the family parity tests
(``test_family_parity.py``: stress shapes and modes, images in system and tool messages)
and to the real template by the goldens (``test_golden.py``); this file holds what is
GLM's own: the checkpoint carries the real template and GLM's specials at their roles,
its forward places images by M-RoPE, its tool calls (``<tool_call>NAME`` with
``<arg_key>``/``<arg_value>`` pairs) and reasoning parse back to what the template
writes, tool results bridge, and what it cannot render is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.models import family_info, load_processor, model_class, model_type
from vf_mm.renderers import load_renderer

GOLDEN = Path(__file__).parent / "golden"
SPECIALS = {
    "image_token_id": "<|image|>",
    "video_token_id": "<|video|>",
    "image_start_token_id": "<|begin_of_image|>",
    "image_end_token_id": "<|end_of_image|>",
    "video_start_token_id": "<|begin_of_video|>",
    "video_end_token_id": "<|end_of_video|>",
}


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def renderer(glm46v_checkpoint):
    return load_renderer(glm46v_checkpoint, image_backend="pil")


def test_the_tiny_checkpoint_carries_the_real_template_and_glms_specials(glm46v_checkpoint):
    path = glm46v_checkpoint
    assert (path / "chat_template.jinja").read_bytes() == (GOLDEN / "glm46v.jinja").read_bytes()
    processor = load_processor(path, image_backend="pil")
    tokenizer = processor.tokenizer
    config = json.loads((path / "config.json").read_text())
    for key, token in SPECIALS.items():
        assert config[key] == tokenizer.convert_tokens_to_ids(token), key
    assert processor.image_token == "<|image|>"
    assert processor.image_token_id == config["image_token_id"]
    for token in ("[gMASK]", "<sop>", "<|user|>", "<|observation|>", "<arg_key>", "</think>"):
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    stops = [tokenizer.convert_tokens_to_ids(t) for t in family_info("glm46v").stop_tokens]
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == stops
    image = processor.image_processor
    assert (image.patch_size, image.merge_size, image.temporal_patch_size) == (14, 2, 2)
    assert list(image.image_mean) == [0.48145466, 0.4578275, 0.40821073]  # CLIP's, as released
    rope = config["text_config"]["rope_parameters"]
    assert rope["partial_rotary_factor"] == 0.5 and sum(rope["mrope_section"]) == 32 // 2 // 2


def _with_config(source: Path, target: Path, config_type: str, processor: str | None) -> Path:
    """``source``'s configs (no weights: the family is read from the files alone) with its
    config type and the processor class its files name replaced; None names none."""
    target.mkdir()
    for name in ("config.json", "preprocessor_config.json", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "model_type": config_type}))
    if processor is not None:
        (target / "processor_config.json").write_text(json.dumps({"processor_class": processor}))
    return target


def test_the_tiny_checkpoint_is_flash_s_kind_and_its_kin_are_told_apart_by_processor(
    glm46v_checkpoint, tmp_path
):
    """The released GLM-4.6V-Flash declares ``glm4v`` (Glm4vForConditionalGeneration) and
    GLM-4.6V ``glm4v_moe``, the config types of GLM-4.1V and GLM-4.5V too: only the
    processor their files name tells GLM-4.6V (Glm46VProcessor) apart. The tiny checkpoint
    is Flash's kind; either type naming Glm46VProcessor (in processor_config.json, or in
    preprocessor_config.json alone) is the glm46v family, loaded by its own type's class;
    one naming Glm4vProcessor, or nothing, is GLM-4.1V/4.5V or unknown, refused by name."""
    config = json.loads((glm46v_checkpoint / "config.json").read_text())
    assert config["model_type"] == "glm4v"
    assert config["architectures"] == ["Glm4vForConditionalGeneration"]
    assert json.loads((glm46v_checkpoint / "processor_config.json").read_text()) == {
        "processor_class": "Glm46VProcessor"
    }
    assert model_type(glm46v_checkpoint) == "glm46v"
    assert model_class("glm46v", checkpoint=glm46v_checkpoint).__name__ == (
        "Glm4vForConditionalGeneration"
    )

    moe = _with_config(glm46v_checkpoint, tmp_path / "moe", "glm4v_moe", None)
    preprocessor = json.loads((moe / "preprocessor_config.json").read_text())
    (moe / "preprocessor_config.json").write_text(
        json.dumps({**preprocessor, "processor_class": "Glm46VProcessor"})
    )  # where the real GLM-4.6V names it
    assert model_type(moe) == "glm46v"
    assert model_class("glm46v", checkpoint=moe).__name__ == "Glm4vMoeForConditionalGeneration"
    # without the checkpoint the class is a guess that would load the MoE's missing dense
    # weights at random (only a warning says so): refused, naming the fix
    with pytest.raises(ValueError, match=r"model_class\('glm46v', checkpoint=path\)"):
        model_class("glm46v")
    assert model_class("qwen2_vl").__name__ == "Qwen2VLForConditionalGeneration"

    for processor in ("Glm4vProcessor", None):
        other = _with_config(glm46v_checkpoint, tmp_path / f"4.1v-{processor}", "glm4v", processor)
        assert model_type(other) == "glm4v"
        with pytest.raises(UnsupportedModelError) as info:
            load_renderer(other)
        message = str(info.value)
        assert "model type 'glm4v' is a vision-language model vf_mm does not render" in message
        assert "family 'glm46v', only when its processor config names Glm46VProcessor" in message
        assert f"this one names {processor!r}" in message
    with pytest.raises(UnsupportedModelError, match="pass family='glm46v'"):
        family_info("glm4v")  # make_batches(family=model.config.model_type) of a real Flash


def test_the_forward_places_image_tokens_on_a_grid_by_m_rope(glm46v_checkpoint):
    """The tiny model runs offline, and its ``get_rope_index`` (what the local backend
    asks for positions) gives an image's tokens (height, width) positions, not a run."""
    import torch
    from transformers import Glm4vForConditionalGeneration

    processor = load_processor(glm46v_checkpoint, image_backend="pil")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[text], images=[noise(120, 60)], return_tensors="pt")
    model = Glm4vForConditionalGeneration.from_pretrained(glm46v_checkpoint).eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    assert torch.isfinite(logits).all()
    positions, _ = model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"],
    )  # fmt: skip
    image = inputs["input_ids"][0] == processor.image_token_id
    height, width = positions[1, 0, image], positions[2, 0, image]
    _, rows, columns = (inputs["image_grid_thw"][0] // torch.tensor([1, 2, 2])).tolist()
    assert len(set(height.tolist())) == rows and len(set(width.tolist())) == columns


def test_a_completion_parses_into_reasoning_content_and_calls(renderer):
    text = (
        "<think>Crop first.</think>\nCropping.\n<tool_call>zoom\n<arg_key>x</arg_key>\n"
        "<arg_value>1</arg_value>\n<arg_key>label</arg_key>\n<arg_value>a b</arg_value>\n"
        "<arg_key>box</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>\n"
        "<tool_call>look\n</tool_call>"
    )
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    observation = renderer.tokenizer.convert_tokens_to_ids("<|observation|>")
    parsed = renderer.parse_response([*ids, observation])
    assert parsed.stopped and not parsed.tool_call_errors
    assert parsed.reasoning == "Crop first." and parsed.content == "Cropping."
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]
    assert calls == [("zoom", {"x": 1, "label": "a b", "box": [1, 2]}), ("look", {})]


@pytest.mark.parametrize(
    "call",
    [
        "<tool_call><arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "<tool_call>zoom\nx=1\n</tool_call>",
        "<tool_call>zoom\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\nstray\n</tool_call>",
    ],
)
def test_a_malformed_call_is_reported_not_raised(renderer, call):
    ids = renderer.tokenizer(call, add_special_tokens=False)["input_ids"]
    parsed = renderer.parse_response(ids)
    assert parsed.tool_calls == [] and len(parsed.tool_call_errors) == 1


def test_tool_results_bridge_to_a_full_render_with_their_images(renderer):
    """After a turn of calls the template keeps that turn as written (its reasoning too:
    no user message followed), so tool results, images and all, bridge; each bridge
    equals a full render of the conversation with the parsed turn in it."""
    tools = [{"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
              "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]  # fmt: skip
    messages = [{"role": "user", "content": [{"type": "image", "image": noise(90, 40)},
                                              {"type": "text", "text": "Zoom in."}]}]  # fmt: skip
    rendered = renderer.render(messages, tools=tools)
    observation = renderer.tokenizer.convert_tokens_to_ids("<|observation|>")
    for turn in range(3):
        calls = renderer.format_tool_calls([("zoom", {"x": turn, "where": "top left"})])
        text = f"<think>Turn {turn}.</think>\nLooking.\n{calls}"
        completion = [*renderer.tokenizer(text, add_special_tokens=False)["input_ids"], observation]
        parsed = renderer.parse_response(completion)
        assert not parsed.tool_call_errors and parsed.reasoning == f"Turn {turn}."
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"],
                "content": [{"type": "text", "text": "zoomed"},
                            {"type": "image", "image": noise(30 + turn, 200, turn)}]}]  # fmt: skip
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


def test_a_new_question_after_reasoning_is_rendered_in_full_saying_why(renderer):
    """The template rewrites the reasoning of answers before the last user message to
    ``<think></think>``: a bridge could not equal a full render, so it declines by name."""
    first = renderer.render([{"role": "user", "content": "How many?"}])
    text = "<think>Count them.</think>\nSeven."
    user = renderer.tokenizer.convert_tokens_to_ids("<|user|>")
    completion = [*renderer.tokenizer(text, add_special_tokens=False)["input_ids"], user]
    new = [{"role": "user", "content": "Sure?"}]
    assert renderer.bridge_to_next_turn(first.token_ids, completion, new) is None
    assert "the template drops the reasoning of earlier turns" in renderer.bridge_refusals


def test_an_aspect_beyond_the_processors_is_refused_by_name(renderer):
    thin = [{"role": "user", "content": [{"type": "image", "image": noise(300, 1)}]}]
    with pytest.raises(RenderError, match=r"message 0, part 0: .*aspect ratio"):
        renderer.render(thin)


@pytest.mark.slow
def test_glm_4_6v_s_moe_kind_is_built_recognised_and_generates(tmp_path):
    """``variant="moe"`` builds GLM-4.6V's own kind (``glm4v_moe``, routed experts beside a
    shared one, the same template and processor): it is the glm46v family, and the local
    backend loads it with ``Glm4vMoeForConditionalGeneration`` and samples from an image
    prompt the renderer made."""
    import asyncio

    from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams
    from vf_mm.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "moe", "glm46v", variant="moe")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "glm4v_moe"
    assert config["text_config"]["n_routed_experts"] > 1
    assert (path / "chat_template.jinja").read_bytes() == (GOLDEN / "glm46v.jinja").read_bytes()
    assert model_type(path) == "glm46v"
    renderer = load_renderer(path, image_backend="pil")
    content = [{"type": "image", "image": noise(100, 60)}, {"type": "text", "text": "Hi"}]
    rendered = renderer.render([{"role": "user", "content": content}])
    backend = LocalBackend(path, batch_window_ms=1)

    async def sample():
        try:
            return await backend.generate(GenerateRequest(
                rendered.token_ids, SamplingParams(max_tokens=4, temperature=0.0, logprobs=True),
                multi_modal_data=rendered.multi_modal_data,
            ))  # fmt: skip
        finally:
            await backend.aclose()

    out = asyncio.run(sample())
    assert type(backend.model).__name__ == "Glm4vMoeForConditionalGeneration"
    assert len(out.completion_ids) == 4 and all(np.isfinite(out.logprobs))
