"""``load_renderer``: pick the renderer for a checkpoint directory, processor or tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vf_mm.errors import UnsupportedModelError
from vf_mm.images import ImagePolicy
from vf_mm.models import (
    VISION_FAMILIES,
    family_info,
    load_processor,
    load_video_settings,
    model_type,
)
from vf_mm.models._internal import VideoSettings, checkpoint_processor
from vf_mm.renderers._cache import DEFAULT_CACHE_BYTES, ImageCache
from vf_mm.renderers._template import ChatTemplateRenderer
from vf_mm.renderers._vision import VisionSpec
from vf_mm.videos import VideoLimits

SUPPORTED = (*VISION_FAMILIES, "any text model with a chat template")


def load_renderer(
    model: Any,
    *,
    image_policy: ImagePolicy | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    image_cache: ImageCache | None = None,
    template_kwargs: dict[str, Any] | None = None,
    image_backend: str = "auto",
    processor_kwargs: dict[str, Any] | None = None,
    video_limits: VideoLimits | None = None,
    tokenizer: Any = None,
) -> ChatTemplateRenderer:
    """A renderer for ``model``.

    Checkpoints of the families in ``vf_mm.models.VISION_FAMILIES`` get image support
    (``docs/models.md`` says what is exact per family); any other checkpoint with a
    tokenizer chat template gets a text renderer.

    Args:
        model: A checkpoint directory, a loaded HF processor, or a tokenizer.
        image_policy: Which image sources may be read (``vf_mm.images``).
        cache_bytes: The bound of the renderer's own cache, when no ``image_cache`` is
            given.
        image_cache: Where processed images and videos are cached (share one
            ``ImageCache`` between renderers built apart; a ``RendererPool`` shares one
            between its renderers by itself).
        template_kwargs: Go to the chat template on every render (e.g.
            ``enable_thinking``).
        image_backend: For a checkpoint directory: ``"auto"`` (what ``AutoProcessor`` and
            vLLM use on this machine), ``"pil"``, ``"torchvision"`` or ``"torch"`` (vf_mm's
            torch-only port of a torchvision-only image processor, LFM2-VL's and
            Kimi-K2.5's: torchvision's pixels without torchvision, which ``"auto"`` picks
            there); the renderer's pixels must be the engine's and the trainer's, and PIL's
            and torchvision's differ on every resized image. A processor passed in keeps its own backend
            (``renderer.image_backend`` says which).
        processor_kwargs: Processor call options, the ones the engine is given too (vLLM's
            ``mm_processor_kwargs``).
        video_limits: What a clip may cost to load (``VideoLimits()`` when None).
        tokenizer: For a checkpoint directory: its tokenizer, already loaded (e.g. a
            ``vf_mm.models.TokenizerSnapshot``'s copy), used instead of loading it from the
            directory again; None loads it. The renderer owns it from then on (renderers
            must not share one: a tokenizer is not safe to use from two threads at once).

    Raises:
        UnsupportedModelError: A checkpoint vf_mm has no renderer for (no chat template,
            a vision family it does not know).
    """
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
            raise UnsupportedModelError(
                f"{path} is not a checkpoint directory (no config.json or tokenizer_config.json)"
            )
        family = model_type(path) if (path / "config.json").exists() else None
        if family in VISION_FAMILIES:
            return _from_processor(
                load_processor(path, image_backend=image_backend, tokenizer=tokenizer),
                family,
                image_policy,
                _cache(cache_bytes, image_cache),
                template_kwargs,
                processor_kwargs,
                video=load_video_settings(path, family),
                video_limits=video_limits,
            )
        if family is not None and _is_vision_model(path):
            raise UnsupportedModelError(
                f"{path}: model type {family!r} is a vision-language model vf_mm does not "
                f"render yet{_shared_type_note(path, family)} (as a text model its images "
                f"would be lost); vision families "
                f"vf_mm renders: {', '.join(VISION_FAMILIES)}. For text only, pass its "
                "tokenizer: load_renderer(AutoTokenizer.from_pretrained(path))"
            )
        from transformers import AutoTokenizer

        try:
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise UnsupportedModelError(
                f"{path}: model type {family!r} is not a vision family vf_mm renders and its "
                f"tokenizer does not load as a text model ({str(exc).splitlines()[0]}); "
                f"supported: {', '.join(SUPPORTED)}"
            ) from None
        return ChatTemplateRenderer(tokenizer, name=str(path), template_kwargs=template_kwargs)
    if tokenizer is not None:
        raise ValueError("tokenizer= goes with a checkpoint directory (model is already loaded)")
    if hasattr(model, "image_processor") and hasattr(model, "tokenizer"):
        family = _processor_family(model)
        if family is None:
            raise UnsupportedModelError(
                f"no renderer for processor {type(model).__name__} (a vision-language "
                f"processor of a family vf_mm does not render yet); vision families vf_mm "
                f"renders: {', '.join(VISION_FAMILIES)}; for text only, pass its tokenizer"
            )
        return _from_processor(
            model,
            family,
            image_policy,
            _cache(cache_bytes, image_cache),
            template_kwargs,
            processor_kwargs,
        )
    if hasattr(model, "apply_chat_template"):
        return ChatTemplateRenderer(
            model, name=getattr(model, "name_or_path", ""), template_kwargs=template_kwargs
        )
    raise UnsupportedModelError(
        f"cannot load a renderer from {type(model).__name__}: pass a checkpoint directory, "
        f"a processor or a tokenizer (supported: {', '.join(SUPPORTED)})"
    )


def _from_processor(
    processor: Any,
    family: str,
    policy: ImagePolicy | None,
    cache: ImageCache,
    template_kwargs: Any,
    processor_kwargs: dict[str, Any] | None,
    *,
    video: VideoSettings | None = None,
    video_limits: VideoLimits | None = None,
) -> ChatTemplateRenderer:
    tokenizer = processor.tokenizer
    if not getattr(tokenizer, "chat_template", None) and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template
    vision = VisionSpec(
        processor,
        policy=policy,
        cache=cache,
        options=processor_kwargs,
        video=video,
        video_limits=video_limits,
        family=family,
    )
    return ChatTemplateRenderer(
        tokenizer,
        vision=vision,
        name=family,
        template_kwargs=template_kwargs,
        stop_tokens=family_info(family).stop_tokens,
        content_as_parts=family_info(family).content_as_parts,
        tool_format=family_info(family).tool_format,
    )


def _cache(cache_bytes: int, image_cache: ImageCache | None) -> ImageCache:
    if image_cache is None:
        return ImageCache(cache_bytes)
    if not isinstance(image_cache, ImageCache):
        raise TypeError(f"image_cache must be an ImageCache, not {type(image_cache).__name__}")
    return image_cache


def _processor_family(processor: Any) -> str | None:
    """The family of a loaded processor, by its class; Qwen3.5 shares Qwen3-VL's
    processor class and is told apart by its tokenizer (``Qwen3_5Tokenizer``)."""
    classes = {cls.__name__ for cls in type(processor).__mro__}
    matches = [f for f in VISION_FAMILIES if family_info(f).processor in classes]
    if "qwen3_5" in matches:
        qwen3_5 = type(processor.tokenizer).__name__ == "Qwen3_5Tokenizer"
        matches = [f for f in matches if (f == "qwen3_5") == qwen3_5]
    return matches[0] if matches else None


def _shared_type_note(path: Path, config_type: str) -> str:
    """Why a checkpoint of a type some family's checkpoints share is not that family: the
    processor its files name is another model's (GLM-4.1V's ``Glm4vProcessor`` where
    GLM-4.6V's ``glm4v`` checkpoints name ``Glm46VProcessor``); empty for other types."""
    for family in VISION_FAMILIES:
        info = family_info(family)
        if config_type in dict(info.config_types):
            return (
                f" (a {config_type!r} checkpoint is {info.label}, family {family!r}, only when "
                f"its processor config names {info.processor}; this one names "
                f"{checkpoint_processor(path)!r})"
            )
    return ""


def _is_vision_model(path: Path) -> bool:
    """Whether a checkpoint's config describes a vision tower (``vision_config``), or it
    ships an image processor config: a model that takes images."""
    import json

    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in config or (path / "preprocessor_config.json").exists()
