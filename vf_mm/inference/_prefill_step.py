"""A packed prefill's text stack replayed as a CUDA graph per token-count bucket.

An eager packed prefill of a 3B model launches a few thousand kernels from Python, about
35 ms on an H100 whatever the number of new tokens; most of the pool engine's prefills
hold a few hundred tokens (a turn's new image and text for a handful of rows), so that
fixed cost, paid while every decoding row waits, is most of a prefill. ``PrefillStep``
replays the text stack instead.

What stays eager is everything whose shapes or control flow follow the data: the
model's own forward embeds the ids, runs the vision tower (or takes its cached outputs)
and scatters the features in, then calls its decoder (``model.get_decoder()``, the
stack of text layers). That call is answered here (``installed``): its
``inputs_embeds`` (or ``input_ids``, for a model whose decoder embeds them itself) and
``position_ids`` are copied into fixed buffers of ``bucket`` tokens, and the graph
captured for that bucket replays the decoder over them. The model then applies its head
to the kept positions, eagerly, as before.

Padding is one more sequence of the packed stream: its tokens follow the real ones,
write their keys and values to the arena's scratch slot and attend over that one slot,
causally with the new tokens last, so no padding token sees a key (FlashAttention gives
such a query zeros) and no real token sees a padding one. Every per-token operation
(norms, projections, MLPs) is unchanged by the rows beside it, so the real tokens'
outputs are the eager forward's up to the kernels the larger shape picks (bfloat16
rounding on the GPU).

Qwen3-VL's decoder also adds its tower's deepstack features to the hidden states of
its first layers at the image positions, through a boolean index (a host sync, which a
graph cannot hold). Here each layer's features are scattered eagerly into a dense
buffer, zero elsewhere, and the graph adds that buffer whole: the same sums at the
image positions, and ``x + 0 == x`` at every other one.

A decoder call the graph would not compute as asked is run eagerly, unchanged: one with
an input the buffers do not hold (Qwen3-VL-MoE's passes its router's
``output_router_logits``), a stream over the largest bucket, a call from another thread
or of another length than the installed stream, or a model whose capture failed (the
reason is kept in ``PrefillStep.refused``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutputWithPast

from vf_mm.inference._arena import KVArena
from vf_mm.inference._packed import PackedModel, PackedStep, kv_bucket

#: the token counts a prefill is padded up to; a longer one runs eagerly (its kernels are
#: long enough that launching them from Python no longer shows)
TOKEN_BUCKETS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)

# the decoder call's arguments a graph answers (``logits_to_keep``, which LLaVA-OneVision
# passes on, is its head's, not the decoder's): every other one must be None (or False)
_FED = ("input_ids", "inputs_embeds", "position_ids", "vf_mm_step", "logits_to_keep")
# Qwen3-VL's deepstack inputs, answered where the decoder adds them by ``_deepstack_process``
_DEEPSTACK = ("visual_pos_masks", "deepstack_visual_embeds")
_NONE_OR_FALSE = ("attention_mask", "past_key_values", "cache_position", "use_cache",
                  "output_attentions", "output_hidden_states")  # fmt: skip


@dataclass(slots=True)
class _Graph:
    """One captured bucket: its graph and where it leaves the decoder's output (a view of
    the step's one output buffer, read before the next replay)."""

    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor


class PrefillStep:
    """The decoder of ``packed``'s model over fixed buffers of up to ``max_tokens`` new
    tokens in at most ``max_rows`` sequences, on ``arena`` (module docstring).

    ``graphs``: capture each (token bucket, KV-length bucket, input kind) on first use and
    replay it; False runs the same padded path eagerly (what the CPU tests check against
    the unpadded forward)."""

    def __init__(
        self,
        packed: PackedModel,
        arena: KVArena,
        *,
        max_rows: int,
        max_tokens: int,
        mrope: bool,
        device: torch.device,
        graphs: bool,
        reference: bool,
    ) -> None:
        self.packed = packed
        self.arena = arena
        self.decoder = packed.model.get_decoder()
        self.mrope = mrope
        self.device = device
        self.graphs = graphs and device.type == "cuda" and not reference
        self.reference = reference
        self.buckets = [b for b in TOKEN_BUCKETS if b <= max_tokens]
        self.rows = max_rows + 1  # the real sequences and the padding one
        hidden = int(packed.config.hidden_size)
        top = self.buckets[-1] if self.buckets else 0
        dtype = packed.model.dtype
        self._embeds = torch.zeros((1, top, hidden), dtype=dtype, device=device)
        # every graph's output, copied here inside the graph: a graph's own output would
        # stay allocated in the shared pool, one per captured key (~55 MB a KV bucket and
        # input kind for a 3B model), outside the arena's budget
        self._out = torch.zeros_like(self._embeds) if self.graphs else self._embeds
        # Qwen3-VL's deepstack features, one dense (1, top, hidden) per level (on first use)
        self._deep: list[torch.Tensor] = []
        self._ids = torch.zeros((1, top), dtype=torch.long, device=device)
        self._positions = torch.zeros((3 if mrope else 1, 1, top), dtype=torch.long, device=device)  # fmt: skip
        # cu_q (rows + 1), starts (rows + 1), lengths (rows): int32, as FlashAttention
        # reads them; the write slots (top): int64, as index_copy_ does
        pin = device.type == "cuda"
        self._meta = torch.zeros(3 * self.rows + 2, dtype=torch.int32, device=device)
        self._meta_host = torch.zeros(3 * self.rows + 2, dtype=torch.int32, pin_memory=pin)
        self._write = torch.zeros(top, dtype=torch.int64, device=device)
        self._write_host = torch.zeros(top, dtype=torch.int64, pin_memory=pin)
        self._graphs: dict[tuple[int, int, str], _Graph] = {}
        self._pool: Any = None
        self._step: tuple[PackedStep, int, int] | None = None  # the step being answered
        # who is answered: the installing thread's call of the stream's own length
        self._caller: tuple[int, int] = (0, 0)  # (thread ident, tokens)
        self.captures = 0  # graphs captured, and the time it took
        self.capture_s = 0.0
        self.replays = 0  # prefills answered from the buffers
        self.refused: str | None = None  # why captures stopped (a failed one), if they did

    def serves(self, tokens: int, rows: int) -> bool:
        """Whether a prefill of ``tokens`` new tokens in ``rows`` sequences runs here."""
        return bool(self.buckets) and tokens <= self.buckets[-1] and rows < self.rows

    @contextlib.contextmanager
    def installed(
        self, *, starts: Sequence[int], cached: Sequence[int], new: Sequence[int]
    ) -> Iterator[None]:
        """For this block the decoder's calls are answered from the buffers, for a
        prefill whose sequence ``i`` owns the range at ``starts[i]``, holds ``cached[i]``
        tokens already and brings ``new[i]`` (the eager ``PackedStep`` it is called with
        is then not read). Only this thread's call of ``sum(new)`` tokens is answered:
        every thread sees the instance's ``forward``, and another caller of the model
        (or another length) runs the class's forward, never over these buffers."""
        tokens = int(sum(new))
        bucket = next(b for b in self.buckets if b >= tokens)
        max_k = kv_bucket(max(c + n for c, n in zip(cached, new, strict=True)), self.arena.capacity + 1)  # fmt: skip
        self._step = (self._fill(bucket, starts, cached, new), bucket, max_k)
        self._caller = (threading.get_ident(), tokens)
        earlier = self.decoder.__dict__.get("forward")  # a hook's, put back after
        self.decoder.forward = self._forward  # the instance's, over the class's
        try:
            yield
        finally:
            if earlier is None:
                del self.decoder.forward
            else:
                self.decoder.forward = earlier
            self._step = None

    def _fill(
        self, bucket: int, starts: Sequence[int], cached: Sequence[int], new: Sequence[int]
    ) -> PackedStep:
        """The padded step over the buffers: the real sequences, then one of ``bucket -
        sum(new)`` padding tokens on the scratch slot, then empty ones up to ``rows``."""
        n, rows, scratch = len(new), self.rows, self.arena.scratch
        meta = self._meta_host.numpy()
        cu, first, lengths = meta[: rows + 1], meta[rows + 1 : 2 * rows + 2], meta[2 * rows + 2 :]
        cu[0] = 0
        np.cumsum(new, out=cu[1 : n + 1])
        cu[n + 1 :] = bucket  # the padding sequence ends the stream, the rest are empty
        first[:n] = starts
        first[n:] = scratch
        lengths[:n] = np.asarray(cached) + np.asarray(new)
        lengths[n:] = 1
        write = self._write_host.numpy()
        at = 0
        for s, c, k in zip(starts, cached, new, strict=True):
            write[at : at + k] = np.arange(s + c, s + c + k)
            at += k
        write[at:bucket] = scratch
        # the host buffers are refilled only at the next prefill, after this one's tokens
        # were read back (a sync): the copies have landed by then
        self._meta.copy_(self._meta_host, non_blocking=True)
        self._write[:bucket].copy_(self._write_host[:bucket], non_blocking=True)
        return PackedStep(
            arena=self.arena,
            write=self._write[:bucket],
            cu_q=self._meta[: rows + 1],
            starts=self._meta[rows + 1 : 2 * rows + 2],
            lengths=self._meta[2 * rows + 2 :],
            max_q=bucket,
            max_k=0,  # set per call: the graph's KV bucket
            host=(cu.tolist(), first.tolist(), lengths.tolist()) if self.reference else None,
        )

    def _forward(self, **kwargs: Any) -> BaseModelOutputWithPast:
        """The decoder's forward, answered from the buffers (or run as it is, module
        docstring)."""
        # another thread may have found this forward during a block and call it after:
        # with no step installed it is answered as any call outside a prefill
        installed = self._step
        if installed is None:
            return type(self.decoder).forward(self.decoder, **kwargs)
        step, bucket, max_k = installed
        kind = "embeds" if kwargs.get("inputs_embeds") is not None else "ids"
        fed = kwargs.get("inputs_embeds" if kind == "embeds" else "input_ids")
        extra = [
            k for k, v in kwargs.items()
            if k not in _FED and v is not None
            and not (k in _NONE_OR_FALSE and v is False)
        ]  # fmt: skip
        positions = kwargs.get("position_ids")
        if positions is not None and positions.dim() == 2:
            positions = positions[None]
        deepstack = kwargs.get("deepstack_visual_embeds") is not None
        if deepstack and set(extra) == set(_DEEPSTACK) and hasattr(self.decoder, "_deepstack_process"):  # fmt: skip
            extra = []
            kind += "+deepstack"
        if (
            extra
            or fed is None
            or positions is None
            or positions.shape[0] != self._positions.shape[0]
            or self.refused is not None
            or (threading.get_ident(), fed.shape[1]) != self._caller
        ):
            return type(self.decoder).forward(self.decoder, **kwargs)
        tokens = fed.shape[1]
        source = self._ids if kind == "ids" else self._embeds
        source[:, :tokens].copy_(fed)
        self._positions[:, :, :tokens].copy_(positions)
        self._positions[:, :, tokens:bucket].zero_()
        if deepstack:
            self._scatter_deepstack(kwargs["visual_pos_masks"], kwargs["deepstack_visual_embeds"], bucket)  # fmt: skip
        step.max_k = max_k
        key = (bucket, max_k, kind)
        if not self.graphs:
            hidden = self._run(step, bucket, kind)
        else:
            graph = self._graphs.get(key)
            if graph is None:
                try:
                    graph = self._graphs[key] = self._capture(step, bucket, kind)
                except RuntimeError as exc:  # a decoder with a data-dependent step
                    self.refused = f"{type(exc).__name__}: {exc}"
                    return type(self.decoder).forward(self.decoder, **kwargs)
            graph.graph.replay()
            hidden = graph.hidden
        self.replays += 1
        return BaseModelOutputWithPast(last_hidden_state=hidden[:, :tokens])

    def _scatter_deepstack(
        self, masks: torch.Tensor, levels: Sequence[torch.Tensor], bucket: int
    ) -> None:
        """Each level's features at the image positions of its dense buffer, zeros at
        every other position (eager: the boolean index syncs the host)."""
        if len(self._deep) != len(levels):
            top, hidden = self._embeds.shape[1:]
            self._deep = [self._embeds.new_zeros((1, top, hidden)) for _ in levels]
        where = masks.reshape(-1).to(self.device)
        for dense, features in zip(self._deep, levels, strict=True):
            dense[:, :bucket].zero_()
            dense[0, : where.shape[0]][where] = features.to(self.device, dense.dtype)

    def _run(self, step: PackedStep, bucket: int, kind: str) -> torch.Tensor:
        """The decoder over the first ``bucket`` positions of the buffers."""
        positions = self._positions[:, :, :bucket]
        fed: dict[str, Any] = (
            {"input_ids": self._ids[:, :bucket]}
            if kind == "ids"
            else {"inputs_embeds": self._embeds[:, :bucket]}
        )
        added: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if kind.endswith("+deepstack"):
            fed["deepstack_visual_embeds"] = [dense[:, :bucket] for dense in self._deep]
            fed["visual_pos_masks"] = None  # read only by the dense addition below
            added = _dense_deepstack(self.decoder)
        with added:
            out = type(self.decoder).forward(
                self.decoder,
                position_ids=positions if self.mrope else positions[0],
                attention_mask=None,
                use_cache=False,
                vf_mm_step=step,
                **fed,
            )
        hidden: torch.Tensor = out.last_hidden_state
        return hidden

    def _capture(self, step: PackedStep, bucket: int, kind: str) -> _Graph:
        """Warm up, then capture, the decoder for this bucket: the warm-up writes this
        prefill's own keys and values to its own slots, as the replay that follows does."""
        started = time.perf_counter()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._run(step, bucket, kind)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._out[:, :bucket].copy_(self._run(step, bucket, kind))
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return _Graph(graph, self._out[:, :bucket])

    def describe(self) -> dict[str, Any]:
        """What the prefill graphs cost and served, for benches and ``/metrics``."""
        return {
            "prefill_graphs_captured": self.captures,
            "prefill_capture_s": round(self.capture_s, 2),
            "prefills_replayed": self.replays,
            "prefill_graphs_refused": self.refused,
        }

    def clear(self) -> None:
        """Forget every captured graph (they hold the weights' addresses)."""
        self._graphs.clear()
        self._pool = None


@contextlib.contextmanager
def _dense_deepstack(decoder: torch.nn.Module) -> Iterator[None]:
    """For the block, ``decoder._deepstack_process`` adds a dense level (zeros away from
    the image positions) to the whole hidden state, where Qwen3-VL's own adds the image
    positions' features through a boolean index: the same sums, with no host sync."""

    def dense(hidden: torch.Tensor, masks: object, features: torch.Tensor) -> torch.Tensor:
        return hidden + features

    decoder._deepstack_process = dense  # type: ignore[assignment]
    try:
        yield
    finally:
        del decoder._deepstack_process
