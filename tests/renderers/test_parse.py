"""``parse_response``: reasoning, content, tool calls; malformed calls reported, not raised."""

from __future__ import annotations

import json

import pytest

from vf_mm.renderers import load_renderer


@pytest.fixture(scope="module")
def renderer(checkpoints):
    return load_renderer(checkpoints["qwen2_5_vl"])


def ids(renderer, text, stop=True):
    out = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    return out + ([renderer.stop_token_ids[0]] if stop else [])


def test_plain_content(renderer):
    parsed = renderer.parse_response(ids(renderer, "There are three circles."))
    assert parsed.content == "There are three circles."
    assert parsed.reasoning is None and parsed.tool_calls == [] and parsed.stopped


def test_cut_off_by_max_tokens_is_not_stopped(renderer):
    assert not renderer.parse_response(ids(renderer, "There are", stop=False)).stopped


def test_tokens_after_the_stop_token_are_ignored(renderer):
    parsed = renderer.parse_response(ids(renderer, "yes") + ids(renderer, "garbage"))
    assert parsed.content == "yes"


def test_reasoning_is_split_off(renderer):
    parsed = renderer.parse_response(ids(renderer, "<think>\ncount them\n</think>\n\nthree"))
    assert parsed.reasoning == "count them"
    assert parsed.content == "three"


def test_message_content_keeps_what_the_template_would_not_render(renderer, checkpoints):
    """Qwen2.5-VL's template renders neither reasoning_content nor tool_calls: the message
    keeps them in its content, so a re-render shows the model its own words. Qwen3-VL's
    renders both: there the content is clean."""
    text = '<think>\nplan\n</think>\n\nok\n<tool_call>\n{"name": "zoom", "arguments": {}}\n</tool_call>'
    kept = renderer.parse_response(ids(renderer, text)).message
    assert kept["content"] == text and kept["reasoning_content"] == "plan"
    qwen3 = load_renderer(checkpoints["qwen3_vl"])
    clean = qwen3.parse_response(ids(qwen3, text)).message
    assert clean["content"] == "ok" and clean["reasoning_content"] == "plan"
    assert clean["tool_calls"][0]["function"]["name"] == "zoom"


def test_tool_calls_are_parsed(renderer):
    text = (
        'Let me zoom.\n<tool_call>\n{"name": "zoom", "arguments": {"x": 1, "y": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "crop", "arguments": {}}\n</tool_call>'
    )
    parsed = renderer.parse_response(ids(renderer, text))
    assert parsed.content == "Let me zoom."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["zoom", "crop"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"x": 1, "y": 2}
    assert parsed.message["tool_calls"] == parsed.tool_calls
    assert parsed.tool_call_errors == []


def test_format_tool_calls_writes_what_parse_response_reads_back(renderer):
    calls = [("zoom", {"x": 1, "label": "ünï"}), ("crop", {})]
    text = renderer.format_tool_calls(calls)
    parsed = renderer.parse_response(ids(renderer, text))
    assert parsed.tool_call_errors == [] and parsed.content == ""
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]
    assert got == calls


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('{"name": "zoom", "arguments": {"x": 1}', "not JSON"),
        ('["zoom"]', "not a JSON object"),
        ('{"arguments": {}}', "no function name"),
        ('{"name": "zoom", "arguments": [1]}', "arguments are not a JSON object"),
    ],
)
def test_malformed_tool_calls_are_reported_not_raised(renderer, raw, error):
    parsed = renderer.parse_response(ids(renderer, f"<tool_call>\n{raw}\n</tool_call>"))
    assert parsed.tool_calls == []
    assert len(parsed.tool_call_errors) == 1 and error in parsed.tool_call_errors[0]


def test_string_arguments_holding_json_are_accepted(renderer):
    text = '<tool_call>\n{"name": "zoom", "arguments": "{\\"x\\": 3}"}\n</tool_call>'
    parsed = renderer.parse_response(ids(renderer, text))
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"x": 3}


def test_unclosed_tool_call_at_max_tokens(renderer):
    parsed = renderer.parse_response(ids(renderer, '<tool_call>\n{"name": "zo', stop=False))
    assert parsed.tool_calls == [] and parsed.tool_call_errors
