"""``RendererPool``: renderers for many threads, and the one "is this multimodal" test.

Every caller asks ``is_multimodal(obj)``, which answers for a renderer and for a pool
alike: a check on the renderer's class would say "text" for a pool of vision
renderers, and images would silently stop being carried forward.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Generic, TypeVar

from vf_mm.renderers._parse import ParsedResponse
from vf_mm.renderers._protocol import Renderer, bridge
from vf_mm.types import MultiModalData, RenderedTokens

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=Renderer)

#: bounds on a borrower's wait for a renderer to come back before it builds one (the
#: first build's duration, within these)
MIN_PATIENCE_S = 0.01
MAX_PATIENCE_S = 5.0


class RendererPool(Generic[R]):
    """Up to ``size`` renderers built by ``factory``; ``with pool.renderer() as r:`` borrows one.

    Tokenizers keep per-instance state that is not safe to share across threads while
    encoding; a pool gives each concurrent render its own renderer. The first is built at
    once (so a bad checkpoint fails here); another only when a render has found every
    built one borrowed for as long as building the first took. A build costs about a
    second with a large vocabulary, and most of it (the tokenizer's deserialisation)
    holds the GIL, stalling every thread of the process, the event loop included; so a
    renderer that comes back sooner is the faster answer, and a process whose renders
    are short (one of many rollout workers) builds few or none beyond the first instead
    of one for every render in flight at its start. A pool is itself a
    ``Renderer``: calls made on it (``render``, ``bridge_to_next_turn``,
    ``parse_response``) borrow one for the duration of the call.

    The renderers share one image cache (the first renderer's ``vision.cache``), so an
    image one of them processed is a hit for all: a group of rollouts showing the same
    prompt image processes it once, whichever renderer each rollout borrows. Sharing is
    safe whatever the factory builds: entries are keyed by each renderer's processing
    namespace and image policy (``VisionSpec``), and concurrent misses of one image wait
    for one computation.

    Args:
        factory: Builds one renderer.
        size: The most renderers (the most renders at once).
    """

    def __init__(self, factory: Callable[[], R], size: int = 4) -> None:
        if size < 1:
            raise ValueError("a RendererPool needs at least one renderer")
        self._factory = factory
        self._size = size
        started = time.perf_counter()
        self._all = [factory()]
        #: how long a borrower waits for a renderer to come back before building one
        self._patience = min(max(time.perf_counter() - started, MIN_PATIENCE_S), MAX_PATIENCE_S)
        self._free: queue.SimpleQueue[R] = queue.SimpleQueue()
        self._free.put(self._all[0])
        self._growing = threading.Lock()
        self._reserved = 1  # renderers built or being built

    @property
    def size(self) -> int:
        """The most renderers the pool builds (the most renders at once)."""
        return self._size

    @property
    def renderers(self) -> tuple[R, ...]:
        """The renderers built so far (for reading their counters, not for rendering)."""
        return tuple(self._all)

    @property
    def is_multimodal(self) -> bool:
        return is_multimodal(self._all[0])

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._all[0].stop_token_ids

    @property
    def image_backend(self) -> str | None:
        return getattr(self._all[0], "image_backend", None)

    @contextmanager
    def renderer(self) -> Iterator[R]:
        """Borrow one renderer, for what only a single renderer has (its tokenizer, its vision spec)."""
        try:
            r = self._free.get_nowait()
        except queue.Empty:
            r = self._waited()
        try:
            yield r
        finally:
            self._free.put(r)

    def _waited(self) -> R:
        """A renderer for a borrower that found none free: the first to come back within
        ``_patience``, else a new one (``_grown``), else (at ``size``, or the build
        failed) the first to come back."""
        if self._reserved < self._size:
            with suppress(queue.Empty):
                return self._free.get(timeout=self._patience)
        return self._grown() or self._free.get()

    def _grown(self) -> R | None:
        """A new renderer (sharing the first one's image cache), or None at ``size``.

        A slot is reserved under the lock and the renderer built outside it, so borrowers
        that arrive together build theirs at once instead of one after another. A factory
        that fails stops the growth (logged once): the pool keeps the renderers it has, and
        the borrower waits for one of them."""
        with self._growing:
            if self._reserved >= self._size:
                return None
            self._reserved += 1
        try:
            r = self._factory()
        except Exception:
            logger.exception("a RendererPool could not build another renderer; it keeps %d",
                             len(self._all))  # fmt: skip
            with self._growing:
                self._size = self._reserved = len(self._all)
            return None
        _share_cache([self._all[0], r])
        with self._growing:
            self._all.append(r)
        return r

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedTokens:
        with self.renderer() as r:
            return r.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: Sequence[int],
        previous_completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        previous_multi_modal_data: MultiModalData | None = None,
        previous_messages: Sequence[Mapping[str, Any]] | None = None,
        on_refusal: Callable[[str], object] | None = None,
    ) -> RenderedTokens | None:
        with self.renderer() as r:
            return bridge(
                r,
                previous_prompt_ids,
                previous_completion_ids,
                new_messages,
                tools=tools,
                previous_multi_modal_data=previous_multi_modal_data,
                previous_messages=previous_messages,
                on_refusal=on_refusal,
            )

    def parse_response(self, completion_ids: Sequence[int]) -> ParsedResponse:
        with self.renderer() as r:
            return r.parse_response(completion_ids)

    @property
    def bridge_refusals(self) -> dict[str, int]:
        """Refusal reasons summed over the pool's renderers."""
        total: dict[str, int] = {}
        for r in self._all:
            for reason, n in getattr(r, "bridge_refusals", {}).items():
                total[reason] = total.get(reason, 0) + n
        return total


def _share_cache(renderers: Sequence[object]) -> None:
    """Point every renderer's vision spec at the first one's image cache."""
    specs = [v for v in (getattr(r, "vision", None) for r in renderers) if v is not None]
    caches = [getattr(v, "cache", None) for v in specs]
    shared = next((c for c in caches if c is not None), None)
    if shared is None:
        return
    for spec, cache in zip(specs, caches, strict=True):
        if cache is not None and cache is not shared:
            spec.cache = shared


def is_multimodal(renderer: object) -> bool:
    """True when ``renderer`` (or a pool of them) turns images into tokens.

    Args:
        renderer: A renderer or a ``RendererPool``.
    """
    return bool(getattr(renderer, "is_multimodal", False))
