"""Write ``renderings.json``: each golden conversation rendered by the real template.

    .venv/bin/python tests/renderers/golden/regenerate.py

Run it only when a conversation is added or a template file is replaced (with its new
source in ``templates.json`` and ``SOURCES.md``); ``tests/renderers/test_golden.py``
re-renders every case from the stored template and fails if the file and the template
disagree. Conversations are written the way vf_mm's renderer hands them to a template:
image and video parts reduced to ``{"type": "image"}`` / ``{"type": "video"}``, tool-call
arguments as mappings (the Qwen3.5 template renders nothing from a JSON string).

A family whose checkpoints ship several templates (Gemma 4) has one entry per template,
keyed ``family@variant`` (the tiny checkpoint of that variant gives the vocabulary).

Two cases carry an ``upstream_target``: the rendering huggingface.js records for the same
template and conversation (packages/jinja/test/e2e.test.js), an independent check that
transformers' rendering of the stored text is the one others see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

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


class UpstreamMismatchError(ValueError):
    """transformers' rendering of a stored template differs from the rendering its
    upstream copy records for the same conversation: the stored text, or the case, is
    not what it claims to be."""


IMAGE: dict[str, Any] = {"type": "image"}
VIDEO: dict[str, Any] = {"type": "video"}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def case(name: str, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """One golden conversation; ``options``: ``tools``, ``add_generation_prompt`` (default
    true), ``template_kwargs``, ``template`` (another file of the family's, e.g. SmolVLM's
    video template) and ``upstream_target``."""
    return {"name": name, "messages": messages, "add_generation_prompt": True, **options}


def image_multi_turn() -> dict[str, Any]:
    """An image, an answer, a new question with another image (families that write any
    message's images where they sit)."""
    return case(
        "multi_turn",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "There are 3 circles."},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    )


def history_without_generation_prompt() -> dict[str, Any]:
    """A question and its answer as parts, rendered without a generation prompt."""
    return case(
        "history_without_generation_prompt",
        [
            {"role": "user", "content": [text("How many circles?")]},
            {"role": "assistant", "content": [text("Three.")]},
        ],
        add_generation_prompt=False,
    )


def qwen2_cases(upstream: bool) -> list[dict[str, Any]]:
    """Qwen2-VL and Qwen2.5-VL (one template): the default system turn, string and list
    content, images, video, ``add_vision_id``, and what the template ignores (``tools``)
    or writes verbatim (tool messages, reasoning in the content)."""
    out = [
        case("text_only", [{"role": "user", "content": "Hello there, how many circles?"}]),
        case(
            "system_and_text",
            [
                {"role": "system", "content": "You count shapes."},
                {"role": "user", "content": [text("How many circles?")]},
            ],
        ),
        case("one_image", [{"role": "user", "content": [IMAGE, text("How many circles?")]}]),
        case(
            "several_images",
            [
                {"role": "system", "content": [text("You compare pictures.")]},
                {
                    "role": "user",
                    "content": [text("Compare "), IMAGE, IMAGE, text(" with\n"), IMAGE],
                },
            ],
        ),
        case(
            "multi_turn",
            [
                {"role": "user", "content": [IMAGE, text("How many circles?")]},
                {"role": "assistant", "content": "There are 3 circles."},
                {"role": "user", "content": [text("And now?"), IMAGE]},
            ],
        ),
        case(
            "history_without_generation_prompt",
            [
                {"role": "user", "content": [IMAGE, text("How many circles?")]},
                {"role": "assistant", "content": "Three."},
            ],
            add_generation_prompt=False,
        ),
        case(
            "tools_tool_result_and_reasoning_in_content",
            [
                {"role": "user", "content": [IMAGE, text("How many?")]},
                {
                    "role": "assistant",
                    "content": "<think>\nzoom first\n</think>\n\n"
                    '<tool_call>\n{"name": "zoom", "arguments": {"x": 1, "y": 2}}\n</tool_call>',
                },
                {"role": "tool", "content": [IMAGE, text("zoomed")]},
            ],
            tools=TOOLS,
        ),
        case("video", [{"role": "user", "content": [VIDEO, text("What moves?")]}]),
        case(
            "add_vision_id",
            [
                {"role": "user", "content": [IMAGE, text("First.")]},
                {"role": "assistant", "content": "Seen."},
                {"role": "user", "content": [IMAGE, VIDEO, IMAGE, text("And these?")]},
            ],
            template_kwargs={"add_vision_id": True},
        ),
    ]
    if upstream:
        out.append(
            case(
                "huggingface_js_example",
                [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "image": "https://qianwen-res.oss-cn-beijing.aliyuncs.com/Qwen-VL/assets/demo.jpeg",
                            },
                            text("Describe this image."),
                        ],
                    }
                ],
                upstream_target="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                "Describe this image.<|im_end|>\n<|im_start|>assistant\n",
            )
        )
    return out


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


QWEN3_5_CASES = [
    case(
        "text_only",
        [{"role": "user", "content": "Hello there, how many circles?"}],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "system_and_text_trimmed",
        [
            {"role": "system", "content": "  You count shapes.\n"},
            {"role": "user", "content": [text("  How many circles?  \n")]},
        ],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "one_image_thinking",
        [{"role": "user", "content": [IMAGE, text("How many circles?")]}],
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "several_images",
        [{"role": "user", "content": [text("Compare "), IMAGE, IMAGE, text(" with"), IMAGE]}],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "earlier_reasoning_dropped_on_new_query",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "<think>\ncount them\n</think>\n\nThree."},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "reasoning_content_after_last_query",
        [
            {"role": "user", "content": "How many circles?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "\ncount them\n"},
        ],
        add_generation_prompt=False,
    ),
    case(
        "tools_calls_and_tool_results",
        [
            {"role": "system", "content": "You count shapes."},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "", "tool_calls": [call("zoom", {"x": 1, "y": 2})]},
            {"role": "tool", "content": [IMAGE, text("zoomed")]},
            {"role": "tool", "content": "second result"},
        ],
        tools=TOOLS,
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "tool_call_after_text_with_structured_arguments",
        [
            {"role": "user", "content": "Crop it."},
            {
                "role": "assistant",
                "content": "<think>\nneed a crop\n</think>\n\nCropping now.",
                "tool_calls": [
                    call("zoom", {"region": [1, 2, 3, 4], "opts": {"scale": 2}, "label": "a b"}),
                    call("zoom", {"x": True, "y": None}),
                ],
            },
            {"role": "tool", "content": "done"},
        ],
        tools=TOOLS,
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "video",
        [{"role": "user", "content": [VIDEO, text("What moves?")]}],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "add_vision_id",
        [{"role": "user", "content": [IMAGE, VIDEO, IMAGE, text("Which?")]}],
        template_kwargs={"enable_thinking": False, "add_vision_id": True},
    ),
    case(
        "huggingface_js_example",
        [
            {
                "role": "user",
                "content": "What's the temperature in San Francisco now? How about tomorrow?",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "get_temperature_date",
                        {"location": "San Francisco, CA, USA", "date": "2024-10-01"},
                    )
                ],
            },
        ],
        add_generation_prompt=False,
        upstream_target="<|im_start|>user\nWhat's the temperature in San Francisco now? How about "
        "tomorrow?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
        "<function=get_temperature_date>\n<parameter=location>\nSan Francisco, CA, USA\n"
        "</parameter>\n<parameter=date>\n2024-10-01\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>\n",
    ),
]

GEMMA3_CASES = [
    case("text_only_trimmed", [{"role": "user", "content": "  Hello there, how many?  \n"}]),
    case(
        "system_string",
        [
            {"role": "system", "content": "You count shapes."},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
        ],
    ),
    case(
        "system_parts",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [text("How many circles?"), IMAGE]},
        ],
    ),
    case(
        "several_images_trimmed_parts",
        [{"role": "user", "content": [text("Compare\n"), IMAGE, IMAGE, text("  these  ")]}],
    ),
    case(
        "multi_turn",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "There are 3 circles.\n"},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    ),
    case(
        "history_without_generation_prompt",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": [text("Three.")]},
        ],
        add_generation_prompt=False,
    ),
]

SMOLVLM_CASES = [
    case("text_only", [{"role": "user", "content": [text("Hello there, how many?")]}]),
    case(
        "system_and_image_first",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
        ],
    ),
    case(
        "several_images_and_system_image",
        [
            {"role": "system", "content": [IMAGE, text("Reference shapes.")]},
            {"role": "user", "content": [text("Compare "), IMAGE, IMAGE]},
        ],
    ),
    case(
        "multi_turn",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": [text("There are 3 circles.")]},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    ),
    history_without_generation_prompt(),
    case(
        "tool_message_with_image",
        [
            {"role": "user", "content": [text("Zoom in.")]},
            {"role": "assistant", "content": [text("zoom(1, 2)")]},
            {"role": "tool", "content": [IMAGE, text("zoomed")]},
        ],
    ),
    case(
        "video",
        [{"role": "user", "content": [VIDEO, text("What moves?")]}],
        template="smolvlm_video.jinja",
    ),
]

LLAVA_ONEVISION_CASES = [
    case("text_only", [{"role": "user", "content": [text("Hello there, how many?")]}]),
    case(
        "system_and_image_after_text",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [text("How many circles?"), IMAGE]},
        ],
    ),
    case(
        "several_images_interleaved",
        [{"role": "user", "content": [text("Compare"), IMAGE, text("with"), IMAGE, IMAGE]}],
    ),
    case(
        "multi_turn",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": [text("There are 3 circles.")]},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    ),
    history_without_generation_prompt(),
    case(
        "system_and_tool_images",
        [
            {"role": "system", "content": [IMAGE, text("Reference.")]},
            {"role": "user", "content": [text("Zoom in.")]},
            {"role": "assistant", "content": [text("zoom(1, 2)")]},
            {"role": "tool", "content": [text("zoomed"), IMAGE]},
        ],
    ),
    case("video", [{"role": "user", "content": [VIDEO, text("What moves?")]}]),
]

# Qwen3.5's variants (the small and large checkpoints', Qwen3.6's, Qwen3.8's): the
# Qwen3.5 conversations (without huggingface.js's rendering, which is the 4B's) and what
# the variants branch on: the default thinking, preserve_thinking, reasoning_effort, and
# how argument values other than strings are written.
QWEN3_5_VARIANT_CASES = [
    {k: v for k, v in entry.items() if k != "upstream_target"} for entry in QWEN3_5_CASES
] + [
    case("default_thinking", [{"role": "user", "content": [IMAGE, text("How many?")]}]),
    case(
        "system_and_default_thinking_after_history",
        [
            {"role": "system", "content": "You count."},
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "count"},
            {"role": "user", "content": "Sure?"},
        ],
    ),
    case(
        "preserve_thinking_and_typed_arguments",
        [
            {"role": "user", "content": "Crop it."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "crop first",
                "tool_calls": [
                    call("zoom", {"deep": True, "skip": None, "n": 2.5, "box": [1, 2], "s": "a"})
                ],
            },
            {"role": "tool", "content": "done"},
            {"role": "assistant", "content": "Cropped.", "reasoning_content": "done"},
            {"role": "user", "content": "Again?"},
        ],
        tools=TOOLS,
        template_kwargs={"preserve_thinking": True},
    ),
    case(
        "thinking_off_and_empty_system",
        [{"role": "system", "content": "  "}, {"role": "user", "content": "Hi"}],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "reasoning_effort_low_with_tools",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tools=TOOLS,
        template_kwargs={"reasoning_effort": "low"},
    ),
    case(
        "reasoning_effort_medium",
        [{"role": "user", "content": "Hi"}],
        template_kwargs={"reasoning_effort": "medium", "preserve_thinking": False},
    ),
]


# Qwen3-VL-Instruct: the Qwen2-VL conversations (the same ChatML, but no default system
# turn, tools in the system turn, tool results in <tool_response> user turns) and what
# it leaves out: a system message's images, a system message after the first,
# reasoning_content.
QWEN3_VL_INSTRUCT_CASES = [
    *qwen2_cases(upstream=False),
    case(
        "tools_calls_and_tool_results",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {
                "role": "assistant",
                "content": "Zooming.",
                "reasoning_content": "ignored",
                "tool_calls": [call("zoom", {"x": 1, "y": 2}), call("zoom", '{"x": 3}')],
            },
            {"role": "tool", "content": [IMAGE, text("zoomed")]},
            {"role": "tool", "content": "second result"},
        ],
        tools=TOOLS,
    ),
    case(
        "system_image_and_a_later_system_message",
        [
            {"role": "system", "content": [text("Reference: "), IMAGE]},
            {"role": "user", "content": [text("Compare"), IMAGE]},
            {"role": "assistant", "content": "Same."},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Sure?"},
        ],
    ),
]


# Qwen3-VL-*-Thinking: the Instruct conversations (the same ChatML, tools and tool
# results), which it writes differently (a thought opened in the generation prompt, a
# system message's images, reasoning split out of the content), and what it branches on:
# reasoning given as a field or in the content, kept only after the last user query
# (through tool turns), a user text that reads as a tool response, images numbered with
# ``add_vision_id`` (a first system message's written before they are counted), and the
# ``enable_thinking`` switch it does not read.
QWEN3_VL_THINKING_CASES = [
    *QWEN3_VL_INSTRUCT_CASES,
    case(
        "earlier_reasoning_dropped_on_new_query",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "<think>\ncount them\n</think>\n\nThree."},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    ),
    case(
        "reasoning_content_after_last_query",
        [
            {"role": "user", "content": "How many circles?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "\ncount them\n"},
        ],
        add_generation_prompt=False,
    ),
    case(
        "reasoning_kept_through_tool_turns",
        [
            {"role": "user", "content": [IMAGE, text("Crop it.")]},
            {
                "role": "assistant",
                "content": "Cropping.",
                "reasoning_content": "need a crop",
                "tool_calls": [call("zoom", {"x": 1, "y": 2})],
            },
            {"role": "tool", "content": [IMAGE, text("cropped")]},
            {"role": "assistant", "content": "<think>\nlooks right\n</think>\n\nA circle."},
        ],
        tools=TOOLS,
        add_generation_prompt=False,
    ),
    case(
        "a_user_text_that_reads_as_a_tool_response",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "counted"},
            {"role": "user", "content": "<tool_response>x</tool_response>"},
        ],
    ),
    case(
        "vision_ids_with_a_system_image",
        [
            {"role": "system", "content": [text("Reference: "), IMAGE]},
            {"role": "user", "content": [IMAGE, VIDEO, text("Which?")]},
            {"role": "assistant", "content": "The first."},
            {"role": "tool", "content": [IMAGE, text("zoomed")]},
        ],
        template_kwargs={"add_vision_id": True},
    ),
    case(
        "enable_thinking_is_not_read",
        [{"role": "user", "content": [IMAGE, text("How many?")]}],
        template_kwargs={"enable_thinking": False},
    ),
]


LLAVA_NEXT_CASES = [
    case("text_only", [{"role": "user", "content": [text("Hello there, how many?")]}]),
    case(
        "system_and_images_after_text",
        [
            {"role": "system", "content": [text("You count shapes.")]},
            {"role": "user", "content": [text("How many circles?"), IMAGE, text(" Now."), IMAGE]},
        ],
    ),
    case(
        "multi_turn",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": [text("There are 3 circles.")]},
            {"role": "user", "content": [text("And now?"), IMAGE]},
        ],
    ),
    history_without_generation_prompt(),
    case(
        "assistant_parts_after_the_first_dropped",
        [
            {"role": "user", "content": [text("How many circles?")]},
            {"role": "assistant", "content": [text("Three."), text(" Dropped.")]},
            {"role": "user", "content": [text("Sure?")]},
        ],
    ),
    case(
        "system_image_dropped",
        [
            {"role": "system", "content": [text("Reference:"), IMAGE]},
            {"role": "user", "content": [text("Compare."), IMAGE]},
        ],
    ),
]

INTERNVL_CASES = [
    case("text_only", [{"role": "user", "content": "Hello there, how many circles?"}]),
    case(
        "system_and_image",
        [
            {"role": "system", "content": "You count shapes."},
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
        ],
    ),
    case(
        "several_images_between_text",
        [{"role": "user", "content": [text("Compare "), IMAGE, text(" and "), IMAGE, text(".")]}],
    ),
    image_multi_turn(),
    history_without_generation_prompt(),
    case(
        "system_image_and_tool_image",
        [
            {"role": "system", "content": [text("Reference:"), IMAGE]},
            {"role": "user", "content": [text("Zoom in.")]},
            {"role": "assistant", "content": "Zooming."},
            {"role": "tool", "content": [IMAGE, text("the crop")]},
        ],
    ),
    case(
        "tools_are_not_written",
        [{"role": "user", "content": [IMAGE, text("Crop it.")]}],
        tools=TOOLS,
    ),
    case("video", [{"role": "user", "content": [VIDEO, text("What moves?")]}]),
]


GEMMA4_TOOLS = [
    TOOLS[0],
    {
        "type": "function",
        "function": {
            "name": "crop",
            "description": "Crop boxes out of the picture.",
            "parameters": {
                "type": "object",
                "properties": {
                    "boxes": {
                        "type": "array",
                        "description": "Boxes to cut.",
                        "items": {
                            "type": "object",
                            "properties": {"x": {"type": "integer"}, "label": {"type": "string"}},
                            "required": ["x"],
                        },
                    },
                    "mode": {"type": "string", "enum": ["fast", "exact"], "nullable": True},
                    "options": {
                        "type": "object",
                        "properties": {"scale": {"type": "number"}, "type": {"type": "string"}},
                        "required": ["scale"],
                    },
                    "extra": {
                        "type": "object",
                        "description": "Free form.",
                        "hint": {"type": "string"},
                    },
                    "tags": {"type": "array", "items": {"type": ["string", "null"]}},
                    "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
                "required": ["boxes"],
            },
        },
    },
]


def called(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, **call(name, arguments)}


def tool_result(call_id: str, name: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


LFM2_VL_CASES = [
    case("text_only", [{"role": "user", "content": "Hello there, how many circles?"}]),
    case(
        "system_and_images",
        [
            {"role": "system", "content": "You count shapes."},
            {"role": "user", "content": [IMAGE, text("How many circles?"), IMAGE]},
        ],
    ),
    case(
        "system_parts_with_an_image",
        [
            {"role": "system", "content": [text("Reference: "), IMAGE]},
            {"role": "user", "content": [text("Compare."), IMAGE]},
        ],
    ),
    image_multi_turn(),
    history_without_generation_prompt(),
    case(
        "tools_calls_and_an_image_result",
        [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": [IMAGE, text("Crop it.")]},
            {
                "role": "assistant",
                "content": "Cropping.",
                "tool_calls": [
                    called(
                        "c1",
                        "zoom",
                        {
                            "x": 1,
                            "label": "it's a\nline",
                            "box": {"a": True, "b": None},
                            "ids": [1, 2.5],
                            "on": False,
                            "none": None,
                        },
                    ),
                    called("c2", "look", {}),
                ],
            },
            tool_result("c1", "zoom", [IMAGE, text("the crop")]),
            tool_result("c2", "look", "nothing"),
        ],
        tools=TOOLS,
    ),
    case(
        "reasoning_after_and_before_the_last_query",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "count them"},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "recount"},
        ],
        add_generation_prompt=False,
    ),
    case(
        "reasoning_in_the_content_of_an_earlier_turn",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "<think>count them</think>  Three."},
            {"role": "user", "content": "Sure?"},
        ],
    ),
    case(
        "preserve_thinking",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "count them"},
            {"role": "user", "content": "Sure?"},
        ],
        template_kwargs={"preserve_thinking": True},
    ),
]


GEMMA4_CASES = [
    case("text_only_trimmed", [{"role": "user", "content": "  Hello there, how many?  \n"}]),
    case(
        "system_string_and_images",
        [
            {"role": "system", "content": "  You count shapes.\n"},
            {"role": "user", "content": [IMAGE, text("How many circles?"), IMAGE]},
        ],
    ),
    case(
        "system_parts",
        [
            {"role": "system", "content": [text(" You count "), text("shapes.")]},
            {"role": "user", "content": [text("How many circles?")]},
        ],
    ),
    case(
        "several_images_and_thinking",
        [{"role": "user", "content": [text("Compare\n"), IMAGE, IMAGE, text("  these  ")]}],
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "multi_turn_with_reasoning",
        [
            {"role": "user", "content": [IMAGE, text("How many circles?")]},
            {"role": "assistant", "content": "There are 3.", "reasoning_content": "count"},
            {"role": "user", "content": [text("And now?"), IMAGE]},
            {"role": "assistant", "content": "  Two.\n", "reasoning_content": "again"},
        ],
        add_generation_prompt=False,
    ),
    case(
        "thought_block_in_content_is_stripped",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Hello."},
            {"role": "user", "content": "Bye"},
        ],
        template_kwargs={"enable_thinking": False},
    ),
    case(
        "tools_call_and_text_result",
        [
            {"role": "developer", "content": "Use the tools."},
            {"role": "user", "content": [IMAGE, text("Zoom in.")]},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "zoom first",
                "tool_calls": [called("c1", "zoom", {"x": 1, "y": 2})],
            },
            tool_result("c1", "zoom", "zoomed"),
        ],
        tools=GEMMA4_TOOLS,
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "tool_result_with_images_then_answer",
        [
            {"role": "user", "content": "Crop it."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    called(
                        "c1",
                        "crop",
                        {
                            "boxes": [{"x": 1, "label": "a b"}],
                            "mode": None,
                            "options": {"scale": 2.5, "deep": True},
                        },
                    ),
                    called("c2", "zoom", {"x": 3, "y": 4}),
                ],
            },
            tool_result("c1", "crop", [text("cropped"), IMAGE]),
            tool_result("c2", "zoom", [IMAGE, text("zoomed "), text("twice")]),
            {"role": "assistant", "content": "Done.", "reasoning_content": "looked"},
            {"role": "user", "content": "Thanks"},
        ],
        tools=GEMMA4_TOOLS,
    ),
    case(
        "tool_result_a_mapping_and_open_turn",
        [
            {"role": "user", "content": "Zoom."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "why not",
                "tool_calls": [called("c1", "zoom", {"x": 1, "y": 2})],
            },
            tool_result("c1", "zoom", [text("ok")]),
            {
                "role": "tool",
                "tool_call_id": "c9",
                "content": "unmatched id, named by itself",
                "name": "zoom",
            },
        ],
        template_kwargs={"enable_thinking": True},
    ),
    case(
        "preserve_thinking_on_earlier_calls",
        [
            {"role": "user", "content": "Zoom."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "first",
                "tool_calls": [called("c1", "zoom", {"x": 1, "y": 2})],
            },
            tool_result("c1", "zoom", "ok"),
            {"role": "assistant", "content": "Seen."},
            {"role": "user", "content": "Again."},
        ],
        template_kwargs={"enable_thinking": True, "preserve_thinking": True},
    ),
    case(
        "call_without_results_and_video",
        [
            {"role": "user", "content": [VIDEO, text("What moves?")]},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [called("c1", "zoom", {"x": 1, "y": 2})],
            },
        ],
        add_generation_prompt=False,
    ),
]


# GLM-4.6V: images wherever they stand (system, user and tool messages, several a turn),
# reasoning as a field and in the content, kept after the last user message and emptied
# before it, calls with arguments of every type, runs of tool results (text, parts,
# images), tools, the thinking switch, and no generation prompt.
GLM46V_CASES = [
    case("text_only", [{"role": "user", "content": "Hello there, how many circles?"}]),
    case(
        "system_parts_and_images",
        [
            {"role": "system", "content": [text("Reference: "), IMAGE]},
            {"role": "user", "content": [IMAGE, text("How many circles?"), IMAGE]},
        ],
    ),
    image_multi_turn(),
    history_without_generation_prompt(),
    case(
        "reasoning_after_and_before_the_last_query",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "Three.", "reasoning_content": "count them"},
            {"role": "user", "content": [IMAGE, text("And here?")]},
            {"role": "assistant", "content": "Four.", "reasoning_content": "recount"},
        ],
        add_generation_prompt=False,
    ),
    case(
        "reasoning_in_the_content",
        [
            {"role": "user", "content": "How many?"},
            {"role": "assistant", "content": "<think>\ncount them\n</think>\nThree."},
        ],
        add_generation_prompt=False,
    ),
    case(
        "tools_calls_and_image_results",
        [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": [IMAGE, text("Crop it.")]},
            {
                "role": "assistant",
                "content": "Cropping.",
                "reasoning_content": "crop first",
                "tool_calls": [
                    called(
                        "c1",
                        "zoom",
                        {
                            "x": 1,
                            "label": "it's a\nline",
                            "box": {"a": True, "b": None},
                            "ids": [1, 2.5],
                            "on": False,
                        },
                    ),
                    called("c2", "look", {}),
                ],
            },
            tool_result("c1", "zoom", [IMAGE, text("the crop"), IMAGE]),
            tool_result("c2", "look", "nothing"),
        ],
        tools=TOOLS,
    ),
    case(
        "thinking_off",
        [
            {"role": "user", "content": [IMAGE, text("Quick: what is it?")]},
        ],
        template_kwargs={"enable_thinking": False},
    ),
    case("video", [{"role": "user", "content": [VIDEO, text("What moves?")]}]),
]


def kimi_k25_cases() -> list[dict[str, Any]]:
    """Kimi-K2.5's conversations are the oracle's (``kimi_k25_oracle.json``: text,
    reasoning kept and dropped, calls, tool results, names, the thinking switch, tools,
    images in user, system and tool messages), so the real template's rendering and the
    ``renderers`` package's ids are checked on the same ones. Kimi's tokenizer hands the
    template the tools' TypeScript declaration (``tools_ts_str``) beside them: vf_mm's
    ``typescript_tools`` writes it (the oracle's tool cases check that it is the same)."""
    from vf_mm.renderers._kimi import typescript_tools

    oracle = json.loads((HERE / "kimi_k25_oracle.json").read_text())["cases"]
    out = []
    for entry in oracle:
        kwargs: dict[str, Any] = {"thinking": False} if entry.get("thinking") is False else {}
        options: dict[str, Any] = {"add_generation_prompt": entry["add_generation_prompt"]}
        if entry.get("tools"):
            kwargs["tools_ts_str"] = typescript_tools(entry["tools"])
            options["tools"] = entry["tools"]
        if kwargs:
            options["template_kwargs"] = kwargs
        out.append(case(entry["name"], entry["messages"], **options))
    return out


CASES: dict[str, list[dict[str, Any]]] = {
    "qwen2_vl": qwen2_cases(upstream=False),
    "qwen2_5_vl": qwen2_cases(upstream=True),
    "qwen3_5": QWEN3_5_CASES,
    "gemma3": GEMMA3_CASES,
    "smolvlm": SMOLVLM_CASES,
    "llava_onevision": LLAVA_ONEVISION_CASES,
    "qwen3_vl@instruct": QWEN3_VL_INSTRUCT_CASES,
    "qwen3_vl@reasoning": QWEN3_VL_THINKING_CASES,
    "llava_next": LLAVA_NEXT_CASES,
    "internvl": INTERNVL_CASES,
    "lfm2_vl": LFM2_VL_CASES,
    **{f"qwen3_5@{variant}": QWEN3_5_VARIANT_CASES
       for variant in ("nothink", "think", "qwen3.6", "qwen3.8")},
    **{f"gemma4@{variant}": GEMMA4_CASES
       for variant in ("4742fe8", "b446025", "6b7e72c", "905e84b", "8995379", "31b")},
    "kimi_k25": kimi_k25_cases(),
    "glm46v": GLM46V_CASES,
}  # fmt: skip

# The vocabulary each family's ids are recorded with: the real Qwen2 vocabulary where
# vf_mm has it, else the family's tiny checkpoint vocabulary.
VOCAB = {
    "qwen2_vl": "qwen",
    "qwen2_5_vl": "qwen",
    "qwen3_5": "tiny",
    "gemma3": "tiny",
    "smolvlm": "tiny",
    "llava_onevision": "tiny",
    "llava_next": "tiny",
    "internvl": "tiny",
    "lfm2_vl": "tiny",
    "kimi_k25": "tiny",
    "glm46v": "tiny",
    **{key: "tiny" for key in CASES if "@" in key},
}


def family_and_variant(key: str) -> tuple[str, str | None]:
    """A golden key is a family (``model_type``), or ``family@variant`` for a family whose
    checkpoints ship several templates (Gemma 4's Hub revisions)."""
    family, _, variant = key.partition("@")
    return family, variant or None


def tokenizer_for(key: str, vocab: str, root: Path) -> Any:
    """The real Qwen2 vocabulary, or the tokenizer of the family's tiny checkpoint."""
    from transformers import AutoTokenizer

    from vf_mm.testing import build_tiny_vlm, qwen_tokenizer

    if vocab == "qwen":
        return qwen_tokenizer()
    family, variant = family_and_variant(key)
    path = build_tiny_vlm(root / key.replace("@", "-"), family, variant=variant)  # type: ignore[arg-type]
    return AutoTokenizer.from_pretrained(path)  # the processor's (LFM2-VL's needs torchvision)


def render(tokenizer: Any, template: str, entry: dict[str, Any]) -> str:
    return tokenizer.apply_chat_template(
        entry["messages"],
        chat_template=template,
        tools=entry.get("tools"),
        tokenize=False,
        add_generation_prompt=entry["add_generation_prompt"],
        **entry.get("template_kwargs", {}),
    )


def main() -> None:
    import tempfile

    import transformers

    sources = json.loads((HERE / "templates.json").read_text())
    out: dict[str, Any] = {
        "rendered_with": f"transformers {transformers.__version__}, apply_chat_template(tokenize=False)",
        "families": {},
    }
    with tempfile.TemporaryDirectory(prefix="vf_mm_golden_") as tmp:
        root = Path(tmp)
        for family, cases in CASES.items():
            vocab = VOCAB[family]
            tokenizer = tokenizer_for(family, vocab, root)
            entries = []
            for entry in cases:
                file = entry.get("template", sources[family]["file"])
                rendered = render(tokenizer, (HERE / file).read_text(), entry)
                if "upstream_target" in entry and rendered != entry["upstream_target"]:
                    raise UpstreamMismatchError(
                        f"{family}/{entry['name']}: {rendered!r} != {entry['upstream_target']!r}"
                    )
                ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
                entries.append({**entry, "template": file, "text": rendered, "ids": ids})
            name, variant = family_and_variant(family)
            described = {"family": name, "variant": variant} if variant else {}
            out["families"][family] = {**described, "vocab": vocab, "cases": entries}
    path = HERE / "renderings.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
