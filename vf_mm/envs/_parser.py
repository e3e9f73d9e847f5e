"""Parsers: pull the answer out of a completion.

``Parser.parse_answer(completion)`` is what reward functions usually call: the text of
the last assistant message, cleaned by ``parse``. ``XMLParser`` reads tagged fields
(``<answer>...</answer>``); ``ThinkParser`` drops a ``<think>...</think>`` block first.
Parsers never raise on model output: a missing field is None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vf_mm.types import Messages, text_of


class Parser:
    """The identity parser: the answer is the last assistant message's text, stripped."""

    def parse(self, text: str) -> Any:
        """The answer in one message's text: here, the text stripped.

        Args:
            text: A message's text.
        """
        return text.strip()

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The parsed last assistant message, or None when there is none.

        Args:
            completion: The completion messages, or one text (parsed as is).
        """
        if isinstance(completion, str):
            return self.parse(completion)
        for message in reversed(completion):
            if message.get("role") == "assistant":
                return self.parse(text_of(message))
        return None

    def format_reward(self, completion: Messages) -> float:
        """1.0 when the last assistant message parses to a non-empty answer.

        Args:
            completion: The rollout's completion messages.
        """
        answer = self.parse_answer(completion)
        return 1.0 if answer not in (None, "") else 0.0


class XMLParser(Parser):
    """Reads ``<field>...</field>`` blocks.

    ``parse`` returns a dict of every field found (the last occurrence wins, as a model
    that corrects itself means its final answer).

    Args:
        fields: The tags to read.
        answer_field: The field ``parse_answer`` returns.
    """

    def __init__(
        self, fields: Sequence[str] = ("answer",), *, answer_field: str = "answer"
    ) -> None:
        self.fields = tuple(fields)
        self.answer_field = answer_field
        self._patterns = {
            f: re.compile(rf"<{re.escape(f)}>\s*(.*?)\s*</{re.escape(f)}>", re.DOTALL)
            for f in self.fields
        }

    def parse(self, text: str) -> dict[str, str | None]:
        """Each field's text (its last occurrence), None for a field not found.

        Args:
            text: A message's text.
        """
        out: dict[str, str | None] = {}
        for field, pattern in self._patterns.items():
            found = pattern.findall(text)
            out[field] = found[-1] if found else None
        return out

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The ``answer_field`` of the last assistant message, or None.

        Args:
            completion: The completion messages, or one text.
        """
        if isinstance(completion, str):
            return self.parse(completion).get(self.answer_field)
        for message in reversed(completion):
            if message.get("role") == "assistant":
                value = self.parse(text_of(message)).get(self.answer_field)
                if value is not None:
                    return value
        return None

    def format_reward(self, completion: Messages) -> float:
        """Share of assistant messages that contain every field exactly once.

        Turns that only call tools are not answers, and do not count.

        Args:
            completion: The rollout's completion messages.
        """
        assistant = [
            m for m in completion if m.get("role") == "assistant" and not _only_tool_calls(m)
        ]
        if not assistant:
            return 0.0
        good = sum(
            all(len(p.findall(text_of(m))) == 1 for p in self._patterns.values()) for m in assistant
        )
        return good / len(assistant)


class ThinkParser(Parser):
    """Drops reasoning, then applies ``inner`` to what follows.

    Reasoning is ``<think>...</think>``, or everything before a lone ``</think>``.

    Args:
        inner: The parser for what follows (default: ``Parser()``, which strips).
    """

    def __init__(self, inner: Parser | None = None) -> None:
        self.inner = inner or Parser()

    def parse(self, text: str) -> Any:
        """``inner``'s parse of what follows the last ``</think>`` (of all of it when none).

        Args:
            text: A message's text.
        """
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        return self.inner.parse(text)


_TOOL_CALL_TEXT = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def _only_tool_calls(message: Mapping[str, Any]) -> bool:
    """A turn that only calls tools: tool calls, and no text besides them (templates that
    do not render ``tool_calls`` keep the ``<tool_call>`` blocks in the content)."""
    return bool(message.get("tool_calls")) and not _TOOL_CALL_TEXT.sub("", text_of(message)).strip()
