"""The vision-language family registry: which families vf_mm renders, and their pieces.

``VISION_FAMILIES`` are the ``model_type`` values that get image support
(``QWEN_VL_FAMILIES`` the Qwen-VL subset); ``family_info(family)`` is a family's record
(``VisionFamily``: its transformers classes and the per-token input its model takes);
``model_type(path)`` reads a checkpoint's type; ``model_class``,
``image_processor_class`` and ``processor_class`` name a family's transformers classes;
``load_processor`` loads a checkpoint directory's processor; ``expand_image`` is one
image's model inputs and the text that replaces its placeholder, as the family's own
processor computes them.

Image processing has two backends in transformers, and they compute different pixels
whenever an image is resized (up to 0.3 apart in normalised ``pixel_values``):
``torchvision`` (e.g. ``Qwen2VLImageProcessor``), which ``AutoProcessor`` and vLLM pick
wherever torchvision imports (every GPU machine), and ``pil``
(``Qwen2VLImageProcessorPil``), the fallback. The renderer's pixels must be the ones the
engine and the trainer compute, so the backend is a choice (``image_backend``):
``"auto"`` (the default) picks what ``AutoProcessor`` would on this machine,
``resolve_image_backend`` says which that is.

Two families have only a torchvision image processor in transformers 5.23 (LFM2-VL and
Kimi-K2.5, ``VisionFamily.pil_backend`` False). For them vf_mm has its own torch-only
ports (``VisionFamily.torch_port``), which compute the torchvision processor's numbers
bit for bit: ``"auto"`` loads the port where torchvision does not import, and
``"torch"`` asks for it by name anywhere; ``"torchvision"`` stays transformers' own class
and is refused by name where torchvision does not import. ``image_backend_of`` reports a
port as ``"torchvision"``: the backend names whose numbers are computed.

Everything also loads without torchvision (a CPU-only machine): the stock processors of
families with video refuse to build there (they look up a video processor class), so
the registry uses a processor subclass that accepts ``video_processor=None``.
``AutoProcessor`` on such a directory fails or silently returns only the tokenizer, so
everything is loaded by concrete class.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from vf_mm.errors import MissingDependencyError, UnsupportedModelError


@dataclass(frozen=True, slots=True)
class VisionFamily:
    """One vision-language family: its transformers classes and its forward's other inputs.

    What its model's forward takes besides the images.

    Classes are named, not imported, so nothing is imported until used.

    Attributes:
        model_type: The ``model_type`` of its checkpoints' ``config.json``.
        label: Its name for people (``"Qwen2-VL"``).
        processor: Its HF processor class.
        image_processor: Its torchvision image processor class; the PIL one is this name +
            ``"Pil"``.
        model: Its transformers model class (``...ForConditionalGeneration``).
        token_types: The per-token input the model needs with images (1 on image
            embedding positions, 2 on video ones): ``"mm_token_type_ids"`` (Qwen-VL,
            Qwen3.5: M-RoPE positions; Gemma 4: bidirectional attention over each image in
            the 26B and 31B), ``"token_type_ids"`` (Gemma 3: bidirectional attention over
            each image) or None (SmolVLM, LLaVA-OneVision, LLaVA-NeXT, InternVL find image
            tokens by id).
        mirrors: The real checkpoint the tiny one mirrors.
        stop_tokens: The tokens that end an assistant turn.
        image_axis: The axis along which a forward takes several images' inputs.
        pad_axis: An axis padded with zeros to the batch's largest image.
        tool_format: Tool calls: ``"json"`` (``<tool_call>{...}``), ``"xml"``
            (``<function=...>``), ``"gemma4"``, ``"pythonic"`` (LFM2), ``"kimi"`` or
            ``"glm"`` (``<tool_call>NAME`` with ``<arg_key>``/``<arg_value>`` pairs).
        tool_role: The template renders a ``"tool"`` message (Gemma 3's refuses one).
        content_as_parts: The template renders only list content (drops strings).
        image_inputs: One image's model inputs.
        video_inputs: One video's model inputs (empty: no video support).
        frames_as_images: The forward takes a clip's frames as images, in the images'
            inputs (SmolVLM, InternVL): images and clips then go in one sequence, in the
            order their tokens appear.
        video_image_token: A clip's frames hold the image's embedding token while the
            forward takes them as video inputs (GLM-4.6V writes ``<|image|>`` between
            ``<|begin_of_video|>`` and ``<|end_of_video|>``, and its processor marks those
            2 in ``mm_token_type_ids`` by the markers). transformers' forward then fills
            images and clips at the one token's positions and cannot take both in a
            sequence or batch, so ``model_inputs`` gives it a clip as images, one per
            temporal group, which is what the model computes for the clip.
        video_pooled_chunks: A clip's ``video_grid_thw`` row ``(t, h, w)`` is one chunk of
            ``t`` frames that the vision tower pools into one frame's tokens, so it fills
            ``h * w / merge**2`` embeddings, not ``t * h * w / merge**2`` (Kimi-K2.5:
            MoonViT's temporal pooling, chunks of up to 4 frames).
        feature_extractor: The processor's audio feature extractor class (Gemma 4's
            processor needs one even for images), loaded from the checkpoint beside the
            image processor.
        marker_tokens: Tokens that only an image's or video's markup holds besides its
            placeholder and pads (which the processor names itself): the template's vision
            start/end markers, the processor's tile and crop markers. A model must never
            sample them (``VisionSpec``'s ``banned_token_ids``); tokens a tokenizer lacks
            are skipped.
        pil_backend: The image processor has a PIL backend (a ``"Pil"`` class); LFM2-VL's
            and Kimi-K2.5's have only torchvision's.
        torch_port: vf_mm's torch-only port of a torchvision-only image processor
            (``"module:Class"`` in ``vf_mm.models``): the torchvision numbers where
            torchvision does not import; None: the family has a PIL backend.
        item_layout: How one image's inputs are laid out, which ``ItemChecker``
            (``_items``) checks a client's against: ``"grid"``, ``"crops"``, ``"tiles"``,
            ``"anyres"``, ``"soft_tokens"``; None: not checked (a server refuses to take
            the family's processed images).
        config_types: The ``model_type`` values of the family's checkpoints where they are
            not the family's own name, each with the transformers model class that loads
            it, and told apart from other models sharing the type by the processor class
            their processor config names (``processor``): GLM-4.6V-Flash's ``config.json``
            says ``glm4v`` (``Glm4vForConditionalGeneration``) and GLM-4.6V's ``glm4v_moe``
            (``Glm4vMoeForConditionalGeneration``), the types of GLM-4.1V and GLM-4.5V
            too, which name ``Glm4vProcessor`` (another template and processor) where
            GLM-4.6V names ``Glm46VProcessor``. ``model_type(path)`` gives such a
            checkpoint its family, and ``model_class(family, checkpoint=path)`` its class.
        vllm_video_embed_token: The token vLLM 0.32's processing writes at a clip's
            embedding positions where transformers' processor (and the renderer) writes
            the family's own embedding token; None where vLLM writes the renderer's.
            InternVL3 (``"<video>"``): vLLM serves ``InternVLForConditionalGeneration``
            with ``interns1.py``, which expands a clip by transformers' processor and then
            rewrites the frames' ``<IMG_CONTEXT>`` ids to ``<video>``, and its model
            scatters the frame embeddings at those ``<video>`` positions: the same
            computation under another id. A vLLM answer's clip ranges are mapped back to
            the renderer's ids by this pair only (``Vision.vllm_embed_swaps``).
        vllm_video_refusal: Why vLLM 0.32 cannot take the family's clips at all (raw, as
            content_parts, or rendered, as features); None where it can. Kimi-K2.5: a
            server answers a raw clip with 400 (its token-in route hands the decoded clip
            to ``KimiK25Processor`` unsplit, as 0.32 has no ``split_video_chunks``, and the
            processor takes only image and ``video_chunk`` dicts), and even split it would
            write ``<|media_pad|>`` ids per chunk where transformers' processor (and the
            renderer) writes the video token with each chunk's timestamp and markup.
            ``VLLMBackend`` refuses such a clip before sending, naming this reason
            (``Vision.vllm_refusal``).
    """

    model_type: str
    label: str
    processor: str
    image_processor: str  # the torchvision class; the PIL one is this name + "Pil"
    model: str
    token_types: str | None
    mirrors: str  # the real checkpoint the tiny one mirrors
    stop_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")  # end an assistant turn
    image_axis: int = 0  # the axis along which a forward takes several images' inputs
    pad_axis: int | None = None  # an axis padded with zeros to the batch's largest image
    tool_format: str = "json"  # tool calls: "json" (<tool_call>{...}) or "xml" (<function=...>)
    tool_role: bool = True  # the template renders a "tool" message (Gemma 3's refuses one)
    content_as_parts: bool = False  # the template renders only list content (drops strings)
    image_inputs: tuple[str, ...] = ("pixel_values", "image_grid_thw")  # one image's inputs
    video_inputs: tuple[str, ...] = ()  # one video's inputs (empty: no video support)
    # the forward takes a clip's frames as images, in the images' inputs (SmolVLM,
    # InternVL): images and clips then go in one sequence, in the order their tokens appear
    frames_as_images: bool = False
    # a clip's frames hold the image's token, the forward taking them as video (GLM-4.6V)
    video_image_token: bool = False
    # a clip's grid row (t, h, w) is one chunk whose t frames the tower pools into one
    # frame's tokens: h * w / merge^2 embeddings, not t * h * w / merge^2 (Kimi-K2.5's
    # MoonViT; see the docstring)
    video_pooled_chunks: bool = False
    # the processor's audio feature extractor class (Gemma 4's processor needs one even
    # for images), loaded from the checkpoint beside the image processor
    feature_extractor: str | None = None
    # tokens that only an image's or video's markup holds besides its placeholder and pads
    # (which the processor names itself): the template's vision start/end markers, the
    # processor's tile and crop markers. A model must never sample them (``VisionSpec``'s
    # ``banned_token_ids``); tokens a tokenizer lacks are skipped
    marker_tokens: tuple[str, ...] = ()
    # the image processor has a PIL backend ("Pil" class); LFM2-VL's has only torchvision's
    pil_backend: bool = True
    # vf_mm's torch-only port of a torchvision-only image processor ("module:Class")
    torch_port: str | None = None
    # how one image's inputs are laid out, which ``ItemChecker`` (``_items``) checks a
    # client's against: "grid", "crops", "tiles", "anyres", "soft_tokens"; None: not
    # checked (a server refuses to take the family's processed images)
    item_layout: str | None = "grid"
    # the token vLLM 0.32 writes at a clip's embedding positions in place of the renderer's
    # (InternVL3: "<video>" for "<IMG_CONTEXT>"; see the docstring); None: the renderer's
    vllm_video_embed_token: str | None = None
    # why vLLM 0.32 cannot take the family's clips (see the docstring); None: it can
    vllm_video_refusal: str | None = None
    # other config model_types of the family's checkpoints, with the model class of each,
    # recognised by the processor class their processor config names (see the docstring)
    config_types: tuple[tuple[str, str], ...] = ()


#: vLLM 0.32 and Kimi-K2.5's clips (``VisionFamily.vllm_video_refusal``): measured against a
#: CPU server (vllm/entrypoints/scale_out/token_in_token_out/serving.py parses a video_url
#: part; vllm/renderers/chat_utils.py ``_resolve_vision_chunk_items`` passes the clip on
#: unsplit; vllm/model_executor/models/kimi_k25.py expands each chunk to <|media_pad|> ids)
_KIMI_VLLM_VIDEO = (
    "vLLM 0.32 cannot take Kimi-K2.5's clips: its token-in route passes a raw clip to "
    "KimiK25Processor unsplit, which answers 400 'Failed to apply KimiK25Processor', and it "
    "would expand a chunk to <|media_pad|> ids where the renderer writes the video token "
    "with the chunk's timestamp and <|media_begin|>video<|media_content|> markup (features "
    "likewise: one vision_chunk item per chunk at <|media_pad|> positions). Render "
    "Kimi-K2.5's clips with the LocalBackend or `vf-mm serve`"
)

QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_QWEN_VIDEO = ("pixel_values_videos", "video_grid_thw")
_QWEN_MARKERS = ("<|vision_start|>", "<|vision_end|>")
# SmolVLM writes a split image's tiles as <row_R_col_C> (R, C up to 6 in its vocabulary)
_SMOLVLM_MARKERS = ("<fake_token_around_image>", "<global-img>",
                    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))  # fmt: skip

# LFM2-VL writes a split image's tiles as <|img_row_R_col_C|> (up to 10 tiles a side)
_LFM2_VL_MARKERS = ("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                    *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11)))  # fmt: skip

_FAMILIES = {
    f.model_type: f
    for f in (
        VisionFamily("qwen2_vl", "Qwen2-VL", "Qwen2VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen2VLForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen2-VL-2B-Instruct", video_inputs=_QWEN_VIDEO,
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen2_5_VLForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen2.5-VL-3B-Instruct",
                     video_inputs=(*_QWEN_VIDEO, "second_per_grid_ts"),
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("qwen3_vl", "Qwen3-VL", "Qwen3VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen3VLForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen3-VL-2B-Instruct", video_inputs=_QWEN_VIDEO,
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("qwen3_5", "Qwen3.5", "Qwen3VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen3_5ForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen3.5-0.8B", tool_format="xml", video_inputs=_QWEN_VIDEO,
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("gemma3", "Gemma 3", "Gemma3Processor", "Gemma3ImageProcessor",
                     "Gemma3ForConditionalGeneration", "token_type_ids",
                     "google/gemma-3-4b-it", ("<end_of_turn>", "<eos>"), tool_role=False,
                     image_inputs=("pixel_values",),
                     marker_tokens=("<start_of_image>", "<end_of_image>"),
                     item_layout="crops"),
        VisionFamily("smolvlm", "SmolVLM", "SmolVLMProcessor", "SmolVLMImageProcessor",
                     "SmolVLMForConditionalGeneration", None,
                     "HuggingFaceTB/SmolVLM2-2.2B-Instruct", ("<end_of_utterance>",),
                     image_axis=1, content_as_parts=True,
                     image_inputs=("pixel_values", "pixel_attention_mask"),
                     video_inputs=("pixel_values", "pixel_attention_mask"),
                     frames_as_images=True, marker_tokens=_SMOLVLM_MARKERS,
                     item_layout="tiles"),
        VisionFamily("llava_onevision", "LLaVA-OneVision", "LlavaOnevisionProcessor",
                     "LlavaOnevisionImageProcessor", "LlavaOnevisionForConditionalGeneration",
                     None, "llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
                     pad_axis=1, content_as_parts=True,
                     image_inputs=("pixel_values", "image_sizes", "batch_num_images"),
                     video_inputs=("pixel_values_videos",),
                     item_layout="anyres"),
        VisionFamily("gemma4", "Gemma 4", "Gemma4Processor", "Gemma4ImageProcessor",
                     "Gemma4ForConditionalGeneration", "mm_token_type_ids",
                     "google/gemma-4-E2B-it", ("<turn|>", "<|tool_response>", "<eos>"),
                     tool_format="gemma4", image_inputs=("pixel_values", "image_position_ids"),
                     video_inputs=("pixel_values_videos", "video_position_ids",
                                   "num_frames_per_video"),
                     feature_extractor="Gemma4AudioFeatureExtractor",
                     marker_tokens=("<|image>", "<image|>", "<|video|>", "<|audio>", "<audio|>",
                                    "<|audio|>"),
                     item_layout="soft_tokens"),
        VisionFamily("qwen3_vl_moe", "Qwen3-VL-MoE", "Qwen3VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen3VLMoeForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen3-VL-30B-A3B-Instruct", video_inputs=_QWEN_VIDEO,
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("qwen3_5_moe", "Qwen3.5-MoE", "Qwen3VLProcessor", "Qwen2VLImageProcessor",
                     "Qwen3_5MoeForConditionalGeneration", "mm_token_type_ids",
                     "Qwen/Qwen3.5-35B-A3B", tool_format="xml", video_inputs=_QWEN_VIDEO,
                     marker_tokens=_QWEN_MARKERS),
        VisionFamily("llava_next", "LLaVA-NeXT", "LlavaNextProcessor", "LlavaNextImageProcessor",
                     "LlavaNextForConditionalGeneration", None,
                     "llava-hf/llava-v1.6-mistral-7b-hf", ("</s>",), pad_axis=1, tool_role=False,
                     content_as_parts=True, image_inputs=("pixel_values", "image_sizes"),
                     item_layout="anyres"),
        VisionFamily("internvl", "InternVL", "InternVLProcessor", "GotOcr2ImageProcessor",
                     "InternVLForConditionalGeneration", None, "OpenGVLab/InternVL3-1B-hf",
                     image_inputs=("pixel_values",), video_inputs=("pixel_values",),
                     frames_as_images=True, marker_tokens=("<img>", "</img>"),
                     item_layout="crops", vllm_video_embed_token="<video>"),
        VisionFamily("lfm2_vl", "LFM2-VL", "Lfm2VlProcessor", "Lfm2VlImageProcessor",
                     "Lfm2VlForConditionalGeneration", None, "LiquidAI/LFM2.5-VL-3B",
                     ("<|im_end|>",), tool_format="pythonic",
                     image_inputs=("pixel_values", "pixel_attention_mask", "spatial_shapes"),
                     marker_tokens=_LFM2_VL_MARKERS, pil_backend=False,
                     torch_port="_lfm2_vl_images:Lfm2VlImages", item_layout=None),
        VisionFamily("kimi_k25", "Kimi-K2.5", "Kimi_K25Processor", "Kimi_K25ImageProcessor",
                     "Kimi_K25ForConditionalGeneration", None, "moonshotai/Kimi-K2.5",
                     ("<|im_end|>", "[EOS]"), tool_format="kimi",
                     video_inputs=("pixel_values_videos", "video_grid_thw"),
                     video_pooled_chunks=True,
                     marker_tokens=("<|media_begin|>", "<|media_content|>", "<|media_end|>"),
                     pil_backend=False, torch_port="_kimi_k25_images:KimiK25Images",
                     item_layout=None, vllm_video_refusal=_KIMI_VLLM_VIDEO),
        # GLM-4.6V: a Qwen-VL-like grid of merged patches (image_grid_thw) and M-RoPE
        # (mm_token_type_ids); <|image|> is both the placeholder and the pad; a turn ends
        # when the model writes the next turn's header (<|user|>, <|observation|>). Its
        # released checkpoints are GLM-4.1V's and GLM-4.5V's config types with
        # Glm46VProcessor (config_types); transformers' own "glm46v" config is the same
        # architecture (Glm46VForConditionalGeneration subclasses Glm4v's)
        VisionFamily("glm46v", "GLM-4.6V", "Glm46VProcessor", "Glm46VImageProcessor",
                     "Glm4vForConditionalGeneration", "mm_token_type_ids",
                     "zai-org/GLM-4.6V-Flash",
                     ("<|endoftext|>", "<|user|>", "<|observation|>"), tool_format="glm",
                     video_inputs=_QWEN_VIDEO, video_image_token=True,
                     marker_tokens=("<|begin_of_image|>", "<|end_of_image|>",
                                    "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"),
                     config_types=(("glm4v", "Glm4vForConditionalGeneration"),
                                   ("glm4v_moe", "Glm4vMoeForConditionalGeneration"),
                                   ("glm46v", "Glm46VForConditionalGeneration"))),
    )
}  # fmt: skip

VISION_FAMILIES = tuple(_FAMILIES)

IMAGE_BACKENDS = ("auto", "pil", "torchvision", "torch")


def family_info(family: str) -> VisionFamily:
    """The registry record of ``family``.

    Args:
        family: A ``model_type``.

    Raises:
        UnsupportedModelError: A family vf_mm does not know.
    """
    try:
        return _FAMILIES[family]
    except KeyError:
        shared = _sharing_families(family)
        if shared:
            raise UnsupportedModelError(
                f"model type {family!r} is a config type that several models share; vf_mm "
                f"renders it as family {shared[0]!r} only when its processor config names "
                f"{_FAMILIES[shared[0]].processor} (a {_FAMILIES[shared[0]].label} "
                f"checkpoint): pass family={shared[0]!r}, or vf_mm.models.model_type(path), "
                "which reads a checkpoint's family"
            ) from None
        close = _nearest_family(family)
        raise UnsupportedModelError(
            f"model type {family!r} is not a vision family vf_mm renders "
            + (f"(did you mean {close!r}? " if close else "(")
            + f"supported: {', '.join(VISION_FAMILIES)})"
        ) from None


def _sharing_families(config_type: object) -> list[str]:
    """The families whose checkpoints may declare ``config_type`` (``config_types``)."""
    return [f.model_type for f in _FAMILIES.values() if config_type in dict(f.config_types)]


def _nearest_family(name: object) -> str | None:
    """The family a mistyped or model-card name most likely means: ``"Qwen2.5-VL-3B"``,
    ``"llava"`` or ``"gema3"`` give ``qwen2_5_vl``, ``llava_onevision``, ``gemma3``; None
    when nothing is close."""
    text = re.sub(r"[-. ]", "_", str(name).lower())
    if len(text) >= 3:
        for family in VISION_FAMILIES:
            if family.startswith(text) or text.startswith(family):
                return family
    close = difflib.get_close_matches(text, VISION_FAMILIES, n=1)
    return close[0] if close else None


def torchvision_available() -> bool:
    """Whether torchvision imports here (installed is not enough: a torchvision built for
    another torch fails at import, and transformers then falls back to PIL too)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or a binary that does not match this torch
        return False
    return True


def resolve_image_backend(backend: str = "auto", *, family: str | None = None) -> str:
    """``"pil"``, ``"torchvision"`` or ``"torch"``: the backend ``backend`` names on this
    machine, or, given ``family``, whose numbers its images get (``image_backend_of``'s
    answer, without loading the processor).

    A family with no PIL image processor (LFM2.5-VL, Kimi-K2.5) computes torchvision's
    numbers on every machine, through transformers' class or vf_mm's port, so for it
    ``"auto"`` and ``"torch"`` give ``"torchvision"``: a run recorded without torchvision
    resumes where it imports, its pixels being equal.

    Args:
        backend: ``"auto"`` is what ``AutoProcessor`` picks on this machine (torchvision
            where it imports, else PIL; a family with no PIL backend then gets vf_mm's
            torch-only port, ``image_processor_class``); ``"torch"`` is that port asked
            for by name.
        family: The checkpoint's ``model_type`` (None: not known; a family vf_mm does not
            render is taken as one with a PIL backend).

    Raises:
        MissingDependencyError: Asking for torchvision where it does not import.
    """
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"image_backend must be one of {list(IMAGE_BACKENDS)}, not {backend!r}")
    if backend == "torchvision" and not torchvision_available():
        raise MissingDependencyError(
            "image_backend='torchvision' needs torchvision, which does not import here "
            "(install the build that matches your torch, or use image_backend='auto')"
        )
    info = _FAMILIES.get(family) if family is not None else None
    if info is not None and not info.pil_backend and backend in ("auto", "torch"):
        return "torchvision"
    if backend == "auto":
        return "torchvision" if torchvision_available() else "pil"
    return backend


def image_processor_class(family: str, backend: str = "pil") -> type[Any]:
    """The family's image processor class for ``backend``.

    ``"pil"`` and ``"torchvision"`` are transformers' classes; ``"torch"`` is vf_mm's
    torch-only port of a torchvision-only one (``VisionFamily.torch_port``), which
    ``"auto"`` also gives where torchvision does not import.

    Raises:
        MissingDependencyError: ``"pil"`` for a family with no PIL image processor;
            ``"torchvision"`` where it does not import.
        UnsupportedModelError: ``"torch"`` for a family with a PIL image processor (it
            has no port: nothing to port).
    """
    import transformers

    info = family_info(family)
    resolved = resolve_image_backend(backend)
    if resolved == "torch" and info.torch_port is None:
        raise UnsupportedModelError(
            f"image_backend='torch' is vf_mm's torch-only port of the image processors "
            f"transformers has only for torchvision; {info.label}'s has a PIL backend: "
            "use image_backend='auto', 'pil' or 'torchvision'"
        )
    if info.torch_port is not None and (
        resolved == "torch" or (backend == "auto" and resolved == "pil")
    ):
        return _torch_port(info.torch_port)
    if resolved == "pil" and not info.pil_backend:
        raise MissingDependencyError(
            f"{info.label}'s image processor ({info.image_processor}) has only a torchvision "
            "backend in transformers 5.23 (no PIL one): load it with image_backend='auto' "
            "(torchvision's where it imports, else vf_mm's torch-only port, which computes "
            "the same numbers), 'torchvision' or 'torch' (the port)"
        )
    return getattr(
        transformers, info.image_processor + ("" if resolved == "torchvision" else "Pil")
    )


#: the transformers release whose image processor pipeline and torchvision processors
#: the ports follow (the lock's); older ones differ (5.19's ``convert_to_rgb``, its
#: backends), so a port is refused there rather than computing something else
PORTS_FOLLOW = (5, 23)


def _torch_port(spec: str) -> type[Any]:
    """The port class named ``"module:Class"`` (a module of ``vf_mm.models``).

    Raises:
        MissingDependencyError: A transformers older than the one the ports follow.
    """
    import importlib

    import transformers

    version = tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:2])
    if version < PORTS_FOLLOW:
        raise MissingDependencyError(
            f"vf_mm's torch-only image processors follow transformers "
            f"{'.'.join(map(str, PORTS_FOLLOW))}'s; this is {transformers.__version__}: "
            "install transformers>=5.23, or use image_backend='torchvision' where it imports"
        )
    module, name = spec.split(":")
    return getattr(importlib.import_module(f"vf_mm.models.{module}"), name)


def image_backend_of(image_processor: Any) -> str:
    """Whose numbers a loaded image processor computes: ``"pil"`` or ``"torchvision"``.

    vf_mm's torch-only ports (``"torch"``) compute torchvision's numbers with torch
    alone, so they are ``"torchvision"`` too: a sampler with torchvision and a trainer
    without it agree (their pixels equal, bit for bit).

    Args:
        image_processor: A loaded HF image processor.
    """
    names = {cls.__name__ for cls in type(image_processor).__mro__}
    return "torchvision" if names & {"TorchvisionBackend", "TorchvisionPort"} else "pil"


def model_class(family: str, *, checkpoint: str | Path | None = None) -> type[Any]:
    """The family's transformers model class (``...ForConditionalGeneration``).

    Args:
        family: A ``model_type``.
        checkpoint: A checkpoint directory of the family: the class that loads it, which
            its config type decides where the family's checkpoints declare several
            (``VisionFamily.config_types``: GLM-4.6V's MoE is
            ``Glm4vMoeForConditionalGeneration``, GLM-4.6V-Flash
            ``Glm4vForConditionalGeneration``); None: the family's class, for a family
            whose checkpoints all load with one.

    Raises:
        ValueError: No checkpoint for a family whose checkpoints load with several classes:
            the wrong one would load with its missing weights initialised at random, which
            only a warning reports.
    """
    import transformers

    info = family_info(family)
    name = info.model
    if checkpoint is not None:
        name = dict(info.config_types).get(_config_type(Path(checkpoint)), name)
    elif len({cls for _, cls in info.config_types} | {name}) > 1:
        classes = " or ".join(sorted({cls for _, cls in info.config_types} | {name}))
        raise ValueError(
            f"{info.label}'s checkpoints load with {classes}, by their config: pass "
            f"model_class({family!r}, checkpoint=path)"
        )
    return getattr(transformers, name)


@cache
def processor_class(family: str) -> type[Any]:
    """The family's HF processor, accepting ``video_processor=None``.

    Args:
        family: A ``model_type``.
    """
    import transformers

    base = getattr(transformers, family_info(family).processor)
    if "video_processor" not in base.get_attributes():
        return base

    def check_argument_for_proper_class(self: Any, name: str, argument: Any) -> Any:
        if argument is None and name == "video_processor":
            return None
        return base.check_argument_for_proper_class(self, name, argument)

    return type(
        f"{base.__name__}NoVideo",
        (base,),
        {"check_argument_for_proper_class": check_argument_for_proper_class},
    )


def model_type(path: str | Path) -> str:
    """A checkpoint directory's family: the ``model_type`` of its ``config.json``, or the
    vision family whose checkpoints declare that type (``VisionFamily.config_types``) when
    its processor config names that family's processor.

    GLM-4.6V-Flash declares ``glm4v`` and GLM-4.6V ``glm4v_moe``, as GLM-4.1V and GLM-4.5V
    do; only the processor their ``processor_class`` names (``Glm46VProcessor``, not
    ``Glm4vProcessor``) tells them apart, the way vLLM tells them apart too. A shared type
    whose processor is not the family's is returned as is: no family vf_mm renders.

    Args:
        path: The checkpoint directory.
    """
    path = Path(path)
    declared = _config_type(path)
    if declared in _FAMILIES:
        return declared
    shared = _sharing_families(declared)
    if shared:
        named = checkpoint_processor(path)
        for family in shared:
            if named == _FAMILIES[family].processor:
                return family
    return declared


def _config_type(path: Path) -> str:
    """The ``model_type`` written in ``path``'s ``config.json``."""
    config = path / "config.json"
    try:
        return json.loads(config.read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"{config}: cannot read the model type ({exc})") from None


def checkpoint_processor(path: str | Path) -> str | None:
    """The processor class a checkpoint directory's files name (``processor_class``), read
    where vLLM reads it: ``processor_config.json``, then ``preprocessor_config.json``, then
    ``tokenizer_config.json``; None where none names one (or a file is not JSON)."""
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        file = Path(path) / name
        try:
            saved = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and isinstance(saved.get("processor_class"), str):
            return saved["processor_class"]
    return None


def load_processor(path: str | Path, *, image_backend: str = "auto", tokenizer: Any = None) -> Any:
    """The HF processor of a vision checkpoint directory.

    The tokenizer, the image processor of ``image_backend``, and the processor options of
    its ``processor_config.json`` (e.g. Gemma 3's ``image_seq_length``).

    Args:
        path: The checkpoint directory.
        image_backend: ``"auto"``, ``"pil"``, ``"torchvision"`` or ``"torch"``
            (``image_processor_class``).
        tokenizer: This checkpoint's tokenizer, already loaded (``AutoTokenizer``'s, or a
            ``TokenizerSnapshot``'s copy), taken as is instead of loading it from the
            directory again (a large vocabulary takes seconds to load); None loads it.

    Raises:
        UnsupportedModelError: A checkpoint of a family vf_mm does not know.
        MissingDependencyError: ``"torchvision"`` where it does not import.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    family = model_type(path)
    if family not in _FAMILIES:
        raise UnsupportedModelError(
            f"{path}: model type {family!r} is not a vision family vf_mm renders "
            f"(supported: {', '.join(VISION_FAMILIES)})"
        )
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = image_processor_class(family, image_backend).from_pretrained(path)
    template = tokenizer.chat_template
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    options = _processor_options(path)
    cls = processor_class(family)
    if "video_processor" in cls.get_attributes():
        options["video_processor"] = None
    extractor = family_info(family).feature_extractor
    if extractor is not None:
        import transformers

        try:
            options["feature_extractor"] = getattr(transformers, extractor).from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise UnsupportedModelError(
                f"{path}: the {family_info(family).label} processor needs its audio feature "
                f"extractor's settings (processor_config.json), which do not load: {exc}"
            ) from None
    try:
        return cls(
            image_processor=image_processor, tokenizer=tokenizer, chat_template=template, **options
        )
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(
            f"{path}: its tokenizer and processor files do not make a "
            f"{family_info(family).label} processor ({type(exc).__name__}: {exc})"
        ) from None


def _processor_options(path: Path) -> dict[str, Any]:
    """The processor's own init options saved beside the checkpoint (not its class name,
    its sub-processors or its template, which are loaded on their own)."""
    file = path / "processor_config.json"
    if not file.exists():
        return {}
    try:
        saved = json.loads(file.read_text())
    except ValueError as exc:
        raise UnsupportedModelError(f"{file}: not valid JSON ({exc})") from None
    skip = {"processor_class", "chat_template", "image_processor", "video_processor", "tokenizer",
            "feature_extractor"}  # fmt: skip
    return {k: v for k, v in saved.items() if k not in skip and not k.startswith("_")}


def image_token_ids(processor: Any) -> tuple[int, ...]:
    """The ids of the tokens that stand for image embeddings.

    Gemma 3's soft tokens, not its ``<start_of_image>`` placeholder; Qwen's
    ``<|image_pad|>``.

    Args:
        processor: The family's HF processor.
    """
    ids = getattr(processor, "image_token_ids", None) or [processor.image_token_id]
    # InternVL lists its <img> and </img> markers among its image tokens (transformers'
    # mm_token_type_ids mark them); its model puts no embedding there
    markers = {getattr(processor, n, None) for n in ("start_image_token_id", "end_image_token_id")}
    return tuple(int(i) for i in ids if i not in markers)


def image_kwargs(processor: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The image processor call options the processor uses: its defaults (e.g. SmolVLM's
    ``return_row_col_info``, Gemma 3's pan-and-scan settings) updated with ``options``
    (processor call options such as ``do_pan_and_scan=True``). Compute once per processor
    and pass to ``expand_image``: merging them costs as much as a small image."""
    import inspect

    merge = processor._merge_kwargs
    leading: tuple[Any, ...] = ()
    if "ModelProcessorKwargs" in inspect.signature(merge).parameters:  # transformers < 5.23
        leading = (processor.valid_processor_kwargs,)
    merged = merge(
        *leading,
        tokenizer_init_kwargs=getattr(processor.tokenizer, "init_kwargs", {}),
        return_tensors="np",
        **(options or {}),
    )
    return {**merged["images_kwargs"], "return_tensors": "np"}


def expand_image(
    processor: Any,
    image: Any,
    *,
    options: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> tuple[str, dict[str, np.ndarray]]:
    """One image as the family's processor sees it: replacement text and model inputs.

    The text replaces the image's placeholder (``processor.image_token``) in the prompt; the
    inputs are numpy arrays with a leading image axis, as the image processor returns them
    for a batch of one (bookkeeping the model does not take, like Gemma 3's ``num_crops``,
    is dropped, exactly as the processor drops it).

    This is the processor's own per-image step (its image processor with the processor's
    options, then its ``replace_image_token``), so the text equals what
    ``processor(text=..., images=..., **options)`` puts in the prompt for this image.

    ``image`` is a PIL image or a channels-last ``(H, W, C)`` array. An array's layout is
    told to the processor (``input_data_format``): left to itself, it guesses it from the
    shape and reads a picture 1, 3 or 4 pixels tall as channels-first (its rows taken for
    colours), without an error. A PIL image is not told: every backend reads it by its own
    layout, and transformers 5.19's torchvision backend, which turns it into a
    channels-first tensor first, would permute it again if told channels-last.

    Args:
        processor: The family's HF processor.
        image: A loaded RGB PIL image, or a channels-last ``(H, W, C)`` array.
        options: Processor call options (e.g. Gemma 3's ``do_pan_and_scan=True``, which
            the processor's own defaults switch off whatever the image processor's config
            says).
        kwargs: ``image_kwargs(processor, options)``, computed beforehand.
    """
    from PIL import Image

    if kwargs is None:
        kwargs = image_kwargs(processor, options)
    layout = {} if isinstance(image, Image.Image) else {"input_data_format": "channels_last"}
    processed = processor.image_processor([image], **kwargs, **layout)
    replacement = processor.replace_image_token(
        processed, image_idx=0, **_replacement_options(processor, kwargs)
    )
    unused = set(getattr(processor, "unused_input_names", ()) or ())
    keep = set(processor.image_processor.model_input_names) - unused
    item = {k: _numpy(v) for k, v in processed.items() if k in keep}
    return replacement, item


def _replacement_options(processor: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the processor's own call passes ``replace_image_token`` besides the image:
    LFM2-VL's takes the image options (tile size, thumbnail) and whether to write its
    image and tile markers (``use_image_special_tokens``, on by default: without it the
    text would lack them); the other families' take nothing.

    transformers 5.23 keeps that flag on the processor; 5.19 to 5.22 keep it as a
    ``text_kwargs`` default of the processor's kwargs class (their call moves it to the
    image options). It is read from either: missed, ``replace_image_token`` writes no
    markers and the prompt silently differs from the processor's."""
    flag = getattr(processor, "use_image_special_tokens", None)  # transformers >= 5.23
    if flag is None:
        kwargs_class = getattr(processor, "valid_processor_kwargs", None)
        defaults = getattr(kwargs_class, "_defaults", None) or {}
        flag = defaults.get("text_kwargs", {}).get("use_image_special_tokens")
    if flag is None:
        return {}
    return {**kwargs, "use_image_special_tokens": flag}


def _numpy(value: Any) -> np.ndarray:
    """A processor output as numpy (the torchvision backend may hand back torch tensors)."""
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)
