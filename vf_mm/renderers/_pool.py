"""``RendererPool``: renderers for many threads, and the one "is this multimodal" test.

A peer checked ``isinstance(renderer, MultimodalRenderer)`` on a pool and so silently
stopped carrying images forward; here every caller asks ``is_multimodal(obj)``,
which answers for a renderer and for a pool alike.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RendererPool:
    """``size`` renderers built by ``factory``; ``with pool.renderer() as r:`` borrows one.

    Tokenizers keep per-instance state that is not safe to share across threads while
    encoding; a pool gives each concurrent render its own renderer. Calls made on the
    pool itself (``render``, ``bridge_to_next_turn``, ``parse_response``) borrow one for
    the duration of the call.
    """

    def __init__(self, factory: Callable[[], Any], size: int = 4) -> None:
        if size < 1:
            raise ValueError("a RendererPool needs at least one renderer")
        self._all = [factory() for _ in range(size)]
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for r in self._all:
            self._free.put(r)

    @property
    def size(self) -> int:
        return len(self._all)

    @property
    def renderers(self) -> tuple[Any, ...]:
        """Every renderer of the pool (for reading their counters, not for rendering)."""
        return tuple(self._all)

    @property
    def is_multimodal(self) -> bool:
        return is_multimodal(self._all[0])

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._all[0].stop_token_ids

    @contextmanager
    def renderer(self) -> Iterator[Any]:
        r = self._free.get()
        try:
            yield r
        finally:
            self._free.put(r)

    def render(self, *args: Any, **kwargs: Any) -> Any:
        with self.renderer() as r:
            return r.render(*args, **kwargs)

    def bridge_to_next_turn(self, *args: Any, **kwargs: Any) -> Any:
        with self.renderer() as r:
            return r.bridge_to_next_turn(*args, **kwargs)

    def try_bridge(self, *args: Any, **kwargs: Any) -> Any:
        with self.renderer() as r:
            return r.try_bridge(*args, **kwargs)

    def parse_response(self, *args: Any, **kwargs: Any) -> Any:
        with self.renderer() as r:
            return r.parse_response(*args, **kwargs)

    @property
    def bridge_refusals(self) -> dict[str, int]:
        """Refusal reasons summed over the pool's renderers."""
        total: dict[str, int] = {}
        for r in self._all:
            for reason, n in r.bridge_refusals.items():
                total[reason] = total.get(reason, 0) + n
        return total


def is_multimodal(renderer: Any) -> bool:
    """True when ``renderer`` (or a pool of them) turns images into tokens."""
    return bool(getattr(renderer, "is_multimodal", False))
