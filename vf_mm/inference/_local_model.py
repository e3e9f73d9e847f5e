"""The checkpoint the local backend serves, loaded once, and what its engines ask of it.

``LocalModel.from_pretrained`` loads a checkpoint directory (a vision family's own
class, else a causal LM) onto a device and reads the facts every engine needs: the
special token ids that are never sampled (an image's own tokens need image inputs),
the end and pad ids, the layer kinds (which decide the engine: ``resumable``,
``pool_model``), and whether positions are M-RoPE. Its generation config is replaced
by a neutral one, so the logprobs the engines return are the model's raw ones.

It also turns a request into model-side inputs, the same for every engine: the checks
a request passes before it joins a batch (``check``), its images' and clips' processed
inputs (``media_inputs``) and its positions (``positions``: for the Qwen-VL families the
model's own M-RoPE positions, computed for a prompt's uncached tail alone).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vf_mm.errors import BackendError, BackendOutOfMemoryError
from vf_mm.inference._kv import LINEAR_STATES
from vf_mm.inference._packed import PackedModel, flash_available
from vf_mm.inference._prefix_cache import MediaSpan
from vf_mm.inference._types import GenerateRequest, check_prompt_length

# families whose image attention is not causal: their cache is never reused
_NOT_RESUMABLE = ("gemma3", "gemma4")  # Gemma 4: its 26B and 31B, bidirectional over images

# an image or clip of a prompt: its span (placeholder and content key), modality, inputs
Media = tuple[MediaSpan, str, Mapping[str, Any]]


class LocalModel:
    """A transformers ``model`` loaded from ``path`` on ``device`` (``from_pretrained``),
    with its facts as attributes. ``name`` is the backend's name in errors."""

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_model_len: int | None = None,
    ) -> LocalModel:
        """Load the checkpoint directory ``path`` in ``dtype`` (default float32) onto
        ``device``, in evaluation mode."""
        from transformers.utils import logging as hf_logging

        from vf_mm.models import VISION_FAMILIES, model_class, model_type

        path = Path(path)
        hf_logging.disable_progress_bar()  # no tqdm bars inside vf-mm's own progress display
        family = model_type(path)
        if family in VISION_FAMILIES:
            model = model_class(family, checkpoint=path).from_pretrained(
                path, dtype=dtype or torch.float32
            )
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        model.to(device).eval()
        return cls(model, path=path, family=family, device=device, max_model_len=max_model_len)

    def __init__(
        self,
        model: Any,
        *,
        path: Path,
        family: str,
        device: str,
        max_model_len: int | None = None,
    ) -> None:
        from transformers import GenerationConfig

        from vf_mm.models import VISION_FAMILIES, family_info

        self.model = model
        self.path = path
        self.name = f"local:{path.name}"
        self.family = family
        self.device = torch.device(device)
        config = model.config
        text_config = config.get_text_config(decoder=True)
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self.is_multimodal = family in VISION_FAMILIES
        self.image_token_id = _config_id(config, "image_token")
        self.video_token_id = _config_id(config, "video_token")
        # the input holding each item's pixels (SmolVLM: a clip's frames are images)
        self.pixels = {"image": "pixel_values", "video": "pixel_values_videos"}
        if self.is_multimodal:
            info = family_info(family)
            self.pixels["video"] = (info.video_inputs or ("pixel_values_videos",))[0]
            if info.frames_as_images or info.video_image_token:
                self.video_token_id = self.image_token_id
        # the model must never sample an image's own tokens: they need image inputs (a
        # request adds its renderer's: GenerateRequest.banned_token_ids)
        self.suppress_token_ids = [
            i
            for i in (
                self.image_token_id,
                _config_id(config, "video_token"),
                _config_id(config, "vision_start_token"),
                _config_id(config, "vision_end_token"),
                _config_id(config, "boi_token"),
                _config_id(config, "eoi_token"),
                _config_id(config, "audio_token"),  # Gemma 4's: vf_mm renders no audio
                _config_id(config, "boa_token"),
                _config_id(config, "eoa_token"),
            )
            if i is not None
        ]
        self.suppress = torch.tensor(sorted(set(self.suppress_token_ids)), dtype=torch.long)
        self._suppress_set = frozenset(self.suppress_token_ids)
        self.vocab_size: int | None = getattr(text_config, "vocab_size", None)
        eos = model.generation_config.eos_token_id
        self.eos_token_ids: set[int] = set([eos] if isinstance(eos, int) else (eos or []))
        pad = model.generation_config.pad_token_id
        self.pad_token_id: int = pad if pad is not None else 0
        # a neutral generation config: a checkpoint's defaults (repetition_penalty 1.05 in
        # real Qwen2.5-VL) would otherwise bend the scores before the sampler sees them,
        # and the logprobs would no longer be the model's raw ones
        model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_token_ids) or None, pad_token_id=self.pad_token_id
        )
        self.num_layers = int(text_config.num_hidden_layers)
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        # rows of different lengths share forwards: every layer must be full attention, or
        # linear attention (a state per row, prefilled one row per forward)
        self.linear = frozenset(i for i, t in enumerate(layer_types) if t == "linear_attention")
        self.resumable = (
            family not in _NOT_RESUMABLE
            and all(t in ("full_attention", "linear_attention") for t in layer_types)
            and (LINEAR_STATES or not self.linear)
        )
        self.mrope = self.is_multimodal and hasattr(getattr(model, "model", None), "get_rope_index")
        forward = getattr(model, "model", model).forward
        # the model takes the vision tower's outputs in place of pixels (a cache can hold them)
        self.encoder_outputs = self.is_multimodal and (
            "mm_encoder_outputs" in inspect.signature(forward).parameters
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def image_token(self) -> int:
        """The model's image token id: only asked for by a model that takes images."""
        assert self.image_token_id is not None, "a vision model has an image token"
        return self.image_token_id

    def pool_model(self, kv_pool: bool | None, *, varlen_vision: bool = True) -> PackedModel | None:
        """The model set up for the pool engine, when it runs this model: ``kv_pool``
        True, or None on a CUDA device with a half-precision model (FlashAttention's
        varlen kernel). Families it cannot run (recurrent or sliding-window layers,
        non-causal image attention) keep their engine; asking for it then is an error.
        ``varlen_vision``: the vision tower's attention in one varlen call, where
        FlashAttention serves it."""
        flash = flash_available(self.device, self.dtype)
        if kv_pool is False or (kv_pool is None and not flash):
            return None
        packed = PackedModel(self.model, varlen_vision=varlen_vision and flash)
        if self.resumable and not self.linear and packed.supported:
            return packed
        if kv_pool:
            raise BackendError(
                f"kv_pool=True: {self.family} cannot run on the KV pool engine (it needs "
                "every text layer to be full, causal attention with keys and values of "
                "one width); leave kv_pool unset",
                backend=self.name,
            )
        return None

    # -- requests ---------------------------------------------------------------------------

    def check(self, request: GenerateRequest) -> None:
        """Refuse a request this model cannot run (too long, unprocessed or miscounted
        images, banned ids outside the vocabulary): it fails alone, before it joins a
        batch."""
        check_prompt_length(request, self.max_model_len, backend=self.name)
        if request.content_parts:
            raise BackendError(
                "the local backend takes processed images (features), not content_parts",
                backend=self.name,
            )
        self._check_images(request)
        self._check_banned(request)

    def extra_bans(self, request: GenerateRequest) -> tuple[int, ...]:
        """The request's banned ids that the model's own ban does not cover."""
        own = self._suppress_set
        return tuple(t for t in request.banned_token_ids if t not in own)

    def failure(self, exc: Exception) -> BackendError:
        """The error the requests of a failed forward get (running out of GPU memory
        frees the allocator's cache and says what to lower)."""
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, torch.OutOfMemoryError):
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return BackendOutOfMemoryError(
                f"local generation ran out of GPU memory: {exc!r} (lower kv_pool_bytes or "
                "max_batch, or send fewer or shorter prompts at once)",
                backend=self.name,
            )
        return BackendError(f"local generation failed: {exc!r}", backend=self.name)

    def _check_banned(self, request: GenerateRequest) -> None:
        """Banned ids must be the model's: one outside its vocabulary is a caller's bug
        (a renderer of another checkpoint)."""
        vocab = self.vocab_size
        outside = [t for t in request.banned_token_ids if vocab is not None and not 0 <= t < vocab]
        if outside:
            raise ValueError(
                f"banned_token_ids {outside[:5]} are outside the model's vocabulary of "
                f"{vocab} ids (is the renderer for this checkpoint?)"
            )

    def _check_images(self, request: GenerateRequest) -> None:
        data = request.multi_modal_data
        if not self.is_multimodal:
            if data is not None and not data.is_empty:
                raise BackendError(
                    f"{self.path.name} is a text model: it takes no images", backend=self.name
                )
            return
        tokens = {"image": self.image_token_id, "video": self.video_token_id}

        def ranges(modality: str) -> list[Any]:
            return data.mm_placeholders.get(modality, []) if data else []

        for modality, token in tokens.items():
            if ranges(modality) and token is None:
                raise BackendError(f"{self.path.name} takes no {modality}", backend=self.name)
            pixels = self.pixels[modality]
            for i, item in enumerate(data.mm_items.get(modality, []) if data else []):
                if not item or item.get(pixels) is None:
                    raise BackendError(
                        f"{modality} {i} has no {pixels} (this backend needs the processed "
                        "inputs, not only hashes)",
                        backend=self.name,
                    )
        # per token: modalities that share one (SmolVLM's frames are images) count together
        for token in {t for t in tokens.values() if t is not None}:
            sharing = [m for m, t in tokens.items() if t == token]
            expected = sum(p.num_embeds for m in sharing for p in ranges(m))
            pads = request.prompt_ids.count(token)
            if pads != expected:
                raise BackendError(
                    f"prompt has {pads} {' and '.join(sharing)} pad tokens but its multi-modal "
                    f"data covers {expected}",
                    backend=self.name,
                )

    # -- inputs -----------------------------------------------------------------------------

    def media_inputs(self, ids: torch.Tensor, media: Sequence[Media]) -> dict[str, Any]:
        """The forward's image and video inputs for ``ids``, whose images and clips are
        ``media`` in token order (``request_media``), on the CPU."""
        from vf_mm.models import model_inputs

        try:
            return model_inputs(
                self.family,
                ids,
                [inputs for _, m, inputs in media if m == "image"],
                image_token_ids=[self.image_token()],
                dtype=self.dtype,
                videos=[inputs for _, m, inputs in media if m == "video"],
                video_token_ids=[self.video_token_id] if self.video_token_id is not None else [],
                order=[m for _, m, _ in media],
            )
        except (KeyError, ValueError) as exc:
            raise BackendError(
                f"the images' and videos' inputs do not make one batch: {exc}", backend=self.name
            ) from None

    def positions(
        self,
        prompt: list[int],
        media: list[Media],
        start: int,
        reach: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, int, np.ndarray | None]:
        """The positions of ``prompt[start:]``, the offset of text positions after it, and
        the prompt's ``reach`` (M-RoPE only: the highest position among its first t + 1
        tokens, for every t).

        Qwen-VL families (M-RoPE): the model's own ``get_rope_index``, whose positions are
        a sequence of segments (text, then an image's grid, ...) each starting one past the
        highest position before it. So the new tokens are ``get_rope_index`` over them
        alone, shifted one past the highest position of the cached prefix (``reach`` of
        the entry it came from, None for plain 0, 1, 2...): the same numbers as one pass
        over the whole prompt, at the cost of the new tokens only (a match never ends
        inside an image)."""
        n = len(prompt)
        if not (self.mrope and media):
            positions = torch.arange(start, n)
            return (positions.expand(3, -1) if self.mrope else positions), 0, None
        if start == 0:
            positions, delta = self._rope_index(prompt, media)
            return positions, delta, _peaks(positions)
        offset = int(reach[start - 1]) + 1 if reach is not None else start
        tail = [(span, m, inputs) for span, m, inputs in media if span.offset >= start]
        if tail:
            shifted = [(MediaSpan(s.offset - start, s.end - start, s.key), m, i) for s, m, i in tail]  # fmt: skip
            relative, tail_delta = self._rope_index(prompt[start:], shifted)
        else:
            relative, tail_delta = torch.arange(n - start).expand(3, -1), 0
        positions = relative + offset
        ahead = reach[:start] if reach is not None else np.arange(start)
        return positions, tail_delta + offset - start, np.concatenate([ahead, _peaks(positions)])

    def _rope_index(self, prompt: list[int], media: list[Media]) -> tuple[torch.Tensor, int]:
        """``get_rope_index`` over ``prompt`` with ``media`` (its images and clips, in
        order): positions ``(3, n)`` and the offset of text positions after them."""
        ids = torch.tensor([prompt])
        types = torch.zeros_like(ids)
        grids: dict[str, list[np.ndarray]] = {}
        for span, modality, inputs in media:
            # marked within the item's own span: GLM-4.6V's clips hold the image's token
            token = self.image_token_id if modality == "image" else self.video_token_id
            own = types[0, span.offset : span.end]
            own[ids[0, span.offset : span.end] == token] = 1 if modality == "image" else 2
            for name in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
                if name in inputs:
                    value = np.asarray(inputs[name])
                    shaped = (
                        value.reshape(-1) if name == "second_per_grid_ts" else value.reshape(-1, 3)
                    )
                    grids.setdefault(name, []).append(shaped)
        kwargs = {name: torch.from_numpy(np.concatenate(parts)) for name, parts in grids.items()}
        for name in ("image_grid_thw", "video_grid_thw"):
            if name in kwargs:
                kwargs[name] = kwargs[name].long()
        positions, deltas = self.model.model.get_rope_index(ids, mm_token_type_ids=types, **kwargs)
        return positions[:, 0], int(deltas.reshape(-1)[0])


def _peaks(positions: torch.Tensor) -> np.ndarray:
    """The highest of the three M-RoPE positions among the first t + 1 tokens, for every t.
    ``amax``, not ``max(dim=0)``: torch's max with indices over the first dimension of an
    int64 CPU tensor costs milliseconds for a few hundred tokens (every admitted row)."""
    return np.maximum.accumulate(positions.amax(dim=0).numpy())


def request_media(request: GenerateRequest) -> list[Media]:
    """Every image and clip of a request in token order: its span (keyed by modality,
    content hash and the shapes of its inputs) and its model inputs."""
    data = request.multi_modal_data
    if data is None or data.is_empty:
        return []
    out: list[Media] = []
    for modality, i, where in data.all_placeholders():
        inputs = data.mm_items[modality][i]
        shapes = ",".join(
            f"{name}{tuple(np.shape(value))}" for name, value in sorted(inputs.items())
        )
        if "image_grid_thw" in inputs or "video_grid_thw" in inputs:
            grid = inputs.get("image_grid_thw", inputs.get("video_grid_thw"))
            shapes += f"|{np.asarray(grid).reshape(-1).tolist()}"
        key = f"{modality}:{data.mm_hashes[modality][i]}:{shapes}"
        out.append((MediaSpan(where.offset, where.end, key), modality, inputs))
    return out


def _config_id(config: Any, name: str) -> int | None:
    """A special token's id from a model config (``<name>_id``, or Gemma's
    ``<name>_index``), None when the config has none."""
    for key in (f"{name}_id", f"{name}_index"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None
