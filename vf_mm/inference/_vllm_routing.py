"""``Router``: which of ``VLLMBackend``'s servers each attempt goes to.

The policies and why sessions are never hashed onto servers are in the docstring of
``vf_mm.inference._vllm``; ``Routing`` holds the settings. The router reads and keeps
each server's counters (``Server``), which the backend updates as attempts start, end
and fail. It runs on the event loop only: nothing here is locked.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vf_mm.inference._vllm_config import Routing


@dataclass(slots=True)
class Server:
    """One base URL and its counters (what ``stats`` reports and the router weighs)."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)  # its Authorization, if any
    outstanding: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    down_until: float = 0.0
    sessions: int = 0  # live sessions bound here
    placed_at: int = 0  # when a session was last placed here (the placement count then)


@dataclass(slots=True)
class _Session:
    """Where one session's turns go, and when it last had one (idle sessions expire)."""

    server: int
    last_used: float


class Router:
    """Picks a server per attempt under ``routing``; keeps the sessions of ``"sticky"``."""

    def __init__(self, servers: list[Server], routing: Routing) -> None:
        self.servers = servers
        self.routing = routing
        # by last use, oldest first: expiry pops from the front
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._placements = 0
        self._routed: Counter[str] = Counter()
        self._rr = 0

    @property
    def stats(self) -> dict[str, int | str]:
        """See ``VLLMBackend.routing_stats``."""
        counts = {k: self._routed[k] for k in ("placed", "kept", "shed_load", "shed_failure")}
        return {
            "routing": self.routing.policy,
            **counts,
            "expired": self._routed["expired"],
            "sessions": len(self._sessions),
        }

    def end_session(self, session_id: str) -> None:
        """Forget a session; unknown ids are ignored."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self.servers[entry.server].sessions -= 1

    def touch(self, session_id: str | None) -> None:
        """The session had an answer now: a long generation is not idleness."""
        entry = self._sessions.get(session_id) if session_id else None
        if entry is not None:
            entry.last_used = time.monotonic()

    def pick(self, tried: set[int], session_id: str | None = None) -> int:
        """The server for the next attempt, under the routing policy. Whatever the policy,
        failing servers (in their cooldown) come last, and among the others those this
        request has not tried first."""
        now = time.monotonic()
        policy = self.routing.policy
        if policy == "sticky" and session_id is not None:
            return self._pick_sticky(session_id, tried, now)
        if policy == "round_robin":
            return self._least(tried, now, lambda s: 0)
        return self._least(tried, now, lambda s: s.outstanding)

    def _least(
        self, tried: set[int], now: float, load: Callable[[Server], Any], *, rotate: bool = True
    ) -> int:
        """The server with the least ``load``, failing and tried servers last; ties go
        round-robin (``rotate``) or to the first in order."""
        n = len(self.servers)
        start = 0
        if rotate:
            start = self._rr % n
            self._rr += 1
        best: int | None = None
        best_key: tuple[Any, ...] | None = None
        for k in range(n):
            i = (start + k) % n
            s = self.servers[i]
            key = (s.down_until > now, i in tried, load(s))
            if best_key is None or key < best_key:
                best, best_key = i, key
        assert best is not None
        return best

    def _pick_sticky(self, session_id: str, tried: set[int], now: float) -> int:
        self._expire(now)
        entry = self._sessions.get(session_id)
        if entry is None:
            index = self._place(tried, now)
            self._sessions[session_id] = _Session(index, now)
            self.servers[index].sessions += 1
            self._routed["placed"] += 1
            return index
        self._sessions.move_to_end(session_id)
        entry.last_used = now
        home = self.servers[entry.server]
        if entry.server not in tried and home.down_until <= now:
            target = self._unloaded(entry.server, now)
            if target is None:
                self._routed["kept"] += 1
                return entry.server
            self._routed["shed_load"] += 1
        else:
            target = self._place(tried, now)
            self._routed["shed_failure"] += 1
        home.sessions -= 1
        self.servers[target].sessions += 1
        entry.server = target
        return target

    def _place(self, tried: set[int], now: float) -> int:
        """Where a new (or moving) session goes: fewest live sessions, then fewest requests
        in flight, then the server least recently given a session."""
        index = self._least(
            tried, now, lambda s: (s.sessions, s.outstanding, s.placed_at), rotate=False
        )
        self._placements += 1
        self.servers[index].placed_at = self._placements
        return index

    def _unloaded(self, home: int, now: float) -> int | None:
        """The least-loaded other server when ``home`` is saturated (``shed_margin`` or more
        requests in flight above it), else None."""
        margin = self.routing.shed_margin
        if margin is None:
            return None
        best: Server | None = None
        index = None
        for i, s in enumerate(self.servers):
            if (
                i != home
                and s.down_until <= now
                and (best is None or s.outstanding < best.outstanding)
            ):
                best, index = s, i
        if best is None or best.outstanding > self.servers[home].outstanding - margin:
            return None
        return index

    def _expire(self, now: float) -> None:
        """Forget sessions idle for ``session_idle_s`` (the oldest are first in line)."""
        cutoff = now - self.routing.session_idle_s
        while self._sessions:
            session_id, entry = next(iter(self._sessions.items()))
            if entry.last_used >= cutoff:
                return
            del self._sessions[session_id]
            self.servers[entry.server].sessions -= 1
            self._routed["expired"] += 1
