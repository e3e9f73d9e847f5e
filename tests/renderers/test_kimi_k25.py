"""Kimi-K2.5 (``kimi_k25``): its text format exact against its real template and an oracle.

Two references, each from a different hand. The real template: Kimi-K2.5's
``chat_template.jinja`` as lightseekorg/smg vendors it for its tests
(``golden/kimi_k25.jinja``, source and sha256 in ``golden/templates.json``); the golden
tests hold the tiny checkpoint's template to it on every conversation of
``golden/renderings.json`` as for the other families. The oracle: the ``renderers``
package (0.1.12), which renders Kimi-K2.5 in code against pinned Hub revisions; its token
ids for the same conversations, with the tiny checkpoint's tokenizer, are recorded in
``golden/kimi_k25_oracle.json`` (``golden/kimi_k25_oracle.py`` writes them in a venv that
has the package). The tiny template, the real one, and radixark/miles' copy (the real
one plus a ``preserve_thinking`` gate; off, as here) must all give those ids. Images are
compared there in their message-level form (one ``<|media_pad|>`` per image); the text
tests' renderer is the tiny checkpoint's tokenizer with the family's stop tokens and call
format.

Pixels: transformers 5.23 has only a torchvision image processor for Kimi-K2.5, and the
default tier has no torchvision, so there ``load_renderer`` uses vf_mm's torch-only port
(``KimiK25Images``). The default tier holds it to goldens the real processor wrote
(``golden/tv_ports.json``: ids, tensor hashes); the torchvision tier (``-m vllm``) holds
it to the real processor itself, bit for bit, and the renderer to the processor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import vf_mm as vf
from tests._forward import assert_scores_as_sampled
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
from vf_mm.errors import MissingDependencyError, RenderError
from vf_mm.models import family_info, torchvision_available
from vf_mm.renderers import ChatTemplateRenderer, load_renderer
from vf_mm.renderers._kimi import typescript_tools

GOLDEN = Path(__file__).parent / "golden"
ORACLE = json.loads((GOLDEN / "kimi_k25_oracle.json").read_text())["cases"]
REAL = (GOLDEN / "kimi_k25.jinja").read_text()
MILES = (GOLDEN / "kimi_k25_miles_MODIFIED.jinja").read_text()


@pytest.fixture(scope="module")
def kimi(kimi_k25_checkpoint) -> Path:
    return kimi_k25_checkpoint


@pytest.fixture(scope="module")
def renderer(kimi) -> ChatTemplateRenderer:
    from transformers import AutoTokenizer

    info = family_info("kimi_k25")
    return ChatTemplateRenderer(
        AutoTokenizer.from_pretrained(kimi), name="kimi_k25", stop_tokens=info.stop_tokens,
        tool_format=info.tool_format,
    )  # fmt: skip


def template_ids(renderer: ChatTemplateRenderer, case: dict[str, Any], template: str | None):
    tokenizer = renderer.tokenizer
    kwargs: dict[str, Any] = {"thinking": False} if case.get("thinking") is False else {}
    if case.get("tools"):  # what Kimi's tokenizer hands the template beside the tools
        kwargs["tools_ts_str"] = typescript_tools(case["tools"])
    text = tokenizer.apply_chat_template(
        case["messages"], tools=case.get("tools"), tokenize=False, chat_template=template,
        add_generation_prompt=case["add_generation_prompt"], **kwargs,
    )  # fmt: skip
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("case", ORACLE, ids=[c["name"] for c in ORACLE])
def test_the_tiny_template_the_real_one_and_the_miles_copy_render_the_oracles_ids(renderer, case):
    """Text, reasoning kept after the last answer and dropped up to it, calls, tool
    results, names, the thinking switch and each image's markup: the tiny template, the
    real one, and the miles copy with its gate off, give the oracle's ids token for token
    (so the real template is the Hub revision the oracle was written against, on these)."""
    assert template_ids(renderer, case, None) == case["ids"]
    assert template_ids(renderer, case, REAL) == case["ids"]
    assert template_ids(renderer, case, MILES) == case["ids"]


@pytest.mark.parametrize(
    "case", [c for c in ORACLE if "image" not in c["name"]], ids=lambda c: c["name"]
)
def test_the_renderer_renders_the_oracles_ids(renderer, case):
    kwargs = {"thinking": False} if case.get("thinking") is False else {}
    tokenizer = renderer.tokenizer
    r = ChatTemplateRenderer(tokenizer, name="kimi_k25", template_kwargs=kwargs,
                             stop_tokens=family_info("kimi_k25").stop_tokens, tool_format="kimi")  # fmt: skip
    rendered = r.render(case["messages"], tools=case.get("tools"),
                        add_generation_prompt=case["add_generation_prompt"])  # fmt: skip
    assert rendered.token_ids == case["ids"]


def sampled(renderer: ChatTemplateRenderer, text: str) -> list[int]:
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    return [*ids, renderer.stop_token_ids[0]]


def test_a_turn_of_reasoning_and_calls_parses_and_re_renders_as_sampled(renderer):
    """Reasoning (the prompt opened the think block), content and two calls come back
    parsed; the calls keep the ids and arguments text the model wrote (the template
    writes a call as its id, where Kimi's format names the function), so the parsed
    message renders as the tokens sampled."""
    user = {"role": "user", "content": "Crop it."}
    prompt = renderer.render([user]).token_ids
    calls = renderer.format_tool_calls([("zoom", {"x": 1, "label": "a\nb"}), ("look", {})])
    assert calls == (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.zoom:0"
        '<|tool_call_argument_begin|>{"x": 1, "label": "a\\nb"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.look:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    )
    completion = sampled(renderer, "a crop helps</think>Cropping." + calls)
    parsed = renderer.parse_response(completion)
    assert parsed.reasoning == "a crop helps" and parsed.content == "Cropping."
    assert not parsed.tool_call_errors
    assert [(c["id"], c["function"]["name"]) for c in parsed.tool_calls] == [
        ("functions.zoom:0", "zoom"), ("functions.look:1", "look"),
    ]  # fmt: skip
    result = {"role": "tool", "tool_call_id": "functions.zoom:0", "content": "ok"}
    history = renderer.render([user, parsed.message, result], add_generation_prompt=False)
    assert history.token_ids[: len(prompt) + len(completion)] == [*prompt, *completion]


@pytest.mark.parametrize(
    ("section", "error"),
    [("<|tool_call_begin|>zoom<|tool_call_argument_begin|>{}<|tool_call_end|>", "functions.NAME"),
     ("<|tool_call_begin|>functions.zoom:0<|tool_call_argument_begin|>{x<|tool_call_end|>", "not JSON"),
     ("<|tool_call_begin|>functions.zoom:0<|tool_call_argument_begin|>[1]<|tool_call_end|>", "JSON object"),
     ("<|tool_call_begin|>functions.zoom:0<|tool_call_end|>", "no <|tool_call_argument_begin|>")],
)  # fmt: skip
def test_a_malformed_call_is_reported_not_raised(renderer, section, error):
    text = f"<|tool_calls_section_begin|>{section}<|tool_calls_section_end|>"
    parsed = renderer.parse_response(sampled(renderer, "x</think>" + text))
    assert not parsed.tool_calls
    assert len(parsed.tool_call_errors) == 1 and error in parsed.tool_call_errors[0]


def test_tool_results_bridge_to_a_full_render(renderer):
    """A turn of calls keeps its reasoning until an answer without calls follows it, so a
    tool result does not rewrite history: with the real history it bridges, to the
    tokens of a full render. From the tokens alone the bridge cannot tell a turn of
    calls from an answer (whose reasoning the next turn drops), so it re-renders and
    says why."""
    messages: list = [{"role": "user", "content": "Crop it."}]
    rendered = renderer.render(messages)
    for turn in range(3):
        text = f"step {turn}</think>" + renderer.format_tool_calls([("zoom", {"x": turn})])
        completion = sampled(renderer, text)
        parsed = renderer.parse_response(completion)
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "r"}]
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new, previous_messages=[*messages, parsed.message]
        )
        assert bridged is not None, dict(renderer.bridge_refusals)
        messages = [*messages, parsed.message, *new]
        assert bridged.token_ids == renderer.render(messages).token_ids
        rendered = bridged
    reasons: list[str] = []
    assert renderer.bridge_to_next_turn(rendered.token_ids, completion, new,
                                        on_refusal=reasons.append) is None  # fmt: skip
    assert reasons == ["the template drops the reasoning of earlier turns"]


@pytest.mark.parametrize("with_history", [True, False])
def test_a_turn_after_an_answer_is_rendered_in_full_not_bridged(kimi, with_history):
    """The template writes every turn up to the last answer without calls as
    ``<think></think>``: the answer's sampled reasoning is rewritten by whatever follows,
    so the next turn is not bridged (with the real history or the tokens alone), and the
    refusal says why."""
    from transformers import AutoTokenizer

    info = family_info("kimi_k25")
    renderer = ChatTemplateRenderer(AutoTokenizer.from_pretrained(kimi), name="kimi_k25",
                                    stop_tokens=info.stop_tokens, tool_format=info.tool_format)  # fmt: skip
    messages = [{"role": "user", "content": "How many?"}]
    rendered = renderer.render(messages)
    completion = sampled(renderer, "count</think>Three.")
    parsed = renderer.parse_response(completion)
    new = [{"role": "user", "content": "Sure?"}]
    bridged = renderer.bridge_to_next_turn(
        rendered.token_ids, completion, new,
        previous_messages=[*messages, parsed.message] if with_history else None,
    )  # fmt: skip
    assert bridged is None and renderer.bridge_refusals
    full = renderer.tokenizer.decode(renderer.render([*messages, parsed.message, *new]).token_ids)
    assert "count" not in full and "<think></think>Three." in full


def test_the_probe_sees_that_an_answers_reasoning_is_rewritten(renderer):
    """The template probe (``TemplateFacts``) knows Kimi's template writes reasoning and
    calls, and that it rewrites history: not on a turn of calls (kept until an answer
    follows) but on an answer, which every later turn writes ``<think></think>``. So a
    bridge given the real history replays all of it, not just the sampled turn."""
    facts = renderer._facts[None]
    assert facts.reasoning and facts.tool_calls
    assert facts.history_sensitive


def test_tools_the_declaration_cannot_write_are_refused_and_a_given_one_is_written(renderer):
    """Kimi's tokenizer declares tools to the template as TypeScript (``tools_ts_str``),
    which vf_mm writes (the golden cases above); a schema it does not write (``$ref``
    interfaces) is refused by name rather than sending the template's JSON fallback, a
    prompt the served model never sees; a declaration passed in is written verbatim."""
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {
        "type": "object", "properties": {"box": {"$ref": "#/$defs/Box"}}}}}]  # fmt: skip
    with pytest.raises(RenderError, match=r"tools_ts_str.*|\$ref"):
        renderer.render([{"role": "user", "content": "Hi"}], tools=tools)
    declared = ChatTemplateRenderer(renderer.tokenizer, tool_format="kimi",
                                    template_kwargs={"tools_ts_str": "# Tools\nTS"})  # fmt: skip
    text = declared.tokenizer.decode(
        declared.render([{"role": "user", "content": "Hi"}], tools=tools).token_ids
    )
    assert text.startswith("<|im_system|>tool_declare<|im_middle|># Tools\nTS<|im_end|>")


@pytest.fixture(scope="module")
def image_renderer(kimi) -> ChatTemplateRenderer:
    """The checkpoint's renderer as ``load_renderer`` makes it here: with transformers'
    torchvision image processor where torchvision imports, else vf_mm's torch-only port."""
    return load_renderer(kimi)


@pytest.mark.parametrize("case", golden_cases("kimi_k25"), ids=lambda c: f"seed{c['seed']}")
def test_images_render_as_the_real_processor_wrote_them(image_renderer, case):
    """Without torchvision too: the renderer's ids, ``pixel_values`` and
    ``image_grid_thw`` (sha256 of their bytes) and placeholders equal what
    ``Kimi_K25ImageProcessor`` (torchvision) gave for the same stress images
    (``golden/tv_ports.json``)."""
    assert_renders_the_golden(image_renderer, "kimi_k25", case)


def test_torchvision_or_pil_asked_for_by_name_is_refused_not_replaced(kimi):
    """``image_backend="torchvision"`` is transformers' own class: where torchvision does
    not import it is refused naming it, never silently the port; ``"pil"`` (which
    Kimi-K2.5 has none of) is refused naming the backends it has."""
    from vf_mm.models import load_processor

    if not torchvision_available():
        with pytest.raises(MissingDependencyError, match="needs torchvision"):
            load_renderer(kimi, image_backend="torchvision")
    with pytest.raises(MissingDependencyError, match=r"no PIL one.*'torch'"):
        load_processor(kimi, image_backend="pil")
    auto = load_processor(kimi).image_processor
    port = load_processor(kimi, image_backend="torch").image_processor
    assert type(port).__name__ == "KimiK25Images"
    assert type(auto).__name__ == (
        "Kimi_K25ImageProcessor" if torchvision_available() else "KimiK25Images"
    )


def test_the_port_is_refused_under_a_transformers_it_does_not_follow(kimi, monkeypatch):
    """The port computes what transformers 5.23's processor computes; under an older
    transformers (whose pipeline differs) it is refused by name, not run."""
    import transformers

    from vf_mm.models import load_processor

    monkeypatch.setattr(transformers, "__version__", "5.19.0")
    with pytest.raises(MissingDependencyError, match=r"follow transformers 5\.23.*5\.19\.0"):
        load_processor(kimi, image_backend="torch")


def test_the_local_backend_samples_as_a_full_forward_scores_it(kimi):
    """The DeepSeek-V3 text stack (MLA attention, routed experts) samples a text turn
    whose logprobs equal one forward over the prompt and completion."""
    assert_samples_as_a_full_forward_scores(kimi, "kimi_k25")


#: the released checkpoints' weight prefixes, the only ones vLLM 0.32's Kimi-K2.5 loads
RELEASED_PREFIXES = (
    "language_model.model.layers.", "language_model.model.embed_tokens.",
    "language_model.model.norm.", "language_model.lm_head.", "vision_tower.patch_embed.",
    "vision_tower.encoder.blocks.", "vision_tower.encoder.final_layernorm.", "mm_projector.",
)  # fmt: skip


def test_the_checkpoint_is_laid_out_as_released_and_transformers_reads_it_whole(kimi):
    """The tiny checkpoint is written as moonshotai/Kimi-K2.5 is released, so that vLLM's
    own Kimi-K2.5 model serves it (the vllm tier's ``test_families_vllm.py``): its
    architecture name, weight names, router settings, the unified "vision_chunk" modality
    and ``media_proc_cfg`` (the same resizing limits as transformers' settings beside it);
    transformers still loads every weight from it, none missing or left over."""
    from safetensors import safe_open
    from transformers import Kimi_K25ForConditionalGeneration

    config = json.loads((kimi / "config.json").read_text())
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["use_unified_vision_chunk"] is True
    assert (config["text_config"]["topk_method"], config["text_config"]["scoring_func"]) == (
        "noaux_tc", "sigmoid",
    )  # fmt: skip
    with safe_open(str(kimi / "model.safetensors"), "pt") as handle:
        keys = list(handle.keys())
    assert [k for k in keys if not k.startswith(RELEASED_PREFIXES)] == []
    image = json.loads((kimi / "preprocessor_config.json").read_text())
    media = image["media_proc_cfg"]
    assert (media["in_patch_limit"], media["patch_limit_on_one_side"]) == (
        image["max_patches"], image["size"]["max_height"],
    )  # fmt: skip
    assert (media["patch_size"], media["merge_kernel_size"]) == (
        image["patch_size"], image["merge_size"],
    )  # fmt: skip
    _model, info = Kimi_K25ForConditionalGeneration.from_pretrained(kimi, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}


# -- the images, where torchvision imports ---------------------------------------------


@pytest.mark.vllm
@pytest.mark.parametrize("size", [(1, 1), (300, 90), (64, 64), (40, 900), (700, 500)])
def test_images_expand_the_message_level_layout_exactly_as_the_processor(kimi, size):
    """Where torchvision imports (the vllm tier's venv): each image's ``<|media_pad|>``
    (the message-level form the oracle writes, one per image) becomes
    ``grid.prod() // merge**2`` pads, and the renderer's ids and pixel tensors equal
    ``Kimi_K25Processor``'s; collapsing each placeholder back to one pad gives the
    template's ids; the tiny model's forward takes them."""
    pytest.importorskip("torchvision")
    import numpy as np
    import torch
    from PIL import Image

    from vf_mm.models import load_processor, model_class

    renderer = load_renderer(kimi, image_backend="torchvision")
    processor = load_processor(kimi, image_backend="torchvision")
    picture = Image.new("RGB", size, "red")
    messages = [{"role": "user", "content": [{"type": "image", "image": picture},
                                             {"type": "text", "text": "Count."}]}]  # fmt: skip
    rendered = renderer.render(messages)
    text = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    ref = processor(text=text, images=[picture], return_tensors="np")
    assert rendered.token_ids == ref["input_ids"][0].tolist()
    item = rendered.multi_modal_data.mm_items["image"][0]
    assert set(item) == {"pixel_values", "image_grid_thw"}
    for key, value in item.items():
        assert np.array_equal(value, ref[key]), key
    (placeholder,) = rendered.multi_modal_data.mm_placeholders["image"]
    assert placeholder.length == int(np.prod(ref["image_grid_thw"][0])) // 4
    ids = rendered.token_ids
    collapsed = ids[: placeholder.offset + 1] + ids[placeholder.offset + placeholder.length :]
    assert collapsed == processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    model = model_class("kimi_k25").from_pretrained(kimi).eval()
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]),
            pixel_values=torch.from_numpy(item["pixel_values"]),
            image_grid_thw=torch.from_numpy(item["image_grid_thw"]),
        ).logits
    assert logits.shape[1] == len(ids)


class _Ask(vf.MultiTurnEnv):
    """Every turn asks again, in text (the default tier has no Kimi-K2.5 images)."""

    async def env_response(self, messages, state):
        return [{"role": "user", "content": f"and now {state['turn']}?"}]


def test_a_text_rollout_trains_and_the_forward_gives_back_the_samplers_logprobs(kimi, renderer):
    """A text rollout sampled by the local backend becomes samples whose DeepSeek-V3
    forward (MLA attention, routed experts) gives back the sampler's logprobs, and a
    GRPO step moves the language model's weights (router included)."""
    import asyncio

    import torch

    from vf_mm.inference import LocalBackend
    from vf_mm.models import model_class
    from vf_mm.training import build_samples, grpo_loss, make_batches

    env = _Ask(dataset=[{"question": "what is it?"}], max_turns=3,
               sampling_args={"max_tokens": 6, "temperature": 1.0})  # fmt: skip
    state = asyncio.run(env.rollout(vf.RendererClient(LocalBackend(kimi), renderer),
                                    env.get_dataset()[0]))  # fmt: skip
    image_token = renderer.tokenizer.convert_tokens_to_ids("<|media_pad|>")
    samples = build_samples(state, advantage=1.0, image_token_id=image_token)
    batches = make_batches(samples, token_budget=10_000, pad_token_id=0,
                           image_token_id=image_token, family="kimi_k25")  # fmt: skip
    model = model_class("kimi_k25").from_pretrained(kimi, dtype=torch.float32).eval()
    assert_scores_as_sampled(model, batches)
    model.train()
    loss, _ = grpo_loss(model, batches[0])
    loss.backward()
    router = [p for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert router and any(p.grad is not None and p.grad.abs().sum() > 0 for p in router)


def test_an_image_rollout_trains_and_the_forward_gives_back_the_samplers_logprobs(kimi):
    """Without torchvision too (vf_mm's port): an image rollout sampled by the local
    backend trains, its forward (MoonViT, the projector, the DeepSeek-V3 stack) giving
    back the sampler's logprobs (``assert_an_image_rollout_trains``)."""
    assert_an_image_rollout_trains(kimi, "kimi_k25")


# -- vf_mm's torch-only port against transformers' torchvision processor ---------------

PORT_SIZES = ((1, 1), (3, 500), (500, 3), (64, 64), (97, 501), (1000, 120), (640, 480),
              (1500, 1300), (13, 29), (300, 90))  # fmt: skip
PORT_MODES = ("RGB", "L", "RGBA", "P", "LA")


def port_images(seed: int) -> list[Any]:
    """Every stress size in every mode (PIL), and arrays of 1, 3 and 4 channels."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    images: list[Any] = []
    for i, (w, h) in enumerate(PORT_SIZES):
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        mode = PORT_MODES[(seed + i) % len(PORT_MODES)]
        fast = Image.Quantize.FASTOCTREE  # the mode, not how its palette is chosen, is tested
        images.append(picture.convert(mode) if mode != "P" else picture.quantize(16, method=fast))
    return images


@pytest.mark.vllm
@pytest.mark.parametrize(
    "options",
    [{}, {"resample": 2}, {"resample": 0}, {"resample": 1}, {"max_patches": 4}, {"do_normalize": False},
     {"do_rescale": False}, {"do_resize": False, "size": {"max_height": 16, "max_width": 16}},
     {"disable_grouping": False}],
    ids=["checkpoint", "bilinear", "nearest", "lanczos", "tight_budget", "no_normalize", "no_rescale",
         "no_resize", "grouped"],
)  # fmt: skip
def test_the_port_computes_the_torchvision_processors_numbers_bit_for_bit(kimi, options):
    """``KimiK25Images`` (torch alone) gives ``Kimi_K25ImageProcessor``'s
    ``pixel_values`` and ``image_grid_thw``, same dtype, shape and bytes, for every stress
    size and mode, several images a call, channels-last arrays of 1, 3 and 4 channels, and
    the processor's options; and the same patch counts without the image."""
    pytest.importorskip("torchvision")
    require_the_ports_transformers(kimi)
    import numpy as np
    from PIL import Image

    from vf_mm.models import load_processor

    real = load_processor(kimi, image_backend="torchvision").image_processor
    port = load_processor(kimi, image_backend="torch").image_processor
    assert type(real).__name__ == "Kimi_K25ImageProcessor"
    assert port.to_dict() == real.to_dict()  # the same settings, saved under the same class
    if options.get("do_resize") is False:  # no resize: sides a multiple of the patch
        calls = [[np.full((28, 42, 3), 7, np.uint8), np.arange(14 * 56 * 3, dtype=np.uint8)
                  .reshape(14, 56, 3)]]  # fmt: skip
    else:
        images = port_images(len(options))
        rng = np.random.default_rng(7)
        rgba = rng.integers(0, 256, (37, 45, 4), dtype=np.uint8)
        twins = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in "ab"]
        calls = [images[:4], images[4:], twins, [rgba], [rgba[..., :1]], [rgba[..., :3]]]
    assert_same_outputs(real, port, calls, options)
    for h, w in PORT_SIZES:
        assert port.get_number_of_image_patches(h, w, options) == real.get_number_of_image_patches(
            h, w, options
        )


@pytest.mark.vllm
def test_the_ports_render_and_description_are_the_torchvision_ones(kimi):
    assert_the_port_renders_as_torchvision(kimi)
