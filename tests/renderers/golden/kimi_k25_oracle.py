"""Write ``kimi_k25_oracle.json``: Kimi-K2.5 conversations rendered by the ``renderers``
package (PyPI 0.1.12, ``renderers/kimi_k25.py``), the oracle for Kimi-K2.5's text format.

``renderers`` implements Kimi-K2.5's rendering in code against pinned Hub revisions
(moonshotai/Kimi-K2.5 @ 4d01dfe0); the stored template (``kimi_k25.jinja``, a vendored
copy that names no revision) is checked against these ids. It is not a vf_mm
dependency, so this script runs in a venv of its own that has it (the default venv's
packages plus ``renderers==0.1.12``):

    python -m venv --without-pip .venv-oracle
    echo "$PWD/.venv/lib/python3.11/site-packages" > .venv-oracle/lib/python3.11/site-packages/main.pth
    .venv/bin/python -m pip --python .venv-oracle/bin/python install renderers==0.1.12
    PYTHONPATH=. .venv-oracle/bin/python tests/renderers/golden/kimi_k25_oracle.py

The ids are the tiny Kimi-K2.5 tokenizer's (``build_tiny_vlm(path, "kimi_k25")``), which
both renderers are handed. Images are rendered without pixels
(``process_multimodal=False``): the oracle writes each image's markup with one
``<|media_pad|>``, the message-level form a server expands. ``tests/renderers/
test_kimi_k25.py`` holds vf_mm's rendering, and the stored template's, to these ids.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
IMAGE: dict[str, Any] = {"type": "image"}


def call(name: str, index: int, arguments: str) -> dict[str, Any]:
    return {
        "id": f"functions.{name}:{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def case(name: str, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return {"name": name, "messages": messages, "add_generation_prompt": True, **options}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": "Crop a region.\n\nThen zoom in.",
            "parameters": {
                "type": "object",
                "required": ["y", "x"],
                "properties": {
                    "x": {"type": "integer", "description": "Left edge.", "minimum": 0},
                    "y": {"type": "integer", "maximum": 100, "minimum": 0},
                    "label": {
                        "type": "string",
                        "maxLength": 20,
                        "pattern": "^[a-z]+$",
                        "default": "box",
                    },
                    "mode": {"type": "string", "enum": ["fast", "exact"], "description": "How."},
                    "scale": {"type": ["number", "null"]},
                    "maybe": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    "boxes": {
                        "type": "array",
                        "description": "Boxes.",
                        "items": {
                            "type": "object",
                            "description": "One box.",
                            "required": ["w"],
                            "properties": {"w": {"type": "number"}, "h": {"type": "number"}},
                        },
                    },
                    "extra": {"type": "object", "additionalProperties": {"type": "string"}},
                    "open": {"type": "object", "additionalProperties": True},
                    "anything": {},
                    "flag": {"type": "boolean", "default": False},
                    "nothing": {"type": "array"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "look",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
USER = {"role": "user", "content": "How many circles?"}
ZOOM = {
    "role": "assistant",
    "content": "Zooming.",
    "reasoning_content": "zoom first",
    "tool_calls": [call("zoom", 0, '{"x": 1, "y": 2}')],
}
RESULT = {"role": "tool", "tool_call_id": "functions.zoom:0", "content": "zoomed"}
ANSWER = {"role": "assistant", "content": "Three.", "reasoning_content": "counted"}

CASES = [
    case("text_only", [USER]),
    case("system_and_text", [{"role": "system", "content": "You count shapes."}, USER]),
    case("thinking_off", [USER], thinking=False),
    case("no_generation_prompt", [USER, ANSWER], add_generation_prompt=False),
    case("named_user", [{"role": "user", "name": "alice", "content": "Hi."}]),
    case("a_call_and_its_result", [USER, ZOOM, RESULT]),
    case(
        "two_calls_in_a_turn",
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "both",
                "tool_calls": [call("zoom", 0, '{"x": 1}'), call("crop", 1, '{"box": [1, 2]}')],
            },
            {"role": "tool", "tool_call_id": "functions.zoom:0", "content": "z"},
            {"role": "tool", "tool_call_id": "functions.crop:1", "content": "c"},
        ],
    ),
    case("answer_then_new_question", [USER, ANSWER, {"role": "user", "content": "Sure?"}]),
    case(
        "calls_answer_and_new_question",
        [USER, ZOOM, RESULT, ANSWER, {"role": "user", "content": "And now?"}],
    ),
    case(
        "calls_after_an_answer", [USER, ANSWER, {"role": "user", "content": "Zoom."}, ZOOM, RESULT]
    ),
    case("tools_declared", [USER], tools=TOOLS),
    case("tools_and_a_call", [USER, ZOOM, RESULT], tools=TOOLS),
    case(
        "tools_without_parameters",
        [USER],
        tools=[
            {"type": "function", "function": {"name": "ping"}},
            {"name": "flat", "description": "A bare spec.", "parameters": {"type": "object"}},
            {"type": "retrieval"},
        ],
    ),
    case("one_image", [{"role": "user", "content": [IMAGE, {"type": "text", "text": "Count."}]}]),
    case(
        "several_images_and_system",
        [
            {"role": "system", "content": [{"type": "text", "text": "You compare."}]},
            {"role": "user", "content": [{"type": "text", "text": "Compare"}, IMAGE, IMAGE]},
        ],
    ),
    case(
        "image_in_a_tool_result",
        [
            USER,
            ZOOM,
            {
                "role": "tool",
                "tool_call_id": "functions.zoom:0",
                "content": [IMAGE, {"type": "text", "text": "zoomed"}],
            },
        ],
    ),
]


def main() -> None:
    from renderers.configs import KimiK25RendererConfig
    from renderers.kimi_k25 import KimiK25Renderer
    from transformers import AutoTokenizer

    from vf_mm.testing import build_tiny_vlm

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_vlm(Path(tmp) / "k", "kimi_k25"))
    out = []
    for c in CASES:
        config = KimiK25RendererConfig(thinking=c.get("thinking", True))
        rendered = KimiK25Renderer(tokenizer, config).render(
            c["messages"],
            tools=c.get("tools"),
            add_generation_prompt=c["add_generation_prompt"],
            process_multimodal=False,
        )
        ids = list(rendered.token_ids)
        out.append({**c, "text": tokenizer.decode(ids), "ids": ids})
    import renderers

    payload = {
        "rendered_with": f"renderers {renderers.__version__} (renderers/kimi_k25.py)",
        "cases": out,
    }
    (HERE / "kimi_k25_oracle.json").write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
