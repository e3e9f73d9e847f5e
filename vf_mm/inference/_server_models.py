"""``vf-mm serve``'s request models and their validation (rules and messages as vLLM's)."""

from __future__ import annotations

import itertools
import math
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# -- /inference/v1/generate request models (vLLM 0.32's GenerateRequest subset) --------

_CACHE_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")
_MAX_CACHE_SALT_LENGTH = 128


def _validate_cache_salt(cache_salt: object) -> None:
    """vllm/entrypoints/generate/base/protocol.py: validate_cache_salt."""
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not cache_salt:
        raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
    if len(cache_salt) > _MAX_CACHE_SALT_LENGTH or any(
        c in _CACHE_SALT_FORBIDDEN_CHARS for c in cache_salt
    ):
        raise ValueError(
            "Parameter 'cache_salt' must be at most 128 characters and must "
            "not contain '@', '/', '\\\\', or NUL."
        )


class PlaceholderRangeInfo(BaseModel):
    offset: int = Field(ge=0)
    length: int = Field(gt=0)


class MultiModalFeatures(BaseModel):
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRangeInfo]]
    kwargs_data: dict[str, list[str | None]] | None = None
    mm_metadata: dict[str, list[str | None]] | None = None

    @model_validator(mode="after")
    def _validate_parallel_fields(self) -> MultiModalFeatures:
        # vllm/entrypoints/scale_out/token_in_token_out/protocol.py (same messages)
        modalities = set(self.mm_hashes)
        if set(self.mm_placeholders) != modalities:
            raise ValueError("mm_hashes and mm_placeholders must use the same modalities")
        if self.kwargs_data is not None and set(self.kwargs_data) != modalities:
            raise ValueError("kwargs_data must use the same modalities as mm_hashes")
        if self.mm_metadata is not None and set(self.mm_metadata) != modalities:
            raise ValueError("mm_metadata must use the same modalities as mm_hashes")
        flattened: list[tuple[int, int]] = []
        for modality in sorted(modalities):
            n = len(self.mm_hashes[modality])
            if len(self.mm_placeholders[modality]) != n:
                raise ValueError(
                    f"{modality} mm_hashes and mm_placeholders must have the same length"
                )
            if self.kwargs_data is not None and len(self.kwargs_data[modality]) != n:
                raise ValueError(f"{modality} kwargs_data and mm_hashes must have the same length")
            if self.mm_metadata is not None and len(self.mm_metadata[modality]) != n:
                raise ValueError(f"{modality} mm_metadata and mm_hashes must have the same length")
            ranges = self.mm_placeholders[modality]
            # vLLM only checks overlap after sorting; items are paired with their image
            # pads by position, so vf-mm also needs each modality's list in order.
            for i in range(1, len(ranges)):
                if ranges[i].offset < ranges[i - 1].offset:
                    raise ValueError(
                        "mm_placeholders must be globally non-overlapping and sorted "
                        f"({modality}[{i}] at offset {ranges[i].offset} comes after "
                        f"{modality}[{i - 1}] at offset {ranges[i - 1].offset})"
                    )
            flattened.extend((p.offset, p.offset + p.length) for p in ranges)
        flattened.sort()
        for (_, end), (next_offset, _) in itertools.pairwise(flattened):
            if next_offset < end:
                raise ValueError("mm_placeholders must be globally non-overlapping and sorted")
        return self


class GenerateSamplingParams(BaseModel):
    """vLLM's SamplingParams, as far as the local engine goes. Output-formatting fields
    are accepted and ignored; sampling controls it cannot honour are refused unless
    they hold their default (see ``UNSUPPORTED_SAMPLING``)."""

    model_config = ConfigDict(extra="allow")

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = None
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True

    @model_validator(mode="after")
    def _verify_args(self) -> GenerateSamplingParams:
        # vllm/sampling_params.py: SamplingParams._verify_args (same messages)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs < 0 and self.logprobs != -1:
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed}.")
        if self.stop_token_ids is not None and any(t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must not contain negative values")
        return self


# vLLM SamplingParams fields the local engine cannot honour: refused unless at default.
UNSUPPORTED_SAMPLING: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "stop": (None, "", []),
    "ignore_eos": (None, False),
    "min_tokens": (None, 0),
    "prompt_logprobs": (None,),
    "logit_bias": (None, {}),
    "allowed_token_ids": (None, []),
    "bad_words": (None, []),
    "structured_outputs": (None,),
    "guided_decoding": (None,),
    "logits_processors": (None, []),
    "thinking_token_budget": (None,),
    "truncate_prompt_tokens": (None,),
}


class GenerateRequestModel(BaseModel):
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    token_ids: list[int] = Field(min_length=1)
    features: MultiModalFeatures | None = None
    content_parts: list[dict[str, Any]] | None = None
    sampling_params: GenerateSamplingParams
    model: str | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    # vf_mm's extension (vf_mm.inference._vllm_items): per modality, the digest of the
    # string each null kwargs_data entry was sent as before (or null)
    vf_mm_kwargs_digests: dict[str, list[str | None]] | None = None

    @field_validator("token_ids")
    @classmethod
    def _validate_token_ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("token_ids must not contain negative values")
        return v

    @model_validator(mode="before")
    @classmethod
    def _validate_cache_salt(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _validate_cache_salt(data.get("cache_salt"))
        return data

    @model_validator(mode="after")
    def _check_mm_fields_exclusive(self) -> GenerateRequestModel:
        if self.content_parts and self.features:
            raise ValueError("content_parts and features are mutually exclusive")
        return self

    @model_validator(mode="after")
    def _require_ec_for_metadata_only(self) -> GenerateRequestModel:
        features = self.features
        if features is None or not features.mm_metadata or self.ec_transfer_params:
            return self
        kwargs_data = features.kwargs_data or {}
        for modality, metadata_items in features.mm_metadata.items():
            kwargs_items = kwargs_data.get(modality, [None] * len(metadata_items))
            if any(
                m is not None and k is None
                for m, k in zip(metadata_items, kwargs_items, strict=True)
            ):
                raise ValueError("metadata-only multimodal items require ec_transfer_params")
        return self

    @model_validator(mode="after")
    def _check_output_mode_detokenizes(self) -> GenerateRequestModel:
        if self.output_mode != "tokens" and not self.sampling_params.detokenize:
            raise ValueError(
                f"output_mode={self.output_mode!r} requires sampling_params.detokenize to be true"
            )
        return self

    @model_validator(mode="after")
    def _validate_multimodal_feature_bounds(self) -> GenerateRequestModel:
        if self.features is None:
            return self
        prompt_len = len(self.token_ids)
        for ranges in self.features.mm_placeholders.values():
            for p in ranges:
                if p.offset + p.length > prompt_len:
                    raise ValueError("mm_placeholders must remain within the token_ids sequence")
        return self


# -- /v1/chat/completions request models -----------------------------------------------


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class _ImageURL(BaseModel):
    url: str
    detail: str | None = None


class _ImagePart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["image_url"]
    image_url: _ImageURL


class _VideoURL(BaseModel):
    url: str


class _VideoPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # per-clip options: fps, num_frames, ...
    type: Literal["video_url"]
    video_url: _VideoURL


_Part = Annotated[_TextPart | _ImagePart | _VideoPart, Field(discriminator="type")]


class _FunctionCall(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"] = "function"
    function: _FunctionCall


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> _Message:
        # an assistant turn in the history may have no content (an empty reply, echoed
        # back as null by clients that normalise "" away): it renders as empty content
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        return self


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: _Function


class ChatCompletionRequestModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[_Message] = Field(min_length=1)
    model: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: Literal["auto", "none"] | dict[str, Any] | str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    n: int | None = Field(default=1, ge=1)
    stream: bool | None = False
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    user: str | None = None
    stream_options: dict[str, Any] | None = None
