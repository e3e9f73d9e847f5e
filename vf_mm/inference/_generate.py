"""The local backend's engine for families it cannot batch row by row: Hugging Face
``generate``, each batch re-encoded whole (no prefix cache).

**Gemma 3** (its attention over an image's tokens is bidirectional and built from the
token types of one forward's input, and half its layers use a sliding window, which a
padded batch of rows with different lengths would misplace), and any model with
sliding-window layers, run here. The per-row rules still hold: ``RowSampler`` samples
each row by its own request's rules and keeps the raw logprobs, ``RowStopper`` stops
each row at its own stop ids or length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vf_mm.inference._local_model import LocalModel, request_media
from vf_mm.inference._rows import Pending, answer
from vf_mm.inference._sampling import RowSampler, RowStopper, Seeds
from vf_mm.inference._types import GenerateRequest, GenerateResult, Usage
from vf_mm.models import forward_inputs


class GenerateEngine:
    """Runs batches of requests through ``model``'s ``generate``, each row seeded from
    ``seeds``."""

    def __init__(self, model: LocalModel, *, seeds: Seeds) -> None:
        self._model = model
        self._seeds = seeds

    def run(self, batch: list[Pending]) -> None:
        """Answer every request of ``batch``: its result, or the batch's error (a bad
        batch fails its requests, never the worker)."""
        try:
            results: list[Any] = self._generate([p.request for p in batch])
        except Exception as exc:
            results = [self._model.failure(exc)] * len(batch)
        for pending, result in zip(batch, results, strict=True):
            answer(pending, result)

    @torch.no_grad()
    def _generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        m = self._model
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), m.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):  # left padding: every prompt ends at the same column
            input_ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention[row, width - len(r.prompt_ids) :] = 1
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention}
        if m.is_multimodal:
            media = [item for r in requests for item in request_media(r)]
            inputs.update(m.media_inputs(input_ids, media))
        inputs = {k: v.to(m.device) for k, v in inputs.items()}
        # the features transformers' forward would compute wrong (Kimi-K2.5's multi-frame
        # chunks) computed by vf_mm; generate passes mm_encoder_outputs to its prefill
        inputs = forward_inputs(m.family, m.model, inputs)
        sampling = [r.sampling for r in requests]
        generators = [self._seeds.generator(self._seeds.seed(s)) for s in sampling]
        sampler = RowSampler(
            sampling, generators, m.suppress_token_ids, [m.extra_bans(r) for r in requests]
        )
        stop_ids = [m.eos_token_ids | set(s.stop_token_ids) for s in sampling]
        stopper = RowStopper(stop_ids, [s.max_tokens for s in sampling], width)
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(s.max_tokens for s in sampling),
            pad_token_id=m.pad_token_id,
            eos_token_id=None,
        )
        output = m.model.generate(
            **inputs,
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
                    stop_reason = None if token in m.eos_token_ids else token
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
