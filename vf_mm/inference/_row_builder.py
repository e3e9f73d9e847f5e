"""A queued request made ready to run: the same for both engines of the local backend.

``RowBuilder.row`` gives a request its images (``request_media``), the longest prefix
the ``PrefixCache`` holds for it (counted into ``prefix_cache_queries`` /
``prefix_cache_hits``, vLLM's meaning), the positions of its uncached tokens, its seed
and stop ids. A request that cannot run is answered there, alone, and never reaches a
forward. The pool engine may put a row back to wait for room (``uncount``: its lookup
did not happen) or run it without its cached prefix (``unmatch``).

``prepare`` does that CPU work ahead, for a request held while rows decode: the worker
runs it while the device computes a step, so admission only repeats the lookup (cheap)
and places the row. The positions (M-RoPE's ``get_rope_index``, ~1 ms a row) are reused
only when the lookup at admission gives the same entry and length, since a row admitted
in between may have replaced or evicted the entry: a row is the same whether it was
prepared or not, and the counts are taken at admission, once. The prepared work is taken
by the first admission (a row that waits for room is built afresh next time): its match
holds its entry, whose state must not stay alive beside the row after the cache let it go.
"""

from __future__ import annotations

import numpy as np
import torch

from vf_mm.inference._local_model import LocalModel, Media, request_media
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._prefix_cache import Match, PrefixCache
from vf_mm.inference._rows import Pending, Prepared, Row, answer
from vf_mm.inference._sampling import Seeds


class RowBuilder:
    """Rows of ``model`` from queued requests. ``prefix_cache`` False: every prompt is
    encoded whole (nothing looked up). ``generators``: give each row its own
    ``torch.Generator`` (the batch engine; the pool engine draws noise from the seed)."""

    def __init__(
        self,
        model: LocalModel,
        prefix: PrefixCache,
        *,
        stats: LocalStats,
        seeds: Seeds,
        prefix_cache: bool,
        generators: bool,
    ) -> None:
        self._model = model
        self._prefix = prefix
        self._stats = stats
        self._seeds = seeds
        self._lookup = prefix_cache
        self._generators = generators

    def prepare(self, pending: Pending) -> None:
        """Do ``row``'s CPU work for ``pending`` ahead (kept on it as ``prepared``),
        counting nothing (its lookup only marks the entry recently used, as the one at
        admission will). A request that cannot run is left as it is: ``row`` meets the
        same error at admission and answers it there."""
        if pending.future.done():
            return
        request = pending.request
        try:
            media = request_media(request)
            prompt = list(request.prompt_ids)
            match = Match(None, 0)
            if self._lookup:
                spans = tuple(span for span, _, _ in media)
                match = self._prefix.lookup(prompt, spans, limit=len(prompt) - 1)
            positions, delta, reach = self._positions(prompt, media, match)
        except Exception:  # answered by ``row``, with the error it raises there
            return
        pending.prepared = Prepared(media, match, positions, delta, reach)

    def row(self, pending: Pending) -> Row | None:
        """A request made ready to run: its images, its cached prefix, its positions
        (``prepared``'s where its match still holds). A request that cannot run is
        answered here, alone (None then, as for one cancelled)."""
        if pending.future.cancelled():
            return None
        request = pending.request
        model = self._model
        # used once: a prepared match holds its entry, whose state (the batch engine's KV
        # tensors) must not outlive the cache's own hold on it for as long as the row runs
        prepared, pending.prepared = pending.prepared, None
        try:
            media = prepared.media if prepared is not None else request_media(request)
            spans = tuple(span for span, _, _ in media)
            prompt = list(request.prompt_ids)
            match = Match(None, 0)
            if self._lookup:
                match = self._prefix.lookup(prompt, spans, limit=len(prompt) - 1)
                self._stats.prefix_cache_queries += len(prompt)
                self._stats.prefix_cache_hits += match.length
            if (
                prepared is not None
                and prepared.match.entry is match.entry
                and prepared.match.length == match.length
            ):
                positions, delta, reach = prepared.positions, prepared.delta, prepared.reach
            else:
                positions, delta, reach = self._positions(prompt, media, match)
            params = request.sampling
            seed = self._seeds.seed(params)
            return Row(
                pending=pending,
                prompt=prompt,
                spans=spans,
                media=media,
                match=match,
                positions=positions,
                delta=delta,
                reach=reach,
                sampling=params,
                seed=seed,
                generator=self._seeds.generator(seed) if self._generators else None,
                stop_ids=model.eos_token_ids | set(params.stop_token_ids),
                banned=model.extra_bans(request),
            )
        except Exception as exc:
            answer(pending, model.failure(exc))
            return None

    def _positions(
        self, prompt: list[int], media: list[Media], match: Match
    ) -> tuple[torch.Tensor, int, np.ndarray | None]:
        """The positions of ``prompt``'s tokens after ``match`` (continuing its entry's
        ``reach``), their text offset and the prompt's reach (``LocalModel.positions``)."""
        reach = match.entry.reach if match.entry is not None else None
        return self._model.positions(prompt, media, match.length, reach)

    def uncount(self, row: Row) -> None:
        """Undo ``row``'s prefix-cache counts: it goes back to wait, and is looked up
        again when it is admitted."""
        if self._lookup:
            self._stats.prefix_cache_queries -= len(row.prompt)
            self._stats.prefix_cache_hits -= row.cached

    def unmatch(self, row: Row) -> None:
        """Run ``row`` without its cached prefix (the caller dropped the entry): its hits
        uncounted, its whole prompt new, its positions from the start."""
        self._stats.prefix_cache_hits -= row.cached
        row.match = Match(None, 0)
        row.positions, row.delta, row.reach = self._positions(row.prompt, row.media, row.match)
