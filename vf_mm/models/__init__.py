"""The model families vf_mm renders, and offline tiny checkpoints of them.

Registry: ``VISION_FAMILIES`` are the checkpoint ``model_type`` values that get image
support (any other checkpoint with a chat template renders as text); ``family_info(family)`` is a family's ``VisionFamily`` record.
``model_type(path)`` reads a checkpoint directory's family (its config's type, or the family
whose checkpoints share that type and whose processor its files name); ``model_class(family)`` and
``processor_class(family)`` are the family's transformers classes, and ``load_processor(path)`` loads a checkpoint's processor
(``TokenizerSnapshot``: a checkpoint's tokenizer loaded once, pickled, copied cheaply for
each renderer and each worker process);
``expand_image(processor, image)`` is one image's model inputs and prompt text, as the
family's processor computes them, and ``image_token_ids(processor)`` the ids that take
image embeddings; ``model_inputs(family, input_ids, images, ...)`` is what the family's
forward takes for a batch, and ``forward_inputs(family, model, inputs)`` those inputs with
the vision features computed by vf_mm where transformers' own forward computes them wrong
(Kimi-K2.5 clips whose chunks keep several frames): every forward vf_mm runs goes through it.
Video (``VIDEO_FAMILIES``: the Qwen-VL ones, LLaVA-OneVision, SmolVLM2, InternVL3):
``load_video_settings(path, family)`` reads a
checkpoint's video processing, ``expand_video(settings, frames, ...)``
is one clip's model inputs and prompt text, as transformers' video processor computes
them, with torch alone (no torchvision needed).
``image_backend`` (``IMAGE_BACKENDS``: ``"auto"``, ``"pil"``, ``"torchvision"``,
``"torch"``) picks the image processing; ``"auto"`` is what ``AutoProcessor`` and vLLM use
on this machine (``resolve_image_backend``), so the renderer's pixels are the engine's.
All of them work without torchvision (CPU-only machines lack it): the families whose
image processor transformers has only for torchvision (LFM2-VL, Kimi-K2.5) get vf_mm's
torch-only ports there (``"torch"``), which compute torchvision's numbers bit for bit.

Recipes (users reach them through ``vf_mm.testing``, siblings through this package's
internal tier ``_internal``): ``build_tiny_vlm(path, family)`` and ``build_tiny_lm(path)``
write random-weight checkpoints in about a second with no network (the same files a real
checkpoint has, so every loader in vf_mm, transformers and vLLM read them), with the
tokenizers and chat templates of ``vf_mm.testing`` (``TEMPLATE_VARIANTS``: the variants of
families whose checkpoints ship several, e.g. Gemma 4's Hub revisions).
``cached_tiny_vlm(family)`` is a family's tiny checkpoint built once into ``$VF_MM_CACHE``
(default ``~/.cache/vf_mm``) and reused; ``embedded_model()`` is the tiny Qwen2.5-VL
``vf-mm eval`` runs when given no model, built the same way.

Importing this module loads neither torch nor transformers; each function imports
what it needs.
"""

from vf_mm.models._embedded import cached_tiny_vlm, embedded_model
from vf_mm.models._families import (
    IMAGE_BACKENDS,
    VISION_FAMILIES,
    VisionFamily,
    expand_image,
    family_info,
    image_backend_of,
    image_token_ids,
    load_processor,
    model_class,
    model_type,
    processor_class,
    resolve_image_backend,
    torchvision_available,
)
from vf_mm.models._forward import forward_inputs
from vf_mm.models._inputs import model_inputs
from vf_mm.models._templates import TEMPLATE_VARIANTS
from vf_mm.models._tokenizer_snapshot import TokenizerSnapshot
from vf_mm.models._video import (
    VIDEO_FAMILIES,
    expand_video,
    load_video_settings,
)

__all__ = [
    "image_backend_of",
    "IMAGE_BACKENDS",
    "resolve_image_backend",
    "torchvision_available",
    "TEMPLATE_VARIANTS",
    "TokenizerSnapshot",
    "VIDEO_FAMILIES",
    "VISION_FAMILIES",
    "VisionFamily",
    "cached_tiny_vlm",
    "embedded_model",
    "expand_image",
    "expand_video",
    "family_info",
    "forward_inputs",
    "image_token_ids",
    "load_processor",
    "load_video_settings",
    "model_class",
    "model_inputs",
    "model_type",
    "processor_class",
]
