"""LFM2.5-VL (``lfm2_vl``): its format under the real template, and its images.

The text: the tiny checkpoint's tokenizer and the real LFM2.5-VL template
(``golden/lfm2_5_vl.jinja``, from the trl 1.16.0 wheel; ``test_golden.py`` holds vf_mm's
template equal to it) rendering, parsing and bridging turns of reasoning and
Python-list tool calls, and the local backend sampling its text as a full forward
scores it.

The images: transformers 5.23 has only a torchvision image processor for LFM2-VL, and
the default tier has no torchvision, so there ``load_renderer`` uses vf_mm's torch-only
port (``Lfm2VlImages``). The default tier holds it to goldens the real processor wrote
(``golden/tv_ports.json``: ids, tensor hashes) and trains on an image rollout; the
torchvision tier (``-m vllm``) holds the port to the real processor itself, bit for bit,
and the renderer to the processor.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.renderers._sampling import (
    assert_an_image_rollout_trains,
    assert_samples_as_a_full_forward_scores,
)
from tests.renderers._tv_golden import (
    assert_renders_the_golden,
    assert_same_outputs,
    assert_the_port_renders_as_torchvision,
    golden_cases,
    require_the_ports_transformers,
)
from vf_mm.errors import MissingDependencyError
from vf_mm.models import family_info, load_processor, torchvision_available
from vf_mm.renderers import ChatTemplateRenderer, load_renderer
from vf_mm.testing import build_tiny_vlm

REAL_TEMPLATE = (Path(__file__).parent / "golden" / "lfm2_5_vl.jinja").read_text()
TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "Zoom in.",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("lfm2_vl") / "m", "lfm2_vl")


@pytest.fixture(scope="module")
def text_renderer(lfm2) -> ChatTemplateRenderer:
    """The tiny checkpoint's tokenizer under the real template, with the family's stop
    tokens and call format: LFM2.5-VL without its images."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lfm2)
    tokenizer.chat_template = REAL_TEMPLATE
    info = family_info("lfm2_vl")
    return ChatTemplateRenderer(
        tokenizer, name="lfm2_vl", stop_tokens=info.stop_tokens, tool_format=info.tool_format
    )


def sampled(renderer: ChatTemplateRenderer, text: str) -> list[int]:
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    return [*ids, renderer.stop_token_ids[0]]


def test_a_turn_of_reasoning_and_calls_parses_and_re_renders_as_sampled(text_renderer):
    """The model's reasoning and a list of calls with arguments of every type the
    template writes come back as reasoning and calls, and the parsed message renders as
    the tokens sampled."""
    renderer = text_renderer
    user = {"role": "user", "content": "Crop it."}
    prompt = renderer.render([user], tools=TOOLS).token_ids
    arguments = {"x": 1, "label": "it's a\nline", "box": {"a": True, "b": None},
                 "ids": [1, 2.5], "on": False, "none": None}  # fmt: skip
    calls = renderer.format_tool_calls([("zoom", arguments), ("look", {})])
    assert calls == (
        '<|tool_call_start|>[zoom(x=1, label=\'it\\\'s a\\nline\', box={"a": true, "b": null}, '
        "ids=[1, 2.5], on=False, none=None), look()]<|tool_call_end|>"
    )
    completion = sampled(renderer, "<think>a crop helps</think>Cropping." + calls)
    parsed = renderer.parse_response(completion)
    assert parsed.reasoning == "a crop helps" and parsed.content == "Cropping."
    assert not parsed.tool_call_errors
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [arguments, {}]
    history = renderer.render([user, parsed.message], tools=TOOLS, add_generation_prompt=False)
    assert history.token_ids == [*prompt, *completion, *renderer.tokenizer("\n")["input_ids"]]


def test_tool_results_bridge_to_a_full_render(text_renderer):
    """The turn after the last user message keeps its reasoning, so a tool result does
    not rewrite history: it bridges, to the tokens of a full render."""
    renderer = text_renderer
    messages: list = [{"role": "user", "content": "Crop it."}]
    rendered = renderer.render(messages, tools=TOOLS)
    for turn in range(3):
        text = f"<think>step {turn}</think>" + renderer.format_tool_calls([("zoom", {"x": turn})])
        completion = sampled(renderer, text)
        parsed = renderer.parse_response(completion)
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": f"r{turn}"}]
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new, tools=TOOLS,
            previous_messages=[*messages, parsed.message],
        )  # fmt: skip
        assert bridged is not None, dict(renderer.bridge_refusals)
        messages = [*messages, parsed.message, *new]
        assert bridged.token_ids == renderer.render(messages, tools=TOOLS).token_ids
        rendered = bridged


def test_a_new_question_after_reasoning_is_rendered_in_full_not_bridged(text_renderer):
    """A new user message drops the reasoning of the turns before it: that history is
    rewritten, so the turn is not bridged (and the refusal says why)."""
    renderer = text_renderer
    messages = [{"role": "user", "content": "How many?"}]
    rendered = renderer.render(messages)
    completion = sampled(renderer, "<think>count</think>Three.")
    parsed = renderer.parse_response(completion)
    new = [{"role": "user", "content": "Sure?"}]
    bridged = renderer.bridge_to_next_turn(
        rendered.token_ids, completion, new, previous_messages=[*messages, parsed.message]
    )
    assert bridged is None and renderer.bridge_refusals
    full = renderer.tokenizer.decode(renderer.render([*messages, parsed.message, *new]).token_ids)
    assert "count" not in full and "Three." in full


@pytest.mark.parametrize(
    ("block", "error"),
    [("[zoom(1)]", "by keyword"), ("[zoom(x=os.system('ls'))]", "not a literal"),
     ("zoom(x=1)", "not a list"), ("[zoom(x=1]", "not a Python list")],
)  # fmt: skip
def test_a_malformed_call_is_reported_not_raised(text_renderer, block, error):
    completion = sampled(text_renderer, f"<|tool_call_start|>{block}<|tool_call_end|>")
    parsed = text_renderer.parse_response(completion)
    assert not parsed.tool_calls
    assert len(parsed.tool_call_errors) == 1 and error in parsed.tool_call_errors[0]


@pytest.fixture(scope="module")
def image_renderer(lfm2) -> ChatTemplateRenderer:
    """The checkpoint's renderer as ``load_renderer`` makes it here: with transformers'
    torchvision image processor where torchvision imports, else vf_mm's torch-only port."""
    return load_renderer(lfm2)


@pytest.mark.parametrize("case", golden_cases("lfm2_vl"), ids=lambda c: f"seed{c['seed']}")
def test_images_render_as_the_real_processor_wrote_them(image_renderer, case):
    """Without torchvision too: the renderer's ids (tile and thumbnail markers included),
    ``pixel_values``, ``pixel_attention_mask`` and ``spatial_shapes`` (sha256 of their
    bytes) and placeholders (``is_embed`` on the image tokens) equal what
    ``Lfm2VlImageProcessor`` (torchvision) gave for the same stress images, tiled ones
    among them (``golden/tv_ports.json``)."""
    assert_renders_the_golden(image_renderer, "lfm2_vl", case)


def test_torchvision_or_pil_asked_for_by_name_is_refused_not_replaced(lfm2):
    """``image_backend="torchvision"`` is transformers' own class: where torchvision does
    not import it is refused naming it, never silently the port; ``"pil"`` (which
    LFM2-VL has none of) is refused naming the backends it has."""
    if not torchvision_available():
        with pytest.raises(MissingDependencyError, match="needs torchvision"):
            load_renderer(lfm2, image_backend="torchvision")
    with pytest.raises(MissingDependencyError, match=r"no PIL one.*'torch'"):
        load_processor(lfm2, image_backend="pil")
    auto = load_processor(lfm2).image_processor
    port = load_processor(lfm2, image_backend="torch").image_processor
    assert type(port).__name__ == "Lfm2VlImages"
    assert type(auto).__name__ == (
        "Lfm2VlImageProcessor" if torchvision_available() else "Lfm2VlImages"
    )


def test_the_local_backend_samples_its_hybrid_stack_as_a_full_forward_scores_it(lfm2):
    """LFM2's short-convolution layers keep a state of their own while sampling: the
    sampler's logprobs of a text turn equal one forward over the prompt and completion."""
    assert_samples_as_a_full_forward_scores(lfm2, "lfm2_vl")


# -- the images, where torchvision imports ---------------------------------------------

SIZES = ((1, 1), (3, 500), (64, 64), (97, 501), (1000, 120), (640, 480), (1500, 1300))
MODES = ("RGB", "L", "RGBA", "P", "LA")
# a P image's 16-colour palette by fast octree: the default (median cut) takes ~1 CPU-s
# on a large noise image, and the mode, not how its palette was chosen, is what is tested
FAST_OCTREE = Image.Quantize.FASTOCTREE


@pytest.mark.vllm
@pytest.mark.parametrize("seed", range(4))
def test_images_match_the_processor_bit_for_bit(lfm2, seed):
    """Token ids, every model-input tensor and the placeholders equal LFM2-VL's processor
    (torchvision), for images that force a resize or tiling, in every mode."""
    pytest.importorskip("torchvision")
    import torch

    from vf_mm.models import image_token_ids, model_inputs

    rng = np.random.default_rng(seed)
    images = []
    for i in range(3):
        w, h = SIZES[(seed * 3 + i) % len(SIZES)]
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        mode = MODES[(seed + i) % len(MODES)]
        images.append(
            picture.convert(mode) if mode != "P" else picture.quantize(16, method=FAST_OCTREE)
        )
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Look: "},
                                       {"type": "image", "image": images[0]}]},
        {"role": "user", "content": [{"type": "image", "image": images[1]},
                                     {"type": "text", "text": "How many?"},
                                     {"type": "image", "image": images[2]}]},
    ]  # fmt: skip
    renderer = load_renderer(lfm2, image_backend="torchvision")
    processor = load_processor(lfm2, image_backend="torchvision")
    rendered = renderer.render(messages)
    ref = processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="np"
    )
    assert rendered.token_ids == ref["input_ids"][0].tolist()
    items = rendered.multi_modal_data.mm_items["image"]
    embed = image_token_ids(processor)
    inputs = model_inputs("lfm2_vl", torch.tensor([rendered.token_ids]), items,
                          image_token_ids=embed)  # fmt: skip
    for name in family_info("lfm2_vl").image_inputs:
        assert np.array_equal(inputs[name].numpy(), ref[name]), name
    marked = np.isin(rendered.token_ids, embed)
    covered = np.zeros(len(marked), dtype=bool)
    for placeholder in rendered.multi_modal_data.mm_placeholders["image"]:
        covered[placeholder.embed_positions()] = True
    assert np.array_equal(covered, marked)


def test_an_image_rollout_trains_and_the_forward_gives_back_the_samplers_logprobs(lfm2):
    """Without torchvision too (vf_mm's port): an image rollout sampled by the local
    backend trains, its forward (the SigLIP2 tower, the projector, the LFM2 hybrid stack
    with its tiles' ``pixel_attention_mask`` and ``spatial_shapes``) giving back the
    sampler's logprobs (``assert_an_image_rollout_trains``)."""
    assert_an_image_rollout_trains(lfm2, "lfm2_vl")


# -- vf_mm's torch-only port against transformers' torchvision processor ---------------

PORT_SIZES = ((1, 1), (3, 500), (500, 3), (64, 64), (97, 501), (1000, 120), (640, 480),
              (1500, 1300), (13, 29), (300, 90), (129, 64), (200, 200))  # fmt: skip


def port_calls(seed: int) -> list[list[object]]:
    """Every stress size in a mode of each (PIL), three images a call, two of one size
    (which transformers batches when grouping), and arrays of 1, 3 and 4 channels."""
    rng = np.random.default_rng(seed)
    images: list[object] = []
    for i, (w, h) in enumerate(PORT_SIZES):
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        mode = MODES[(seed + i) % len(MODES)]
        images.append(
            picture.convert(mode) if mode != "P" else picture.quantize(16, method=FAST_OCTREE)
        )
    rgba = rng.integers(0, 256, (37, 45, 4), dtype=np.uint8)
    twins = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in "ab"]
    calls = [images[i : i + 3] for i in range(0, len(images), 3)]
    return [*calls, twins, [rgba], [rgba[..., :1]], [rgba[..., :3]]]


@pytest.mark.vllm
@pytest.mark.parametrize(
    "options",
    [{"return_row_col_info": True}, {"do_image_splitting": False}, {"use_thumbnail": False},
     {"min_tiles": 1, "max_tiles": 4}, {"resample": 3}, {"resample": 0}, {"resample": 1},
     {"do_normalize": False}, {"do_rescale": False},
     {"do_pad": False, "do_image_splitting": False}, {"disable_grouping": False}],
    ids=["checkpoint", "no_splitting", "no_thumbnail", "one_to_four_tiles", "bicubic",
         "nearest", "lanczos", "no_normalize", "no_rescale", "no_pad", "grouped"],
)  # fmt: skip
def test_the_port_computes_the_torchvision_processors_numbers_bit_for_bit(lfm2, options):
    """``Lfm2VlImages`` (torch alone) gives ``Lfm2VlImageProcessor``'s ``pixel_values``,
    ``pixel_attention_mask``, ``spatial_shapes`` (and the rows, columns and sizes the
    processor writes its tokens from), same dtype, shape and bytes, for every stress
    size and mode, tiled or not, several images a call, arrays of 1, 3 and 4 channels,
    and the processor's options."""
    pytest.importorskip("torchvision")
    require_the_ports_transformers(lfm2)
    real = load_processor(lfm2, image_backend="torchvision").image_processor
    port = load_processor(lfm2, image_backend="torch").image_processor
    assert type(real).__name__ == "Lfm2VlImageProcessor"
    assert port.to_dict() == real.to_dict()  # the same settings, saved under the same class
    calls = port_calls(len(options))
    if options.get("do_pad") is False:  # unpadded crops of one image cannot be stacked
        calls = [[image] for images in calls for image in images]
    assert_same_outputs(real, port, calls, options)


@pytest.mark.vllm
def test_without_avx2_the_port_takes_torchvisions_float_path_too(lfm2, monkeypatch):
    """On a CPU without AVX2 (the capability torch reports, patched here) torchvision
    resizes bilinear uint8 images through float32 and rounds back; the port does the
    same, and that path's pixels are not the native kernel's, so following it matters."""
    pytest.importorskip("torchvision")
    require_the_ports_transformers(lfm2)
    import torch

    real = load_processor(lfm2, image_backend="torchvision").image_processor
    port = load_processor(lfm2, image_backend="torch").image_processor
    calls = port_calls(3)[:4]
    native = [port(images, return_tensors="np")["pixel_values"] for images in calls]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert_same_outputs(real, port, calls, {})
    floats = [port(images, return_tensors="np")["pixel_values"] for images in calls]
    assert any(not np.array_equal(a, b) for a, b in zip(native, floats, strict=True))


@pytest.mark.vllm
def test_the_ports_render_and_description_are_the_torchvision_ones(lfm2):
    assert_the_port_renders_as_torchvision(lfm2)
