"""``Recorder``: OpenAI-style chat calls, grouped into sessions, each recorded as a trajectory.

Agent code written against the OpenAI SDK calls ``/v1/chat/completions`` with the whole
conversation every time. The recorder turns each call of a session into one model turn
through a ``RendererClient``: the call's messages are the prompt, the session's earlier
steps are the trajectory, so the client bridges onto the previous turn's exact tokens
(images carried forward) whenever the new prompt extends it, and renders whole when it
does not (a branch, an edited history). Each turn is appended to the session as a
``TrajectoryStep`` holding the exact prompt and completion ids, logprobs and images.

What a client sends back is not byte for byte what it received: the OpenAI SDK adds
keys set to None (``refusal``, ``audio``, ...) to an assistant message it echoes. Before
the turn, each message of the prompt that matches the session's recorded message at the
same place (equal once None-valued keys are set aside) is replaced by the recorded one,
so the client sees its own history and bridges; a message that differs in anything
else is kept as sent, and the turn is rendered whole.

Sessions are isolated: a turn sees only its own session's steps, and a session has an
``owner`` (on a server with API keys, the key's tag): the same id under two owners is two
sessions, and one owner can neither list, end nor extend another's. A session ends when
``end`` is called, or after ``idle_s`` without a call (``sweep``); ``on_end`` then gets
the ``RecordedSession`` (results directory, trainer stream: the caller decides). Calls
of one session run one at a time, in arrival order.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vf_mm.types import Messages, RolloutOutput, TrajectoryStep


@dataclass(slots=True)
class RecordedSession:
    """One session's recording: its steps in call order, and what it was called.

    Attributes:
        session_id: The session's id.
        owner: Who may see it: an API key's tag on a server with keys.
        steps: One step per model call, in call order.
        started: When it started (``time.time()``).
        last_call: When its last call came (``time.monotonic()``).
        index: How many earlier sessions of this id ended before it.
    """

    session_id: str
    owner: str | None = None  # who may see it: an API key's tag on a server with keys
    steps: list[TrajectoryStep] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    last_call: float = field(default_factory=time.monotonic)
    index: int = 0  # how many earlier sessions of this id ended before it

    @property
    def name(self) -> str:
        """The session's name in results: its id, prefixed by its owner's tag if any."""
        return self.session_id if self.owner is None else f"{self.owner}/{self.session_id}"

    @property
    def messages(self) -> Messages:
        """The last call's prompt and the reply it got: the conversation so far."""
        if not self.steps:
            return []
        last = self.steps[-1]
        return [*last.prompt, *last.completion]

    def as_rollout(self) -> RolloutOutput:
        """The session as a rollout (``example_id`` its id; no reward: a recording scores
        nothing): the first call's prompt, and the last call's conversation after what it
        shares with that prompt as the completion.

        A session whose calls extend each other is one conversation, and that is all of
        it. An agent that branched or compacted its history (a later call's prompt is not
        the previous call's conversation continued) has no single conversation: the row
        shows the last branch, and ``info["branched_at_calls"]`` lists the calls that
        started a new one, so nobody reads the row as the whole session (every call's
        tokens are in the trajectory, and in the groups file)."""
        if not self.steps:
            return RolloutOutput(example_id=self.name, prompt=[], completion=[])
        prompt = self.steps[0].prompt
        last = self.messages
        shared = 0
        while shared < min(len(prompt), len(last)) and _equivalent(prompt[shared], last[shared]):
            shared += 1
        branched = [
            i for i in range(1, len(self.steps)) if not _continues(self.steps[i - 1], self.steps[i])
        ]
        return RolloutOutput(
            example_id=self.name,
            prompt=list(prompt),
            completion=list(last[shared:]),
            info={"branched_at_calls": branched} if branched else {},
            trajectory=list(self.steps),
            timing={"total_s": time.time() - self.started},
        )


def _continues(previous: TrajectoryStep, step: TrajectoryStep) -> bool:
    """Whether ``step``'s prompt is ``previous``'s conversation continued."""
    before = [*previous.prompt, *previous.completion]
    return len(step.prompt) >= len(before) and all(
        _equivalent(a, b) for a, b in zip(before, step.prompt, strict=False)
    )


class Recorder:
    """Sessions of chat calls through ``client``.

    Args:
        client: A token-level ``RendererClient``.
        idle_s: A session without a call for this long ends at the next ``sweep``.
        on_end: ``on_end(session)``, called (awaited if async) with each session that
            ends.
        recorded: How many sessions of each name (``RecordedSession.name``) were recorded
            before (a recording that resumes into the same directory), so a reused id's next
            session gets the next index.
    """

    def __init__(
        self,
        client: Any,
        *,
        idle_s: float = 600.0,
        on_end: Callable[[RecordedSession], Awaitable[None] | None] | None = None,
        recorded: Mapping[str, int] | None = None,
    ) -> None:
        if not getattr(client, "token_level", False):
            raise ValueError(
                "a Recorder needs a token-level RendererClient (a Backend that returns token "
                "ids, with a renderer): a chat API gives no tokens to record"
            )
        self.client = client
        self.idle_s = idle_s
        self.on_end = on_end
        self._sessions: dict[tuple[str | None, str], RecordedSession] = {}
        self._locks: dict[tuple[str | None, str], asyncio.Lock] = {}
        # calls holding or waiting for each key's lock: its lock goes once none is left
        self._callers: dict[tuple[str | None, str], int] = {}
        # session id -> sessions of that id ended so far
        self._ended: dict[str, int] = dict(recorded or {})

    @property
    def sessions(self) -> dict[str, RecordedSession]:
        """The open sessions without an owner, by id (a new mapping)."""
        return self.sessions_of(None)

    def sessions_of(self, owner: str | None) -> dict[str, RecordedSession]:
        """``owner``'s open sessions, by id (a new mapping).

        Args:
            owner: An owner's tag (None: sessions without one).
        """
        return {sid: s for (who, sid), s in self._sessions.items() if who == owner}

    async def turn(
        self,
        session_id: str,
        messages: Messages,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        sampling: Any = None,
        owner: str | None = None,
        max_prompt_tokens: int | None = None,
    ) -> Any:
        """One model turn of ``session_id``, recorded as the session's next step.

        A call that fails (a prompt over ``max_prompt_tokens``, an image that does not load, a
        backend error) records nothing: the session gets no step, and a session is opened only
        by its first call that succeeds, so no session is ever empty (an empty one would reach
        a trainer as a group with nothing to train on).

        Args:
            session_id: The session's id.
            messages: The conversation.
            tools: Tool schemas.
            sampling: The call's sampling.
            owner: The session's owner's tag.
            max_prompt_tokens: A rendered prompt longer than this is refused.

        Returns:
            The ``ModelTurn`` (its ``message`` is the reply to return).
        """
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("a session id is a non-empty string")
        key = (owner, session_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._callers[key] = self._callers.get(key, 0) + 1
        try:
            async with lock:
                session = self._sessions.get(key)
                started = time.time()
                prompt = _with_recorded_history(messages, session.messages if session else [])
                turn = await self.client.generate(
                    prompt, trajectory=session.steps if session else [], tools=tools,
                    sampling=sampling, session_id=session_id, max_prompt_tokens=max_prompt_tokens,
                )  # fmt: skip
                if session is None:
                    session = RecordedSession(session_id, owner=owner, started=started)
                    session.index = self._ended.get(session.name, 0)
                    self._sessions[key] = session
                session.steps.append(turn.step(prompt))
                session.last_call = time.monotonic()
                return turn
        finally:
            self._callers[key] -= 1
            if not self._callers[key]:  # nobody else waits on this key's lock
                del self._callers[key]
                if key not in self._sessions and self._locks.get(key) is lock:
                    del self._locks[key]  # a refused first call leaves nothing behind

    async def end(self, session_id: str, *, owner: str | None = None) -> RecordedSession | None:
        """End ``owner``'s ``session_id`` and hand it to ``on_end``; None if none is open.

        A later call with the same id starts a new session (``index`` + 1).

        Args:
            session_id: The session's id.
            owner: Its owner's tag.
        """
        key = (owner, session_id)
        lock = self._locks.get(key)
        if lock is None:
            return None
        async with lock:
            session = self._sessions.pop(key, None)
            self._locks.pop(key, None)
            if session is None:
                return None
            self._ended[session.name] = session.index + 1
        end_session = getattr(self.client, "end_session", None)
        if end_session is not None:
            end_session(session_id)
        if self.on_end is not None:
            result = self.on_end(session)
            if inspect.isawaitable(result):
                await result
        return session

    async def sweep(self) -> list[RecordedSession]:
        """End every session idle for ``idle_s`` or more; returns them."""
        now = time.monotonic()
        idle = [key for key, s in self._sessions.items() if now - s.last_call >= self.idle_s]
        ended = [await self.end(sid, owner=owner) for owner, sid in idle]
        return [s for s in ended if s is not None]

    async def aclose(self) -> list[RecordedSession]:
        """End every open session (a server shutting down records what it holds)."""
        ended = [await self.end(sid, owner=owner) for owner, sid in list(self._sessions)]
        return [s for s in ended if s is not None]


def _present(message: Mapping[str, Any]) -> set[Any]:
    return {k for k, v in message.items() if v is not None and not (k == "content" and v == "")}


def _with_recorded_history(messages: Messages, recorded: Messages) -> Messages:
    """``messages`` with each leading message that matches ``recorded`` at its place
    replaced by the recorded one (so the client recognises its own history)."""
    out = list(messages)
    for i, (sent, kept) in enumerate(zip(messages, recorded, strict=False)):
        if not _equivalent(sent, kept):
            break
        out[i] = kept
    return out


def _equivalent(a: Any, b: Any) -> bool:
    """Equal once keys whose value is None are set aside (recursively), and an empty
    ``content`` counts as none: the OpenAI SDK echoes an assistant message with
    ``refusal: None`` and friends added, and clients turn an empty reply's ``""`` into
    None (verifiers does)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys_a, keys_b = _present(a), _present(b)
        return keys_a == keys_b and all(_equivalent(a[k], b[k]) for k in keys_a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equivalent(x, y) for x, y in zip(a, b, strict=True))
    if a is b:
        return True
    if isinstance(a, (str, int, float, bool, bytes)) and isinstance(b, type(a)):
        return a == b
    return False
