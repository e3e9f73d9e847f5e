"""LocalBackend keeps each conversation's history between turns: a turn prefills only its
new tokens and runs the vision tower on its new images only, and what comes back is
what a full re-encode gives (greedy ids, logprobs within float tolerance), for every
family, with concurrent rows of different cached lengths sharing forwards. Families
whose cache cannot be resumed re-encode and still answer right. Counters follow vLLM's
prefix-cache meaning; new weights drop every cache."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from PIL import Image

from vf_mm.errors import BackendError
from vf_mm.inference import GenerateRequest, GenerateResult, LocalBackend, SamplingParams
from vf_mm.models import model_inputs
from vf_mm.renderers import load_renderer
from vf_mm.types import MultiModalData, PlaceholderRange

RESUMABLE = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "smolvlm", "llava_onevision", "text"]
FALLBACK = ["gemma3"]  # re-encoded every turn (see LocalBackend's docstring)
GREEDY = SamplingParams(max_tokens=4, temperature=0)


@dataclass
class Prompt:
    ids: list[int]
    data: MultiModalData | None


def image(seed: int) -> Image.Image:
    return Image.fromarray(
        np.random.default_rng(seed).integers(0, 256, (112, 168, 3), dtype=np.uint8)
    )


def clip(seed: int) -> dict:
    frames = np.random.default_rng(seed).integers(0, 256, (4, 56, 56, 3), dtype=np.uint8)
    return {"type": "video", "video": frames, "frame_rate": 2.0}


def user_turn(
    renderer, seeds: list[int], text: str, *, text_first: bool = False, clips: list[int] = ()
) -> Prompt:
    """A rendered user turn with one clip per seed in ``clips``, then one image per seed
    in ``seeds`` (text only for a text model)."""
    if getattr(renderer, "vision", None) is None:
        rendered = renderer.render([{"role": "user", "content": text}])
    else:
        parts = [clip(s) for s in clips] + [{"type": "image", "image": image(s)} for s in seeds]
        words = [{"type": "text", "text": text}]
        content = [*words, *parts] if text_first else [*parts, *words]
        rendered = renderer.render([{"role": "user", "content": content}])
    return Prompt(list(rendered.token_ids), rendered.multi_modal_data)


def extend(prompt: Prompt, completion: list[int], turn: Prompt) -> Prompt:
    """The next turn's prompt as a bridge makes it: the previous prompt, its completion,
    then the new tokens (their images' placeholders shifted after them)."""
    offset = len(prompt.ids) + len(completion)
    parts = [d for d in (prompt.data, turn.data) if d is not None and not d.is_empty]
    if not parts:
        return Prompt(prompt.ids + completion + turn.ids, None)
    hashes: dict[str, list[str]] = {}
    ranges: dict[str, list[PlaceholderRange]] = {}
    items: dict[str, list[dict]] = {}
    for data, shift in ((prompt.data, 0), (turn.data, offset)):
        if data is None:
            continue
        for m in data.modalities:
            hashes.setdefault(m, []).extend(data.mm_hashes[m])
            items.setdefault(m, []).extend(data.mm_items[m])
            ranges.setdefault(m, []).extend(
                PlaceholderRange(r.offset + shift, r.length, r.is_embed)
                for r in data.mm_placeholders[m]
            )
    return Prompt(prompt.ids + completion + turn.ids, MultiModalData(hashes, ranges, items))


async def conversation(backend, renderer, index: int, turns: int, *, clips: bool = False) -> list[tuple[Prompt, GenerateResult]]:  # fmt: skip
    """Conversation ``index``: ``index + 1`` images in its first turn (so concurrent
    conversations have different cached lengths at every turn), one image a turn after
    (``clips``: and a clip before it)."""
    prompt = user_turn(renderer, [100 * index + i for i in range(index + 1)], "x " * (3 * index))
    out = []
    for t in range(turns):
        result = await backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data))
        out.append((prompt, result))
        seed = 1000 * index + t
        turn = user_turn(renderer, [seed], f"turn {t}", clips=[seed + 7] if clips else [])
        prompt = extend(prompt, result.completion_ids, turn)
    return out


def run_conversations(path, *, conversations=3, turns=3, clips=False, **kwargs):
    renderer = load_renderer(path)

    async def main():
        backend = LocalBackend(path, batch_window_ms=30, **kwargs)
        try:
            results = await asyncio.gather(
                *(conversation(backend, renderer, i, turns, clips=clips)
                  for i in range(conversations))
            )  # fmt: skip
            return backend, results
        finally:
            await backend.aclose()

    return asyncio.run(main())


def full_forward_logprobs(backend: LocalBackend, prompt: Prompt, completion: list[int]) -> list[float]:  # fmt: skip
    """The completion's logprobs from one forward over the whole sequence, images and
    all: the full re-encode, computed without the backend."""
    ids = torch.tensor([prompt.ids + completion])
    inputs: dict = {"input_ids": ids}
    data = prompt.data
    if data is not None and not data.is_empty:
        inputs.update(
            model_inputs(
                backend.family,
                ids,
                data.mm_items.get("image", []),
                image_token_ids=[backend.image_token_id],
                dtype=backend.model.dtype,
                videos=data.mm_items.get("video", []),
                video_token_ids=[backend.video_token_id] if data.num_items("video") else [],
                order=[m for m, _, _ in data.all_placeholders()],
            )
        )
    inputs = {k: v.to(backend.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}  # fmt: skip
    with torch.no_grad():
        logits = backend.model(**inputs).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    n = len(prompt.ids)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("kv_pool", [True, False], ids=["pool", "batch"])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "glm46v"])
def test_clips_beside_images_give_what_a_full_forward_gives(checkpoints, family, kv_pool):
    """Concurrent conversations adding a clip and an image every turn, through either
    engine: GLM-4.6V's clips hold the image's token and go in as images, one per temporal
    group, sharing forwards with other rows' images; the logprobs are one full forward's."""
    backend, conversations = run_conversations(checkpoints(family), kv_pool=kv_pool, clips=True)
    assert backend.engine == ("pool" if kv_pool else "batch")
    for conversation in conversations:
        assert conversation[-1][0].data.num_items("video") == 2
        for prompt, result in conversation:
            reference = full_forward_logprobs(backend, prompt, result.completion_ids)
            assert result.logprobs == pytest.approx(reference, abs=1e-4)


@pytest.mark.parametrize("family", RESUMABLE + FALLBACK)
def test_history_gives_what_a_full_re_encode_gives(checkpoints, family):
    path = checkpoints(family)
    cached, with_cache = run_conversations(path)
    fresh, without_cache = run_conversations(path, prefix_cache=False)
    assert cached.resumable == (family in RESUMABLE)
    for conv_on, conv_off in zip(with_cache, without_cache, strict=True):
        for (prompt, on), (_, off) in zip(conv_on, conv_off, strict=True):
            assert on.completion_ids == off.completion_ids
            assert on.logprobs == pytest.approx(off.logprobs, abs=1e-4)
            reference = full_forward_logprobs(cached, prompt, on.completion_ids)
            assert on.logprobs == pytest.approx(reference, abs=1e-4)
    if family in RESUMABLE:
        # every later turn found its history cached: the previous prompt and completion
        # but the completion's last token (sampled, never fed)
        history = sum(len(p.ids) + len(r.completion_ids) - 1 for conv in with_cache for p, r in conv[:-1])  # fmt: skip
        assert cached.prefix_cache_hits >= history > 0
    else:
        assert cached.prefix_cache_hits == 0
    assert fresh.prefix_cache_queries == fresh.prefix_cache_hits == 0


def test_counters_count_prompt_tokens_looked_up_and_found(checkpoints):
    path = checkpoints("qwen2_5_vl")
    backend, (conv,) = run_conversations(path, conversations=1, turns=3)
    assert backend.prefix_cache_queries == sum(len(p.ids) for p, _ in conv)
    # turn k reuses turn k-1's prompt and completion but the completion's last token,
    # which was sampled, never fed
    expected = sum(len(p.ids) + len(r.completion_ids) - 1 for p, r in conv[:-1])
    assert backend.prefix_cache_hits == expected


def test_equal_ids_with_other_images_share_nothing_past_the_image(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    a = user_turn(renderer, [1], "same text")
    b = user_turn(renderer, [2], "same text")
    assert a.ids == b.ids and a.data.mm_hashes != b.data.mm_hashes
    first_image = a.data.mm_placeholders["image"][0].offset

    async def main(cache: bool):
        backend = LocalBackend(path, prefix_cache=cache)
        try:
            await backend.generate(GenerateRequest(a.ids, GREEDY, a.data))
            hits = backend.prefix_cache_hits
            out = await backend.generate(GenerateRequest(b.ids, GREEDY, b.data))
            return out, backend.prefix_cache_hits - hits
        finally:
            await backend.aclose()

    cached, reused = asyncio.run(main(True))
    fresh, _ = asyncio.run(main(False))
    assert reused <= first_image
    assert cached.completion_ids == fresh.completion_ids
    assert cached.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)


def test_the_vision_tower_runs_on_new_images_only(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    images_encoded: list[int] = []

    async def main():
        backend = LocalBackend(path)
        encode = backend.model.model.get_image_features

        def counting(pixel_values, image_grid_thw, **kwargs):
            images_encoded.append(len(image_grid_thw))
            return encode(pixel_values, image_grid_thw, **kwargs)

        backend.model.model.get_image_features = counting
        try:
            results = await conversation(backend, renderer, 2, 3)  # 3 images, then 1 a turn
            # another conversation showing the same three images after other tokens (so
            # no cached prefix covers them): their tower outputs are cached too
            again = user_turn(renderer, [200, 201, 202], "other words", text_first=True)
            await backend.generate(GenerateRequest(again.ids, GREEDY, again.data))
            return results, backend
        finally:
            await backend.aclose()

    _, backend = asyncio.run(main())
    assert images_encoded == [3, 1, 1]
    assert backend.vision_cache_hits == 3


def test_rows_of_different_lengths_share_forwards(checkpoints):
    path = checkpoints("qwen2_5_vl")
    backend, results = run_conversations(path, conversations=4, turns=2)
    # 4 conversations x 2 turns, started in fewer admissions than requests
    assert backend.batches_run < 8
    assert all(len(r.completion_ids) == 4 for conv in results for _, r in conv)


def test_new_weights_drop_every_cache(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    prompt = user_turn(renderer, [5], "hello")

    async def main():
        backend = LocalBackend(path)
        try:
            first = await backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data))
            state = {
                k: torch.randn_like(v) if v.dtype.is_floating_point else v
                for k, v in backend.model.state_dict().items()
            }
            backend.load_weights(state)
            hits, vision_hits = backend.prefix_cache_hits, backend.vision_cache_hits
            nxt = extend(prompt, first.completion_ids, user_turn(renderer, [6], "more"))
            after = await backend.generate(GenerateRequest(nxt.ids, GREEDY, nxt.data))
            reference = full_forward_logprobs(backend, nxt, after.completion_ids)
            return backend, hits, vision_hits, after, reference
        finally:
            await backend.aclose()

    backend, hits, vision_hits, after, reference = asyncio.run(main())
    assert backend.prefix_cache_hits == hits  # nothing reused across the swap
    assert backend.vision_cache_hits == vision_hits
    assert after.logprobs == pytest.approx(reference, abs=1e-4)


def test_the_cache_stays_within_its_byte_budget(checkpoints):
    path = checkpoints("qwen2_5_vl")
    budget = 200_000  # a few entries of the tiny model (about 1 KiB a token)
    backend, results = run_conversations(path, conversations=3, turns=3, prefix_cache_bytes=budget)
    assert 0 < backend.prefix_cache_bytes <= budget
    _, reference = run_conversations(path, conversations=3, turns=3, prefix_cache=False)
    for conv, ref in zip(results, reference, strict=True):
        assert [r.completion_ids for _, r in conv] == [r.completion_ids for _, r in ref]


def test_a_request_joins_rows_already_decoding(checkpoints):
    """A short request sent while a long one decodes is answered before the long one."""
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    long = user_turn(renderer, [7], "a long answer")
    short = user_turn(renderer, [8], "a short one")

    async def main():
        backend = LocalBackend(path, batch_window_ms=0)
        try:
            slow = asyncio.create_task(
                backend.generate(
                    GenerateRequest(
                        long.ids, SamplingParams(max_tokens=400, temperature=0), long.data
                    )
                )
            )
            while backend.running_rows == 0:
                await asyncio.sleep(0.001)
            quick = await backend.generate(GenerateRequest(short.ids, GREEDY, short.data))
            still_running = not slow.done()
            return quick, still_running, await slow, backend.batches_run
        finally:
            await backend.aclose()

    quick, still_running, slow, admissions = asyncio.run(main())
    assert len(slow.completion_ids) == 400  # it ran to its length, after the short one
    assert still_running and admissions == 2
    assert len(quick.completion_ids) == 4


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "smolvlm", "llava_onevision"])
def test_clips_in_the_history_are_exact(checkpoints, family):
    """A clip (its own M-RoPE positions over time) in the first turn and in a later one."""
    path = checkpoints(family)
    renderer = load_renderer(path)

    async def main(cache: bool):
        backend = LocalBackend(path, prefix_cache=cache)
        out = []
        try:
            prompt = user_turn(renderer, [1], "what moves?", clips=[2])
            for t, turn in enumerate([([3], []), ([], [4]), ([5], [])]):
                result = await backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data))
                out.append((prompt, result, full_forward_logprobs(backend, prompt, result.completion_ids)))  # fmt: skip
                images, clips = turn
                prompt = extend(prompt, result.completion_ids, user_turn(renderer, images, f"t{t}", clips=clips))  # fmt: skip
            return out, backend.prefix_cache_hits
        finally:
            await backend.aclose()

    cached, hits = asyncio.run(main(True))
    fresh, _ = asyncio.run(main(False))
    assert hits > 0
    for (_, on, reference), (_, off, _) in zip(cached, fresh, strict=True):
        assert on.completion_ids == off.completion_ids
        assert on.logprobs == pytest.approx(reference, abs=1e-4)


@pytest.mark.parametrize("length", [31, 32, 33])  # a prompt ending on, before and after a block
def test_the_same_prompt_again_computes_its_last_token_only(checkpoints, length):
    path = checkpoints("text")

    async def main():
        backend = LocalBackend(path)
        try:
            prompt = list(range(1, length + 1))
            first = await backend.generate(GenerateRequest(prompt, GREEDY))
            hits = backend.prefix_cache_hits
            again = await backend.generate(GenerateRequest(prompt, GREEDY))
            return first, again, backend.prefix_cache_hits - hits
        finally:
            await backend.aclose()

    first, again, reused = asyncio.run(main())
    assert reused == length - 1
    assert again.completion_ids == first.completion_ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-5)


def test_a_recurrent_state_is_reused_whole_or_not_at_all(checkpoints):
    """Qwen3.5's linear-attention layers keep one state per sequence: a prompt that
    extends a finished request reuses all of it; one that stops short of it reuses none
    (a state cannot be cut back), and both answer as a full re-encode does."""
    path = checkpoints("qwen3_5")
    renderer = load_renderer(path)
    first = user_turn(renderer, [1], "hello there")

    async def main():
        backend = LocalBackend(path)
        try:
            out = await backend.generate(GenerateRequest(first.ids, GREEDY, first.data))
            short = Prompt(first.ids + out.completion_ids[:1], first.data)
            hits = backend.prefix_cache_hits
            cut = await backend.generate(GenerateRequest(short.ids, GREEDY, short.data))
            cut_hits = backend.prefix_cache_hits - hits
            longer = extend(first, out.completion_ids, user_turn(renderer, [2], "more"))
            hits = backend.prefix_cache_hits
            whole = await backend.generate(GenerateRequest(longer.ids, GREEDY, longer.data))
            whole_hits = backend.prefix_cache_hits - hits
            checks = [
                (cut, full_forward_logprobs(backend, short, cut.completion_ids)),
                (whole, full_forward_logprobs(backend, longer, whole.completion_ids)),
            ]
            return out, cut_hits, whole_hits, checks
        finally:
            await backend.aclose()

    out, cut_hits, whole_hits, checks = asyncio.run(main())
    assert cut_hits == 0
    # at least the first request's state (the second one's, greedy, went on to the same
    # tokens and covers one more)
    assert whole_hits >= len(first.ids) + len(out.completion_ids) - 1
    for result, reference in checks:
        assert result.logprobs == pytest.approx(reference, abs=1e-4)


def test_a_failed_forward_fails_its_rows_and_the_backend_goes_on(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    prompt = user_turn(renderer, [3], "hi")

    async def main():
        backend = LocalBackend(path)
        forward = backend.model.forward
        calls = {"n": 0}

        def failing_once(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # the first decode step
                raise RuntimeError("out of memory, say")
            return forward(*args, **kwargs)

        backend.model.forward = failing_once
        try:
            failed = await asyncio.gather(
                backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data)),
                return_exceptions=True,
            )
            after = await backend.generate(GenerateRequest(prompt.ids, GREEDY, prompt.data))
            return failed[0], after
        finally:
            await backend.aclose()

    failed, after = asyncio.run(main())
    assert isinstance(failed, BackendError) and "out of memory, say" in str(failed)
    assert len(after.completion_ids) == 4


def test_what_is_kept_holds_no_autograd_history(checkpoints):
    """A cached state is plain tensors: an autograd graph behind them would keep every
    step's activations alive for as long as the entry lives."""
    path = checkpoints("qwen2_5_vl")
    backend, _ = run_conversations(path, conversations=2, turns=2)
    entries = [backend._prefix._lru.peek(key) for key in backend._prefix._lru]
    assert entries
    for entry in entries:
        for keys, values in entry.state.layers:
            assert keys.grad_fn is None and not keys.requires_grad
            assert values.grad_fn is None and not values.requires_grad


def test_clear_cache_forgets_the_history(checkpoints):
    path = checkpoints("text")

    async def main():
        backend = LocalBackend(path)
        try:
            prompt = list(range(1, 40))
            first = await backend.generate(GenerateRequest(prompt, GREEDY))
            backend.clear_cache()
            again = await backend.generate(GenerateRequest(prompt, GREEDY))
            return first, again, backend
        finally:
            await backend.aclose()

    first, again, backend = asyncio.run(main())
    assert backend.prefix_cache_hits == 0 and backend.prefix_cache_bytes > 0  # again's entry
    assert again.completion_ids == first.completion_ids
