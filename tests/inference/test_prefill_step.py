"""A prefill's text stack from fixed buffers (``PrefillStep``, replayed as a CUDA graph on
the GPU; the same padded path runs eagerly here): the model's forward embeds, runs the
vision tower and scatters its features eagerly, and its decoder's call is answered over
buffers padded up to a token bucket. The padding is one more sequence on the arena's
scratch slot, so what comes back equals the unpadded forward, every slot the rows own
holds the same keys and values, and no other slot is written. A decoder call with inputs
the buffers do not hold runs eagerly, unchanged."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from tests.inference.test_local_history import (
    GREEDY,
    full_forward_logprobs,
    run_conversations,
    user_turn,
)
from vf_mm.inference import GenerateRequest, LocalBackend
from vf_mm.inference._packed import _attention_per_sequence
from vf_mm.renderers import load_renderer

POOL = {"kv_pool": True, "kv_pool_bytes": 4 << 20}


@pytest.mark.parametrize(
    ("family", "every_prefill"),
    [
        ("qwen2_5_vl", True),  # inputs_embeds, M-RoPE positions
        ("llava_onevision", True),  # passes its head's logits_to_keep on to the decoder
        ("text", True),  # a decoder that embeds its input_ids itself
        ("qwen3_vl", True),  # deepstack features: added from dense buffers
        ("qwen3_vl_moe", False),  # its router flag: eager (experts picked by nonzero)
    ],
)
def test_prefills_from_fixed_buffers_answer_as_a_full_re_encode(checkpoints, family, every_prefill):
    path = checkpoints(family)
    backend, conversations = run_conversations(
        path, conversations=2, turns=2, prefill_graph_tokens=4096, **POOL
    )
    for conversation in conversations:
        for prompt, result in conversation:
            reference = full_forward_logprobs(backend, prompt, result.completion_ids)
            assert result.logprobs == pytest.approx(reference, abs=1e-4)
    replayed = backend._pool.describe()["prefills_replayed"]
    assert replayed == backend.prefills_run if every_prefill else replayed == 0
    assert backend._pool.describe()["prefill_graphs_refused"] is None


def test_padding_writes_only_the_rows_own_slots_and_scratch(checkpoints):
    """The same requests, padded and not: every arena slot but the scratch one holds the
    same keys and values afterwards (slots nobody owns stay zero), and so do the answers."""
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    prompts = [user_turn(renderer, [i], f"prompt {i} " * i) for i in range(1, 4)]

    async def run(tokens):
        backend = LocalBackend(path, prefill_graph_tokens=tokens, batch_window_ms=50, **POOL)
        try:
            results = await asyncio.gather(
                *(backend.generate(GenerateRequest(p.ids, GREEDY, p.data)) for p in prompts)
            )
            arena = backend._pool.arena
            return results, arena.storage[:, :, : arena.scratch].clone(), backend
        finally:
            await backend.aclose()

    padded, kept, backend = asyncio.run(run(4096))
    eager, reference, _ = asyncio.run(run(0))
    assert backend._pool.describe()["prefills_replayed"] == backend.prefills_run == 1
    for a, b in zip(padded, eager, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    torch.testing.assert_close(kept, reference, atol=1e-5, rtol=1e-5)
    assert torch.equal(kept == 0, reference == 0)  # the same slots written


def test_a_prefill_over_the_largest_bucket_runs_eagerly(checkpoints):
    path = checkpoints("text")
    long = list(range(1, 300))  # over prefill_graph_tokens=256

    async def run():
        backend = LocalBackend(path, prefill_graph_tokens=256, **POOL)
        try:
            result = await backend.generate(GenerateRequest(long, GREEDY))
            short = await backend.generate(GenerateRequest(long[:100], GREEDY))
            return backend, result, short
        finally:
            await backend.aclose()

    backend, result, short = asyncio.run(run())
    assert backend.prefills_run == 2
    assert backend._pool.describe()["prefills_replayed"] == 1  # the short one
    assert len(result.completion_ids) == len(short.completion_ids) == GREEDY.max_tokens


def test_the_decoder_is_its_own_again_after_a_prefill_even_a_failed_one(checkpoints):
    path = checkpoints("text")

    async def run():
        backend = LocalBackend(path, prefill_graph_tokens=4096, **POOL)
        try:
            prefiller = backend._pool.prefiller
            decoder = prefiller.decoder
            with (
                pytest.raises(RuntimeError, match="boom"),
                prefiller.installed(starts=[0], cached=[0], new=[3]),
            ):
                assert "forward" in vars(decoder)
                raise RuntimeError("boom")
            await backend.generate(GenerateRequest([1, 2, 3], GREEDY))
            return decoder
        finally:
            await backend.aclose()

    decoder = asyncio.run(run())
    assert "forward" not in vars(decoder)  # the class's forward answers other callers


def test_a_padding_query_that_sees_no_key_gets_zeros_as_from_flashattention():
    """The reference attention's rule for padding: a sequence of more new tokens than its
    length (padding over one scratch slot) gives its first queries nothing to see."""
    q = torch.randn(5, 2, 4)
    store = torch.randn(2, 8, 2, 4)
    # one real sequence of 2 new tokens at slots 0..1, then 3 padding tokens on slot 7
    out = _attention_per_sequence(q, store, ([0, 2, 5, 5], [0, 7, 7], [2, 1, 1]), None)
    assert torch.equal(out[2:4], torch.zeros_like(out[2:4]))
    last = torch.nn.functional.scaled_dot_product_attention(
        q[4:5].transpose(0, 1)[None], store[0, 7:8].transpose(0, 1)[None],
        store[1, 7:8].transpose(0, 1)[None],
    )[0].transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(out[4:5], last)
    assert torch.isfinite(out).all()


def test_only_the_installing_threads_call_of_the_streams_length_is_answered(checkpoints):
    """Every thread sees the decoder's instance ``forward`` while a prefill is installed:
    a call from another thread (another caller of the model), or one of another length,
    runs the class's forward (under packed attention without its step: an error), never
    over the buffers, so it cannot write the installed rows' arena slots."""
    backend = LocalBackend(checkpoints("text"), prefill_graph_tokens=4096, **POOL)
    pool = backend._pool
    prefiller, arena = pool.prefiller, pool.arena

    def call(tokens: int) -> BaseException | None:
        try:
            prefiller.decoder(
                input_ids=torch.arange(1, tokens + 1)[None],
                position_ids=torch.arange(tokens)[None],
                use_cache=False,
            )
        except RuntimeError as exc:
            return exc
        return None

    try:
        with torch.no_grad(), pool.packed.packed(), prefiller.installed(starts=[0], cached=[0], new=[3]):  # fmt: skip
            errors: list[BaseException | None] = []
            thread = threading.Thread(target=lambda: errors.append(call(3)))
            thread.start()
            thread.join()
            errors.append(call(5))  # this thread, another length
        assert all(e is not None and "without its step" in str(e) for e in errors), errors
        assert prefiller.replays == 0
        assert not arena.storage.any()  # no slot written
    finally:
        asyncio.run(backend.aclose())


def test_a_call_that_found_the_installed_forward_after_the_block_runs_the_class_forward(
    checkpoints,
):
    """Another thread's ``decoder(...)`` may look up ``forward`` while a prefill is
    installed and call it after the block ended (``nn.Module.__call__`` resolves it first):
    that call runs the class's forward, the model's own attention, as any call outside a
    prefill does, never an error about the prefill that is gone."""
    backend = LocalBackend(checkpoints("text"), prefill_graph_tokens=4096, **POOL)
    prefiller = backend._pool.prefiller
    decoder = prefiller.decoder
    ids, positions = torch.arange(1, 6)[None], torch.arange(5)[None]
    try:
        with prefiller.installed(starts=[0], cached=[0], new=[3]):
            resolved = decoder.forward  # the instance's, as another thread found it
        got: list[object] = []

        def call() -> None:
            try:
                with torch.no_grad():
                    got.append(resolved(input_ids=ids, position_ids=positions, use_cache=False))
            except Exception as exc:  # reported below, not lost in the thread
                got.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        with torch.no_grad():
            own = type(decoder).forward(decoder, input_ids=ids, position_ids=positions, use_cache=False)  # fmt: skip
        (answer,) = got
        assert not isinstance(answer, Exception), repr(answer)
        torch.testing.assert_close(answer.last_hidden_state, own.last_hidden_state)
        assert prefiller.replays == 0
    finally:
        asyncio.run(backend.aclose())


def test_every_tensor_a_graph_reads_is_one_fixed_buffer_refilled_in_place(checkpoints):
    """A CUDA graph replays the addresses it captured: the step's metadata, the ids or
    embeddings and the positions a prefill's decoder reads must be the same storage at
    every prefill (refilled, never re-created), or a replay would read the first one's.
    The GPU is not here; the addresses are."""
    path = checkpoints("text")
    seen: list[tuple[int, ...]] = []

    async def run():
        backend = LocalBackend(path, prefill_graph_tokens=4096, **POOL)
        prefiller = backend._pool.prefiller
        own = prefiller._run

        def spy(step, bucket, kind):
            fed = prefiller._ids if kind == "ids" else prefiller._embeds
            tensors = (step.write, step.cu_q, step.starts, step.lengths, fed, prefiller._positions)  # fmt: skip
            seen.append(tuple(t.data_ptr() for t in tensors))
            return own(step, bucket, kind)

        prefiller._run = spy
        try:
            for prompt in ([1, 2, 3], list(range(1, 40)), [5, 6]):
                await backend.generate(GenerateRequest(prompt, GREEDY))
        finally:
            await backend.aclose()

    asyncio.run(run())
    assert len(seen) == 3 and len(set(seen)) == 1, seen


@pytest.mark.parametrize("given", [-1, True, 2.5, "4096"])
def test_a_prefill_graph_size_that_is_not_a_count_is_refused_before_loading(given):
    """A negative, a bool or a non-int would otherwise read as "no prefill graphs"."""
    with pytest.raises(ValueError, match=r"prefill_graph_tokens=.*an int >= 0"):
        LocalBackend("/nonexistent", prefill_graph_tokens=given)


def test_a_forward_set_on_the_decoder_before_a_prefill_is_put_back_after(checkpoints):
    """A hook's own ``forward`` on the decoder instance (accelerate sets one) outlives the
    prefill's block: the block takes the attribute over and gives it back."""
    backend = LocalBackend(checkpoints("text"), prefill_graph_tokens=4096, **POOL)
    prefiller = backend._pool.prefiller
    decoder = prefiller.decoder

    def hooked(*args, **kwargs):
        return type(decoder).forward(decoder, *args, **kwargs)

    decoder.forward = hooked
    try:
        with prefiller.installed(starts=[0], cached=[0], new=[3]):
            assert decoder.forward == prefiller._forward
        assert decoder.forward is hooked
    finally:
        del decoder.forward
        asyncio.run(backend.aclose())
