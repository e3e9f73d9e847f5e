"""Image handling for the renderer: load, hash, process once, cache.

Each image is processed by its family's own processor, one image at a time
(``vf_mm.models.expand_image``): its model inputs (``item``: e.g. ``pixel_values`` and
``image_grid_thw`` for Qwen-VL, ``pixel_values`` for Gemma 3), and the text that replaces
the image's placeholder in the prompt. Processing images one by one gives the same
values as a batch: every family's image processor treats each image independently.

The replacement text splits in three: text before the first added token of the image
(Gemma 3's ``"\\n\\n"``), the *span* from that token to the last added token (tokenized
alone: added tokens bound it, and the tokenizer splits at them anyway, so its ids are
the ids it has inside any prompt), and text after (``"\\n\\n"``). The text before and
after is tokenized with the prompt text around it, as the processor does. The span is
the image's placeholder range; ``is_embed`` marks the positions that take image
embeddings (None when all do: Qwen's run of pads).

Processed images are cached by content hash (an LRU bounded in entries), so an image
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

from vf_mm.errors import RenderError
from vf_mm.images import ImagePolicy, image_hash, load_image
from vf_mm.models import expand_image, image_backend_of, image_kwargs, image_token_ids


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """One image, ready to splice into a prompt: ``tokens`` is its placeholder span,
    ``is_embed`` which of them take embeddings (None: all), ``text_before`` /
    ``text_after`` the replacement text outside the span, ``item`` its model inputs."""

    hash: str
    num_tokens: int  # len(tokens): the placeholder range's length
    item: dict[str, np.ndarray]  # read-only arrays, e.g. {"pixel_values", "image_grid_thw"}
    backend: str = "pil"  # the image processing that computed item: "pil" or "torchvision"
    tokens: tuple[int, ...] = ()
    is_embed: tuple[bool, ...] | None = None
    text_before: str = ""
    text_after: str = ""

    @property
    def num_embeds(self) -> int:
        return self.num_tokens if self.is_embed is None else sum(self.is_embed)


class VisionSpec:
    """What a renderer needs to expand images: the family's processor and a cache.

    ``image_token`` is the placeholder the chat template writes once per image (the
    processor's ``image_token``: ``<|image_pad|>`` for Qwen, ``<start_of_image>`` for
    Gemma 3); ``embed_token_ids`` the tokens that take image embeddings
    (``image_token_id`` the first). ``backend`` is the image processor's backend
    (``"pil"`` or ``"torchvision"``): the two compute different pixels for a resized
    image, and every ``ProcessedImage`` says which. ``options`` are processor call
    options (``processor_kwargs`` of ``load_renderer``), the ones the engine is given too
    (vLLM's ``mm_processor_kwargs``).
    """

    def __init__(
        self,
        processor: Any,
        *,
        policy: ImagePolicy | None = None,
        cache_size: int = 512,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.processor = processor
        self.options = dict(options or {})
        self._image_kwargs = image_kwargs(processor, self.options)
        self.image_processor = processor.image_processor
        self.tokenizer = processor.tokenizer
        self.image_token: str = processor.image_token
        self.embed_token_ids: tuple[int, ...] = image_token_ids(processor)
        self.image_token_id = self.embed_token_ids[0]
        self.placeholder_token_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        self.merge_size = int(getattr(self.image_processor, "merge_size", None) or 2)
        self.backend = image_backend_of(self.image_processor)
        self.policy = policy
        self.cache_size = cache_size
        self._added = sorted(
            {str(t) for t in self.tokenizer.get_added_vocab()}, key=len, reverse=True
        )
        self._cache: OrderedDict[str, ProcessedImage] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.processing_s = 0.0  # time spent inside the image processor (cache misses)

    @property
    def marker_token_ids(self) -> frozenset[int]:
        """Ids that only an image's span may hold (a completion holding one cannot be
        re-rendered as the same tokens)."""
        return frozenset((*self.embed_token_ids, self.placeholder_token_id))

    @property
    def reserved_token_ids(self) -> frozenset[int]:
        """Ids that text may not hold: the image's tokens, and the video placeholder (no
        video is ever expanded here). Written literally in a message, they would be
        embedding positions no image explains."""
        video = getattr(self.processor, "video_token_id", None)
        token = getattr(self.processor, "video_token", None)
        if not isinstance(video, int) and isinstance(token, str):
            video = self.tokenizer.convert_tokens_to_ids(token)
            video = None if video == self.tokenizer.unk_token_id else video
        return self.marker_token_ids | ({video} if isinstance(video, int) else set())

    def process(self, part: Any, *, where: str) -> ProcessedImage:
        """Load one image content part and return its (cached) expansion and inputs."""
        image = load_image(part, policy=self.policy, where=where)
        key = image_hash(image)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
        start = time.perf_counter()
        try:
            replacement, item = expand_image(self.processor, image, kwargs=self._image_kwargs)
        except Exception as exc:
            raise RenderError(f"{where}: the image processor failed: {exc}") from exc
        for array in item.values():
            array.flags.writeable = False
        processed = self._splice(key, replacement, item)
        with self._lock:
            self.processing_s += time.perf_counter() - start
            self.misses += 1
            self._cache[key] = processed
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return processed

    def _splice(self, key: str, replacement: str, item: dict[str, np.ndarray]) -> ProcessedImage:
        first, last = self._added_bounds(replacement)
        if first is None:
            raise RenderError(
                f"the processor's image text {replacement[:60]!r} holds no added token "
                "to anchor the image's span"
            )
        span = replacement[first:last]
        tokens = tuple(self.tokenizer(span, add_special_tokens=False)["input_ids"])
        embeds = [t in self.embed_token_ids for t in tokens]
        if not any(embeds):
            raise RenderError(f"the processor's image text {span[:60]!r} holds no image token")
        return ProcessedImage(
            hash=key,
            num_tokens=len(tokens),
            item=item,
            backend=self.backend,
            tokens=tokens,
            is_embed=None if all(embeds) else tuple(embeds),
            text_before=replacement[:first],
            text_after=replacement[last:],
        )

    def _added_bounds(self, text: str) -> tuple[int | None, int]:
        """Where the first added token of ``text`` starts and the last one ends."""
        first: int | None = None
        last = 0
        for token in self._added:
            at = text.find(token)
            if at >= 0:
                first = at if first is None else min(first, at)
                last = max(last, text.rfind(token) + len(token))
        return first, last
