"""Packed forwards over a ``KVArena``: many sequences' new tokens as one token stream.

The pool engine never pads. A forward's input is every running sequence's new tokens
laid end to end, ``(1, T)``; each token carries its own position (M-RoPE's three for the
Qwen-VL families), and everything a transformer does per token (embeddings, norms,
projections, MLPs, the vision features scattered in) is unchanged by the packing. Only
attention must know where one sequence ends: ``packed_attention`` is registered with
transformers' attention interface and, for the length of a packed forward
(``packed_forward``), replaces the text layers' attention. It writes the new keys and
values into each sequence's arena range (``PackedStep.write``), then attends each
query over its own sequence's range: causally, the new tokens being the last
``n`` of the ``lengths[i]`` it sees. On CUDA in half precision that is one varlen
FlashAttention call (``seqused_k``: a range is read only as far as it is written); on
other devices and dtypes a loop of ``scaled_dot_product_attention`` per sequence (exact,
slow, what the CPU tests run).

``DecodeStep`` runs one decode step (every running sequence's one new token, the
forward and the sampling) from fixed buffers, so on CUDA it is captured once per
batch-size bucket as a CUDA graph and replayed: a step costs one launch and two small
copies instead of a few thousand kernel launches from Python.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import AttentionInterface, PreTrainedModel

from vf_mm.inference._arena import KVArena
from vf_mm.inference._sampling import sample_packed

NAME = "vf_mm_packed"


@dataclass(slots=True)
class PackedStep:
    """Where a packed forward's sequences are: ``cu_q`` (``(N + 1,)`` int32) splits the
    token stream into sequences; sequence ``i`` owns arena slots from ``starts[i]`` on
    and attends over its first ``lengths[i]`` of them (its new tokens included, written
    at ``write``, one arena slot per token of the stream). ``max_q`` / ``max_k`` bound
    the new tokens and the lengths of any sequence. ``host``: the same numbers as
    Python lists, for the per-sequence path (None on the graph path)."""

    arena: KVArena
    write: torch.Tensor
    cu_q: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    max_q: int
    max_k: int
    host: tuple[list[int], list[int], list[int]] | None = None  # cu_q, starts, lengths

    @classmethod
    def build(
        cls,
        arena: KVArena,
        *,
        starts: Sequence[int],
        cached: Sequence[int],
        new: Sequence[int],
        device: torch.device,
        reference: bool,
    ) -> PackedStep:
        """Sequence ``i`` owns the range at ``starts[i]``, ``cached[i]`` of its tokens are
        in it already and ``new[i]`` come in this forward. ``reference``: attention by the
        per-sequence path (it reads ``host``)."""
        cu = np.zeros(len(new) + 1, dtype=np.int64)
        np.cumsum(new, out=cu[1:])
        write = np.concatenate(
            [np.arange(s + c, s + c + n, dtype=np.int64) for s, c, n in zip(starts, cached, new, strict=True)]
        )  # fmt: skip
        lengths = [c + n for c, n in zip(cached, new, strict=True)]
        ints = torch.from_numpy(np.concatenate([cu, [*starts, 0], lengths]).astype(np.int32)).to(
            device, non_blocking=True
        )
        n = len(new)
        return cls(
            arena=arena,
            write=torch.from_numpy(write).to(device, non_blocking=True),
            cu_q=ints[: n + 1],
            starts=ints[n + 1 : 2 * n + 2],
            lengths=ints[2 * n + 2 :],
            max_q=max(new),
            max_k=max(lengths),
            host=(cu.tolist(), list(starts), lengths) if reference else None,
        )


def flash_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the varlen FlashAttention kernel serves this device and dtype."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` ``(1, heads, T, dim)``, ``key`` /
    ``value`` ``(1, kv_heads, T, dim)`` for the stream's tokens; returns ``(1, T, heads,
    dim)``."""
    step: PackedStep | None = kwargs.get("vf_mm_step")
    if step is None:
        raise RuntimeError(
            "packed attention ran without its step: a forward outside packed_forward"
        )
    store = step.arena.layer(module.layer_idx)  # type: ignore[arg-type]
    q = query[0].transpose(0, 1)
    store[0].index_copy_(0, step.write, key[0].transpose(0, 1))
    store[1].index_copy_(0, step.write, value[0].transpose(0, 1))
    if step.host is None:
        out = torch.ops.aten._flash_attention_forward(
            q, store[0], store[1], step.cu_q, step.starts, step.max_q, step.max_k,
            0.0, True, False, scale=scaling, seqused_k=step.lengths,
        )[0]  # fmt: skip
    else:
        out = _attention_per_sequence(q, store, step.host, scaling)
    return out.unsqueeze(0), None


def _attention_per_sequence(
    q: torch.Tensor,
    store: torch.Tensor,
    host: tuple[list[int], list[int], list[int]],
    scaling: float | None,
) -> torch.Tensor:
    """The reference path: each sequence's queries over its range, causal with the new
    tokens last, by ``scaled_dot_product_attention``. A query that sees no key (a
    sequence of more new tokens than its length: padding) gets zeros, as from
    FlashAttention."""
    cu, starts, lengths = host
    out = torch.empty_like(q)
    for i, (start, length) in enumerate(zip(starts, lengths, strict=False)):
        a, b = cu[i], cu[i + 1]
        if b - a > length:  # the first queries see nothing
            out[a : b - length] = 0
            a = b - length
        n = b - a
        if n == 0:
            continue
        keys = store[0, start : start + length].transpose(0, 1)[None]
        values = store[1, start : start + length].transpose(0, 1)[None]
        seen = torch.arange(length, device=q.device)[None] <= (
            torch.arange(n, device=q.device)[:, None] + (length - n)
        )
        o = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1)[None], keys, values, attn_mask=seen, scale=scaling,
            enable_gqa=q.shape[1] != keys.shape[1],
        )  # fmt: skip
        out[a:b] = o[0].transpose(0, 1)
    return out


AttentionInterface.register(NAME, packed_attention)

#: the vision towers' varlen attention; "flash" in the name makes transformers' Qwen-VL
#: vision attention take its varlen branch (``cu_seq_lens_q``), one call over every
#: image and window, instead of a ``scaled_dot_product_attention`` call per window
VISION_NAME = "vf_mm_flash_vision"


def varlen_vision_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Bidirectional attention within each segment (an image, or a window of one) of
    ``cu_seq_lens_q``: ``query`` / ``key`` / ``value`` ``(1, heads, T, dim)``, returns
    ``(1, T, heads, dim)``. On CUDA in half precision one varlen FlashAttention call;
    elsewhere ``scaled_dot_product_attention`` per segment, as transformers' own path.
    A call it would compute otherwise than asked (causal, with dropout, or keys segmented
    apart from the queries) is refused, never approximated."""
    cu = kwargs.get("cu_seq_lens_q")
    longest = kwargs.get("max_length_q")
    if cu is None or longest is None or attention_mask is not None:
        raise RuntimeError(
            "the varlen vision attention ran without its segments (cu_seq_lens_q): it "
            "serves only vision towers that pass them (the Qwen-VL families')"
        )
    keys = kwargs.get("cu_seq_lens_k", cu)
    if kwargs.get("is_causal") or dropout or (keys is not cu and not torch.equal(keys, cu)):
        raise RuntimeError(
            "the varlen vision attention computes bidirectional self-attention within "
            "segments, without dropout: this tower asked for causal attention, dropout or "
            "other key segments; run it with LocalBackend(varlen_vision=False)"
        )
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if flash_available(q.device, q.dtype):
        cu = cu.to(torch.int32)
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, int(longest), int(longest), 0.0, False, False, scale=scaling
        )[0]
        return out.unsqueeze(0), None
    bounds = cu.tolist()
    out = torch.empty_like(q)
    for a, b in itertools.pairwise(bounds):
        o = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=scaling
        )
        out[a:b] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(VISION_NAME, varlen_vision_attention)


class PackedModel:
    """A model's text layers switched to packed attention for the length of a forward
    (``packed``), and its vision tower's attention to one varlen call over all images
    (``varlen_vision``: a vision tower whose attention takes segments, the Qwen-VL
    families'): other callers of the model (Hugging Face ``generate``, a trainer's
    reference forward) see its own attention."""

    def __init__(self, model: PreTrainedModel, *, varlen_vision: bool = False) -> None:
        self.model = model
        # the vision attention modules' configs (a tower may hold its own copy)
        self.vision_configs: list[Any] = list(
            {
                id(m.config): m.config
                for m in model.modules()
                if type(m).__name__.endswith("VisionAttention")
                and "cu_seqlens" in inspect.signature(type(m).forward).parameters
            }.values()
        ) if varlen_vision else []  # fmt: skip
        config = model.config.get_text_config(decoder=True)
        layers = [
            m
            for m in model.modules()
            if hasattr(m, "layer_idx") and "Attention" in type(m).__name__
        ]
        self.layers = int(config.num_hidden_layers)
        self.config = config
        first = layers[0] if layers else None
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.kv_heads = int(heads)
        self.head_dim = int(getattr(first, "head_dim", 0) or 0)
        # keys and values of one width per head (the arena's layout); multi-head latent
        # attention (Kimi-K2.5's DeepSeek-V3 layers: keys of 80, values of 32) has none
        widths = {getattr(config, k, None) for k in ("qk_head_dim", "v_head_dim")} - {None}
        self.supported = (
            len(layers) == self.layers
            and all(m.config is config for m in layers)
            and self.head_dim > 0
            and widths <= {self.head_dim}
        )

    @contextlib.contextmanager
    def packed(self) -> Iterator[None]:
        """The text layers' attention is ``packed_attention``, and the vision tower's
        ``varlen_vision_attention`` where it takes segments, for this block."""
        with _switched([self.config], NAME), self.vision():
            yield

    def vision(self) -> contextlib.AbstractContextManager[None]:
        """The vision tower's attention is ``varlen_vision_attention`` for this block,
        where it takes segments (else nothing changes)."""
        return _switched(self.vision_configs, VISION_NAME)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        step: PackedStep,
        *,
        keep: torch.Tensor | int = 0,
        inputs: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """Logits ``(len(keep) or T, vocab)`` of a packed forward over ``ids`` ``(1, T)``."""
        with self.packed():
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=None,
                use_cache=False,
                logits_to_keep=keep,
                vf_mm_step=step,
                **(inputs or {}),
            )
        return out.logits[0]


@contextlib.contextmanager
def _switched(configs: list[Any], name: str) -> Iterator[None]:
    """``configs``' attention implementation is ``name`` for the block, restored after
    (an exception included)."""
    old = [c._attn_implementation_internal for c in configs]
    for config in configs:
        config._attn_implementation_internal = name
    try:
        yield
    finally:
        for config, value in zip(configs, old, strict=True):
            config._attn_implementation_internal = value


@dataclass(slots=True)
class Launched:
    """A decode step on its way: its sampled ``(2, rows)`` tokens and logprobs land in
    ``host`` once ``event`` has passed (None: already there)."""

    rows: int
    host: torch.Tensor
    event: torch.cuda.Event | None

    def read(self) -> tuple[list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()
        tokens, logprobs = self.host[:, : self.rows].tolist()
        return [int(t) for t in tokens], logprobs


class DecodeStep:
    """One decode step of up to ``max_rows`` sequences: their last tokens fed, each one's
    next token sampled (``sample_packed``: its temperature, its seed and token index,
    image tokens suppressed). Inputs go through fixed buffers; on CUDA each batch-size
    bucket (and KV-length bucket) is captured as a CUDA graph on first use and replayed
    after, elsewhere the same code runs eagerly.

    ``launch`` does not wait for the step: the sampled tokens come back through a pinned
    buffer (``Launched.read``), and a row may feed the token the step before sampled
    without the host having seen it (``previous``: its index in that step, read from
    ``last`` on the device), so the next step is on its way while the host reads this
    one's tokens. Host buffers alternate between two, so filling one never races the
    copy of the other."""

    # per-row integers in ``meta``: what each row of the fixed buffer means
    IDS, PREVIOUS, POSITION, WRITE, START, LENGTH, SEED, COUNTER = range(8)

    def __init__(
        self,
        packed: PackedModel,
        arena: KVArena,
        *,
        max_rows: int,
        mrope: bool,
        suppress: torch.Tensor,
        device: torch.device,
        reference: bool,
        graphs: bool,
    ) -> None:
        self.packed = packed
        self.arena = arena
        self.mrope = mrope
        self.device = device
        self.reference = reference
        self.graphs = graphs and not reference and device.type == "cuda"
        self.suppress = suppress.to(device)
        self.buckets = _buckets(max_rows)
        rows = self.buckets[-1]
        self.meta = torch.zeros((8, rows), dtype=torch.long, device=device)
        self.temperature = torch.zeros(rows, dtype=torch.float32, device=device)
        self.last = torch.zeros(rows, dtype=torch.long, device=device)  # the last step's tokens
        pin = device.type == "cuda"
        self._meta_host = [torch.zeros((8, rows), dtype=torch.long, pin_memory=pin) for _ in range(2)]  # fmt: skip
        self._temp_host = [torch.zeros(rows, dtype=torch.float32, pin_memory=pin) for _ in range(2)]
        self._out_host = [torch.zeros((2, rows), dtype=torch.float32, pin_memory=pin) for _ in range(2)]  # fmt: skip
        self._turn = 0
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}  # fmt: skip
        self._pool: Any = None
        self._warm: set[int] = set()
        self.captures = 0  # graphs captured, and the time it took
        self.capture_s = 0.0

    def launch(
        self,
        *,
        ids: Sequence[int],
        previous: Sequence[int],
        positions: Sequence[int],
        starts: Sequence[int],
        lengths: Sequence[int],
        seeds: Sequence[int],
        counters: Sequence[int],
        temperatures: Sequence[float],
        resample: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> Launched:
        """Feed row ``i`` token ``ids[i]`` (or, where ``previous[i] >= 0``, the token row
        ``previous[i]`` of the last step sampled) at position ``positions[i]`` into slot
        ``starts[i] + lengths[i] - 1`` of its range, attending over ``lengths[i]`` slots,
        and sample each row's next token by temperature (``resample``: another rule,
        given the step's logits ``(rows, vocab)``)."""
        n = len(ids)
        bucket = next(b for b in self.buckets if b >= n)
        turn = self._turn
        self._turn ^= 1
        host = self._meta_host[turn].numpy()
        host[:, :bucket] = 0
        host[self.IDS, :n] = ids
        host[self.PREVIOUS, :bucket] = -1
        host[self.PREVIOUS, :n] = previous
        host[self.POSITION, :n] = positions
        host[self.START, :n] = starts
        host[self.LENGTH, :n] = lengths
        host[self.WRITE, :n] = np.asarray(starts) + np.asarray(lengths) - 1
        host[self.SEED, :n] = seeds
        host[self.COUNTER, :n] = counters
        pad = slice(n, bucket)  # padding rows: one scratch slot each
        host[self.START, pad] = host[self.WRITE, pad] = self.arena.scratch
        host[self.LENGTH, pad] = 1
        temp = self._temp_host[turn].numpy()
        temp[:bucket] = 0
        temp[:n] = temperatures
        self.meta[:, :bucket].copy_(self._meta_host[turn][:, :bucket], non_blocking=True)
        self.temperature[:bucket].copy_(self._temp_host[turn][:bucket], non_blocking=True)
        max_k = kv_bucket(max(lengths), self.arena.capacity + 1)
        if not self.graphs:
            sample, logits = self._step(bucket, max_k)
        else:
            key = (bucket, max_k)
            if key not in self._graphs:
                self._graphs[key] = self._capture(bucket, max_k)
            graph, (sample, logits) = self._graphs[key]
            graph.replay()
        sample = sample[:, :n]
        if resample is not None:
            sample = resample(logits[:n])
            self.last[:n].copy_(sample[0].long())
        out = self._out_host[turn]
        out[:, :n].copy_(sample, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return Launched(n, out, event)

    def _step(self, bucket: int, max_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        meta = self.meta[:, :bucket]
        zero = torch.zeros(1, dtype=torch.int32, device=self.device)
        step = PackedStep(
            arena=self.arena,
            write=meta[self.WRITE],
            cu_q=torch.arange(bucket + 1, dtype=torch.int32, device=self.device),
            starts=torch.cat([meta[self.START].to(torch.int32), zero]),
            lengths=meta[self.LENGTH].to(torch.int32),
            max_q=1,
            max_k=max_k,
            host=self._host_lists(bucket) if self.reference else None,
        )
        previous = meta[self.PREVIOUS]
        fed = self.last.gather(0, previous.clamp(min=0))  # an index of the last step's rows
        ids = torch.where(previous >= 0, fed, meta[self.IDS])
        at = meta[self.POSITION][None, None]  # (1, 1, rows)
        positions = at.expand(3, 1, bucket) if self.mrope else at[0]
        logits = self.packed.forward(ids[None], positions, step)
        sample = sample_packed(
            logits,
            temperature=self.temperature[:bucket],
            seeds=meta[self.SEED],
            counters=meta[self.COUNTER],
            suppress=self.suppress,
        )
        self.last[:bucket].copy_(sample[0].long())
        return sample, logits

    def _host_lists(self, bucket: int) -> tuple[list[int], list[int], list[int]]:
        host = self._meta_host[self._turn ^ 1].numpy()  # the buffer this step filled
        return (
            list(range(bucket + 1)),
            host[self.START, :bucket].tolist(),
            host[self.LENGTH, :bucket].tolist(),
        )

    def _capture(
        self, bucket: int, max_k: int
    ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        """Capture the step for ``bucket`` rows. What ``meta`` holds now (this step's real
        rows) is what the warm-up run feeds, into the rows' own slots: the replay that
        follows writes the same values again. A batch size seen before needs no warm-up
        (only the attention's KV bound differs)."""
        started = time.perf_counter()
        if bucket not in self._warm:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            saved = self.last.clone()
            with torch.cuda.stream(stream):
                self._step(bucket, max_k)  # lazy inits, workspaces
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.last.copy_(saved)  # the warm-up's tokens are not the last step's
            self._warm.add(bucket)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._step(bucket, max_k)
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return graph, out

    def clear(self) -> None:
        """Forget every captured graph (they hold the weights' addresses)."""
        self._graphs.clear()
        self._pool = None
        self._warm.clear()


def _buckets(max_rows: int) -> list[int]:
    """Batch sizes a step is padded up to: 1, 2, 4, 8, then every multiple of 8."""
    sizes = [b for b in (1, 2, 4) if b < max_rows]
    sizes += list(range(8, max_rows + 8, 8))
    return sorted({min(s, max(8, -(-max_rows // 8) * 8)) for s in sizes})


def kv_bucket(longest: int, limit: int) -> int:
    """The KV length a step's attention is launched for: a power of two at least
    ``longest`` (few graphs, and a split-KV plan close to the real lengths)."""
    size = 1024
    while size < longest:
        size *= 2
    return min(size, limit)
