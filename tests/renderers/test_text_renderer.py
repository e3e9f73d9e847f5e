"""The text renderer works over any Hugging Face tokenizer with a chat template, not just
Qwen's: render equals ``apply_chat_template(tokenize=True)`` and bridging equals a full
render wherever the template is prefix-stable."""

from __future__ import annotations

import pytest

from vf_mm.renderers import load_renderer
from vf_mm.testing import tiny_tokenizer

# A Llama-3-like layout, unlike Qwen's ChatML: header tokens, no default system turn.
LLAMA_LIKE = (
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def renderer():
    tok = tiny_tokenizer()
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.chat_template = LLAMA_LIKE
    r = load_renderer(tok)
    r.stop_token_ids = (tok.convert_tokens_to_ids("<|eot_id|>"),)
    return r


CONVERSATION = [
    {"role": "system", "content": "You count shapes."},
    {"role": "user", "content": "How many circles?"},
    {"role": "assistant", "content": "Three."},
    {"role": "tool", "content": "zoomed: 4 circles"},
    {"role": "user", "content": "And now?"},
]


def test_render_equals_apply_chat_template(renderer):
    expected = renderer.tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert renderer.render(CONVERSATION).token_ids == list(expected)
    assert renderer.render(CONVERSATION).multi_modal_data is None


def test_bridge_equals_full_render(renderer):
    first = renderer.render(CONVERSATION[:2])
    completion = renderer.tokenizer("Three.", add_special_tokens=False)["input_ids"] + [
        renderer.stop_token_ids[0]
    ]
    bridged = renderer.bridge_to_next_turn(first.token_ids, completion, CONVERSATION[3:])
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == renderer.render(CONVERSATION).token_ids


def test_template_that_rewrites_history_is_refused(renderer):
    """A template that numbers turns from the end changes earlier turns: never bridged."""
    tok = renderer.tokenizer
    tok_template = tok.chat_template
    tok.chat_template = (
        "{%- for m in messages -%}{{- (messages|length - loop.index0)|string + m['content'] + '|' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- 'A:' -}}{%- endif -%}"
    )
    try:
        first = renderer.render(CONVERSATION[:2])
        out = renderer.bridge_to_next_turn(first.token_ids, [1, 2], CONVERSATION[3:])
    finally:
        tok.chat_template = tok_template
    assert out is None
    assert any("earlier turns" in reason for reason in renderer.bridge_refusals)
