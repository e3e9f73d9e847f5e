"""Micro-batches: samples padded and packed to a token budget, as torch tensors.

Multimodal and text-only samples never share a micro-batch (so every rank of a data-
parallel step sees one kind of input, and text batches skip the vision tower). A
sample longer than ``max_seq_len`` is never cut through an image: ``truncate="error"``
(the default) refuses it naming the sample; ``truncate="image_boundary"`` cuts it at the
last image boundary (or any token, for text) before the limit, keeping only the images
wholly before the cut. Each sample's images stay as their model inputs
(``MicroBatch.images``); ``model_inputs()`` lays them out as the model family's forward
takes them (``vf_mm.models.model_inputs``: Qwen-VL's patch rows and grids, Gemma 3's
images and ``token_type_ids``, ...). ``TensorList`` is a list of tensors of different
lengths (one per sample).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

from vf_mm.errors import TrajectoryError
from vf_mm.models import family_info, model_inputs
from vf_mm.training._samples import Sample, concat_images


class TensorList:
    """A list of tensors of different lengths along dim 0 (one per sample).

    Args:
        tensors: The tensors.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = list(tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tensors[i]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.tensors)

    def to(self, *args: Any, **kwargs: Any) -> TensorList:
        return TensorList([t.to(*args, **kwargs) for t in self.tensors])

    def cat(self) -> torch.Tensor:
        return torch.cat(self.tensors) if self.tensors else torch.empty(0)

    @property
    def lengths(self) -> list[int]:
        return [int(t.shape[0]) for t in self.tensors]


@dataclass(slots=True)
class MicroBatch:
    """Right-padded tensors for one forward/backward pass.

    Attributes:
        input_ids: ``(B, L)`` int64.
        attention_mask: ``(B, L)`` int64.
        loss_mask: ``(B, L)`` float32: 1 on the tokens the sampler drew.
        logprobs: ``(B, L)`` float32: the sampler's, aligned with ``input_ids``.
        advantages: ``(B, L)`` float32.
        mm_token_type_ids: ``(B, L)`` int64.
        images: Per sample, each image's inputs (None for a text batch).
        sources: Per sample, the rollout and steps it came from (named in errors).
        family: The model family whose forward ``model_inputs()`` feeds.
        image_token_ids: The ids that take image embeddings.
        videos: Per sample, each video's inputs.
        video_token_ids: The ids that take video embeddings.
        order: Every image's and video's modality, in token order.
    """

    input_ids: torch.Tensor  # (B, L) int64
    attention_mask: torch.Tensor  # (B, L) int64
    loss_mask: torch.Tensor  # (B, L) float32
    logprobs: torch.Tensor  # (B, L) float32, the sampler's, aligned with input_ids
    advantages: torch.Tensor  # (B, L) float32
    mm_token_type_ids: torch.Tensor  # (B, L) int64
    images: list[list[dict[str, np.ndarray]]] | None  # per sample, each image's inputs
    sources: list[str]
    family: str = "qwen2_vl"  # the model family whose forward model_inputs() feeds
    image_token_ids: tuple[int, ...] = ()
    videos: list[list[dict[str, np.ndarray]]] | None = None  # per sample, each video's inputs
    video_token_ids: tuple[int, ...] = ()
    order: list[str] | None = None  # every image's and video's modality, in token order

    @property
    def is_multimodal(self) -> bool:
        return self.images is not None

    @property
    def pixel_values(self) -> TensorList | None:
        """Each sample's images' ``pixel_values``, concatenated per sample (None when they
        do not stack along axis 0)."""
        return self._per_sample("pixel_values")

    @property
    def image_grid_thw(self) -> TensorList | None:
        """Qwen-VL: each sample's image grids ``(images, 3)``."""
        return self._per_sample("image_grid_thw")

    def _per_sample(self, name: str) -> TensorList | None:
        """Each sample's images' ``name`` along axis 0; None when an image lacks it or
        they do not stack that way (SmolVLM's and LLaVA-OneVision's tiles: their layout is
        ``model_inputs()``'s)."""
        if self.images is None:
            return None
        out = []
        for images in self.images:
            stacked = concat_images(images, name)
            if stacked is None:
                return None
            out.append(torch.from_numpy(stacked))
        return TensorList(out)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """What the family's forward takes (each sample's images in order, samples in row
        order; Qwen-VL also gets ``mm_token_type_ids``, Gemma 3 ``token_type_ids``)."""
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.images is not None:
            flat = [image for images in self.images for image in images]
            videos = [video for per_sample in self.videos or [] for video in per_sample]
            extra = model_inputs(
                self.family,
                self.input_ids,
                flat,
                image_token_ids=self.image_token_ids,
                videos=videos,
                video_token_ids=self.video_token_ids,
                order=self.order or (),
            )
            if "mm_token_type_ids" in extra:  # exactly the samples' own marks
                marks = self.mm_token_type_ids
                if family_info(self.family).video_image_token:  # clips go in as images
                    marks = marks.clamp(max=1)
                extra["mm_token_type_ids"] = marks
            inputs.update(extra)
        return inputs


def make_batches(
    samples: Sequence[Sample],
    *,
    token_budget: int,
    pad_token_id: int,
    image_token_id: int,
    max_seq_len: int | None = None,
    truncate: Literal["error", "image_boundary"] = "error",
    merge_size: int = 2,
    family: str | None = None,
    video_token_id: int | None = None,
) -> list[MicroBatch]:
    """Validate, (maybe) truncate, and pack samples into micro-batches.

    Each micro-batch holds at most ``token_budget`` padded tokens (``B * L``),
    multimodal and text apart.

    Args:
        samples: The samples (``build_samples``).
        token_budget: The most padded tokens (``B * L``) in one micro-batch.
        pad_token_id: The id padding is filled with.
        image_token_id: The id at an image's embedding positions.
        max_seq_len: The longest sample; a longer one is never cut through an image.
        truncate: ``"error"`` refuses a sample over ``max_seq_len`` naming it;
            ``"image_boundary"`` cuts it before the image it would cut through (module
            docstring).
        merge_size: The vision tower's spatial merge (Qwen-VL: 2), which checks each
            image's pad count against its grid.
        family: The model's family (``vf_mm.models.model_type(checkpoint)``: the config's
            ``model_type``, but ``"glm46v"`` for GLM-4.6V's ``glm4v`` configs): it decides how
            ``MicroBatch.model_inputs()`` lays the images out for the forward. It may be
            left out only for Qwen-VL images (they carry ``image_grid_thw``); any other
            family's images without it are refused, since a wrong layout still runs (Gemma 3
            without its ``token_type_ids``) and silently changes every logprob.
        video_token_id: The token at a clip's embedding positions (``<|video_pad|>`` for
            Qwen-VL, ``<video>`` for LLaVA-OneVision, the image's token for SmolVLM and
            GLM-4.6V, whose frames hold it: ``renderer.vision.video_embed_token_id``); needed
            when samples hold videos.

    Raises:
        TrajectoryError: A sample that breaks its rules (``Sample.validate``), or is over
            ``max_seq_len`` with ``truncate="error"``.
    """
    from vf_mm.models import family_info

    if family is None:
        family = _qwen_or_refuse(samples)
    info = family_info(family)  # an unknown family fails here
    for sample in samples:
        for modality, items, expected in (
            ("images", sample.images, set(info.image_inputs)),
            ("videos", sample.videos, set(info.video_inputs)),
        ):
            if not expected and items:
                raise TrajectoryError(f"{sample.source}: a {family} forward takes no videos")
            if any(set(item) != expected for item in items):
                raise TrajectoryError(
                    f"{sample.source}: its {modality}' inputs are not a {family} forward's "
                    f"({sorted(expected)}): family= must be the model that made them"
                )
    ready = []
    for sample in samples:
        if max_seq_len is not None and sample.num_tokens > max_seq_len:
            sample = _truncate(sample, max_seq_len, truncate)
        sample.validate(
            image_token_id=image_token_id,
            merge_size=merge_size,
            video_token_id=video_token_id,
            video_pooled_chunks=info.video_pooled_chunks,
        )
        ready.append(sample)
    ids = (image_token_id, video_token_id)
    batches = []
    for kind in (True, False):
        group = sorted((s for s in ready if s.is_multimodal == kind), key=lambda s: -s.num_tokens)
        current: list[Sample] = []
        for sample in group:
            width = max([s.num_tokens for s in current] + [sample.num_tokens])
            if current and width * (len(current) + 1) > token_budget:
                batches.append(_collate(current, pad_token_id, family, ids))
                current = []
            if sample.num_tokens > token_budget:
                raise TrajectoryError(
                    f"{sample.source}: {sample.num_tokens} tokens exceed the token budget {token_budget}"
                )
            current.append(sample)
        if current:
            batches.append(_collate(current, pad_token_id, family, ids))
    return batches


def _qwen_or_refuse(samples: Sequence[Sample]) -> str:
    for sample in samples:
        if sample.videos:
            raise TrajectoryError(
                f"{sample.source}: it holds videos: pass make_batches(..., "
                "family=vf_mm.models.model_type(checkpoint)) so the forward gets them in its "
                "own layout"
            )
        if any("image_grid_thw" not in image for image in sample.images):
            raise TrajectoryError(
                f"{sample.source}: its images are not Qwen-VL's (no image_grid_thw): pass "
                "make_batches(..., family=vf_mm.models.model_type(checkpoint)) so the forward "
                "gets them in its own layout"
            )
    return "qwen2_vl"


def _collate(
    samples: Sequence[Sample], pad_token_id: int, family: str, ids: tuple[int, int | None]
) -> MicroBatch:
    image_token_id, video_token_id = ids
    width = max(s.num_tokens for s in samples)

    def pad(name: str, value: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.full((len(samples), width), value, dtype=dtype)
        for row, s in enumerate(samples):
            out[row, : s.num_tokens] = torch.from_numpy(np.ascontiguousarray(getattr(s, name)))
        return out

    attention = torch.zeros((len(samples), width), dtype=torch.long)
    for row, s in enumerate(samples):
        attention[row, : s.num_tokens] = 1
    multimodal = samples[0].is_multimodal
    return MicroBatch(
        input_ids=pad("input_ids", pad_token_id, torch.long),
        attention_mask=attention,
        loss_mask=pad("loss_mask", 0, torch.float32),
        logprobs=pad("logprobs", 0.0, torch.float32),
        advantages=pad("advantages", 0.0, torch.float32),
        mm_token_type_ids=pad("mm_token_type_ids", 0, torch.long),
        images=[list(s.images) for s in samples] if multimodal else None,
        sources=[s.source for s in samples],
        family=family,
        image_token_ids=(image_token_id,),
        videos=[list(s.videos) for s in samples] if multimodal else None,
        video_token_ids=(video_token_id,) if video_token_id is not None else (),
        order=[m for s in samples for m in s.item_order()] if multimodal else None,
    )


def _truncate(sample: Sample, limit: int, policy: str) -> Sample:
    ranges = [*sample.placeholders, *sample.video_placeholders]
    inside = [p for p in ranges if p.offset < limit]
    straddles = any(p.end > limit for p in inside)
    if policy == "error":
        what = "through an image or video" if straddles else "its tokens"
        raise TrajectoryError(
            f"{sample.source}: {sample.num_tokens} tokens exceed max_seq_len {limit}; cutting would "
            f"lose {what} (pass truncate='image_boundary' to cut at an image boundary)"
        )
    cut = limit
    if straddles:
        cut = max(p.offset for p in inside if p.end > limit)
    kept = [p for p in sample.placeholders if p.end <= cut]
    kept_videos = [p for p in sample.video_placeholders if p.end <= cut]
    return replace(
        sample,
        input_ids=sample.input_ids[:cut],
        loss_mask=sample.loss_mask[:cut],
        logprobs=sample.logprobs[:cut],
        advantages=sample.advantages[:cut],
        mm_token_type_ids=sample.mm_token_type_ids[:cut],
        images=sample.images[: len(kept)],
        placeholders=kept,
        videos=sample.videos[: len(kept_videos)],
        video_placeholders=kept_videos,
        source=f"{sample.source} (cut at token {cut})",
    )


_HINTS = {
    "advantages": "build samples with finite advantages (vf_mm.training.group_advantages)",
    "logprobs": "the sampler's logprobs (a backend asked with SamplingParams(logprobs=False) "
    "records NaN: sample with logprobs on)",
}


def first_non_finite(
    batch: MicroBatch, values: torch.Tensor, *, where: torch.Tensor | None = None
) -> tuple[str, int, int, int] | None:
    """``(sample, row, token, count)`` of the first NaN or infinity in ``values`` (a
    ``(B, L)`` tensor of ``batch``'s shape; only where ``where`` is true), or None: what an
    error about a non-finite value names."""
    bad = ~torch.isfinite(values)
    if where is not None:
        bad &= where
    if not bool(bad.any()):
        return None
    row, token = (int(i) for i in bad.nonzero()[0])
    source = batch.sources[row] if row < len(batch.sources) else f"row {row}"
    return source, row, token, int(bad.sum())


def check_finite(batch: MicroBatch, fields: tuple[str, ...]) -> None:
    """Refuse ``batch`` if one of ``fields`` holds a NaN or an infinity, naming the field,
    the sample it is in (``batch.sources``) and the token."""
    for name in fields:
        values = getattr(batch, name)
        found = first_non_finite(batch, values)
        if found is not None:
            source, row, token, count = found
            raise TrajectoryError(
                f"{source}: the batch's {name} hold {float(values[row, token])} at token "
                f"{token} (row {row}; {count} such values in all): "
                f"{_HINTS.get(name, 'every value must be finite')}"
            )
