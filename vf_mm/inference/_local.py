"""``LocalBackend``: an in-process transformers model that batches concurrent requests and
keeps each conversation's history between turns.

The embedded default backend, the CPU development backend, and what ``vf-mm serve``
exposes. ``LocalBackend`` is the front of parts that each hold one concept:

- ``LocalModel`` (``_local_model``): the checkpoint, loaded (``from_pretrained``), with
  the facts the engines need and a request's model-side inputs (checks, positions);
- ``Scheduler`` (``_scheduler``): the worker thread the requests are queued to (the
  model never runs on the event loop), continuous batching, weight swaps between
  batches;
- an engine: ``PoolEngine`` (``_pool``), ``BatchEngine`` (``_batch_engine``) or
  ``GenerateEngine`` (``_generate``), below;
- ``RowBuilder`` (``_row_builder``): a request made ready to run (its images, cached
  prefix, positions, seed);
- ``PrefixCache`` (``_prefix_cache``) and ``VisionCache`` (``_vision_cache``): what is
  kept between requests; ``LocalStats`` (``_local_stats``): the counters.

Each row keeps its own sampling rules, seed and stop tokens (``_sampling``), image and
vision tokens are never sampled, and each row's raw log-probabilities come back with
its tokens.

**Three engines** (``engine`` says which). On a CUDA device with a half-precision model
the **pool engine**: every sequence's keys and values in one preallocated arena
(``kv_pool_bytes``), prefills as one packed token stream with varlen FlashAttention,
decode steps replayed as CUDA graphs, sampling on the device. Elsewhere (and with
``kv_pool=False``) the **batch engine**: padded KV tensors per running batch, what the
CPU runs and the CPU tests check. Both give what a full re-encode gives (greedy ids;
logprobs within float tolerance, bf16's on a GPU). Families that cannot share padded
forwards (Gemma 3's bidirectional image attention, sliding-window layers) run through
Hugging Face ``generate`` (the **generate engine**), re-encoding every prompt.

**Continuous batching.** When idle, the worker takes the first waiting request and
whatever else arrives within ``batch_window_ms`` (up to ``max_batch``); while rows are
decoding, requests that arrive join the running batch (after waiting, so that requests
arriving close together share one prefill forward: the pool engine as long as the last
prefill took, two to eight decode steps; the batch engine two steps), and a row that
finishes leaves it and is answered at once. Each step is one forward over every
running row. ``clear_cache`` and ``load_weights`` wait for the running rows and hold
new ones back meanwhile.

**Prefix caching.** A multi-turn rollout sends turn N's prompt as turn N-1's prompt,
its completion and the new messages (the renderer bridges), so almost all of a prompt
was computed the turn before. When a request finishes, its KV (prompt and completion)
goes into a ``PrefixCache`` keyed by token ids and image hashes; a new request reuses
the longest cached prefix and prefills only the rest, running the vision tower only on
images in that rest (whose outputs are cached by image too). The backend never needs
to know which rollout a request belongs to. Positions are passed per token, for the
Qwen-VL families the model's own M-RoPE positions over the whole prompt, so a cached
prefix and a full re-encode see the same positions. ``prefix_cache=False`` re-encodes
every prompt whole (for comparison). ``prefix_cache_queries`` / ``prefix_cache_hits``
count prompt tokens looked up and found cached (vLLM's counters of the same names).

**Qwen3.5** (Gated DeltaNet linear-attention layers beside full attention): a linear
layer keeps a recurrent state per row, not per token, so a cached entry stands for its
whole length only (a prompt reuses it when it extends all of it, as every bridged turn
does), rows are prefilled one per forward (a pad fed through the recurrence would
change the state), and decode together.

``load_weights`` swaps weights in place between batches (a trainer pushing a new
policy): no request ever sees two versions, no cache outlives the weights it was
computed with, and ``weights_version`` counts swaps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from vf_mm.errors import BackendError
from vf_mm.inference._batch_engine import BatchEngine
from vf_mm.inference._generate import GenerateEngine
from vf_mm.inference._local_model import LocalModel
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._packed import flash_available
from vf_mm.inference._pool import PoolEngine, entry_release, pool_arena
from vf_mm.inference._prefill_step import TOKEN_BUCKETS
from vf_mm.inference._prefix_cache import PrefixCache
from vf_mm.inference._row_builder import RowBuilder
from vf_mm.inference._rows import Pending
from vf_mm.inference._sampling import Seeds
from vf_mm.inference._scheduler import HOLD_STEPS, RowParts, Scheduler
from vf_mm.inference._types import GenerateRequest, GenerateResult
from vf_mm.inference._vision_cache import VisionCache

_GIB = 1 << 30
#: the default ``prefill_graph_tokens`` on CUDA: the largest token bucket
PREFILL_GRAPH_TOKENS = TOKEN_BUCKETS[-1]


class LocalBackend:
    """Serve a transformers model in-process.

    Prompts arrive as token ids with their images' ``pixel_values`` / ``image_grid_thw``
    in ``multi_modal_data`` (as a ``vf_mm`` renderer produces them).

    The model's facts (``family``, ``image_token_id``, ``eos_token_ids``, ...) are
    attributes and the counters (``batches_run``, ``prefix_cache_hits``, ...) read-only
    properties: read them, never write them.

    Args:
        model: A checkpoint directory (any ``build_tiny_vlm`` / ``build_tiny_lm`` output,
            or a real Qwen-VL / causal LM).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: The weights' dtype (default float32).
        batch_window_ms: When idle, the worker takes the first waiting request and
            whatever else arrives within this window (module docstring).
        max_batch: The most rows in one batch.
        max_model_len: The longest prompt plus completion (default: the model's
            ``max_position_embeddings``).
        seed: Starts the stream of seeds for requests that set none, so the same requests
            in the same order sample the same tokens.
        prefix_cache: Keep history between requests (module docstring).
        prefix_cache_bytes: Bounds the KV entries kept (default: the KV pool on a GPU,
            2 GiB on CPU).
        vision_cache_bytes: Bounds the vision tower's outputs kept (default: an eighth of
            ``prefix_cache_bytes``).
        kv_pool: Run the pool engine (module docstring); None (default) runs it on a CUDA
            device in bfloat16 / float16, True asks for it anywhere (on CPU with exact, slow
            per-sequence attention) and is an error for a family it cannot run.
        kv_pool_bytes: The arena's size, all the KV memory the engine ever holds (default
            60% of the GPU memory free after loading; 256 MiB elsewhere): a request waits for
            room, and one that cannot fit at all fails alone (``BackendOutOfMemoryError``).
        cuda_graphs: Capture decode steps as CUDA graphs (the pool engine on CUDA), and
            prefills of up to ``prefill_graph_tokens`` new tokens.
        prefill_graph_tokens: The pool engine's prefills of at most this many new tokens
            (rounded down to a bucket: a value under 256 graphs none, one over 4096 is
            4096) run their text stack as a CUDA graph per token-count bucket (256, 512,
            768, 1024, 1536, 2048, 3072, 4096), padded up to it (Qwen3-VL's deepstack
            features added from dense buffers); a longer one, and one whose decoder takes
            inputs the graph does not hold (Qwen3-VL-MoE's router flag), runs eagerly.
            Default 4096 with ``cuda_graphs`` on CUDA in half precision, 0 (none)
            elsewhere, where the padded path runs eagerly and only costs.
        varlen_vision: Run a Qwen-VL vision tower's attention as one varlen FlashAttention
            call over every image and window (the pool engine on CUDA in half precision);
            False keeps transformers' own per-window attention, whose features a trainer's
            forward computes (they differ by bfloat16 rounding).
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
        prefill_graph_tokens: int | None = None,
        varlen_vision: bool = True,
    ) -> None:
        if prefill_graph_tokens is not None and (
            isinstance(prefill_graph_tokens, bool)
            or not isinstance(prefill_graph_tokens, int)
            or prefill_graph_tokens < 0
        ):  # checked before the model loads: a typo would otherwise mean "no graphs"
            raise ValueError(
                f"prefill_graph_tokens={prefill_graph_tokens!r}: give an int >= 0 (0: no "
                "prefill graphs) or None (the device's default)"
            )
        loaded = LocalModel.from_pretrained(
            model, device=device, dtype=dtype, max_model_len=max_model_len
        )
        self._model = loaded
        # the model's facts, as callers (vf-mm serve, trainers, tests) read them
        self.path = loaded.path
        self.name = loaded.name
        self.model = loaded.model
        self.device = loaded.device
        self.family = loaded.family
        self.max_model_len = loaded.max_model_len
        self.is_multimodal = loaded.is_multimodal
        self.image_token_id = loaded.image_token_id
        self.video_token_id = loaded.video_token_id
        self.suppress_token_ids = loaded.suppress_token_ids
        self.eos_token_ids = loaded.eos_token_ids
        self.pad_token_id = loaded.pad_token_id
        self.resumable = loaded.resumable
        self.prefix_cache_enabled = prefix_cache
        self.batch_window_s = batch_window_ms / 1000
        self.max_batch = max_batch

        self._stats = LocalStats()
        packed = loaded.pool_model(kv_pool, varlen_vision=varlen_vision)
        arena = None
        if packed is not None:
            if kv_pool_bytes is None:
                kv_pool_bytes = _default_pool_bytes(loaded.device)
            arena = pool_arena(loaded, packed, pool_bytes=kv_pool_bytes)
            if prefix_cache_bytes is None:  # entries live in the arena: it bounds them
                prefix_cache_bytes = arena.nbytes
        if prefix_cache_bytes is None:
            prefix_cache_bytes = _default_cache_bytes(loaded.device)
        if vision_cache_bytes is None:
            vision_cache_bytes = prefix_cache_bytes // 8
        on_drop = entry_release(arena) if arena is not None else None
        self._prefix = PrefixCache(prefix_cache_bytes, on_drop=on_drop)
        self._vision = VisionCache(
            loaded, vision_cache_bytes, stats=self._stats, enabled=prefix_cache
        )
        seeds = Seeds(seed, loaded.device)
        builder = RowBuilder(
            loaded,
            self._prefix,
            stats=self._stats,
            seeds=seeds,
            prefix_cache=prefix_cache,
            generators=packed is None,
        )
        parts = RowParts(
            loaded, builder, self._prefix, self._vision, self._stats, prefix_cache=prefix_cache
        )
        self._pool: PoolEngine | None = None
        engine: PoolEngine | BatchEngine | GenerateEngine
        if packed is not None and arena is not None:
            if prefill_graph_tokens is None:
                # graphs need FlashAttention's kernel (CUDA, half precision): elsewhere the
                # padded path only costs
                graphed = cuda_graphs and flash_available(loaded.device, loaded.dtype)
                prefill_graph_tokens = PREFILL_GRAPH_TOKENS if graphed else 0
            self._pool = engine = PoolEngine(
                parts, packed, arena, max_batch=max_batch, graphs=cuda_graphs,
                prefill_tokens=prefill_graph_tokens,
            )  # fmt: skip
            self.engine = "pool"
        elif loaded.resumable:
            engine = BatchEngine(parts)
            self.engine = "batch"
        else:
            engine = GenerateEngine(loaded, seeds=seeds)
            self.engine = "generate"
        self._closed = False
        # a GPU prefill's cost is mostly fixed, a CPU one's grows with its tokens: only the
        # pool engine holds arrivals up to a prefill's duration (scheduler docstring)
        self._scheduler = Scheduler(
            engine,
            stats=self._stats,
            batch_window_s=self.batch_window_s,
            max_batch=max_batch,
            hold_steps=HOLD_STEPS if self.engine == "pool" else 2,
        )

    # -- public -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._closed:
            raise BackendError("the local backend is closed", backend=self.name)
        self._model.check(request)  # a bad request fails alone, before it joins a batch
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateResult] = loop.create_future()
        started = time.perf_counter()
        self._scheduler.submit(Pending(request, future, loop))
        try:
            return await future
        finally:
            self._stats.requests_answered += 1
            self._stats.request_s += time.perf_counter() - started

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
        """Replace the model's weights in place, between batches.

        Running rows finish on the old weights, waiting ones start on the new; every cache is
        dropped.

        Args:
            state_dict: The new weights, by parameter name.
            strict: Refuse a ``state_dict`` whose names are not exactly the model's.
        """
        with self._scheduler.between_batches(), torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=strict)
            self._stats.weights_version += 1
            self._prefix.clear()
            self._vision.clear()

    def clear_cache(self) -> None:
        """Drop every cached prefix and vision-tower output, between batches (the next
        requests are encoded whole)."""
        with self._scheduler.between_batches():
            self._prefix.clear()
            self._vision.clear()

    async def aclose(self) -> None:
        """Stop the worker (running requests finish first); the pool engine gives back its
        KV arena (and with it the prefix cache, whose entries live there) and its graphs."""
        if not self._closed:
            self._closed = True
            stopped = await asyncio.to_thread(self._scheduler.stop, 30)
            if self._pool is not None and stopped:
                self._prefix.clear()
                self._vision.clear()
                self._pool.close()

    @property
    def prefix_cache_bytes(self) -> int:
        """Bytes of KV tensors the prefix cache holds now."""
        return self._prefix.nbytes

    # -- counters (LocalStats, read-only) ---------------------------------------------------

    @property
    def weights_version(self) -> int:
        """Weight swaps so far (``load_weights``)."""
        return self._stats.weights_version

    @property
    def batches_run(self) -> int:
        """Admissions: groups of requests started together."""
        return self._stats.batches_run

    @property
    def busy_s(self) -> float:
        """Wall time the worker spent generating (model time)."""
        return self._stats.busy_s

    @property
    def running_rows(self) -> int:
        """Requests being generated right now."""
        return self._stats.running_rows

    @property
    def prefills_run(self) -> int:
        """Prefill forwards (a group of rows' new tokens each)."""
        return self._stats.prefills_run

    @property
    def steps_run(self) -> int:
        """Decode forwards (one token for every running row each)."""
        return self._stats.steps_run

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache (vLLM's counter)."""
        return self._stats.prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, tokens found cached, not computed again (vLLM's counter)."""
        return self._stats.prefix_cache_hits

    @property
    def vision_cache_queries(self) -> int:
        """Images whose vision-tower output was looked up."""
        return self._stats.vision_cache_queries

    @property
    def vision_cache_hits(self) -> int:
        """Of those, found: the tower did not run."""
        return self._stats.vision_cache_hits

    @property
    def requests_answered(self) -> int:
        """Requests the engine answered or failed."""
        return self._stats.requests_answered

    @property
    def request_s(self) -> float:
        """Their seconds from the engine's queue to their answer, summed: over
        ``requests_answered``, the engine's share of a request's latency."""
        return self._stats.request_s


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
