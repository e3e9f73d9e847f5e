"""``LocalBackend``: an in-process transformers model that batches concurrent requests and
keeps each conversation's history between turns.

The embedded default backend, the CPU development backend, and what ``vf-mm serve``
exposes. Requests are queued from the event loop to one worker thread (the model
never runs on the loop). Each row keeps its own sampling rules, seed and stop tokens
(``_sampling``), image and vision tokens are never sampled, and each row's raw
log-probabilities come back with its tokens.

**Two engines** run the same rows (``engine`` says which). On a CUDA device with a
half-precision model the **pool engine** (``_pool``): every sequence's keys and values
in one preallocated arena (``kv_pool_bytes``), prefills as one packed token stream with
varlen FlashAttention, decode steps replayed as CUDA graphs, sampling on the device.
Elsewhere (and with ``kv_pool=False``) the **batch engine** below: padded KV tensors per
running batch (``_kv.BatchKV``), what the CPU runs and the CPU tests check. Both give
what a full re-encode gives (greedy ids; logprobs within float tolerance, bf16's on a
GPU).

**Continuous batching.** When idle, the worker takes the first waiting request and
whatever else arrives within ``batch_window_ms`` (up to ``max_batch``); while rows are
decoding, requests that arrive join the running batch (after two decode steps' wait,
so that requests arriving close together share one prefill forward), and a row that
finishes leaves it and is answered at once. Each step is one forward over every
running row. ``clear_cache`` and ``load_weights`` wait for the running rows and hold
new ones back meanwhile.

**Prefix caching.** A multi-turn rollout sends turn N's prompt as turn N-1's prompt,
its completion and the new messages (the renderer bridges), so almost all of a prompt
was computed the turn before. When a request finishes, its KV tensors (prompt and
completion) go into a ``PrefixCache`` keyed by token ids and image hashes; a new
request reuses the longest cached prefix and prefills only the rest, running the
vision tower only on images in that rest (whose outputs are cached by image too). The
backend never needs to know which rollout a request belongs to. Rows with different
cached lengths share one forward: each row's KV is padded into one tensor and masked
(``_kv.BatchKV``); positions are passed per token, for the Qwen-VL families the
model's own M-RoPE positions over the whole prompt (``get_rope_index`` with every
image's grid), so a cached prefix and a full re-encode see the same positions.
Greedy results (ids, and logprobs within float tolerance) are those of a full
re-encode. ``prefix_cache=False`` re-encodes every prompt whole (for comparison).
``prefix_cache_queries`` / ``prefix_cache_hits`` count prompt tokens looked up and
found cached (vLLM's counters of the same names).

**Qwen3.5** (Gated DeltaNet linear-attention layers beside full attention): a linear
layer keeps a recurrent state per row, not per token, so a cached entry stands for its
whole length only (a prompt reuses it when it extends all of it, as every bridged turn
does), rows are prefilled one per forward (a pad fed through the recurrence would
change the state), and decode together.

Families that run through Hugging Face ``generate`` instead (re-encoding every
prompt, batched per window, no prefix cache): **Gemma 3** (its attention over an
image's tokens is bidirectional and built from the token types of one forward's
input, and half its layers use a sliding window, which a padded batch of rows with
different lengths would misplace), and any model with sliding-window layers.

``load_weights`` swaps weights in place between batches (a trainer pushing a new
policy): no request ever sees two versions, no cache outlives the weights it was
computed with, and ``weights_version`` counts swaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vf_mm.errors import BackendError, BackendOutOfMemoryError
from vf_mm.inference._kv import LINEAR_STATES, BatchKV
from vf_mm.inference._packed import PackedModel, flash_available
from vf_mm.inference._pool import PoolEngine
from vf_mm.inference._prefix_cache import ByteLRU, Match, MediaSpan, PrefixCache
from vf_mm.inference._rows import Pending as _Pending
from vf_mm.inference._rows import Row as _Row
from vf_mm.inference._rows import answer as _answer
from vf_mm.inference._rows import result as _result
from vf_mm.inference._sampling import RowSampler, RowStopper, sample_rows
from vf_mm.inference._types import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Usage,
    check_prompt_length,
)

_GIB = 1 << 30
# most tokens (pads included) one prefill forward takes: bounds a prefill's activations
_PREFILL_TOKENS = 8192
# families whose image attention is not causal: their cache is never reused
_NOT_RESUMABLE = ("gemma3", "gemma4")  # Gemma 4: its 26B and 31B, bidirectional over images


class LocalBackend:
    """Serve a transformers model in-process. ``model`` is a checkpoint directory (any
    ``build_tiny_vlm`` / ``build_tiny_lm`` output, or a real Qwen-VL / causal LM).

    Prompts arrive as token ids with their images' ``pixel_values`` / ``image_grid_thw``
    in ``multi_modal_data`` (as a ``vf_mm`` renderer produces them).

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...; ``dtype``: the weights' dtype
    (default float32). ``prefix_cache``: keep history between requests (module
    docstring); ``prefix_cache_bytes`` bounds the KV entries kept (default: the KV pool
    on a GPU, 2 GiB on CPU) and ``vision_cache_bytes`` the vision tower's outputs kept
    (default: an eighth of that).

    ``kv_pool``: run the pool engine (module docstring); None (default) runs it on a
    CUDA device in bfloat16 / float16, True asks for it anywhere (on CPU with exact,
    slow per-sequence attention) and is an error for a family it cannot run.
    ``kv_pool_bytes``: the arena's size, all the KV memory the engine ever holds
    (default 60% of the GPU memory free after loading; 256 MiB elsewhere): a request
    waits for room, and one that cannot fit at all fails alone
    (``BackendOutOfMemoryError``). ``cuda_graphs``: capture decode steps as CUDA graphs
    (the pool engine on CUDA).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        batch_window_ms: float = 5.0,
        max_batch: int = 32,
        max_model_len: int | None = None,
        seed: int = 0,
        prefix_cache: bool = True,
        prefix_cache_bytes: int | None = None,
        vision_cache_bytes: int | None = None,
        kv_pool: bool | None = None,
        kv_pool_bytes: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        from vf_mm.models import VISION_FAMILIES, family_info, model_class, model_type

        self.path = Path(model)
        self.name = f"local:{self.path.name}"
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no tqdm bars inside vf-mm's own progress display
        family = model_type(self.path)
        if family in VISION_FAMILIES:
            self.model = model_class(family).from_pretrained(
                self.path, dtype=dtype or torch.float32
            )
        else:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=dtype or torch.float32
            )
        self.model.to(device).eval()
        self.device = torch.device(device)
        config = self.model.config
        text_config = config.get_text_config(decoder=True)
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self.is_multimodal = family in VISION_FAMILIES
        self.family = family
        self.image_token_id = _config_id(config, "image_token")
        self.video_token_id = _config_id(config, "video_token")
        # the input holding each item's pixels (SmolVLM: a clip's frames are images)
        self._pixels = {"image": "pixel_values", "video": "pixel_values_videos"}
        if self.is_multimodal:
            info = family_info(family)
            self._pixels["video"] = (info.video_inputs or ("pixel_values_videos",))[0]
            if info.frames_as_images:
                self.video_token_id = self.image_token_id
        # the model must never sample an image's own tokens: they need image inputs (a
        # request adds its renderer's: GenerateRequest.banned_token_ids)
        self.suppress_token_ids = [
            i
            for i in (
                self.image_token_id,
                _config_id(config, "video_token"),
                _config_id(config, "vision_start_token"),
                _config_id(config, "vision_end_token"),
                _config_id(config, "boi_token"),
                _config_id(config, "eoi_token"),
                _config_id(config, "audio_token"),  # Gemma 4's: vf_mm renders no audio
                _config_id(config, "boa_token"),
                _config_id(config, "eoa_token"),
            )
            if i is not None
        ]
        self._suppress = torch.tensor(sorted(set(self.suppress_token_ids)), dtype=torch.long)
        self._suppress_set = frozenset(self.suppress_token_ids)
        self._vocab_size: int | None = getattr(text_config, "vocab_size", None)
        from transformers import GenerationConfig

        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = set([eos] if isinstance(eos, int) else (eos or []))
        pad = self.model.generation_config.pad_token_id
        self.pad_token_id = pad if pad is not None else 0
        # a neutral generation config: a checkpoint's defaults (repetition_penalty 1.05 in
        # real Qwen2.5-VL) would otherwise bend the scores before RowSampler sees them,
        # and the logprobs would no longer be the model's raw ones
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_token_ids) or None, pad_token_id=self.pad_token_id
        )
        self.batch_window_s = batch_window_ms / 1000
        self.max_batch = max_batch
        self.weights_version = 0
        self.batches_run = 0  # admissions: groups of requests started together
        self.busy_s = 0.0  # wall time the worker spent generating (model time)
        self.running_rows = 0  # requests being generated right now
        self.prefills_run = 0  # prefill forwards (a group of rows' new tokens each)
        self.steps_run = 0  # decode forwards (one token for every running row each)

        self._num_layers = int(text_config.num_hidden_layers)
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        # rows of different lengths share forwards: every layer must be full attention, or
        # linear attention (a state per row, prefilled one row per forward)
        self._linear = frozenset(i for i, t in enumerate(layer_types) if t == "linear_attention")
        self.resumable = (
            family not in _NOT_RESUMABLE
            and all(t in ("full_attention", "linear_attention") for t in layer_types)
            and (LINEAR_STATES or not self._linear)
        )
        self._mrope = self.is_multimodal and hasattr(
            getattr(self.model, "model", None), "get_rope_index"
        )
        forward = getattr(self.model, "model", self.model).forward
        self._encoder_outputs = self.is_multimodal and (
            "mm_encoder_outputs" in inspect.signature(forward).parameters
        )
        self.prefix_cache_enabled = prefix_cache
        self._pool: PoolEngine | None = None
        self.engine = "batch" if self.resumable else "generate"
        packed = self._pool_model(kv_pool)
        if packed is not None:
            if kv_pool_bytes is None:
                kv_pool_bytes = _default_pool_bytes(self.device)
            self._pool = PoolEngine(self, packed, pool_bytes=kv_pool_bytes, graphs=cuda_graphs)
            self.engine = "pool"
            if prefix_cache_bytes is None:  # entries live in the arena: it bounds them
                prefix_cache_bytes = self._pool.arena.nbytes
        if prefix_cache_bytes is None:
            prefix_cache_bytes = _default_cache_bytes(self.device)
        if vision_cache_bytes is None:
            vision_cache_bytes = prefix_cache_bytes // 8
        self._prefix = PrefixCache(
            prefix_cache_bytes, on_drop=self._pool.dropped if self._pool else None
        )
        self._vision = ByteLRU(vision_cache_bytes)
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found cached (not computed again)
        self.vision_cache_queries = 0  # images whose tower output was looked up
        self.vision_cache_hits = 0  # of those, found (the tower did not run)

        self._seeds = np.random.default_rng(seed)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._weights_lock = threading.Lock()
        self._swap = threading.Condition()
        self._swaps_waiting = 0
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="vf_mm-local-backend", daemon=True)
        self._worker.start()

    # -- public -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._closed:
            raise BackendError("the local backend is closed", backend=self.name)
        check_prompt_length(
            len(request.prompt_ids), request.sampling, self.max_model_len, backend=self.name
        )
        if request.content_parts:
            raise BackendError(
                "the local backend takes processed images (features), not content_parts",
                backend=self.name,
            )
        self._check_images(request)  # a bad request fails alone, before it joins a batch
        self._check_banned(request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateResult] = loop.create_future()
        self._queue.put(_Pending(request, future, loop))
        return await future

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
        """Replace the model's weights in place, between batches: running rows finish on
        the old weights, waiting ones start on the new; every cache is dropped."""
        with self._between_batches(), torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=strict)
            self.weights_version += 1
            self._prefix.clear()
            self._vision.clear()

    def clear_cache(self) -> None:
        """Drop every cached prefix and vision-tower output, between batches (the next
        requests are encoded whole)."""
        with self._between_batches():
            self._prefix.clear()
            self._vision.clear()

    @contextlib.contextmanager
    def _between_batches(self) -> Iterator[None]:
        """Hold the worker between batches: it takes in no new request and, once its
        running rows are done, waits until this block ends."""
        with self._swap:
            self._swaps_waiting += 1
        try:
            with self._weights_lock:
                yield
        finally:
            with self._swap:
                self._swaps_waiting -= 1
                self._swap.notify_all()

    @property
    def prefix_cache_bytes(self) -> int:
        """Bytes of KV tensors the prefix cache holds now."""
        return self._prefix.nbytes

    def _image_token(self) -> int:
        """The model's image token id: only asked for by a model that takes images."""
        assert self.image_token_id is not None, "a vision model has an image token"
        return self.image_token_id

    async def aclose(self) -> None:
        """Stop the worker (running requests finish first); the pool engine gives back its
        KV arena (and with it the prefix cache, whose entries live there) and its graphs."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            await asyncio.to_thread(self._worker.join, 30)
            if self._pool is not None and not self._worker.is_alive():
                self._prefix.clear()
                self._vision.clear()
                self._pool.close()

    # -- the worker thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._collect([first], self.max_batch, wait=True)
            with self._swap:
                while self._swaps_waiting:
                    self._swap.wait()
            # no autograd anywhere in here: a graph would chain every step through the KV
            # tensors written in place, and cached entries would keep it all alive
            with self._weights_lock, torch.inference_mode():
                if self._pool is not None:
                    stop = self._pool.episode(batch) or stop
                elif self.resumable:
                    stop = self._episode(batch) or stop
                else:
                    self._generate_batch(batch)
            if stop:
                return

    def _collect(
        self, batch: list[_Pending], room: int, *, wait: bool
    ) -> tuple[list[_Pending], bool]:
        """More requests for ``batch``, up to ``room`` in all: those arriving within the
        batch window (``wait``) or those already queued. Returns them and whether the
        backend is closing."""
        deadline = time.monotonic() + (self.batch_window_s if wait else 0.0)
        while len(batch) < room:
            timeout = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _generate_batch(self, batch: list[_Pending]) -> None:
        """The ``generate`` path: one batch, re-encoded whole."""
        batch = [p for p in batch if not p.future.cancelled()]
        if not batch:
            return
        started = time.perf_counter()
        self.batches_run += 1
        try:
            results: list[Any] = self._generate([p.request for p in batch])
        except Exception as exc:  # a bad batch fails its requests, never the worker
            results = [self._failure(exc)] * len(batch)
        self.busy_s += time.perf_counter() - started
        for pending, result in zip(batch, results, strict=True):
            _answer(pending, result)

    def _episode(self, admit: list[_Pending]) -> bool:
        """Run rows until none is left, taking in new requests as they come (unless a
        weight swap waits). Returns whether the backend is closing.

        A request that arrives while rows decode is held until it has waited two decode
        steps (or nothing else runs), so that requests arriving close together join in
        one prefill: a prefill is one forward, whatever its number of rows."""
        rows: list[_Row] = []
        kv: BatchKV | None = None
        closing = False
        held: list[_Pending] = []
        held_since = 0.0
        step_s = 0.0  # a recent decode step's duration
        while True:
            started = time.perf_counter()
            new: list[_Row] = []
            try:
                if admit:
                    self.batches_run += 1
                    new = [r for r in map(self._row, admit) if r is not None]
                    admit = []
                    if new:
                        new_kv = self._prefill(new)
                        kv = new_kv if kv is None else kv.merge(new_kv, reserve=_reserve(new))
                        rows, new = rows + new, []
                if rows and kv is not None:
                    rows, kv = self._retire(rows, kv)
                if rows and kv is not None:
                    step = time.perf_counter()
                    self._decode(rows, kv)
                    step_s = time.perf_counter() - step
                    rows, kv = self._retire(rows, kv)
            except Exception as exc:  # a failed forward fails the rows in it, never the worker
                error = self._failure(exc)
                for row in [*rows, *new]:
                    if row.pending is not None:  # not answered yet
                        _answer(row.pending, error)
                rows, kv = [], None
            self.busy_s += time.perf_counter() - started
            self.running_rows = sum(not r.done for r in rows)
            if not closing and not self._swaps_waiting:
                room = self.max_batch - len(rows) - len(held)
                more, closing = self._collect([], room, wait=False)
                if more and not held:
                    held_since = time.monotonic()
                held += more
            if not rows and not held:
                return closing
            waited = time.monotonic() - held_since
            if held and (not self.running_rows or waited >= max(self.batch_window_s, 2 * step_s)):
                admit, held = held, []

    def _seed(self, params: SamplingParams) -> int:
        """The request's seed, else one drawn from the backend's."""
        return params.seed if params.seed is not None else int(self._seeds.integers(2**63))

    def _generator(self, seed: int) -> torch.Generator:
        """A request's own random stream."""
        return torch.Generator(self.device).manual_seed(seed)

    def _failure(self, exc: Exception) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, torch.OutOfMemoryError):
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return BackendOutOfMemoryError(
                f"local generation ran out of GPU memory: {exc!r} (lower kv_pool_bytes or "
                "max_batch, or send fewer or shorter prompts at once)",
                backend=self.name,
            )
        return BackendError(f"local generation failed: {exc!r}", backend=self.name)

    def _pool_model(self, kv_pool: bool | None) -> PackedModel | None:
        """The model set up for the pool engine, when it runs this backend: ``kv_pool``
        True, or None on a CUDA device with a half-precision model (FlashAttention's
        varlen kernel). Families it cannot run (recurrent or sliding-window layers,
        non-causal image attention) keep their engine; asking for it then is an error."""
        if kv_pool is False:
            return None
        if kv_pool is None and not flash_available(self.device, self.model.dtype):
            return None
        packed = PackedModel(self.model)
        if self.resumable and not self._linear and packed.supported:
            return packed
        if kv_pool:
            raise BackendError(
                f"kv_pool=True: {self.family} cannot run on the KV pool engine (it needs "
                "every text layer to be full, causal attention); leave kv_pool unset",
                backend=self.name,
            )
        return None

    # -- rows -----------------------------------------------------------------------------

    def _row(self, pending: _Pending) -> _Row | None:
        """A request made ready to run: its images, its cached prefix, its positions. A
        request that cannot run is answered here, alone."""
        if pending.future.cancelled():
            return None
        request = pending.request
        try:
            media = _media(request)
            spans = tuple(span for span, _, _ in media)
            prompt = list(request.prompt_ids)
            match = Match(None, 0)
            if self.prefix_cache_enabled:
                match = self._prefix.lookup(prompt, spans, limit=len(prompt) - 1)
                self.prefix_cache_queries += len(prompt)
                self.prefix_cache_hits += match.length
            reach = match.entry.reach if match.entry is not None else None
            positions, delta, reach = self._positions(prompt, media, match.length, reach)
            params = request.sampling
            seed = self._seed(params)
            return _Row(
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
                generator=None if self._pool else self._generator(seed),
                stop_ids=self.eos_token_ids | set(params.stop_token_ids),
                banned=self._extra_bans(request),
            )
        except Exception as exc:
            _answer(pending, self._failure(exc))
            return None

    def _positions(
        self,
        prompt: list[int],
        media: list[tuple[MediaSpan, str, Mapping[str, Any]]],
        start: int,
        reach: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, int, np.ndarray | None]:
        """The positions of ``prompt[start:]``, the offset of text positions after it, and
        the prompt's ``reach`` (M-RoPE only: the highest position among its first t + 1
        tokens, for every t).

        Qwen-VL families (M-RoPE): the model's own ``get_rope_index``, whose positions are
        a sequence of segments (text, then an image's grid, ...) each starting one past the
        highest position before it. So the new tokens are ``get_rope_index`` over them
        alone, shifted one past the highest position of the cached prefix (``reach`` of
        the entry it came from, None for plain 0, 1, 2...): the same numbers as one pass
        over the whole prompt, at the cost of the new tokens only (a match never ends
        inside an image)."""
        n = len(prompt)
        if not (self._mrope and media):
            positions = torch.arange(start, n)
            return (positions.expand(3, -1) if self._mrope else positions), 0, None
        if start == 0:
            positions, delta = self._rope_index(prompt, media)
            return positions, delta, np.maximum.accumulate(positions.max(dim=0).values.numpy())
        offset = int(reach[start - 1]) + 1 if reach is not None else start
        tail = [(span, m, inputs) for span, m, inputs in media if span.offset >= start]
        if tail:
            shifted = [(MediaSpan(s.offset - start, s.end - start, s.key), m, i) for s, m, i in tail]  # fmt: skip
            relative, tail_delta = self._rope_index(prompt[start:], shifted)
        else:
            relative, tail_delta = torch.arange(n - start).expand(3, -1), 0
        positions = relative + offset
        ahead = reach[:start] if reach is not None else np.arange(start)
        peaks = np.maximum.accumulate(positions.max(dim=0).values.numpy())
        return positions, tail_delta + offset - start, np.concatenate([ahead, peaks])

    def _rope_index(
        self, prompt: list[int], media: list[tuple[MediaSpan, str, Mapping[str, Any]]]
    ) -> tuple[torch.Tensor, int]:
        """``get_rope_index`` over ``prompt`` with ``media`` (its images and clips, in
        order): positions ``(3, n)`` and the offset of text positions after them."""
        ids = torch.tensor([prompt])
        types = torch.zeros_like(ids)
        grids: dict[str, list[np.ndarray]] = {}
        for _, modality, inputs in media:
            token = self.image_token_id if modality == "image" else self.video_token_id
            types[ids == token] = 1 if modality == "image" else 2
            for name in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
                if name in inputs:
                    value = np.asarray(inputs[name])
                    shaped = (
                        value.reshape(-1) if name == "second_per_grid_ts" else value.reshape(-1, 3)
                    )
                    grids.setdefault(name, []).append(shaped)
        kwargs = {name: torch.from_numpy(np.concatenate(parts)) for name, parts in grids.items()}
        for name in ("image_grid_thw", "video_grid_thw"):
            if name in kwargs:
                kwargs[name] = kwargs[name].long()
        positions, deltas = self.model.model.get_rope_index(ids, mm_token_type_ids=types, **kwargs)
        return positions[:, 0], int(deltas.reshape(-1)[0])

    # -- forwards -------------------------------------------------------------------------

    def _prefill(self, rows: list[_Row]) -> BatchKV:
        """Compute the uncached part of every row's prompt and sample each row's first
        token. Rows go in groups of similar length (a group is one forward)."""
        order = sorted(rows, key=lambda r: len(r.new_ids), reverse=True)
        groups: list[list[_Row]] = []
        for row in order:
            group = groups[-1] if groups else None
            if group is not None and not self._linear:  # a recurrent state takes no pads
                width = len(group[0].new_ids)  # the group's longest
                real = sum(len(r.new_ids) for r in group) + len(row.new_ids)
                padded = width * (len(group) + 1)
                if padded <= _PREFILL_TOKENS and padded <= 2 * real:
                    group.append(row)
                    continue
            groups.append([row])
        kv: BatchKV | None = None
        for group in groups:
            part = self._prefill_group(group)
            kv = part if kv is None else kv.merge(part, reserve=_reserve(rows))
        rows[:] = [r for g in groups for r in g]  # the batch's row order
        assert kv is not None
        return kv

    def _prefill_group(self, rows: list[_Row]) -> BatchKV:
        prefixes = [
            r.match.entry.state.prefix(r.cached) if r.match.entry is not None else None
            for r in rows
        ]
        width = max(len(r.new_ids) for r in rows)
        kv = BatchKV.start(
            prefixes,
            num_layers=self._num_layers,
            device=self.device,
            new=width,
            reserve=_reserve(rows),
            linear=self._linear,
        )
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        shape = (3, len(rows), width) if self._mrope else (len(rows), width)
        positions = torch.zeros(shape, dtype=torch.long)
        for i, row in enumerate(rows):
            new = row.new_ids
            ids[i, width - len(new) :] = torch.tensor(new)
            mask[i, width - len(new) :] = 1
            positions[..., i, width - len(new) :] = row.positions
        kv.extend_mask(mask.to(self.device))
        self.prefills_run += 1
        inputs: dict[str, Any] = {}
        if self.is_multimodal:
            inputs = self._vision_inputs(rows, ids)
        logits = self._forward(ids, positions, kv, inputs)
        self._sample(rows, logits)
        return kv

    def _decode(self, rows: list[_Row], kv: BatchKV) -> None:
        """One step: feed every running row its last sampled token, sample the next."""
        ids = torch.tensor([[r.completion[-1] if not r.done else self.pad_token_id] for r in rows])
        at = torch.tensor([[r.next_position] for r in rows])
        positions = at[None].expand(3, -1, -1) if self._mrope else at
        alive = torch.tensor([[0 if r.done else 1] for r in rows])
        kv.extend_mask(alive.to(self.device))
        self.steps_run += 1
        logits = self._forward(ids, positions, kv, {})
        self._sample(rows, logits)

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, kv: BatchKV, inputs: dict[str, Any]
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=kv.mask,
            position_ids=positions.to(self.device),
            past_key_values=kv.cache,
            use_cache=True,
            logits_to_keep=1,
            **inputs,
        )
        return out.logits[:, -1]

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> None:
        live = [i for i, r in enumerate(rows) if not r.done]
        if not live:
            return
        scores = logits if len(live) == len(rows) else logits[torch.tensor(live)]
        _, tokens, logprobs = sample_rows(
            scores,
            [rows[i].sampling for i in live],
            [rows[i].generator for i in live],
            self._suppress,
            [rows[i].banned for i in live],
        )
        self._take([rows[i] for i in live], tokens, logprobs)

    def _take(self, rows: Sequence[_Row], tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """Each row's newly sampled token: kept, and the row done at a stop id or its
        length."""
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.completion.append(token)
            row.logprobs.append(logprob)
            if token in row.stop_ids:
                row.finish = "stop"
                row.stop_reason = None if token in self.eos_token_ids else token
                row.done = True
            elif len(row.completion) >= row.sampling.max_tokens:
                row.done = True

    def _retire(self, rows: list[_Row], kv: BatchKV) -> tuple[list[_Row], BatchKV | None]:
        """Answer the rows that just finished, keep their state, and drop finished rows
        from the batch once they are half of it."""
        for i, row in enumerate(rows):
            if row.pending is None:
                continue
            if row.done:
                if self.prefix_cache_enabled and not row.pending.future.cancelled():
                    state = kv.row(i)  # prompt + completion[:-1]: the last token was not fed
                    tokens = row.prompt + row.completion[:-1]
                    self._prefix.insert(
                        tokens,
                        row.spans,
                        state,
                        state.nbytes,
                        exact=state.exact,
                        replaces=row.match.entry,
                        reach=row.reach_through(len(tokens)),
                    )
                _answer(row.pending, _result(row))
                row.pending = None
            elif row.pending.future.cancelled():  # nobody waits for it: stop it here
                row.done = True
                row.pending = None
        keep = [i for i, r in enumerate(rows) if not r.done]
        if not keep:
            return [], None
        if 2 * len(keep) <= len(rows):
            kept = [rows[i] for i in keep]
            return kept, kv.select(keep, reserve=_reserve(kept))
        return rows, kv

    # -- images ---------------------------------------------------------------------------

    def _vision_inputs(self, rows: Sequence[_Row], ids: torch.Tensor) -> dict[str, Any]:
        """The forward's image inputs for the new part of ``rows`` (``ids``): the vision
        tower's outputs, cached per image, where the model takes them; else the images'
        processed inputs."""
        new = [(span, modality, inputs)
               for r in rows for span, modality, inputs in r.media if span.offset >= r.cached]  # fmt: skip
        if not new:
            return {}
        if (
            self.prefix_cache_enabled
            and self._encoder_outputs
            and all(modality == "image" for _, modality, _ in new)
        ):
            return {"mm_encoder_outputs": {"image": self._image_features(new)}}
        raw = self._media_inputs(ids, new)
        return {name: value.to(self.device) for name, value in raw.items()}

    def _media_inputs(
        self, ids: torch.Tensor, media: Sequence[tuple[MediaSpan, str, Mapping[str, Any]]]
    ) -> dict[str, Any]:
        """The forward's image and video inputs for ``ids``, whose images and clips are
        ``media`` in token order (``_media``)."""
        from vf_mm.models import model_inputs

        try:
            return model_inputs(
                self.family,
                ids,
                [inputs for _, m, inputs in media if m == "image"],
                image_token_ids=[self._image_token()],
                dtype=self.model.dtype,
                videos=[inputs for _, m, inputs in media if m == "video"],
                video_token_ids=[self.video_token_id] if self.video_token_id is not None else [],
                order=[m for _, m, _ in media],
            )
        except (KeyError, ValueError) as exc:
            raise BackendError(
                f"the images' and videos' inputs do not make one batch: {exc}", backend=self.name
            ) from None

    def _image_features(self, new: list[tuple[MediaSpan, str, Mapping[str, Any]]]) -> Any:
        """The vision tower's output for ``new`` images, in order, as the model's
        ``mm_encoder_outputs`` takes it: from the cache, the tower run once on the rest."""
        found: dict[str, tuple[Any, ...]] = {}
        missing: dict[str, Mapping[str, Any]] = {}
        for span, _, inputs in new:
            self.vision_cache_queries += 1
            hit = self._vision.get(span.key)
            if hit is not None:
                self.vision_cache_hits += 1
                found[span.key] = hit
            else:
                missing.setdefault(span.key, inputs)
        if missing:
            found.update(self._encode_images(missing))
        features = [found[span.key] for span, _, _ in new]
        output_class = features[0][0]
        pooled = tuple(f[1] for f in features)
        # a model whose tower gives one tensor for the batch (InternVL) takes one back
        out: dict[str, Any] = {"pooler_output": torch.cat(pooled) if features[0][3] else pooled}
        if features[0][2] is not None:
            layers = len(features[0][2])
            out["deepstack_features"] = [tuple(f[2][i] for f in features) for i in range(layers)]
        return output_class(**out)

    def _encode_images(self, images: dict[str, Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
        """Run the vision tower on ``images`` (by key): all in one call where the model
        returns one output per image, else one call per image."""
        from vf_mm.models import family_info, model_inputs

        info = family_info(self.family)
        keys = list(images)
        chunks = [keys] if info.image_axis == 0 else [[k] for k in keys]
        encoded: dict[str, tuple[Any, ...]] = {}
        dummy = torch.zeros((1, 1), dtype=torch.long)
        for chunk in chunks:
            inputs = model_inputs(
                self.family,
                dummy,
                [images[k] for k in chunk],
                image_token_ids=[self._image_token()],
                dtype=self.model.dtype,
            )
            args = {k: v.to(self.device) for k, v in inputs.items() if k in info.image_inputs}
            output = self.model.model.get_image_features(**args, return_dict=True)
            as_tensor = isinstance(output.pooler_output, torch.Tensor)
            pooled = list(output.pooler_output)
            tiles = [len(images[k][info.image_inputs[0]]) for k in chunk]
            if as_tensor and len(pooled) != len(chunk) and len(pooled) == sum(tiles):
                # one output per tile (InternVL): an image's features are its tiles', in order
                ends = np.cumsum(tiles).tolist()
                pooled = [
                    output.pooler_output[end - n : end].flatten(0, -2)
                    for n, end in zip(tiles, ends, strict=True)
                ]
            if len(pooled) != len(chunk):
                raise BackendError(
                    f"the vision tower returned {len(pooled)} outputs for {len(chunk)} images",
                    backend=self.name,
                )
            deep = getattr(output, "deepstack_features", None)
            for i, key in enumerate(chunk):
                layers = tuple(layer[i] for layer in deep) if deep is not None else None
                value = (type(output), pooled[i], layers, as_tensor)
                size = pooled[i].numel() * pooled[i].element_size() + sum(
                    t.numel() * t.element_size() for t in (layers or ())
                )
                self._vision.put(key, value, size)
                encoded[key] = value
        return encoded

    # -- the generate path ----------------------------------------------------------------

    @torch.no_grad()
    def _generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):  # left padding: every prompt ends at the same column
            input_ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention[row, width - len(r.prompt_ids) :] = 1
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention}
        if self.is_multimodal:
            media = [item for r in requests for item in _media(r)]
            inputs.update(self._media_inputs(input_ids, media))
        sampling = [r.sampling for r in requests]
        generators = [self._generator(self._seed(s)) for s in sampling]
        sampler = RowSampler(
            sampling, generators, self.suppress_token_ids, [self._extra_bans(r) for r in requests]
        )
        stop_ids = [self.eos_token_ids | set(s.stop_token_ids) for s in sampling]
        stopper = RowStopper(stop_ids, [s.max_tokens for s in sampling], width)
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(s.max_tokens for s in sampling),
            pad_token_id=self.pad_token_id,
            eos_token_id=None,
        )
        output = self.model.generate(
            **{k: v.to(self.device) for k, v in inputs.items()},
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([stopper]),
        )
        generated = output[:, width:].tolist()
        results = []
        for row, (r, ids) in enumerate(zip(requests, generated, strict=True)):
            ids = ids[: r.sampling.max_tokens]
            finish, stop_reason = "length", None
            for i, token in enumerate(ids):
                if token in stop_ids[row]:
                    ids = ids[: i + 1]
                    finish = "stop"
                    stop_reason = None if token in self.eos_token_ids else token
                    break
            logprobs = sampler.logprobs[row][: len(ids)] if r.sampling.logprobs else None
            results.append(
                GenerateResult(
                    completion_ids=ids,
                    logprobs=logprobs,
                    finish_reason=finish,  # type: ignore[arg-type]
                    stop_reason=stop_reason,
                    usage=Usage(prompt_tokens=len(r.prompt_ids), completion_tokens=len(ids)),
                )
            )
        return results

    def _check_banned(self, request: GenerateRequest) -> None:
        """Banned ids must be the model's: one outside its vocabulary is a caller's bug
        (a renderer of another checkpoint), refused before the request joins a batch."""
        vocab = self._vocab_size
        outside = [t for t in request.banned_token_ids if vocab is not None and not 0 <= t < vocab]
        if outside:
            raise ValueError(
                f"banned_token_ids {outside[:5]} are outside the model's vocabulary of "
                f"{vocab} ids (is the renderer for this checkpoint?)"
            )

    def _extra_bans(self, request: GenerateRequest) -> tuple[int, ...]:
        """The request's banned ids that the backend's own ban does not cover."""
        own = self._suppress_set
        return tuple(t for t in request.banned_token_ids if t not in own)

    def _check_images(self, request: GenerateRequest) -> None:
        data = request.multi_modal_data
        if not self.is_multimodal:
            if data is not None and not data.is_empty:
                raise BackendError(
                    f"{self.path.name} is a text model: it takes no images", backend=self.name
                )
            return
        tokens = {"image": self.image_token_id, "video": self.video_token_id}

        def ranges(modality: str) -> list[Any]:
            return data.mm_placeholders.get(modality, []) if data else []

        for modality, token in tokens.items():
            if ranges(modality) and token is None:
                raise BackendError(f"{self.path.name} takes no {modality}", backend=self.name)
            pixels = self._pixels[modality]
            for i, item in enumerate(data.mm_items.get(modality, []) if data else []):
                if not item or item.get(pixels) is None:
                    raise BackendError(
                        f"{modality} {i} has no {pixels} (this backend needs the processed "
                        "inputs, not only hashes)",
                        backend=self.name,
                    )
        # per token: modalities that share one (SmolVLM's frames are images) count together
        for token in {t for t in tokens.values() if t is not None}:
            sharing = [m for m, t in tokens.items() if t == token]
            expected = sum(p.num_embeds for m in sharing for p in ranges(m))
            pads = request.prompt_ids.count(token)
            if pads != expected:
                raise BackendError(
                    f"prompt has {pads} {' and '.join(sharing)} pad tokens but its multi-modal "
                    f"data covers {expected}",
                    backend=self.name,
                )


def _media(request: GenerateRequest) -> list[tuple[MediaSpan, str, Mapping[str, Any]]]:
    """Every image and clip of a request in token order: its span (keyed by modality,
    content hash and the shapes of its inputs) and its model inputs."""
    data = request.multi_modal_data
    if data is None or data.is_empty:
        return []
    out: list[tuple[MediaSpan, str, Mapping[str, Any]]] = []
    for modality, i, where in data.all_placeholders():
        inputs = data.mm_items[modality][i]
        shapes = ",".join(
            f"{name}{tuple(np.shape(value))}" for name, value in sorted(inputs.items())
        )
        if "image_grid_thw" in inputs or "video_grid_thw" in inputs:
            grid = inputs.get("image_grid_thw", inputs.get("video_grid_thw"))
            shapes += f"|{np.asarray(grid).reshape(-1).tolist()}"
        key = f"{modality}:{data.mm_hashes[modality][i]}:{shapes}"
        out.append((MediaSpan(where.offset, where.end, key), modality, inputs))
    return out


def _reserve(rows: Sequence[_Row]) -> int:
    """Columns to keep free for decoding ``rows``: the most tokens any still may sample."""
    return max((r.sampling.max_tokens - len(r.completion) for r in rows), default=0)


def _default_pool_bytes(device: torch.device) -> int:
    """The KV pool engine's arena: 60% of the GPU memory free once the model is loaded
    (the rest for activations and the vision tower); 256 MiB elsewhere."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.6)
    return 256 << 20


def _default_cache_bytes(device: torch.device) -> int:
    """A quarter of the GPU memory free once the model is loaded; 2 GiB on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 4
    return 2 * _GIB


def _config_id(config: Any, name: str) -> int | None:
    """A special token's id from a model config (``<name>_id``, or Gemma's
    ``<name>_index``), None when the config has none."""
    for key in (f"{name}_id", f"{name}_index"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None
