"""``ScriptedChatBackend``: a message-level backend for tests, scripted replies, zero latency."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from vf_mm.inference import ChatResult, SamplingParams, Usage


class ScriptedChatBackend:
    """A message-level ``ChatBackend`` answering with scripted text (no token ids).

    ``calls`` keeps every ``(messages, sampling, tools)`` asked, for assertions.

    Args:
        replies: Used in turn, cycling.
        name: The backend's name.
    """

    def __init__(self, replies: Sequence[str], *, name: str = "scripted-chat") -> None:
        self.name = name
        self._replies = itertools.cycle(list(replies))
        self.calls: list[Any] = []

    async def chat(
        self, messages: Any, sampling: SamplingParams, *, tools: Any = None
    ) -> ChatResult:
        """The next scripted reply, as a ``ChatResult``; the call is kept in ``calls``.

        Args:
            messages: The conversation.
            sampling: The call's sampling.
            tools: Tool schemas.
        """
        self.calls.append((messages, sampling, tools))
        return ChatResult(
            message={"role": "assistant", "content": next(self._replies)},
            finish_reason="stop",
            usage=Usage(prompt_tokens=0, completion_tokens=0),
        )

    async def aclose(self) -> None:
        return None
