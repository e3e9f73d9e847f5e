"""``RowBuilder``: a queued request made a row, and the same row when its CPU work was
done ahead (``prepare``, while the request was held).

A prepared row must be the row admission would build: same prefix match, same
positions, counted once. The positions are reused only while the prefix cache still
gives the match they were computed for; a row admitted in between may have dropped the
entry, and then they are computed again."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from vf_mm.errors import BackendError
from vf_mm.inference import GenerateRequest, SamplingParams
from vf_mm.inference._local_model import LocalModel, request_media
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._prefix_cache import PrefixCache
from vf_mm.inference._row_builder import RowBuilder
from vf_mm.inference._rows import Pending, Row
from vf_mm.inference._sampling import Seeds
from vf_mm.renderers import load_renderer


def picture(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def model(tiny_vlm_checkpoint) -> LocalModel:
    return LocalModel.from_pretrained(tiny_vlm_checkpoint)


@pytest.fixture(scope="module")
def turns(tiny_vlm_checkpoint) -> tuple[GenerateRequest, GenerateRequest]:
    """Turn 1 (an image and a question) and turn 2 (turn 1, an answer, a new image): the
    first is a prefix of the second, as in a rollout."""
    renderer = load_renderer(tiny_vlm_checkpoint)
    first = [{"role": "user", "content": [{"type": "image", "image": picture(0)},
                                          {"type": "text", "text": "Where is the goal?"}]}]  # fmt: skip
    second = [*first, {"role": "assistant", "content": "Left."},
              {"role": "user", "content": [{"type": "image", "image": picture(1)},
                                           {"type": "text", "text": "And now?"}]}]  # fmt: skip
    requests = []
    for messages in (first, second):
        rendered = renderer.render(messages)
        requests.append(
            GenerateRequest(
                prompt_ids=list(rendered.token_ids),
                multi_modal_data=rendered.multi_modal_data,
                sampling=SamplingParams(max_tokens=4, temperature=0, seed=7),
            )
        )
    return requests[0], requests[1]


class Built:
    """A builder over a prefix cache holding turn 1's prompt, with its counters and a
    count of the positions computed."""

    def __init__(
        self, model: LocalModel, first: GenerateRequest, monkeypatch, *, state: object = None
    ) -> None:
        self.stats = LocalStats()
        self.cache = PrefixCache(1 << 20)
        self.builder = RowBuilder(
            model, self.cache, stats=self.stats, seeds=Seeds(0, model.device),
            prefix_cache=True, generators=False,
        )  # fmt: skip
        prompt = list(first.prompt_ids)
        media = request_media(first)
        _, _, reach = model.positions(prompt, media, 0)
        self.cache.insert(prompt, [span for span, _, _ in media], state, 1, reach=reach)
        self.positions_computed = 0
        computed = model.positions

        def counting(*args, **kwargs):
            self.positions_computed += 1
            return computed(*args, **kwargs)

        monkeypatch.setattr(model, "positions", counting)


def pending(request: GenerateRequest, loop: asyncio.AbstractEventLoop) -> Pending:
    return Pending(request, loop.create_future(), loop)


def same(a: Row, b: Row) -> None:
    assert a.match.entry is b.match.entry and a.match.length == b.match.length
    assert torch.equal(a.positions, b.positions)
    assert a.delta == b.delta
    assert np.array_equal(a.reach, b.reach)
    assert a.media == b.media and a.spans == b.spans and a.prompt == b.prompt


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_a_prepared_row_is_the_row_admission_builds_and_computes_no_positions_again(
    model, turns, loop, monkeypatch
):
    first, second = turns
    built = Built(model, first, monkeypatch)
    fresh = built.builder.row(pending(second, loop))
    assert fresh is not None and fresh.match.length > 0  # turn 1's prompt is reused
    counted = (built.stats.prefix_cache_queries, built.stats.prefix_cache_hits)

    held = pending(second, loop)
    built.builder.prepare(held)
    computed = built.positions_computed
    assert (built.stats.prefix_cache_queries, built.stats.prefix_cache_hits) == counted
    row = built.builder.row(held)
    assert row is not None
    same(row, fresh)
    assert built.positions_computed == computed  # admission reused the prepared ones
    # counted at admission, once, as the row built without preparing
    assert built.stats.prefix_cache_queries == 2 * counted[0]
    assert built.stats.prefix_cache_hits == 2 * counted[1]


def test_a_prepared_row_whose_entry_was_dropped_meanwhile_is_computed_again(
    model, turns, loop, monkeypatch
):
    first, second = turns
    built = Built(model, first, monkeypatch)
    held = pending(second, loop)
    built.builder.prepare(held)
    assert held.prepared is not None and held.prepared.match.entry is not None
    entry = held.prepared.match.entry
    built.cache.drop(entry)  # a row admitted before it replaced or evicted the entry
    computed = built.positions_computed
    row = built.builder.row(held)
    assert row is not None
    assert built.positions_computed == computed + 1
    assert row.match.entry is None and row.match.length == 0
    # what a builder with nothing cached makes of the request
    empty = RowBuilder(model, PrefixCache(1 << 20), stats=LocalStats(),
                       seeds=Seeds(0, model.device), prefix_cache=True, generators=False)  # fmt: skip
    fresh = empty.row(pending(second, loop))
    assert fresh is not None
    same(row, fresh)


def test_a_running_row_keeps_no_entry_the_cache_dropped_while_it_was_held(
    model, turns, loop, monkeypatch
):
    """The prepared match is used once: a row admitted after its entry left the cache
    does not keep that entry's state (the batch engine's KV tensors) alive."""

    class State:  # stands for an entry's KV tensors
        pass

    first, second = turns
    state = State()
    gone = weakref.ref(state)
    built = Built(model, first, monkeypatch, state=state)
    del state
    held = pending(second, loop)
    built.builder.prepare(held)
    assert held.prepared is not None and held.prepared.match.entry is not None
    built.cache.drop(held.prepared.match.entry)
    row = built.builder.row(held)
    assert row is not None and row.match.entry is None and row.pending is held
    gc.collect()
    assert gone() is None


def test_a_request_that_cannot_run_is_answered_once_at_admission_not_while_prepared(
    model, turns, loop, monkeypatch
):
    first, second = turns
    built = Built(model, first, monkeypatch)

    def broken(*args, **kwargs):
        raise ValueError("a grid that does not match its placeholder")

    monkeypatch.setattr(model, "positions", broken)
    held = pending(second, loop)
    built.builder.prepare(held)
    loop.run_until_complete(asyncio.sleep(0))
    assert held.prepared is None and not held.future.done()
    assert built.builder.row(held) is None
    loop.run_until_complete(asyncio.sleep(0))
    with pytest.raises(BackendError, match="does not match its placeholder"):
        held.future.result()


def test_an_answered_request_is_not_prepared(model, turns, loop, monkeypatch):
    first, second = turns
    built = Built(model, first, monkeypatch)
    held = pending(second, loop)
    held.future.cancel()
    built.builder.prepare(held)
    assert held.prepared is None and built.positions_computed == 0
