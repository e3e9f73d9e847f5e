"""Facts about GLM-4.6V's real chat templates, pinned in ``golden/``.

vf_mm's tiny GLM-4.6V checkpoint carries zai-org/GLM-4.6V's template byte for byte
(``test_glm46v.py``; the goldens in ``renderings.json``). The real templates are stored
(``golden/glm46v.jinja`` for zai-org/GLM-4.6V, ``golden/glm46v_flash.jinja`` for zai-org/GLM-4.6V-Flash; source and
sha256 in ``golden/templates.json``, checked by ``test_golden.py``). These tests hold
what a GLM-4.6V renderer has to match, read from those texts with the same Jinja
environment ``apply_chat_template`` uses (no tokenizer is needed to render text):

- the two checkpoints' templates differ by one Jinja comment, so one vf_mm template can
  serve both;
- every image is written where it stands, in user, system and tool messages alike (none
  is dropped, so a renderer has nothing to refuse there);
- the reasoning of an answer before the last user message is rewritten to an empty
  ``<think></think>``, the one place the template rewrites history (a bridge refusal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

GOLDEN = Path(__file__).parent / "golden"
IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": "Crop the image.",
            "parameters": {"type": "object", "properties": {"box": {"type": "array"}}},
        },
    }
]


def render(file: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    rendered, _indices = render_jinja_template(
        [messages], chat_template=(GOLDEN / file).read_text(), **kwargs
    )
    return rendered[0]


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


IMAGE_PART = {"type": "image"}
CALL = {"type": "function", "function": {"name": "zoom", "arguments": {"box": [1, 2, 3, 4]}}}

CONVERSATIONS = {
    "system-and-images": [
        {"role": "system", "content": [text("Be brief."), IMAGE_PART]},
        user(IMAGE_PART, text("What is it?"), IMAGE_PART),
    ],
    "video": [user({"type": "video"}, text("What happens?"))],
    "tool-round-with-images": [
        user(text("Zoom in."), IMAGE_PART),
        {"role": "assistant", "content": "", "reasoning_content": "Crop.", "tool_calls": [CALL]},
        {"role": "tool", "content": [text("Cropped:"), IMAGE_PART]},
        {"role": "tool", "content": "second result"},
    ],
    "two-questions": [
        user(text("How many?")),
        {"role": "assistant", "content": "Seven.", "reasoning_content": "Count them."},
        user(text("Sure?")),
    ],
}


@pytest.mark.parametrize("enable_thinking", [None, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_glm46v_and_its_flash_template_render_the_same(name, enable_thinking):
    kwargs: dict[str, Any] = {"tools": TOOLS, "add_generation_prompt": True}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    messages = CONVERSATIONS[name]
    assert render("glm46v.jinja", messages, **kwargs) == render(
        "glm46v_flash.jinja", messages, **kwargs
    )


def test_every_image_is_written_in_user_system_and_tool_messages():
    first = render("glm46v.jinja", CONVERSATIONS["system-and-images"])
    assert first.count(IMAGE) == 3
    assert first.index("Be brief.") < first.index(IMAGE) < first.index("<|user|>")
    tool_round = render("glm46v.jinja", CONVERSATIONS["tool-round-with-images"])
    response = tool_round[tool_round.index("<|observation|>") :]
    assert response.startswith(
        f"<|observation|>\n<tool_response>\nCropped:{IMAGE}\n</tool_response>"
    )


def test_reasoning_before_the_last_question_is_rewritten_empty():
    messages = CONVERSATIONS["two-questions"]
    rendered = render("glm46v.jinja", messages, add_generation_prompt=True)
    assert "Count them." not in rendered
    assert "<|assistant|>\n<think></think>\nSeven.<|user|>" in rendered
    last_turn = render("glm46v.jinja", messages[:2])
    assert last_turn.endswith("<|assistant|>\n<think>Count them.</think>\nSeven.")
