"""The vision tower's outputs, kept per image between requests.

A multi-turn rollout shows the same images turn after turn, and a prompt whose KV prefix
is no longer cached (evicted, or the images sit after other tokens) would run the tower
on them again. ``VisionCache`` keeps each image's tower output (keyed by modality,
content hash and input shapes: ``request_media``) in a ``ByteLRU``, and gives a forward
its new images' inputs: cached outputs, the tower run once on the missing ones, where
the model takes ``mm_encoder_outputs``; else the images' processed inputs (through
``forward_inputs``, so a Kimi-K2.5 clip of multi-frame chunks gets the features its
forward cannot compute). A cached
output is what the tower computes for the same inputs, so a hit changes no number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vf_mm.errors import BackendError
from vf_mm.inference._local_model import LocalModel, Media
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._prefix_cache import ByteLRU
from vf_mm.inference._rows import Row
from vf_mm.models import forward_inputs


class VisionCache:
    """Up to ``max_bytes`` of ``model``'s tower outputs. ``enabled`` False (no prefix
    cache: every prompt re-encoded whole) passes images' processed inputs through.
    Lookups count into ``stats`` (``vision_cache_queries`` / ``vision_cache_hits``)."""

    def __init__(
        self, model: LocalModel, max_bytes: int, *, stats: LocalStats, enabled: bool = True
    ) -> None:
        self._model = model
        self._lru = ByteLRU(max_bytes)
        self._stats = stats
        self._enabled = enabled

    def clear(self) -> None:
        """Forget every output (new weights make them stale)."""
        self._lru.clear()

    def inputs(self, rows: Sequence[Row], ids: torch.Tensor) -> dict[str, Any]:
        """The forward's image inputs for the new part of ``rows`` (``ids``): the vision
        tower's outputs, cached per image, where the model takes them; else the images'
        processed inputs."""
        new = [(span, modality, inputs)
               for r in rows for span, modality, inputs in r.media if span.offset >= r.cached]  # fmt: skip
        if not new:
            return {}
        model = self._model
        if (
            self._enabled
            and model.encoder_outputs
            and all(modality == "image" for _, modality, _ in new)
        ):
            return {"mm_encoder_outputs": {"image": self._features(new)}}
        raw = model.media_inputs(ids, new)
        placed = {name: value.to(model.device) for name, value in raw.items()}
        # the features vf_mm computes where transformers' forward would compute them wrong
        return forward_inputs(model.family, model.model, placed)

    def _features(self, new: list[Media]) -> Any:
        """The vision tower's output for ``new`` images, in order, as the model's
        ``mm_encoder_outputs`` takes it: from the cache, the tower run once on the rest."""
        found: dict[str, tuple[Any, ...]] = {}
        missing: dict[str, Mapping[str, Any]] = {}
        for span, _, inputs in new:
            self._stats.vision_cache_queries += 1
            hit = self._lru.get(span.key)
            if hit is not None:
                self._stats.vision_cache_hits += 1
                found[span.key] = hit
            else:
                missing.setdefault(span.key, inputs)
        if missing:
            found.update(self._encode(missing))
        features = [found[span.key] for span, _, _ in new]
        output_class = features[0][0]
        pooled = tuple(f[1] for f in features)
        # a model whose tower gives one tensor for the batch (InternVL) takes one back
        out: dict[str, Any] = {"pooler_output": torch.cat(pooled) if features[0][3] else pooled}
        if features[0][2] is not None:
            layers = len(features[0][2])
            out["deepstack_features"] = [tuple(f[2][i] for f in features) for i in range(layers)]
        return output_class(**out)

    def _encode(self, images: dict[str, Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
        """Run the vision tower on ``images`` (by key): all in one call where the model
        returns one output per image, else one call per image."""
        from vf_mm.models import family_info, model_inputs

        model = self._model
        info = family_info(model.family)
        keys = list(images)
        chunks = [keys] if info.image_axis == 0 else [[k] for k in keys]
        encoded: dict[str, tuple[Any, ...]] = {}
        dummy = torch.zeros((1, 1), dtype=torch.long)
        for chunk in chunks:
            inputs = model_inputs(
                model.family,
                dummy,
                [images[k] for k in chunk],
                image_token_ids=[model.image_token()],
                dtype=model.dtype,
            )
            args = {k: v.to(model.device) for k, v in inputs.items() if k in info.image_inputs}
            output = model.model.model.get_image_features(**args, return_dict=True)
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
                    backend=model.name,
                )
            deep = getattr(output, "deepstack_features", None)
            for i, key in enumerate(chunk):
                layers = tuple(layer[i] for layer in deep) if deep is not None else None
                value = (type(output), pooled[i], layers, as_tensor)
                size = pooled[i].numel() * pooled[i].element_size() + sum(
                    t.numel() * t.element_size() for t in (layers or ())
                )
                self._lru.put(key, value, size)
                encoded[key] = value
        return encoded
