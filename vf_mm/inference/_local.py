"""``LocalBackend``: an in-process transformers model that batches concurrent requests.

The embedded default backend, the CPU development backend, and what ``vf-mm serve``
exposes. Requests are queued from the event loop to one worker thread (the model
never runs on the loop); the worker takes the first waiting request, collects
whatever else arrives within ``batch_window_ms`` (up to ``max_batch``), and generates
for all of them in one left-padded batch. Each row keeps its own sampling rules,
seed and stop tokens (``_sampling.RowSampler``), image and vision tokens are never
sampled, and each row's raw log-probabilities come back with its tokens.

``load_weights`` swaps weights in place between batches (a trainer pushing a new
policy): a batch never mixes two versions, and ``weights_version`` counts swaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vf_mm.errors import BackendError
from vf_mm.inference._sampling import RowSampler, RowStopper
from vf_mm.inference._types import (
    GenerateRequest,
    GenerateResult,
    Usage,
    check_prompt_length,
)


@dataclass(slots=True)
class _Pending:
    request: GenerateRequest
    future: asyncio.Future[GenerateResult]
    loop: asyncio.AbstractEventLoop


class LocalBackend:
    """Serve a transformers model in-process. ``model`` is a checkpoint directory (any
    ``build_tiny_vlm`` / ``build_tiny_lm`` output, or a real Qwen-VL / causal LM).

    Prompts arrive as token ids with their images' ``pixel_values`` / ``image_grid_thw``
    in ``multi_modal_data`` (as a ``vf_mm`` renderer produces them).
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
        self.device = device
        config = self.model.config
        text_config = getattr(config, "text_config", config)
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self.is_multimodal = family in VISION_FAMILIES
        self.family = family
        self.image_token_id = _config_id(config, "image_token")
        self.video_token_id = _config_id(config, "video_token")
        if self.is_multimodal and family_info(family).frames_as_images:
            self.video_token_id = self.image_token_id  # SmolVLM: a clip's frames are images
        # the model must never sample an image's own tokens: they need image inputs
        self.suppress_token_ids = [
            i
            for i in (
                self.image_token_id,
                _config_id(config, "video_token"),
                _config_id(config, "vision_start_token"),
                _config_id(config, "vision_end_token"),
                _config_id(config, "boi_token"),
                _config_id(config, "eoi_token"),
            )
            if i is not None
        ]
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
        self.batches_run = 0
        self.busy_s = 0.0  # wall time the worker spent generating (model time)
        self._seeds = np.random.default_rng(seed)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._weights_lock = threading.Lock()
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
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateResult] = loop.create_future()
        self._queue.put(_Pending(request, future, loop))
        return await future

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
        """Replace the model's weights in place, between batches."""
        with self._weights_lock, torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=strict)
            self.weights_version += 1

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            await asyncio.to_thread(self._worker.join, 30)

    # -- the worker thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                try:
                    item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(item)
            batch = [p for p in batch if not p.future.cancelled()]
            if not batch:
                continue
            started = time.perf_counter()
            try:
                with self._weights_lock:
                    results: list[Any] = self._generate([p.request for p in batch])
            except Exception as exc:  # a bad batch fails its requests, never the worker
                results = [
                    BackendError(f"local generation failed: {exc!r}", backend=self.name)
                ] * len(batch)
            self.batches_run += 1
            self.busy_s += time.perf_counter() - started
            for pending, result in zip(batch, results, strict=True):
                # a RuntimeError means the caller's event loop is gone: nobody waits for it
                with contextlib.suppress(RuntimeError):
                    pending.loop.call_soon_threadsafe(_resolve, pending.future, result)

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
            inputs.update(self._vision_inputs(requests, input_ids))
        sampling = [r.sampling for r in requests]
        generators = [
            torch.Generator().manual_seed(
                s.seed if s.seed is not None else int(self._seeds.integers(2**63))
            )
            for s in sampling
        ]
        sampler = RowSampler(sampling, generators, self.suppress_token_ids)
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

    def _check_images(self, request: GenerateRequest) -> None:
        data = request.multi_modal_data
        if not self.is_multimodal:
            if data is not None and not data.is_empty:
                raise BackendError(
                    f"{self.path.name} is a text model: it takes no images", backend=self.name
                )
            return
        from vf_mm.models import family_info

        video_pixels = (family_info(self.family).video_inputs or ("pixel_values_videos",))[0]
        kinds = (("image", self.image_token_id, "pixel_values"),
                 ("video", self.video_token_id, video_pixels))  # fmt: skip
        for modality, token, pixels in kinds:
            ranges = data.mm_placeholders.get(modality, []) if data else []
            if ranges and token is None:
                raise BackendError(f"{self.path.name} takes no {modality}", backend=self.name)
            expected = sum(p.num_embeds for p in ranges)
            if self.video_token_id == self.image_token_id and data is not None:
                # SmolVLM: a clip's frames take the image token, so both kinds count
                expected = sum(p.num_embeds for m in ("image", "video")
                               for p in data.mm_placeholders.get(m, []))  # fmt: skip
            pads = request.prompt_ids.count(token) if token is not None else 0
            if pads != expected:
                raise BackendError(
                    f"prompt has {pads} {modality} pad tokens but its multi-modal data covers "
                    f"{expected}",
                    backend=self.name,
                )
            for i, item in enumerate(data.mm_items.get(modality, []) if data else []):
                if not item or item.get(pixels) is None:
                    raise BackendError(
                        f"{modality} {i} has no {pixels} (this backend needs the processed "
                        "inputs, not only hashes)",
                        backend=self.name,
                    )

    def _vision_inputs(
        self, requests: Sequence[GenerateRequest], input_ids: torch.Tensor
    ) -> dict[str, Any]:
        from vf_mm.models import model_inputs

        def items(modality: str) -> list[Any]:
            return [
                item
                for r in requests
                if r.multi_modal_data is not None
                for item in r.multi_modal_data.mm_items.get(modality, [])
            ]

        try:
            return model_inputs(
                self.family,
                input_ids,
                items("image"),
                image_token_ids=[self.image_token_id],
                dtype=next(self.model.parameters()).dtype,
                videos=items("video"),
                video_token_ids=[self.video_token_id] if self.video_token_id is not None else [],
                order=[
                    modality
                    for r in requests
                    if r.multi_modal_data is not None
                    for modality, _, _ in r.multi_modal_data.all_placeholders()
                ],
            )
        except (KeyError, ValueError) as exc:
            raise BackendError(
                f"the images' and videos' inputs do not make one batch: {exc}", backend=self.name
            ) from None


def _config_id(config: Any, name: str) -> int | None:
    """A special token's id from a model config (``<name>_id``, or Gemma's
    ``<name>_index``), None when the config has none."""
    for key in (f"{name}_id", f"{name}_index"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def _resolve(future: asyncio.Future[GenerateResult], result: Any) -> None:
    if future.done():
        return  # cancelled while it ran
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
