"""``parse_response``: reasoning, content, tool calls; malformed calls reported, not raised."""

from __future__ import annotations

import json

import pytest

from vf_mm.renderers import ChatTemplateRenderer, format_tool_calls, load_renderer


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


# -- Qwen3.5's XML tool calls -------------------------------------------------------------


@pytest.fixture(scope="module")
def xml_renderer(renderer):
    """A renderer that reads and writes Qwen3.5's XML calls (the same tokenizer)."""
    return ChatTemplateRenderer(renderer.tokenizer, tool_format="xml")


def parse_xml(renderer, text):
    return renderer.parse_response(ids(renderer, text))


def test_xml_calls_round_trip_through_format_and_parse(xml_renderer):
    """What ``format_tool_calls(tool_format="xml")`` writes parses back to the same
    arguments: strings raw, objects and lists as JSON, True/False/None as Python writes
    them, numbers as numbers."""
    arguments = {"x": 3, "ratio": 0.5, "label": "top left", "box": {"w": [1, 2]},
                 "tags": ["a", "b"], "ok": True, "off": False, "none": None,
                 "multi": "line one\nline two"}  # fmt: skip
    text = xml_renderer.format_tool_calls([("zoom", arguments), ("look", {})])
    parsed = parse_xml(xml_renderer, text)
    assert not parsed.tool_call_errors and parsed.content == ""
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["zoom", "look"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == arguments
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"name": "zoom", "arguments": {}}', "no <function=NAME>"),
        ("<function=zoom>\n<parameter=x>\n1\n</parameter>\n", "no <function=NAME>"),
        ("<function=zoom>\nstray words\n</function>", "text outside a <parameter>"),
        ("<function=zoom>\n<parameter=x>\n1\n</parameter>\ntrailing\n</function>",
         "text outside a <parameter>"),
        ("<function= >\n</function>", "no function name"),
    ],
)  # fmt: skip
def test_malformed_xml_calls_are_reported_not_raised(xml_renderer, raw, problem):
    parsed = parse_xml(xml_renderer, f"I will zoom.\n<tool_call>\n{raw}\n</tool_call>")
    assert parsed.tool_calls == [] and parsed.content == "I will zoom."
    assert len(parsed.tool_call_errors) == 1 and problem in parsed.tool_call_errors[0]


def test_a_json_call_is_not_read_as_xml_nor_xml_as_json(renderer, xml_renderer):
    xml = xml_renderer.format_tool_calls([("zoom", {"x": 1})])
    assert renderer.parse_response(ids(renderer, xml)).tool_call_errors  # not JSON
    as_json = renderer.format_tool_calls([("zoom", {"x": 1})])
    assert parse_xml(xml_renderer, as_json).tool_call_errors


def test_an_unknown_tool_format_is_refused(renderer):
    with pytest.raises(ValueError, match="tool_format must be one of"):
        format_tool_calls([("zoom", {})], tool_format="yaml")
    with pytest.raises(ValueError, match="tool_format must be one of"):
        ChatTemplateRenderer(renderer.tokenizer, tool_format="yaml")
