"""Qwen-VL image handling for the renderer: load, hash, process once, cache.

An image's model inputs are ``pixel_values`` (patches x features) and
``image_grid_thw`` (1 x 3), exactly as the transformers image processor computes
them for that image alone (processing images one by one gives the same rows as a
batch: the processor treats each image independently). It takes
``prod(grid) // merge_size**2`` image pad tokens.

Processed inputs are cached by content hash (an LRU bounded in entries), so an image
seen in an earlier turn is never processed again. Cached arrays are read-only numpy
arrays: they are shared by every turn and rollout that shows the image, and a
write through one of them would silently corrupt the others, so it raises instead.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from vf_mm.images import ImagePolicy, image_hash, load_image
from vf_mm.models import image_backend_of


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    hash: str
    num_tokens: int
    item: dict[str, np.ndarray]  # {"pixel_values", "image_grid_thw"}, read-only
    backend: str = "pil"  # the image processing that computed item: "pil" or "torchvision"


class VisionSpec:
    """What a renderer needs to expand images: the pad token, the processor, a cache.

    ``backend`` is the image processor's backend (``"pil"`` or ``"torchvision"``): the two
    compute different pixels for a resized image, and every ``ProcessedImage`` says which.
    """

    def __init__(
        self,
        image_processor: Any,
        *,
        image_token: str,
        image_token_id: int,
        policy: ImagePolicy | None = None,
        cache_size: int = 512,
    ) -> None:
        self.image_processor = image_processor
        self.image_token = image_token
        self.image_token_id = image_token_id
        self.merge_size = int(getattr(image_processor, "merge_size", 2))
        self.backend = image_backend_of(image_processor)
        self.policy = policy
        self.cache_size = cache_size
        self._cache: OrderedDict[str, ProcessedImage] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.processing_s = 0.0  # time spent inside the image processor (cache misses)

    def process(self, part: Any, *, where: str) -> ProcessedImage:
        """Load one image content part and return its (cached) model inputs."""
        image = load_image(part, policy=self.policy, where=where)
        key = image_hash(image)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
        start = time.perf_counter()
        out = self.image_processor(images=[image], return_tensors="np")
        pixel_values = np.ascontiguousarray(_numpy(out["pixel_values"]))
        grid = np.ascontiguousarray(_numpy(out["image_grid_thw"])).astype(np.int64, copy=False)
        pixel_values.flags.writeable = False
        grid.flags.writeable = False
        processed = ProcessedImage(
            hash=key,
            num_tokens=int(np.prod(grid)) // self.merge_size**2,
            item={"pixel_values": pixel_values, "image_grid_thw": grid},
            backend=self.backend,
        )
        with self._lock:
            self.processing_s += time.perf_counter() - start
            self.misses += 1
            self._cache[key] = processed
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return processed


def _numpy(value: Any) -> Any:
    """A processor output as numpy (the torchvision backend may hand back torch tensors)."""
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value
