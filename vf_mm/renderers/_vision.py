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

Videos (Qwen-VL families) take the same path: ``process_video`` loads the clip
(``vf_mm.videos``), ``vf_mm.models.expand_video`` computes its inputs and replacement
text (its pads, and Qwen3-VL's timestamps), and the span is spliced the same way. A
video's options (``fps``, ``num_frames``, ``min_pixels``, ``max_pixels``,
``do_sample_frames``) come from its content part.

Processed images and videos are cached (``ImageCache``: bounded in bytes, shared by the
renderers of a ``RendererPool``) by content hash (``image_hash``, ``video_mm_hash``: the
identity in ``mm_hashes``, sidecars and on the wire) behind the processing namespace, and
images also by source key (``vf_mm.images.source_key``) under the renderer's policy: an
image or clip seen in an earlier turn or another rollout is never processed again, and a
repeated data URL or file is not even decoded. Cached arrays are read-only numpy arrays:
they are shared by every turn, rollout and renderer that shows the image, and a write
through one of them would silently corrupt the others, so it raises instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vf_mm.errors import RenderError
from vf_mm.images import ImagePolicy, image_hash, load_image, source_key
from vf_mm.models import (
    VIDEO_FAMILIES,
    expand_image,
    expand_video,
    family_info,
    image_backend_of,
    image_token_ids,
)
from vf_mm.models._internal import VideoSettings, image_kwargs
from vf_mm.renderers._cache import DEFAULT_CACHE_BYTES, ImageCache
from vf_mm.types import VIDEO_OPTIONS, unknown_video_key
from vf_mm.videos import VideoLimits, load_video, video_hash, video_mm_hash


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """One image (or video: ``modality``), ready to splice into a prompt.

    Attributes:
        hash: Its ``mm_hash``.
        num_tokens: The length of its placeholder span.
        item: Its model inputs.
        backend: The image processor's backend that computed them (``"pil"`` or
            ``"torchvision"``).
        tokens: Its placeholder span.
        is_embed: Which of ``tokens`` take embeddings (None: all).
        text_before: The replacement text before the span.
        text_after: The replacement text after the span.
        modality: ``"image"`` or ``"video"``.
    """

    hash: str
    num_tokens: int  # len(tokens): the placeholder range's length
    item: dict[str, np.ndarray]  # read-only arrays, e.g. {"pixel_values", "image_grid_thw"}
    backend: str = "pil"  # the image processing that computed item: "pil" or "torchvision"
    tokens: tuple[int, ...] = ()
    is_embed: tuple[bool, ...] | None = None
    text_before: str = ""
    text_after: str = ""
    modality: str = "image"

    @property
    def num_embeds(self) -> int:
        return self.num_tokens if self.is_embed is None else sum(self.is_embed)

    @property
    def nbytes(self) -> int:
        """What holding it costs: its arrays' bytes, and its tokens and text."""
        arrays = sum(int(a.nbytes) for a in self.item.values())
        flags = len(self.is_embed) if self.is_embed is not None else 0
        return (
            arrays + 8 * (len(self.tokens) + flags) + len(self.text_before) + len(self.text_after)
        )


class VisionSpec:
    """What a renderer needs to expand images: the family's processor and a cache.

    ``image_token`` is the placeholder the chat template writes once per image (the
    processor's ``image_token``: ``<|image_pad|>`` for Qwen, ``<start_of_image>`` for Gemma
    3); ``embed_token_ids`` the tokens that take image embeddings (``image_token_id`` the
    first). ``backend`` is the image processor's backend (``"pil"`` or ``"torchvision"``):
    the two compute different pixels for a resized image, and every ``ProcessedImage`` says
    which.

    Args:
        processor: The family's Hugging Face processor.
        policy: Which image sources may be read (``ImagePolicy()`` when None).
        cache_bytes: The bound of a cache of its own, when ``cache`` is None.
        cache: Where processed images and clips are kept (an ``ImageCache``, which a
            ``RendererPool`` shares between its renderers; entries are keyed behind
            ``namespace``, the digest of everything processing depends on besides the
            pixels).
        options: Processor call options (``processor_kwargs`` of ``load_renderer``), the
            ones the engine is given too (vLLM's ``mm_processor_kwargs``).
        video: The checkpoint's video settings (None: video parts are refused).
        video_limits: Bound what a clip may cost to load.
        family: The processor's family (a ``model_type``); its other vision markup tokens
            (``vf_mm.models.VisionFamily.marker_tokens``) are banned from sampling with the
            reserved ones (``banned_token_ids``), and errors name it.
    """

    def __init__(
        self,
        processor: Any,
        *,
        policy: ImagePolicy | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        cache: ImageCache | None = None,
        options: dict[str, Any] | None = None,
        video: VideoSettings | None = None,
        video_limits: VideoLimits | None = None,
        family: str | None = None,
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
        self.video = video
        self.video_limits = video_limits
        # an audio placeholder (Gemma 4's <|audio|>): vf_mm renders no audio, so text may
        # not hold it either (written literally it would be a position no audio explains)
        audio = getattr(processor, "audio_token", None)
        self._audio_ids = frozenset(
            {self.tokenizer.get_vocab()[audio]} if audio in self.tokenizer.get_vocab() else ()
        )
        self.video_token: str | None = getattr(processor, "video_token", None)
        self.video_token_id: int | None = None
        if self.video_token is not None:
            token_id = self.tokenizer.convert_tokens_to_ids(self.video_token)
            self.video_token_id = None if token_id == self.tokenizer.unk_token_id else token_id
        self._video_tokens = _video_markup(processor, self.image_token)
        added = self.tokenizer.get_added_vocab()
        self._added = sorted({str(t) for t in added}, key=len, reverse=True)
        info = family_info(family) if family is not None else None
        self.family = family
        self.family_label = info.label if info is not None else "this model"
        # a clip's frames hold the image token, taken as video inputs (GLM-4.6V)
        self.video_image_token = video is not None and info is not None and info.video_image_token
        markers = info.marker_tokens if info is not None else ()
        self._marker_ids = frozenset(added[t] for t in markers if t in added)
        # shared with every renderer whose cache this is (a RendererPool's): entries are
        # keyed behind ``namespace``, so renderers that process differently never share one
        self.cache = ImageCache(cache_bytes) if cache is None else cache
        self.namespace = self._namespace()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.processing_s = 0.0  # time spent inside the image processor (cache misses)

    def embed_ids(self, modality: str) -> tuple[int, ...]:
        """The ids that take ``modality``'s embeddings.

        Args:
            modality: ``"image"`` or ``"video"``.
        """
        if modality == "image" or self.frames_as_images or self.video_image_token:
            return self.embed_token_ids
        return (self.video_token_id,) if self.video_token_id is not None else ()

    @property
    def video_embed_token_id(self) -> int | None:
        """The id at a clip's embedding positions (``<|video_pad|>``; the image's token
        where a clip's frames hold it: SmolVLM, InternVL, GLM-4.6V); None without video."""
        ids = self.embed_ids("video") if self.video is not None else ()
        return ids[0] if ids else None

    def vllm_embed_swaps(self, modality: str) -> dict[int, int]:
        """``{vLLM's id: the renderer's id}`` at ``modality``'s embedding positions, for a
        family whose vLLM 0.32 processing writes another id there than transformers' (the
        one known pair: InternVL3's clips, ``<video>`` for ``<IMG_CONTEXT>``, named by
        ``VisionFamily.vllm_video_embed_token``); empty for every other family and
        modality. ``VLLMBackend`` (``Expansion.of``) maps a content_parts answer's clip
        ranges back to the renderer's ids with it.

        Args:
            modality: ``"image"`` or ``"video"``.
        """
        info = family_info(self.family) if self.family is not None else None
        token = info.vllm_video_embed_token if info is not None else None
        vocab = self.tokenizer.get_vocab()
        if modality != "video" or self.video is None or token is None or token not in vocab:
            return {}
        (own,) = self.embed_ids("video")
        return {vocab[token]: own}

    def vllm_refusal(self, modality: str) -> str | None:
        """Why vLLM 0.32 takes no ``modality`` of this family, or None (Kimi-K2.5's clips).

        Args:
            modality: ``"image"`` or ``"video"``; ``Expansion.of`` hands it to ``VLLMBackend``.
        """
        family = self.family if modality == "video" and self.video is not None else None
        info = family_info(family) if family is not None else None
        return info.vllm_video_refusal if info is not None else None

    @property
    def frames_as_images(self) -> bool:
        """Whether a clip's frames take the image token's embeddings (SmolVLM, InternVL)."""
        return self.video is not None and self.video.frames_as_images

    @functools.cached_property
    def marker_token_ids(self) -> frozenset[int]:
        """Ids that only an image's or video's span may hold (a completion holding one
        cannot be re-rendered as the same tokens)."""
        video = self.embed_ids("video") if self.video is not None else ()
        return frozenset((*self.embed_token_ids, self.placeholder_token_id, *video))

    @functools.cached_property
    def reserved_token_ids(self) -> frozenset[int]:
        """Ids that text may not hold: the image's and the video's tokens (the video's
        even where no video is expanded), and an audio placeholder. Written literally in a
        message, they would be embedding positions no image, video or audio explains."""
        video = {self.video_token_id} if self.video_token_id is not None else set()
        return self.marker_token_ids | video | self._audio_ids

    @functools.cached_property
    def banned_token_ids(self) -> frozenset[int]:
        """Ids a model of this family must never sample: the reserved ones (an image's and
        a video's placeholder and pads) and the other markup of images and videos (vision
        start/end, tile markers). Every backend is sent them with each request
        (``GenerateRequest.banned_token_ids``); a completion holding one anyway is refused
        by ``sampled_reserved``."""
        return self.reserved_token_ids | self._marker_ids

    @functools.cached_property
    def reserved_tokens(self) -> tuple[str, ...]:
        """The literal text of the reserved ids, longest first: text holding one is read
        as an image or video when tokenized (``reserved_in``)."""
        tokens = self.tokenizer.convert_ids_to_tokens(sorted(self.reserved_token_ids))
        return tuple(sorted({str(t) for t in tokens}, key=len, reverse=True))

    def reserved_in(self, text: str) -> str | None:
        """The first reserved token ``text`` holds literally (None: none).

        Args:
            text: Any text.
        """
        found = [(text.find(t), t) for t in self.reserved_tokens if t in text]
        return min(found)[1] if found else None

    def sampled_reserved(self, completion_ids: Sequence[int], text: str) -> tuple[str, str] | None:
        """Why a sampled completion cannot stay in a conversation: ``(token, reason)``, or None.

        A banned id means the backend ignored the ban; reserved text (an id, or ordinary tokens
        that spell one) would be read back as an image or video placeholder when the
        conversation is rendered again, so no later turn would see the tokens that were
        sampled.

        Args:
            completion_ids: The sampled token ids.
            text: Their decoded text.
        """
        banned = self.banned_token_ids
        for token_id in completion_ids:
            if token_id in banned:
                token = str(self.tokenizer.convert_ids_to_tokens(int(token_id)))
                return token, (
                    f"the model sampled {token} (id {token_id}), which {self.family_label} "
                    "reserves for images and videos and which the backend was asked never "
                    "to sample: the backend ignored the ban"
                )
        spelled = self.reserved_in(text)
        if spelled is not None:
            return spelled, (
                f"the completion's text spells {spelled}, which {self.family_label} reads as an "
                "image or video placeholder: rendered again, it would not be the tokens sampled"
            )
        return None

    @property
    def placeholders(self) -> dict[str, str]:
        """The text the chat template writes once per item, by modality (video only where
        this renderer processes video)."""
        out = {"image": self.image_token}
        if self.video is not None and self.video_token is not None:
            out["video"] = self.video_token
        return out

    def process(self, part: Any, *, where: str) -> ProcessedImage:
        """Load one image content part and return its (cached) expansion and inputs.

        A source with a key (``vf_mm.images.source_key``: a data URL, bytes, a file) is looked
        up by it first, under this renderer's policy: a repeat is neither decoded nor hashed.
        Any other source (a PIL image, an array: mutable; http(s): may change) is loaded and
        found by its pixels (``image_hash``).

        Args:
            part: The image content part.
            where: Its place in the conversation, for errors.

        Raises:
            ImageError: The image cannot be loaded.
            RenderError: The image processor failed on it.
        """
        source = source_key(part, policy=self.policy)  # runs the guard's path check
        if source is None:
            return self._process_image(load_image(part, policy=self.policy, where=where), where)
        alias = (self.namespace, self.policy, source)
        cached = self.cache.get(alias)
        if cached is None:
            with self.cache.computing(alias):  # one reader of a source at a time
                cached = self.cache.get(alias)
                if cached is None:
                    image = load_image(part, policy=self.policy, where=where)
                    processed = self._process_image(image, where)
                    self.cache.alias(alias, (self.namespace, processed.hash), source.nbytes)
                    return processed
        with self._lock:
            self.hits += 1
        return cached

    def _process_image(self, image: Any, where: str) -> ProcessedImage:
        key = image_hash(image)

        def compute() -> ProcessedImage:
            try:
                replacement, item = expand_image(self.processor, image, kwargs=self._image_kwargs)
            except Exception as exc:
                raise RenderError(f"{where}: the image processor failed: {exc}") from exc
            return self._splice(key, replacement, item)

        return self._cached(key, compute)

    def process_video(self, part: Any, *, where: str) -> ProcessedImage:
        """Load one video content part and return its (cached) expansion and inputs.

        The part's processing options (``VIDEO_OPTIONS``) apply to this clip only.

        Args:
            part: The video content part.
            where: Its place in the conversation, for errors.

        Raises:
            VideoError: The clip cannot be loaded.
            RenderError: Videos are off for this checkpoint, an unknown key or a bad option in
                the part, or the processor failed on it.
        """
        if self.video is None or (self.video_token_id is None and not self.frames_as_images):
            raise RenderError(
                f"{where}: this renderer has no video processing (video is supported for "
                f"{', '.join(VIDEO_FAMILIES)}, with the renderer loaded from the checkpoint "
                "directory)"
            )
        unknown = unknown_video_key(part)
        if unknown is not None:
            raise RenderError(f"{where}: unknown key {unknown} in a video part")
        options = {k: part[k] for k in VIDEO_OPTIONS if part.get(k) is not None}
        try:
            settings = self.video.with_options(options)
        except RenderError as exc:
            raise RenderError(f"{where}: {exc}") from None
        video = load_video(part, policy=self.policy, limits=self.video_limits, where=where)
        # options change the tensors, so they change the hash (video_mm_hash)
        key = video_mm_hash(video_hash(video), part)

        def compute() -> ProcessedImage:
            try:
                out = expand_video(settings, video.frames, fps=video.fps, tokens=self._video_tokens)
            except RenderError as exc:
                raise RenderError(f"{where}: {exc}") from None
            return self._splice(key, out.replacement, out.item, modality="video")

        return self._cached(key, compute)

    def _cached(self, key: str, compute: Callable[[], ProcessedImage]) -> ProcessedImage:
        """The cached expansion of the content ``key`` (``image_hash``, ``video_mm_hash``),
        or ``compute()``'s, cached (its arrays made read-only first, since every turn,
        rollout and renderer sharing the cache shares them)."""

        def timed() -> tuple[ProcessedImage, int]:
            start = time.perf_counter()
            processed = compute()
            for array in processed.item.values():
                array.flags.writeable = False
            with self._lock:
                self.processing_s += time.perf_counter() - start
                self.misses += 1
            return processed, processed.nbytes

        processed, computed = self.cache.compute((self.namespace, key), timed)
        if not computed:
            with self._lock:
                self.hits += 1
        return processed

    def _namespace(self) -> str:
        """What the processed inputs depend on besides the pixels, as a digest: the
        processor and image processor classes, the image processor's configuration, the
        call options, the backend, the tokenizer and the tokens spliced, the video
        settings. Renderers of one checkpoint and options agree (and share entries);
        any difference keeps their entries apart."""
        processor = self.image_processor
        try:
            config = processor.to_dict()
        except Exception:  # a processor without to_dict: its attributes
            config = {k: v for k, v in vars(processor).items() if not k.startswith("_")}
        described = {
            "classes": [type(self.processor).__qualname__, type(processor).__qualname__],
            "config": config,
            "kwargs": self._image_kwargs,
            "options": self.options,
            "backend": self.backend,
            "tokenizer": [
                type(self.tokenizer).__qualname__,
                getattr(self.tokenizer, "name_or_path", ""),
                len(self.tokenizer),
                self._added,
            ],
            "tokens": [self.image_token, self.embed_token_ids, self.placeholder_token_id],
            "video": [repr(self.video), self._video_tokens, self.video_token_id],
        }
        try:
            text = json.dumps(described, sort_keys=True, default=_describe)
        except (TypeError, ValueError, RecursionError):  # a configuration JSON cannot hold
            return f"unshared-{uuid.uuid4().hex}"  # safe: this renderer shares no entry
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _splice(
        self, key: str, replacement: str, item: dict[str, np.ndarray], *, modality: str = "image"
    ) -> ProcessedImage:
        first, last = self._added_bounds(replacement)
        if first is None:
            raise RenderError(
                f"the processor's {modality} text {replacement[:60]!r} holds no added token "
                f"to anchor the {modality}'s span"
            )
        span = replacement[first:last]
        lead = next(t for t in self._added if replacement.startswith(t, first))
        count, rest = divmod(len(span), len(lead))
        if not rest and span == lead * count:  # a run of one added token (Qwen's pads):
            # its ids without a tokenizer pass, which costs ~1.5 ms per 500 pads
            tokens = (self.tokenizer.convert_tokens_to_ids(lead),) * count
        else:
            tokens = tuple(self.tokenizer(span, add_special_tokens=False)["input_ids"])
        embed_ids = self.embed_ids(modality)
        embeds = [t in embed_ids for t in tokens]
        if not any(embeds):
            raise RenderError(
                f"the processor's {modality} text {span[:60]!r} holds no {modality} token"
            )
        return ProcessedImage(
            hash=key,
            num_tokens=len(tokens),
            item=item,
            backend=self.backend if modality == "image" else "torch",
            tokens=tokens,
            is_embed=None if all(embeds) else tuple(embeds),
            text_before=replacement[:first],
            text_after=replacement[last:],
            modality=modality,
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


def _describe(value: Any) -> Any:
    """A JSON stand-in for a configuration value JSON does not take: its repr, unless
    that names a memory address (then its type and public attributes)."""
    text = repr(value)
    if " at 0x" not in text:
        return text
    attributes = getattr(value, "__dict__", {})
    return [
        type(value).__qualname__,
        {k: v for k, v in attributes.items() if not k.startswith("_")},
    ]


def _video_markup(processor: Any, image_token: str) -> dict[str, str]:
    """The text a clip's expansion writes besides its pads, by name (``expand_video``'s
    ``tokens``): the processor's own, or the Qwen-VL defaults."""
    return {
        "video_token": getattr(processor, "video_token", None) or "",
        "vision_start_token": getattr(processor, "vision_start_token", "<|vision_start|>"),
        "vision_end_token": getattr(processor, "vision_end_token", "<|vision_end|>"),
        # SmolVLM and InternVL write each frame as an image
        "image_token": image_token,
        "fake_image_token": getattr(processor, "fake_image_token", ""),
        "global_image_token": getattr(processor, "global_image_token", ""),
        # Gemma 4 and InternVL write each frame between the image markers
        "boi_token": getattr(processor, "boi_token", ""),
        "eoi_token": getattr(processor, "eoi_token", ""),
        "start_image_token": getattr(processor, "start_image_token", ""),
        "end_image_token": getattr(processor, "end_image_token", ""),
    }
