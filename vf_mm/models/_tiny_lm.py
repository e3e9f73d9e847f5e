"""``build_tiny_lm``: an offline text-only Qwen2 checkpoint directory with random weights.

Same tokenizer as ``build_tiny_vlm`` (``"tiny"`` or the real Qwen2 vocabulary) and a
Qwen2.5-style chat template (the Qwen2-VL template renders text conversations exactly
as Qwen2.5's does). Shapes are tiny (hidden 128, 4 heads of 32 -- vLLM's CPU attention
needs head_dim >= 32 --, 2 layers), so ``transformers`` and vLLM load it in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from vf_mm.models._templates import QWEN2_VL_TEMPLATE
from vf_mm.models._tiny_vlm import TEXT_SHAPE
from vf_mm.models._vocab import qwen_tokenizer, tiny_tokenizer

_CONFIG = dict(TEXT_SHAPE, tie_word_embeddings=False)  # the same language model as the VLMs


def build_tiny_lm(
    path: str | Path, *, vocab: Literal["tiny", "qwen"] = "tiny", seed: int = 0
) -> Path:
    """Write a tiny random-weight ``Qwen2ForCausalLM`` checkpoint to ``path``; return it.

    Args:
        path: The directory to write.
        vocab: ``"qwen"`` uses the real Qwen2 vocabulary (needs ``qwen-tokenizer``).
        seed: Seeds the random weights.
    """
    if vocab not in ("tiny", "qwen"):
        raise ValueError(f"unknown vocab {vocab!r}; choose 'tiny' or 'qwen'")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer() if vocab == "qwen" else tiny_tokenizer()
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").write_text(QWEN2_VL_TEMPLATE)

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        **_CONFIG,
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [eos]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(path)
    return path
