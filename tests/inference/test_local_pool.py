"""The pool engine (``LocalBackend(kv_pool=True)``, the default on a CUDA device in half
precision): one preallocated KV arena for every running and cached sequence, prefills
packed into one token stream, decode steps from fixed buffers with the next step
launched before the last is read. On CPU it runs with per-sequence attention (the same
bookkeeping the GPU runs, CUDA graphs and FlashAttention aside) and must answer exactly
as a full re-encode does, for every family it serves. Memory is bounded by
``kv_pool_bytes``: a request that cannot fit waits for room, one that never can fails
alone with ``BackendOutOfMemoryError``."""

from __future__ import annotations

import asyncio

import pytest

from tests.inference.test_local_history import (
    GREEDY,
    extend,
    full_forward_logprobs,
    run_conversations,
    user_turn,
)
from vf_mm.errors import BackendError, BackendOutOfMemoryError
from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams
from vf_mm.inference._arena import GRAIN, KVArena
from vf_mm.renderers import load_renderer

POOL = {"kv_pool": True, "kv_pool_bytes": 4 << 20}
# the tiny LM's KV: 2 layers x keys and values x 2 heads x 32 dims x float32
TEXT_TOKEN_BYTES = 2 * 2 * 2 * 32 * 4
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm", "llava_onevision", "text"]


def ask(backend: LocalBackend, prompts, params):
    """Every prompt at once (``params``: one SamplingParams each, or one for all)."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    return asyncio.gather(
        *(
            backend.generate(GenerateRequest(p.ids, s, p.data))
            for p, s in zip(prompts, params, strict=True)
        ),
        return_exceptions=True,
    )


def serve(path, coroutine_factory, **kwargs):
    """Run ``coroutine_factory(backend)`` against a fresh backend; returns its result and
    the backend (closed)."""

    async def main():
        backend = LocalBackend(path, **kwargs)
        try:
            return await coroutine_factory(backend), backend
        finally:
            await backend.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pool_engine_answers_as_a_full_re_encode(checkpoints, family):
    path = checkpoints(family)
    backend, conversations = run_conversations(path, conversations=3, turns=3, **POOL)
    assert backend.engine == "pool"
    for conversation in conversations:
        for prompt, result in conversation:
            reference = full_forward_logprobs(backend, prompt, result.completion_ids)
            assert result.logprobs == pytest.approx(reference, abs=1e-4)
    # every later turn found its history cached: the previous prompt and completion but
    # the completion's last token (sampled, never fed)
    history = sum(len(p.ids) + len(r.completion_ids) - 1 for c in conversations for p, r in c[:-1])  # fmt: skip
    assert backend.prefix_cache_hits >= history > 0


def test_rows_leave_and_join_while_others_decode(checkpoints):
    """Requests of different lengths share steps: each leaves when done, the step after
    has fewer rows (one launched before the last was read feeds tokens by their index in
    that last step), and every request gets what it gets alone."""
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    prompts = [user_turn(renderer, [i], f"prompt {i} " * i) for i in range(5)]
    lengths = [2, 11, 5, 1, 8]
    params = [SamplingParams(max_tokens=n, temperature=0) for n in lengths]

    together, _ = serve(path, lambda b: ask(b, prompts, params), batch_window_ms=50, **POOL)
    for prompt, param, result in zip(prompts, params, together, strict=True):
        (alone,), _ = serve(path, lambda b, p=prompt, s=param: ask(b, [p], s), **POOL)
        assert result.completion_ids == alone.completion_ids
        assert len(result.completion_ids) == param.max_tokens
        assert result.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_a_seeded_request_repeats_whatever_shares_its_steps(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    mine = user_turn(renderer, [1], "mine")
    others = [user_turn(renderer, [i], f"other {i}") for i in range(2, 5)]
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    hot = SamplingParams(max_tokens=6, temperature=1.0)

    (alone,), _ = serve(path, lambda b: ask(b, [mine], seeded), **POOL)
    crowd, _ = serve(path, lambda b: ask(b, [mine, *others], [seeded] + [hot] * 3), **POOL)
    assert crowd[0].completion_ids == alone.completion_ids
    assert crowd[0].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_a_request_larger_than_the_pool_fails_alone(checkpoints):
    path = checkpoints("text")
    small = {"kv_pool": True, "kv_pool_bytes": 64 * TEXT_TOKEN_BYTES}

    async def go(backend):
        capacity = backend._pool.arena.capacity
        short = GenerateRequest(list(range(1, 20)), GREEDY)
        long = GenerateRequest(list(range(1, 20)), SamplingParams(max_tokens=capacity))
        results = await asyncio.gather(
            backend.generate(long), backend.generate(short), return_exceptions=True
        )
        after = await backend.generate(short)
        return capacity, results, after

    (capacity, (failed, served), after), _ = serve(path, go, **small)
    assert isinstance(failed, BackendOutOfMemoryError)
    assert failed.available == capacity and failed.needed == 19 + capacity
    assert "kv_pool_bytes" in str(failed)
    assert len(served.completion_ids) == len(after.completion_ids) == GREEDY.max_tokens


def test_requests_wait_for_room_in_the_pool(checkpoints):
    """A pool that holds one request at a time serves several sent together, one after
    another, each as it would alone."""
    path = checkpoints("text")
    prompts = [list(range(1 + i, 60 + i)) for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0)

    async def go(backend, prompts):
        requests = [backend.generate(GenerateRequest(p, params)) for p in prompts]
        return await asyncio.gather(*requests)

    one = (60 + 8 + GRAIN) * TEXT_TOKEN_BYTES  # room for one request's range, not two
    together, _ = serve(path, lambda b: go(b, prompts), kv_pool=True, kv_pool_bytes=one)
    for prompt, result in zip(prompts, together, strict=True):
        (alone,), _ = serve(path, lambda b, p=prompt: go(b, [p]), **POOL)
        assert result.completion_ids == alone.completion_ids


def test_cache_entries_give_their_ranges_back(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)

    async def go(backend):
        arena = backend._pool.arena
        prompt = user_turn(renderer, [1], "hello")
        first = await backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data))
        held = arena.capacity - arena.free_tokens  # the first turn's entry
        nxt = extend(prompt, first.completion_ids, user_turn(renderer, [2], "again"))
        await backend.generate(GenerateRequest(nxt.ids, GREEDY, nxt.data))
        entries = len(backend._prefix)
        backend.clear_cache()
        return held, entries, arena.free_tokens, arena.capacity

    (held, entries, free, capacity), _ = serve(path, go, **POOL)
    assert held > 0
    assert entries == 1  # the second turn's entry replaced the first
    assert free == capacity


@pytest.mark.parametrize("family", ["gemma3", "qwen3_5", "kimi_k25"])
def test_families_the_pool_cannot_run_refuse_it(checkpoints, family):
    with pytest.raises(BackendError, match="kv_pool"):
        LocalBackend(checkpoints(family), kv_pool=True)


def test_the_cpu_default_is_the_batch_engine(checkpoints):
    backend = LocalBackend(checkpoints("text"))
    try:
        assert backend.engine == "batch" and backend._pool is None
    finally:
        asyncio.run(backend.aclose())


def test_the_arena_gives_ranges_first_fit_and_merges_what_comes_back():
    import torch

    arena = KVArena(layers=1, kv_heads=1, head_dim=2, capacity=10 * GRAIN, dtype=torch.float32, device="cpu")  # fmt: skip
    a = arena.alloc(GRAIN)
    b = arena.alloc(3 * GRAIN - 5)  # rounded up to whole grains
    c = arena.alloc(GRAIN)
    assert (a, b, c) == (0, GRAIN, 4 * GRAIN)
    assert arena.alloc(6 * GRAIN) is None  # 5 grains left
    arena.free(b, 3 * GRAIN - 5)
    arena.free(a, GRAIN)
    assert arena.largest_free == 5 * GRAIN  # a and b merged, c still between
    arena.free(c, GRAIN)
    assert arena.largest_free == arena.free_tokens == 10 * GRAIN
    with pytest.raises(ValueError, match="freed twice"):
        arena.free(a, GRAIN)
    d = arena.alloc(4 * GRAIN)
    arena.shrink(d, 4 * GRAIN, GRAIN + 1)  # keeps two grains
    assert arena.free_tokens == 8 * GRAIN
    arena.storage[0, 0, d : d + 2] = 1.0
    e = arena.alloc(2 * GRAIN)
    arena.copy(d, e, 2)
    assert bool((arena.storage[0, 0, e : e + 2] == 1.0).all())


def test_a_forward_out_of_gpu_memory_fails_its_rows_and_the_backend_goes_on(checkpoints):
    import torch

    path = checkpoints("text")
    prompt = list(range(1, 30))

    async def go(backend):
        forward = backend.model.forward
        calls = {"n": 0}

        def failing_once(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # the first decode step
                raise torch.OutOfMemoryError("CUDA out of memory, say")
            return forward(*args, **kwargs)

        backend.model.forward = failing_once
        failed = await asyncio.gather(
            backend.generate(GenerateRequest(prompt, GREEDY)), return_exceptions=True
        )
        after = await backend.generate(GenerateRequest(prompt, GREEDY))
        return failed[0], after, backend._pool.arena.free_tokens, backend._pool.arena.capacity

    (failed, after, free, capacity), _ = serve(path, go, **POOL)
    assert isinstance(failed, BackendOutOfMemoryError) and "kv_pool_bytes" in str(failed)
    assert len(after.completion_ids) == GREEDY.max_tokens
    assert free < capacity  # the second request's entry; the failed one's range came back


def test_a_requests_banned_ids_hold_for_it_alone_in_the_pool_engine(checkpoints):
    """A request's ``banned_token_ids`` (beyond the backend's own) are never sampled,
    prefill or decode, while a neighbour in the same steps samples as it would alone."""
    path = checkpoints("text")
    prompt = list(range(1, 25))
    greedy = SamplingParams(max_tokens=6, temperature=0)

    async def go(backend):
        free = await backend.generate(GenerateRequest(prompt, greedy))
        banned = tuple(sorted(set(free.completion_ids)))
        both = await asyncio.gather(
            backend.generate(GenerateRequest(prompt, greedy, banned_token_ids=banned)),
            backend.generate(GenerateRequest(prompt, greedy)),
        )
        return free, banned, both

    (free, banned, (held, other)), _ = serve(path, go, batch_window_ms=50, **POOL)
    assert not set(held.completion_ids) & set(banned)
    assert other.completion_ids == free.completion_ids
    assert held.logprobs[0] < free.logprobs[0]  # the raw logprob of a lesser token
