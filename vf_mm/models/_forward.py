"""``forward_inputs``: what a family's forward takes, where transformers' own path is wrong.

``model_inputs`` lays a batch out as the family's processor does; transformers' forward
then computes the vision features itself. For one case that computation is wrong in
transformers 5.23, so vf_mm computes the features and hands them to the forward as
``mm_encoder_outputs`` (the argument transformers has for precomputed features):

Kimi-K2.5 clips whose chunks keep several frames (``video_grid_thw`` rows ``(t, h, w)``
with ``t`` > 1). MoonViT pools a chunk's ``t`` frames into one frame's tokens, which its
vision tower computes right, but

1. ``Kimi_K25Model.get_image_features`` (``modeling_kimi_k25.py:601``) splits the pooled
   output into ``t * h * w / merge**2`` tokens a chunk where the tower returns
   ``h * w / merge**2`` (``split_with_sizes`` fails), and
2. ``get_vision_temporal_merge_index`` (``modeling_kimi_k25.py:441-465``) concatenates
   each chunk's ``(tokens, t, merge**2)`` gather index, which fails for chunks of
   different lengths (a clip of 6 frames: chunks of 4 and 2).

So the model's own tower runs once per chunk length, its pooled output is split by one
frame's merged patches a chunk (the tokens the prompt holds, as vLLM's MoonViT
``tpool_patch_merger`` and the processor's text count them), and the model's own
projector maps them; images in the same batch go through ``get_image_features``, which is
right for them (the forward takes precomputed outputs for both modalities or for
neither). Every other input is transformers' own path, untouched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["forward_inputs"]


def forward_inputs(family: str, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs ``model``'s forward takes for a batch: ``inputs`` (``model_inputs``'
    layout, on the model's device) with pixel inputs replaced by ``mm_encoder_outputs``
    only where transformers' own forward computes them wrong, else ``inputs`` itself.

    Invariant: ``model(**forward_inputs(family, model, inputs))`` gives the logits the
    family's reference computation gives (MoonViT's, for Kimi-K2.5), and is
    ``model(**inputs)`` wherever transformers' forward is right. The one case replaced
    is Kimi-K2.5's clips whose chunks keep several frames, on which transformers 5.23's
    forward fails (``get_image_features`` splits the temporally pooled tower output by
    ``frames * patches`` a chunk, ``modeling_kimi_k25.py:601``, and
    ``get_vision_temporal_merge_index`` cannot join chunks of different lengths,
    ``modeling_kimi_k25.py:441-465``): there the features come from the model's own
    vision tower and projector, run here, so gradients flow through both as through
    transformers' path (call it under ``torch.no_grad()`` for inference only).

    Args:
        family: The model's family (``vf_mm.models.model_type``); decides the rule, never
            the inputs' shapes.
        model: The family's transformers model (``...ForConditionalGeneration``).
        inputs: What the forward would take (``input_ids``, ``attention_mask``, the
            image and video inputs, ...), tensors on the model's device.
    """
    if family != "kimi_k25":
        return inputs
    grid = inputs.get("video_grid_thw")
    if grid is None or not bool((grid[:, 0] > 1).any()):
        return inputs
    return _kimi_k25_encoded(model, inputs)


def _kimi_k25_encoded(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` with Kimi-K2.5's pixels replaced by ``mm_encoder_outputs`` (the module
    docstring): one ``BaseModelOutputWithPooling`` a modality, its ``pooler_output`` one
    ``(tokens, hidden)`` tensor per clip chunk (per image), in order."""
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    inner = model.model
    tower, projector = inner.vision_tower, inner.mm_projector
    kh, kw = tower.merge_kernel_size
    out = dict(inputs)
    pixels, grid = out.pop("pixel_values_videos"), out.pop("video_grid_thw")
    pixels = pixels.to(projector.in_proj.weight.dtype)
    tokens = [(h // kh) * (w // kw) for _, h, w in grid.tolist()]
    pieces = pixels.split(grid.prod(-1).tolist())
    lengths = grid[:, 0].tolist()
    pooled: list[Any] = [None] * len(lengths)
    for length in sorted(set(lengths)):  # the gather index takes one chunk length a call
        chunks = [i for i, t in enumerate(lengths) if t == length]
        result = tower(torch.cat([pieces[i] for i in chunks]), grid_thw=grid[chunks])
        parts = result.pooler_output.split([tokens[i] for i in chunks])
        for i, part in zip(chunks, parts, strict=True):
            pooled[i] = part
    embeds = projector(torch.cat(pooled)).squeeze(1)
    features = {"video": BaseModelOutputWithPooling(pooler_output=embeds.split(tokens))}
    if out.get("pixel_values") is not None:
        features["image"] = inner.get_image_features(
            out.pop("pixel_values"), out.pop("image_grid_thw"), return_dict=True
        )
    out["mm_encoder_outputs"] = features
    return out
