"""Golden renderings from the real models' chat templates: fidelity, not self-agreement.

The parity tests elsewhere compare vf_mm with transformers processors built from vf_mm's
own templates (``vf_mm/models/_templates.py``), so a template that drifted from the real
model's would pass them. These tests hold the real templates instead, copied byte for byte
into ``tests/renderers/golden/`` from the sources ``templates.json`` and ``SOURCES.md``
name (repository, path, commit, sha256), and a set of conversations per family rendered
by them (``renderings.json``, written by ``golden/regenerate.py``). Nothing is downloaded
at run time. The invariants:

- each stored template is the text its source holds (its sha256 is the recorded one);
- each golden string is what transformers' ``apply_chat_template(tokenize=False)``
  renders from the stored template now, and its ids are that string's tokens (the real
  Qwen2 vocabulary for Qwen2-VL and Qwen2.5-VL, the tiny checkpoint's otherwise): the
  recorded facts are what they claim;
- vf_mm's own template renders every golden conversation exactly as the real one does:
  the tiny checkpoints, and every parity test built on them, speak the real format;
- the renderer, on a tiny checkpoint carrying the real template, gives the token ids of
  the transformers processor carrying the same template, images expanded, for images
  that force a resize.

Qwen3-VL has no golden file: its real template could not be obtained (``SOURCES.md``).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vf_mm.models import (
    CHAT_TEMPLATES,
    build_tiny_vlm,
    image_token_ids,
    load_processor,
    qwen_tokenizer,
)
from vf_mm.renderers import load_renderer

GOLDEN = Path(__file__).parent / "golden"
SOURCES: dict[str, Any] = json.loads((GOLDEN / "templates.json").read_text())
RENDERINGS: dict[str, Any] = json.loads((GOLDEN / "renderings.json").read_text())["families"]

CASES = [
    pytest.param(family, case, id=f"{family}-{case['name']}")
    for family, entry in RENDERINGS.items()
    for case in entry["cases"]
]


def has_video(case: dict[str, Any]) -> bool:
    return any(
        part["type"] == "video"
        for message in case["messages"]
        if not isinstance(message["content"], str)
        for part in message["content"]
    )


IMAGE_CASES = [
    pytest.param(family, case, id=f"{family}-{case['name']}")
    for family, entry in RENDERINGS.items()
    for case in entry["cases"]
    if not has_video(case)
]


def template(name: str) -> str:
    return (GOLDEN / name).read_text()


def render(tokenizer: Any, chat_template: str, case: dict[str, Any]) -> str:
    """What transformers renders for the case: its tokenizer's ``apply_chat_template``
    (the processors' own, for ``tokenize=False``, renders the same way)."""
    return tokenizer.apply_chat_template(
        case["messages"],
        chat_template=chat_template,
        tools=case.get("tools"),
        tokenize=False,
        add_generation_prompt=case["add_generation_prompt"],
        **case.get("template_kwargs", {}),
    )


@pytest.fixture(scope="module")
def tokenizers(real_checkpoints) -> dict[str, Any]:
    """The vocabulary each family's golden ids were recorded with: the real Qwen2 one, or
    the family's tiny checkpoint's (the chat template in the checkpoint plays no part)."""
    real_qwen = qwen_tokenizer()
    return {
        family: real_qwen
        if entry["vocab"] == "qwen"
        else load_processor(real_checkpoints[family]).tokenizer
        for family, entry in RENDERINGS.items()
    }


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_stored_template_is_the_recorded_text(name):
    """A template file edited by hand (or by an editor adding a final newline) would make
    every golden string below a rendering of something no model ships."""
    entry = SOURCES[name]
    text = (GOLDEN / entry["file"]).read_bytes()
    assert hashlib.sha256(text).hexdigest() == entry["sha256"], entry["file"]
    assert entry["source"], f"{name}: no source recorded"


def test_every_family_with_a_real_template_has_golden_conversations():
    """Each family whose real template is stored is checked; vf_mm renders one more
    family (Qwen3-VL) whose real template could not be obtained here."""
    assert set(RENDERINGS) == set(CHAT_TEMPLATES) - {"qwen3_vl"}
    for family in RENDERINGS:
        assert family in SOURCES
        assert RENDERINGS[family]["cases"]


@pytest.mark.parametrize(("family", "case"), CASES)
def test_golden_string_is_what_the_real_template_renders(tokenizers, family, case):
    """The recorded string and ids are today's rendering of the stored real template (two
    of them also equal the rendering huggingface.js recorded for the same conversation)."""
    tokenizer = tokenizers[family]
    text = render(tokenizer, template(case["template"]), case)
    assert text == case["text"]
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == case["ids"]
    if "upstream_target" in case:
        assert text == case["upstream_target"]


@pytest.mark.parametrize(("family", "case"), CASES)
def test_vf_mm_template_renders_what_the_real_one_renders(tokenizers, family, case):
    """The fidelity check: the tiny checkpoints' template (vf_mm's own Jinja) writes every
    golden conversation character for character as the model's real template does. (A
    SmolVLM conversation holding a video is rendered by transformers with its own video
    template, which the golden case records; vf_mm's template has the video branch.)"""
    assert render(tokenizers[family], CHAT_TEMPLATES[family], case) == case["text"]


def test_gemma3_launch_template_renders_the_same_except_a_string_system_message(tokenizers):
    """Gemma 3 shipped first with a template that reads the system text only from a list
    of parts (``gemma3_2025-03.jinja``). On every golden conversation the two revisions
    render the same, except a string system message, which only the current one takes:
    so the golden strings do not depend on which revision a checkpoint carries."""
    from jinja2 import TemplateError

    launch = template("gemma3_2025-03.jinja")
    tokenizer = tokenizers["gemma3"]
    for case in RENDERINGS["gemma3"]["cases"]:
        messages = case["messages"]
        if messages[0]["role"] == "system" and isinstance(messages[0]["content"], str):
            with pytest.raises((TemplateError, TypeError)):
                render(tokenizer, launch, case)
        else:
            assert render(tokenizer, launch, case) == case["text"], case["name"]


# -- the renderer against the processor, both carrying the real template ----------------

SIZES = ((1000, 120), (97, 501), (1500, 1300), (3, 500), (640, 480), (33, 33))
MODES = ("RGB", "L", "RGBA", "P", "LA")


def pictures(seed: int):
    """Images whose sizes force a resize (tiny, huge, extreme aspect ratios) in every
    family's processor, in several modes."""
    rng = random.Random(seed)
    for i in range(1_000):
        w, h = SIZES[i % len(SIZES)]
        arr = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (h, w, 3), np.uint8)
        picture = Image.fromarray(arr)
        mode = MODES[i % len(MODES)]
        yield picture.convert(mode) if mode != "P" else picture.quantize(16)


def with_images(messages: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    source = pictures(seed)
    out = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):
            content = [
                {"type": "image", "image": next(source)} if part["type"] == "image" else part
                for part in content
            ]
        out.append({**message, "content": content})
    return out


def carrying(path: Path, chat_template: str) -> Path:
    """The checkpoint at ``path`` with ``chat_template`` in place of vf_mm's own."""
    (path / "chat_template.jinja").write_text(chat_template)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if "chat_template" in config:
        config["chat_template"] = chat_template
        config_file.write_text(json.dumps(config, indent=2) + "\n")
    return path


@pytest.fixture(scope="module")
def real_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("golden")
    return {
        family: carrying(build_tiny_vlm(root / family, family), template(SOURCES[family]["file"]))
        for family in RENDERINGS
    }


@pytest.fixture(scope="module")
def renderers() -> dict[tuple[str, str], Any]:
    """One renderer per checkpoint and template arguments (built on first use)."""
    return {}


def reference_ids(processor: Any, family: str, messages: list[dict[str, Any]], case: dict) -> list:
    """The processor's token ids with images expanded. SmolVLM's and LLaVA-OneVision's
    ``apply_chat_template`` need a video processor (torchvision, absent here), so for them
    the same two steps are taken by hand: the real template, then the processor (LLaVA-
    OneVision's images as one flat list: each in single-image mode, as vLLM computes)."""
    kwargs = dict(tools=case.get("tools"), add_generation_prompt=case["add_generation_prompt"])
    kwargs.update(case.get("template_kwargs", {}))
    if family not in ("smolvlm", "llava_onevision"):
        out = processor.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_tensors="np", **kwargs
        )
        return out["input_ids"][0].tolist()
    images, shown = [], []
    for message in messages:
        parts = []
        for part in message["content"]:
            if part["type"] == "image":
                images.append(part["image"])
                part = {"type": "image"}
            parts.append(part)
        shown.append({**message, "content": parts})
    text = processor.tokenizer.apply_chat_template(shown, tokenize=False, **kwargs)
    batch = images if family == "llava_onevision" else [images]
    out = processor(text=[text], images=batch if images else None, return_tensors="np")
    return out["input_ids"][0].tolist()


@pytest.mark.parametrize(("family", "case"), IMAGE_CASES)
def test_renderer_ids_equal_the_processor_with_the_real_template(
    real_checkpoints, renderers, family, case
):
    """Both sides read the real template from the checkpoint; the renderer's ids (its own
    placeholder expansion and image processing) equal the processor's, so vf_mm's exact
    token ids hold for the model's real format, not only for vf_mm's copy of it."""
    path = real_checkpoints[family]
    real = template(SOURCES[family]["file"])
    kwargs = case.get("template_kwargs", {})
    key = (family, json.dumps(kwargs, sort_keys=True))
    if key not in renderers:
        renderers[key] = load_renderer(path, template_kwargs=kwargs)
    renderer = renderers[key]
    processor = load_processor(path)
    assert renderer.tokenizer.chat_template == real
    assert processor.tokenizer.chat_template == real

    messages = with_images(case["messages"], seed=len(case["name"]))
    rendered = renderer.render(
        messages, tools=case.get("tools"), add_generation_prompt=case["add_generation_prompt"]
    )
    assert rendered.token_ids == reference_ids(processor, family, messages, case)
    images = sum(
        part["type"] == "image"
        for m in messages
        if not isinstance(m["content"], str)
        for part in m["content"]
    )
    embedded = np.isin(rendered.token_ids, list(image_token_ids(processor))).sum()
    assert embedded > images or images == 0  # expanded: more image tokens than images


# -- drift found, not yet fixed -----------------------------------------------------------

STRING_ARGUMENTS = [
    {"role": "user", "content": "Crop it."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": '{"x": 1}'}}],
    },
]


def test_real_qwen3_5_template_refuses_tool_arguments_given_as_a_json_string(tokenizers):
    """The real Qwen3.5 template iterates a call's arguments with ``|items``: a JSON string
    (the OpenAI wire form) is refused, not rendered. The renderer hands it mappings."""
    from jinja2 import TemplateError

    case = {"messages": STRING_ARGUMENTS, "add_generation_prompt": False}
    with pytest.raises((TemplateError, TypeError), match="mapping"):
        render(tokenizers["qwen3_5"], template("qwen3_5.jinja"), case)


def test_vf_mm_qwen3_5_template_refuses_json_string_arguments_as_the_real_one_does(tokenizers):
    from jinja2 import TemplateError

    case = {"messages": STRING_ARGUMENTS, "add_generation_prompt": False}
    with pytest.raises((TemplateError, TypeError), match="mapping"):
        render(tokenizers["qwen3_5"], CHAT_TEMPLATES["qwen3_5"], case)


def test_a_parsed_qwen3_5_turn_re_renders_as_sampled_with_the_real_template(real_checkpoints):
    """A sampled turn (reasoning, text, an XML tool call) parsed by the renderer and put
    back into the conversation renders as the model wrote it, under the real template."""
    renderer = load_renderer(real_checkpoints["qwen3_5"], template_kwargs={"enable_thinking": True})
    user = {"role": "user", "content": "Crop it."}
    prompt = renderer.tokenizer.decode(renderer.render([user]).token_ids)
    sampled = (
        "need a crop\n</think>\n\nCropping.\n\n<tool_call>\n<function=zoom>\n<parameter=x>\n1\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    ids = renderer.tokenizer(sampled + "<|im_end|>", add_special_tokens=False)["input_ids"]
    message = renderer.parse_response(ids).message
    history = renderer.render([user, message], add_generation_prompt=False).token_ids
    assert renderer.tokenizer.decode(history) == prompt + sampled + "<|im_end|>\n"
