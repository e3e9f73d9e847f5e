"""``vf-mm serve``: a token-in/token-out HTTP server over a ``Backend`` (the local engine).

``create_app(backend, renderer=..., model_name=...)`` returns a Starlette app with

- ``POST /inference/v1/generate``: vLLM's token-in/token-out route (the subset of vLLM
  0.32's ``GenerateRequest`` in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``
  that a local engine can honour), so ``VLLMBackend`` and any vLLM client talk to it
  unchanged. Images arrive in ``features`` mode: per image its ``mm_hash``, its
  placeholder range and (optionally) its ``kwargs_data`` (base64 msgpack of vLLM's
  ``MultiModalKwargsItem``; ``image_grid_thw`` comes as shape ``(3,)``, as vLLM sends it,
  or ``(1, 3)``, as a transformers processor makes it). An entry of ``None`` is resolved
  from a bounded cache of items that earlier requests sent, keyed by hash, as vLLM does.
  ``pixel_values`` are taken as the transformers processor makes them (rescaled and
  normalised), which is what a vLLM server started with ``--no-mm-device-do-normalize``
  takes too. Or in
  ``content_parts`` mode: ``token_ids`` hold one image pad per image (one video pad per
  clip) and the parts carry them (``{"type": "image_url", "url": "data:..."}`` or
  ``video_url``, vLLM's flat form, or OpenAI's nested ``image_url.url``); the renderer
  expands each pad, and ``return_token_ids`` returns the expanded ids and their
  placeholders. Clips (Qwen-VL families) go through the same two modes: features
  under ``"video"`` (``pixel_values_videos``, ``video_grid_thw``, ...), or raw.
- ``POST /v1/chat/completions``: OpenAI-compatible, messages in / message out; images
  (``image_url``) and clips (``video_url``, with per-clip ``fps`` / ``num_frames`` / ...)
  only as ``data:`` URLs unless an explicit ``image_policy`` allows more. With
  ``stream=true`` the whole reply is generated, then sent as server-sent events in
  OpenAI's chunk format (role, content, tool calls, finish reason; usage with
  ``stream_options.include_usage``), ending with ``data: [DONE]``.
- **Recording** (``create_app(..., recorder=...)``, ``vf-mm serve --record DIR``): each
  chat call is a turn of the session its ``X-Session-ID`` header names (else its
  ``user`` field; neither is a 400), run through the recorder's ``RendererClient``
  (bridged onto the session's previous turn) and recorded as a ``TrajectoryStep``.
  Images are then read by the client's renderer, under its image policy alone.
  ``POST /v1/sessions/{id}/end`` ends a session (its recording goes to the recorder's
  ``on_end``); ``GET /v1/sessions`` lists the open ones.
- ``GET /v1/models`` and ``GET /health``.
- ``GET /metrics``: the backend's prefix-cache counters in Prometheus' text format, as
  vLLM 0.32 publishes them (``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total``: prompt tokens looked up and found cached, with their
  ``_created`` series and ``engine`` / ``model_name`` labels), so a dashboard or
  scraper made for vLLM reads them unchanged.

Request bodies are validated with pydantic models whose rules and messages follow
vLLM's (``MultiModalFeatures._validate_parallel_fields``, ``GenerateRequest``'s
validators, ``validate_cache_salt``, ``SamplingParams._verify_args``); every refusal is
HTTP 400 with vLLM's error body ``{"error": {"message", "type", "param", "code"}}``.
Validation failures read like vLLM's FastAPI handler (``"1 validation error: ..."``,
``type`` ``"Bad Request"``); other refusals have ``type`` ``"BadRequestError"``; an
unknown model is 404 ``"NotFoundError"``; a backend failure is 500
``"InternalServerError"`` with its message.

What the local engine cannot do is refused by name with a 400, never silently dropped:
``n > 1``, stop strings, penalties, ``output_mode="text"``, video, a ``logit_bias``
other than bans (-100, what ``VLLMBackend`` sends for the family's image and video
tokens: honoured). Every request, whichever route, also bans the renderer's image and
video tokens (``VisionSpec.banned_token_ids``).
Logprobs are the sampled tokens' only: with ``sampling_params.logprobs = k > 0`` each
entry's ``top_logprobs`` holds just the sampled token (``rank`` is None).

Work that blocks (JSON parsing and validation of large bodies, base64/msgpack decoding,
image loading and processing, rendering) runs in worker threads, never on the event loop.

The server is one class, ``_Server``: its state (the model's vocabulary, image pad,
merge size and context length; the item cache) and its four routes' handlers;
``create_app`` mounts the handlers. Request models live in ``_server_models``, the
error body in ``_server_errors``.

The hash cache trusts the client's hashes as vLLM does: a client that sends the pixels
of one image under another image's hash poisons later hash-only requests for it. Serve
on 127.0.0.1 (the default) or to trusted clients only: there is no authentication.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, cast

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from vf_mm.errors import (
    BackendError,
    ImageError,
    PromptTooLongError,
    RenderError,
    UnsupportedModelError,
    VfMmError,
    VideoError,
)
from vf_mm.images import ImagePolicy, load_image
from vf_mm.inference._server_errors import (
    RequestError,
    error_response,
    json_error,
    validation_error,
)
from vf_mm.inference._server_guard import ServerGuard, ServerLimits
from vf_mm.inference._server_models import (
    UNSUPPORTED_SAMPLING,
    ChatCompletionRequestModel,
    GenerateRequestModel,
)
from vf_mm.inference._types import GenerateRequest, GenerateResult, SamplingParams
from vf_mm.inference._vllm_protocol import BAN_BIAS
from vf_mm.models import QWEN_VL_FAMILIES, VISION_FAMILIES, family_info
from vf_mm.types import Messages, MultiModalData, PlaceholderRange
from vf_mm.videos import load_video

__all__ = ["DEFAULT_SERVER_IMAGE_POLICY", "create_app"]

#: What ``/v1/chat/completions`` reads when no policy is given: ``data:`` URLs only
#: (no network, no local path). A server must never fetch what a client names.
DEFAULT_SERVER_IMAGE_POLICY = ImagePolicy.dataset(roots=())

# vLLM clamps logprobs to this so that JSON never carries -inf
_MIN_LOGPROB = -9999.0
# parse bodies larger than this off the event loop
_THREAD_PARSE_BYTES = 64 * 1024

# -- the multi-modal item cache --------------------------------------------------------


class _ItemCache:
    """LRU of decoded image items by (modality, mm_hash), bounded in items and bytes.

    Each item keeps a digest of the ``kwargs_data`` string it was decoded from:
    ``get_sent`` returns it for a request that sends the same string again, so a client
    that re-sends every image of a growing conversation each turn (``VLLMBackend``'s
    default) costs one decode per image, not one per image per turn. Only a string equal
    to the one decoded matches (the same bytes decode to the same item): a client that
    sends other tensors under a known hash has them decoded and checked as any new item.
    """

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], int, str | None]] = (
            OrderedDict()
        )
        # get_sent runs on the decoding threads, put on the event loop: one at a time
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, str]) -> dict[str, Any] | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def get_sent(self, key: tuple[str, str], digest: str) -> dict[str, Any] | None:
        """The item cached under ``key`` if it was decoded from a string of ``digest``."""
        with self._lock:
            found = self._items.get(key)
            if found is None or found[2] != digest:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: tuple[str, str], item: dict[str, Any], digest: str | None = None) -> None:
        size = sum(int(getattr(v, "nbytes", 0)) for v in item.values())
        if self.max_items <= 0 or size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._items[key] = (item, size, digest)
            self.nbytes += size
            while len(self._items) > self.max_items or self.nbytes > self.max_bytes:
                _, (_, dropped, _) = self._items.popitem(last=False)
                self.nbytes -= dropped


def _sent_digest(b64: str) -> str:
    """A digest of one ``kwargs_data`` string (xxh3-128 of its UTF-8: a few ms for a
    turn's 7 MB, where decoding it took ~100)."""
    import xxhash

    return xxhash.xxh3_128_hexdigest(b64.encode("utf-8", "surrogatepass"))


def _decode_item(b64: str) -> dict[str, Any]:
    """One ``kwargs_data`` entry decoded (looked up as a module global at each call, so
    tests can stand in a codec of their own)."""
    from vf_mm.inference import _mm_kwargs  # lazy: only image requests need it

    return _mm_kwargs.decode_kwargs_item(b64)


class _Server:
    """The routes' handlers over one backend, and what they share: the model's facts
    (vocabulary, image pad, merge size, context length), the item cache, body parsing."""

    def __init__(
        self,
        backend: Any,
        renderer: Any | None,
        model_name: str,
        image_policy: ImagePolicy | None,
        mm_cache_items: int,
        mm_cache_bytes: int,
        recorder: Any = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.recorder = recorder
        self.limits = limits or ServerLimits()
        family = getattr(backend, "family", None)
        if family not in VISION_FAMILIES and _inner(renderer, "vision") is not None:
            family = _inner(renderer, "name")  # a vision renderer is named for its family
        if family in VISION_FAMILIES and family not in QWEN_VL_FAMILIES:
            # the request checks below are Qwen-VL's (patch rows, grids, merge size)
            raise UnsupportedModelError(
                f"the vf_mm server serves Qwen-VL checkpoints and text models, not {family!r} "
                "yet; use LocalBackend in-process, or vLLM in content_parts mode"
            )
        self.family: str | None = family if family in VISION_FAMILIES else None
        self.backend = backend
        self.renderer = renderer
        self.model_name = model_name
        self.image_policy = image_policy or DEFAULT_SERVER_IMAGE_POLICY
        self.cache = _ItemCache(mm_cache_items, mm_cache_bytes)
        self.created_at = time.time()  # the counters' creation time (their _created series)
        self.created = int(self.created_at)
        self.max_model_len: int | None = getattr(backend, "max_model_len", None)
        vision = _inner(renderer, "vision")
        config = getattr(getattr(backend, "model", None), "config", None)
        vision_config = getattr(config, "vision_config", None)
        text_config = getattr(config, "text_config", config)
        self.image_token_id: int | None = (
            vision.image_token_id
            if vision is not None
            else getattr(backend, "image_token_id", None)
        )
        self.video_token_id: int | None = (
            vision.video_token_id
            if vision is not None and vision.video is not None
            else getattr(backend, "video_token_id", None)
        )
        self.merge_size = int(
            vision.merge_size
            if vision is not None
            else getattr(vision_config, "spatial_merge_size", 2)
        )
        self.patch_dim: int | None = None
        if vision_config is not None and hasattr(vision_config, "patch_size"):
            channels = getattr(vision_config, "in_channels", getattr(vision_config, "in_chans", 3))
            temporal = getattr(vision_config, "temporal_patch_size", 2)
            self.patch_dim = int(channels * temporal * vision_config.patch_size**2)
        vocab = getattr(backend, "vocab_size", None) or getattr(text_config, "vocab_size", None)
        if vocab is None:
            tokenizer = _inner(renderer, "tokenizer")
            vocab = len(tokenizer) if tokenizer is not None else None
        self.vocab_size: int | None = vocab
        self.stop_token_ids: tuple[int, ...] = tuple(getattr(renderer, "stop_token_ids", ()) or ())
        self.banned_token_ids = frozenset(getattr(vision, "banned_token_ids", None) or ())

    # -- GET routes ----------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        labels = f'engine="0",model_name="{_label_value(self.model_name)}"'
        lines = []
        for name, help_text, attribute in _METRICS:
            value = getattr(self.backend, attribute, 0)
            lines += [
                f"# HELP {name}_total {help_text}",
                f"# TYPE {name}_total counter",
                f"{name}_total{{{labels}}} {_sample_value(value)}",
                f"# HELP {name}_created {help_text}",
                f"# TYPE {name}_created gauge",
                f"{name}_created{{{labels}}} {_sample_value(self.created_at)}",
            ]
        return Response("\n".join(lines) + "\n", media_type=_PROMETHEUS_TEXT)

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "vf-mm",
                        "root": self.model_name,
                        "parent": None,
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    # -- POST /inference/v1/generate -----------------------------------------------------

    async def generate(self, request: Request) -> Response:
        req: GenerateRequestModel = await self._body(request, GenerateRequestModel)
        self._check_model(req.model)
        self._check_supported(req)
        self._check_tokens(req.token_ids)
        items = len(req.content_parts or []) + sum(
            len(h) for h in (req.features.mm_hashes.values() if req.features else ())
        )
        self._check_limits(prompt_tokens=len(req.token_ids), items=items, param="token_ids")
        sp = req.sampling_params
        self._check_tokens(sp.stop_token_ids or [], "sampling_params.stop_token_ids")
        banned = self._logit_bias_bans(sp.model_extra or {})
        token_ids = req.token_ids
        mm: MultiModalData | None
        if req.content_parts:
            token_ids, expanded = await run_in_threadpool(
                self._expand_content_parts, req.token_ids, req.content_parts
            )
            # processed items serve later hash-only (features) requests too, as in vLLM
            for modality in expanded.modalities:
                hashes, processed = expanded.mm_hashes[modality], expanded.mm_items[modality]
                for h, item in zip(hashes, processed, strict=True):
                    self.cache.put((modality, h), item)
            mm = expanded
        else:
            mm = await self._multi_modal_data(req)
        sampling = SamplingParams(
            max_tokens=self._max_tokens(sp.max_tokens, len(token_ids)),
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=max(sp.top_k, 0),
            min_p=sp.min_p,
            seed=sp.seed,
            stop_token_ids=tuple(sp.stop_token_ids or ()),
            logprobs=sp.logprobs is not None,
        )
        result = await self._generate(
            GenerateRequest(
                prompt_ids=token_ids,
                sampling=sampling,
                multi_modal_data=mm,
                request_id=req.request_id,
                banned_token_ids=banned,
            )
        )
        logprobs = None
        if sp.logprobs is not None and result.logprobs is not None:
            logprobs = {
                "content": [
                    _token_logprob(t, lp)
                    for t, lp in zip(result.completion_ids, result.logprobs, strict=True)
                ]
            }
        prompt_tokens = result.usage.prompt_tokens or len(token_ids)
        completion_tokens = len(result.completion_ids)
        body: dict[str, Any] = {
            "request_id": f"generate-tokens-{req.request_id}",
            "model": self.model_name,
            "created": int(time.time()),
            "output_mode": "tokens",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": result.finish_reason,
                    "stop_reason": result.stop_reason,
                    "token_ids": list(result.completion_ids),
                    "logprobs": logprobs,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = list(token_ids)
            body["mm_placeholders"] = (
                {
                    m: [{"offset": p.offset, "length": p.length} for p in ranges]
                    for m, ranges in mm.mm_placeholders.items()
                }
                if mm is not None
                else None
            )
        return JSONResponse(body)

    def _check_supported(self, req: GenerateRequestModel) -> None:
        def refuse(what: str, param: str) -> None:
            raise RequestError(f"{what} is not supported by vf-mm serve", param=param)

        if req.stream:
            refuse("stream=true (streaming)", "stream")
        if req.output_mode != "tokens":
            refuse(f"output_mode={req.output_mode!r}", "output_mode")
        if req.priority != 0:
            raise RequestError(
                f"Got priority {req.priority} but Priority scheduling is not enabled.",
                param="priority",
            )
        if req.kv_transfer_params:
            refuse("kv_transfer_params", "kv_transfer_params")
        if req.ec_transfer_params:
            refuse("ec_transfer_params", "ec_transfer_params")
        sp = req.sampling_params
        if sp.n != 1:
            refuse(f"sampling_params.n={sp.n} (only 1; send n requests)", "n")
        if sp.logprobs == -1:
            refuse("sampling_params.logprobs=-1 (the whole vocabulary)", "logprobs")
        for name, value in (sp.model_extra or {}).items():
            if name == "logit_bias":  # bans are honoured (_logit_bias_bans)
                continue
            defaults = UNSUPPORTED_SAMPLING.get(name)
            if defaults is not None and not any(
                value == d and type(value) is type(d) for d in defaults
            ):
                refuse(f"sampling_params.{name}={value!r}", name)

    def _logit_bias_bans(self, extra: dict[str, Any]) -> tuple[int, ...]:
        """The ids a request's ``logit_bias`` bans (a bias of -100 or less, as
        ``VLLMBackend`` sends the family's image and video tokens); any other bias is
        refused: the local engine applies bans only."""
        bias = extra.get("logit_bias")
        if bias is None or bias == {}:
            return ()
        if not isinstance(bias, dict):
            raise RequestError("sampling_params.logit_bias must be an object", param="logit_bias")
        banned: list[int] = []
        for key, value in bias.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if token < 0:
                raise RequestError(
                    f"sampling_params.logit_bias: {key!r} is not a token id", param="logit_bias"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value > BAN_BIAS:
                raise RequestError(
                    f"sampling_params.logit_bias={{{key!r}: {value!r}}} is not supported by "
                    f"vf-mm serve (only bans, a bias of {BAN_BIAS:g} or less)",
                    param="logit_bias",
                )
            banned.append(token)
        self._check_tokens(banned, "sampling_params.logit_bias")
        return tuple(banned)

    async def _multi_modal_data(self, req: GenerateRequestModel) -> MultiModalData | None:
        features = req.features
        ids = np.asarray(req.token_ids, dtype=np.int64)
        pads = {"image": self.image_token_id, "video": self.video_token_id}
        sent = {m: h for m, h in features.mm_hashes.items() if h} if features is not None else {}
        other = sorted(m for m in sent if m not in pads)
        if other:
            raise RequestError(
                f"modality {other[0]!r} is not supported by vf-mm serve (images and videos only)",
                param="features",
            )
        data = MultiModalData()
        for modality, pad in pads.items():
            if modality not in sent:
                if pad is not None and (n := int((ids == pad).sum())):
                    raise RequestError(
                        f"token_ids hold {n} {modality} pad tokens ({pad}) but the request has "
                        f"no features describing their {modality}s",
                        param="features",
                    )
                continue
            if pad is None:
                raise RequestError(
                    f"the model {self.model_name} takes no {modality}s, but the request has "
                    f"{modality} features",
                    param="features",
                )
            assert features is not None
            part = await self._modality_data(features, modality, pad, ids)
            data.mm_hashes[modality] = part.mm_hashes[modality]
            data.mm_placeholders[modality] = part.mm_placeholders[modality]
            data.mm_items[modality] = part.mm_items[modality]
        return data if data.modalities else None

    async def _modality_data(
        self, features: Any, modality: str, pad: int, ids: np.ndarray
    ) -> MultiModalData:
        """One modality's features checked (every placeholder a run of its pad tokens, the
        grids' token counts) and its items decoded or found in the cache."""
        hashes = features.mm_hashes[modality]
        ranges = features.mm_placeholders.get(modality, [])
        if len(ranges) != len(hashes):
            raise RequestError(
                f"features has {len(hashes)} {modality} hashes but {len(ranges)} placeholders",
                param="features.mm_placeholders",
            )
        for i, p in enumerate(ranges):
            span = ids[p.offset : p.offset + p.length]
            if not bool((span == pad).all()):
                bad = p.offset + int(np.argmax(span != pad))
                raise RequestError(
                    f"features.mm_placeholders.{modality}[{i}] (offset {p.offset}, length "
                    f"{p.length}) must cover {modality} pad tokens ({pad}) only, but "
                    f"token_ids[{bad}] is {int(ids[bad])}",
                    param="features.mm_placeholders",
                )
        total = int((ids == pad).sum())
        covered = sum(p.length for p in ranges)
        if total != covered:
            raise RequestError(
                f"token_ids hold {total} {modality} pad tokens ({pad}) but mm_placeholders "
                f"cover {covered}",
                param="features.mm_placeholders",
            )
        data = (features.kwargs_data or {}).get(modality) or [None] * len(hashes)

        digests: dict[int, str] = {}

        def decode_all() -> dict[int, dict[str, Any]]:
            out: dict[int, dict[str, Any]] = {}
            for i, b64 in enumerate(data):
                if b64 is None:
                    continue
                if isinstance(b64, str):  # the same string again: the item decoded then
                    digests[i] = _sent_digest(b64)
                    cached = self.cache.get_sent((modality, hashes[i]), digests[i])
                    if cached is not None:
                        out[i] = cached
                        continue
                where = f"kwargs_data.{modality}[{i}]"
                try:
                    out[i] = self._check_item(_decode_item(b64), where, modality)
                except RequestError:
                    raise
                except (VfMmError, ValueError, TypeError) as exc:
                    raise RequestError(
                        f"features.{where}: {exc}", param="features.kwargs_data"
                    ) from None
            return out

        decoded = await run_in_threadpool(decode_all) if any(d is not None for d in data) else {}
        items: list[dict[str, Any]] = []
        seen: dict[str, dict[str, Any]] = {}
        grid_key = f"{modality}_grid_thw"
        for i, h in enumerate(hashes):
            item = decoded.get(i)
            if item is None:
                item = seen.get(h) or self.cache.get((modality, h))
                if item is None:
                    raise RequestError(
                        f"features.mm_hashes.{modality}[{i}] = {h!r} is not in the server's "
                        "multi-modal cache: send its kwargs_data",
                        param="features.kwargs_data",
                    )
            seen.setdefault(h, item)
            tokens = int(np.prod(item[grid_key])) // self.merge_size**2
            if tokens != ranges[i].length:
                grid = [int(x) for x in np.asarray(item[grid_key]).reshape(-1)]
                raise RequestError(
                    f"{modality} {i} ({h!r}): its placeholder has length {ranges[i].length} but "
                    f"its {grid_key} {grid} makes prod(grid) / merge_size^2 = {tokens} tokens",
                    param="features.mm_placeholders",
                )
            items.append(item)
        for i, item in decoded.items():
            self.cache.put((modality, hashes[i]), item, digests.get(i))
        return MultiModalData(
            mm_hashes={modality: list(hashes)},
            mm_placeholders={modality: [PlaceholderRange(p.offset, p.length) for p in ranges]},
            mm_items={modality: items},
        )

    def _expand_content_parts(
        self, token_ids: list[int], parts: list[dict[str, Any]]
    ) -> tuple[list[int], MultiModalData]:
        """content_parts mode: load each image or video (server policy), process it with
        the renderer, and expand its single pad in ``token_ids`` (``image_url`` and
        ``video_url`` parts, in the order their pads appear)."""
        vision = _inner(self.renderer, "vision")
        if vision is None:
            raise RequestError(
                "content_parts need a server with a multimodal renderer; send features",
                param="content_parts",
            )
        pads = {"image": vision.image_token_id}
        if vision.video is not None and vision.video_token_id is not None:
            pads["video"] = vision.video_token_id
        processed = []
        for i, part in enumerate(parts):
            where = f"content_parts[{i}]"
            kind = part.get("type")
            modality = {"image_url": "image", "video_url": "video"}.get(str(kind))
            if modality not in pads:
                takes = " and ".join(f"{m}_url" for m in pads)
                raise RequestError(
                    f"{where} has type {kind!r}; vf-mm serve takes {takes} parts only",
                    param="content_parts",
                )
            extra = sorted(set(part) - {"type", "url", kind})
            if extra:  # per-clip options, frame_rate: the server would drop them silently
                raise RequestError(
                    f"{where} has {', '.join(map(repr, extra))}: content_parts carry only the "
                    f"{modality} (its file states its frame rate); send per-clip options as "
                    "features",
                    param="content_parts",
                )
            url = part.get("url")
            nested = part.get(str(kind))
            if url is None and isinstance(nested, dict):
                url = nested.get("url")
            if not isinstance(url, str) or not url:
                raise RequestError(f"{where} has no {modality} URL", param="content_parts")
            try:
                if modality == "image":
                    image = load_image(url, policy=self.image_policy, where=where)
                    item = vision.process({"type": "image", "image": image}, where=where)
                else:  # loaded through the server's policy, never the renderer's
                    video = load_video(url, policy=self.image_policy, where=where)
                    item = vision.process_video({"type": "video", "video": video}, where=where)
            except (ImageError, VideoError, RenderError) as exc:
                raise RequestError(str(exc), param="content_parts") from None
            processed.append(item)
        by_pad = {pad: m for m, pad in pads.items()}
        positions = [(k, by_pad[t]) for k, t in enumerate(token_ids) if t in by_pad]
        written = [m for _, m in positions]
        wanted = [item.modality for item in processed]
        if written != wanted:
            raise RequestError(
                f"token_ids hold pads for {written} but content_parts has {wanted}: "
                "content_parts mode takes one pad per image or video, in order",
                param="content_parts",
            )
        tokenizer = vision.tokenizer
        ids: list[int] = []
        data = MultiModalData()
        start = 0
        for (position, modality), item in zip(positions, processed, strict=True):
            ids.extend(token_ids[start:position])
            # text the processor writes around a span (Qwen3-VL's first timestamp) stands
            # next to added tokens, so it tokenizes alone as it does in the prompt
            if item.text_before:
                ids.extend(tokenizer(item.text_before, add_special_tokens=False)["input_ids"])
            data.mm_placeholders.setdefault(modality, []).append(
                PlaceholderRange(len(ids), item.num_tokens, item.is_embed)
            )
            data.mm_hashes.setdefault(modality, []).append(item.hash)
            data.mm_items.setdefault(modality, []).append(item.item)
            ids.extend(item.tokens)
            if item.text_after:
                ids.extend(tokenizer(item.text_after, add_special_tokens=False)["input_ids"])
            start = position + 1
        ids.extend(token_ids[start:])
        return ids, data

    def _check_item(
        self, item: dict[str, Any], where: str, modality: str = "image"
    ) -> dict[str, Any]:
        def bad(message: str) -> RequestError:
            return RequestError(f"features.{where}: {message}", param="features.kwargs_data")

        pixels_key = "pixel_values" if modality == "image" else "pixel_values_videos"
        grid_key = f"{modality}_grid_thw"
        missing = [k for k in (pixels_key, grid_key) if k not in item]
        if missing:
            raise bad(f"no {' or '.join(missing)} (got {', '.join(sorted(item)) or 'nothing'})")
        grid = np.asarray(item[grid_key])
        if grid.shape not in ((1, 3), (3,)) or grid.dtype.kind not in "iu" or (grid <= 0).any():
            raise bad(f"{grid_key} must be 3 positive ints, got {grid.tolist()}")
        grid = grid.astype(np.int64).reshape(1, 3)
        pv = np.asarray(item[pixels_key])
        if pv.ndim != 2 or not (pv.dtype.kind == "f" or pv.dtype.name == "bfloat16"):
            raise bad(f"{pixels_key} must be a 2-D float array, got {pv.dtype} {pv.shape}")
        rows = int(np.prod(grid))
        if pv.shape[0] != rows:
            raise bad(
                f"{pixels_key} has {pv.shape[0]} rows but {grid_key} "
                f"{grid[0].tolist()} needs {rows}"
            )
        if self.patch_dim is not None and pv.shape[1] != self.patch_dim:
            raise bad(
                f"{pixels_key} rows have {pv.shape[1]} values; the model takes {self.patch_dim}"
            )
        if grid[0, 1] % self.merge_size or grid[0, 2] % self.merge_size:
            raise bad(
                f"{grid_key} {grid[0].tolist()} is not a multiple of merge_size {self.merge_size}"
            )
        if pv.dtype != np.float32:
            pv = pv.astype(np.float32)
            pv.flags.writeable = False
        out = dict(item)
        out[pixels_key] = pv
        out[grid_key] = grid
        if "second_per_grid_ts" in out:
            seconds = np.asarray(out["second_per_grid_ts"])
            if (
                seconds.size != 1
                or seconds.dtype.kind != "f"
                or not np.isfinite(seconds).all()
                or (seconds <= 0).any()
            ):
                raise bad(
                    "second_per_grid_ts must be one finite positive float, got "
                    f"{seconds.dtype} {seconds.tolist()}"
                )
            out["second_per_grid_ts"] = seconds.astype(np.float32).reshape(1)
        if modality == "video" and self.family is not None:
            expected = set(family_info(self.family).video_inputs)
            if set(out) != expected:
                raise bad(f"a {self.family} video takes {sorted(expected)}, got {sorted(out)}")
        return out

    # -- POST /v1/chat/completions -------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        if self.renderer is None:
            raise RequestError(
                "this server has no renderer: /v1/chat/completions is unavailable",
                status=HTTPStatus.NOT_IMPLEMENTED,
            )
        req: ChatCompletionRequestModel = await self._body(request, ChatCompletionRequestModel)
        self._check_model(req.model)
        self._check_chat_supported(req)
        messages = [m.model_dump(exclude_unset=True) for m in req.messages]
        for m in messages:
            if m["role"] == "developer":
                m["role"] = "system"
            if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
                m["content"] = ""  # an empty reply echoed as null (a template would print None)
            if isinstance(m.get("content"), list):
                # a key sent as null is no key (Arrow-backed datasets add ``image_url: null``
                # to text parts, which a template would take for an image), as vLLM's typed
                # parsing drops it
                m["content"] = [
                    {k: v for k, v in part.items() if v is not None} for part in m["content"]
                ]
        tools = [t.model_dump(exclude_unset=True) for t in req.tools] if req.tools else None
        self._check_tokens(req.stop_token_ids or [], "stop_token_ids")
        items = sum(
            1
            for m in messages
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") in ("image_url", "video_url")
        )
        self._check_limits(items=items, param="messages")
        if self.recorder is not None:
            return await self._recorded_chat(request, req, messages, tools)
        rendered = await run_in_threadpool(self._render_chat, messages, tools)
        prompt_len = len(rendered.token_ids)
        self._check_limits(prompt_tokens=prompt_len, param="messages")
        sampling = self._chat_sampling(req, prompt_len=prompt_len)
        result = await self._generate(
            GenerateRequest(
                rendered.token_ids,
                sampling,
                rendered.multi_modal_data,
                messages=cast(Messages, messages),
            )
        )
        parsed = await run_in_threadpool(self.renderer.parse_response, result.completion_ids)
        message: dict[str, Any] = {"role": "assistant"}
        content: str | None = parsed.content
        tool_calls = list(parsed.tool_calls) if req.tool_choice != "none" else []
        if req.tool_choice == "none" or (parsed.tool_call_errors and not tool_calls):
            # keep what the model wrote rather than drop a call that did not parse
            text = parsed.text
            if parsed.reasoning is not None:
                text = text.partition("</think>")[2].lstrip("\n")
            content = text
        if tool_calls and not content:
            content = None
        message["content"] = content
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "tool_calls" if tool_calls else result.finish_reason
        logprobs = None
        if req.logprobs and result.logprobs is not None:
            tokenizer = _inner(self.renderer, "tokenizer")
            logprobs = {
                "content": [
                    _chat_logprob(tokenizer, t, lp)
                    for t, lp in zip(result.completion_ids, result.logprobs, strict=True)
                ]
            }
        return self._chat_response(
            req, message, logprobs, finish, result.stop_reason, prompt_len,
            len(result.completion_ids),
        )  # fmt: skip

    async def _recorded_chat(
        self,
        request: Request,
        req: ChatCompletionRequestModel,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> Response:
        """A chat call as a recorded turn of its session (see the module docstring)."""
        session = request.headers.get("x-session-id") or req.user
        if not session:
            raise RequestError(
                "a recording server needs the session a call belongs to: send the "
                "X-Session-ID header (or the request's user field)",
                param="user",
            )
        if req.tool_choice == "none":
            raise RequestError(
                "tool_choice='none' is not recorded (the reply would not be what the model "
                "wrote): leave tools out of the request instead",
                param="tool_choice",
            )
        sampling = self._chat_sampling(req, prompt_len=None)
        owner = _owner(request)
        try:
            turn = await self.recorder.turn(
                session, messages, tools=tools, sampling=sampling, owner=owner,
                max_prompt_tokens=self.limits.max_request_tokens,
            )  # fmt: skip
        except PromptTooLongError as exc:
            # over --max-request-tokens: the same refusal as an unrecorded request's
            self._check_limits(prompt_tokens=exc.prompt_tokens, param="messages")
            raise RequestError(str(exc), param="messages") from None
        except BackendError as exc:  # the engine behind the recorder failed
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None
        except (VfMmError, ValueError, TypeError, KeyError) as exc:  # what was sent
            raise RequestError(f"cannot run the turn: {exc}", param="messages") from None
        except Exception as exc:  # the engine failed: 500 with its message
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None
        tokens = turn.tokens
        message = dict(turn.message)
        logprobs = None
        if req.logprobs and tokens is not None:
            tokenizer = _inner(self.renderer, "tokenizer")
            logprobs = {
                "content": [
                    _chat_logprob(tokenizer, t, lp)
                    for t, lp in zip(tokens.completion_ids, tokens.completion_logprobs, strict=True)
                ]
            }
        finish = "tool_calls" if message.get("tool_calls") else tokens.finish_reason
        return self._chat_response(
            req, message, logprobs, finish, None, len(tokens.prompt_ids),
            len(tokens.completion_ids),
        )  # fmt: skip

    def _chat_response(
        self,
        req: ChatCompletionRequestModel,
        message: dict[str, Any],
        logprobs: dict[str, Any] | None,
        finish: str | None,
        stop_reason: Any,
        prompt_len: int,
        completion_tokens: int,
    ) -> Response:
        """The reply as one JSON body, or (``stream=true``) as server-sent events."""
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_len,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_len + completion_tokens,
            },
        }
        if not req.stream:
            return JSONResponse(body)
        usage = bool((req.stream_options or {}).get("include_usage"))
        return Response(_sse_chunks(body, include_usage=usage), media_type="text/event-stream")

    def _chat_sampling(
        self, req: ChatCompletionRequestModel, *, prompt_len: int | None
    ) -> SamplingParams:
        """The request's sampling. ``prompt_len`` None (a recorded turn, rendered by the
        recorder's client): an unset ``max_tokens`` is ``SamplingParams``' default, not
        the context's room."""
        requested = req.max_completion_tokens or req.max_tokens
        if prompt_len is None:
            max_tokens = requested if requested is not None else SamplingParams().max_tokens
        else:
            max_tokens = self._max_tokens(requested, prompt_len)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                min_p=req.min_p or 0.0,
                seed=req.seed,
                stop_token_ids=tuple(
                    dict.fromkeys([*self.stop_token_ids, *(req.stop_token_ids or [])])
                ),
                logprobs=bool(req.logprobs),
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    async def sessions(self, request: Request) -> Response:
        """GET /v1/sessions: the recording's open sessions and their turns so far."""
        recorder = self._require_recorder()
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": s.session_id, "turns": len(s.steps), "index": s.index}
                    for s in recorder.sessions_of(_owner(request)).values()
                ],
            }
        )

    async def end_session(self, request: Request) -> Response:
        """POST /v1/sessions/{id}/end: end a recorded session (404 if none is open)."""
        recorder = self._require_recorder()
        session_id = request.path_params["session_id"]
        ended = await recorder.end(session_id, owner=_owner(request))
        if ended is None:
            raise RequestError(
                f"no open session {session_id!r}", status=HTTPStatus.NOT_FOUND, param="session"
            )
        return JSONResponse({"id": session_id, "turns": len(ended.steps), "ended": True})

    def _require_recorder(self) -> Any:
        if self.recorder is None:
            raise RequestError(
                "this server does not record sessions (start it with --record DIR)",
                status=HTTPStatus.NOT_FOUND,
            )
        return self.recorder

    def _check_chat_supported(self, req: ChatCompletionRequestModel) -> None:
        def refuse(what: str, param: str) -> None:
            raise RequestError(f"{what} is not supported by vf-mm serve", param=param)

        if req.n not in (None, 1):
            refuse(f"n={req.n} (only 1)", "n")
        if req.stop not in (None, "", []):
            refuse("stop strings (use stop_token_ids)", "stop")
        if req.top_logprobs:
            refuse("top_logprobs > 0", "top_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name) not in (None, 0, 0.0):
                refuse(f"{name}={getattr(req, name)}", name)
        if req.response_format not in (None, {}) and req.response_format.get("type") != "text":
            refuse("response_format (structured output)", "response_format")
        if req.chat_template_kwargs:
            refuse("chat_template_kwargs", "chat_template_kwargs")
        if req.tool_choice not in (None, "auto", "none"):
            refuse(f"tool_choice={req.tool_choice!r} (only 'auto' and 'none')", "tool_choice")

    def _render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Any:
        """Images and videos loaded through the server's policy (never the renderer's), then
        render."""
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                where = f"message {i}, part {j}"
                try:
                    if part.get("type") == "image_url":
                        image = load_image(part, policy=self.image_policy, where=where)
                        content[j] = {"type": "image", "image": image}
                    elif part.get("type") == "video_url":
                        video = load_video(part, policy=self.image_policy, where=where)
                        options = {k: v for k, v in part.items() if k not in ("type", "video_url")}
                        content[j] = {"type": "video", "video": video, **options}
                except (ImageError, VideoError) as exc:
                    raise RequestError(str(exc), param=f"messages.{i}.content.{j}") from None
        assert self.renderer is not None, "chat routes need a renderer (checked at the route)"
        try:
            return self.renderer.render(messages, tools=tools)
        except (VfMmError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise RequestError(f"cannot render the messages: {exc}", param="messages") from None
        except Exception as exc:
            if any(c.__name__ == "TemplateError" for c in type(exc).__mro__):
                raise RequestError(f"chat template error: {exc}", param="messages") from None
            raise

    # -- plumbing ------------------------------------------------------------------------

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()

        def parse() -> Any:
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise json_error(exc) from None
            except UnicodeDecodeError as exc:
                raise RequestError(f"the body is not UTF-8 JSON: {exc}") from None
            if not isinstance(data, dict):
                raise RequestError(
                    f"the body must be a JSON object, got {type(data).__name__}", param="body"
                )
            try:
                return model.model_validate(data)
            except ValidationError as exc:
                raise validation_error(exc) from None

        if len(raw) > _THREAD_PARSE_BYTES:
            return await run_in_threadpool(parse)
        return parse()

    def _check_model(self, model: str | None) -> None:
        # vLLM's OpenAIServing._check_model: an unknown name is 404 NotFoundError
        if model is not None and model != self.model_name:
            raise RequestError(
                f"The model `{model}` does not exist.",
                status=HTTPStatus.NOT_FOUND,
                param="model",
            )

    async def _generate(self, request: GenerateRequest) -> GenerateResult:
        if not self.banned_token_ids.issubset(request.banned_token_ids):
            # every route bans the renderer's image and video tokens, asked or not
            banned = self.banned_token_ids.union(request.banned_token_ids)
            request = dataclasses.replace(request, banned_token_ids=tuple(sorted(banned)))
        try:
            return await self.backend.generate(request)
        except PromptTooLongError as exc:
            raise RequestError(str(exc), param="token_ids") from None
        except (RequestError, HTTPException):
            raise
        except Exception as exc:  # the engine failed: 500 with its message
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None

    def _check_limits(
        self, *, prompt_tokens: int | None = None, items: int = 0, param: str
    ) -> None:
        """The request's images/clips and prompt tokens against ``ServerLimits``."""
        limits = self.limits
        if items > limits.max_images:
            raise RequestError(
                f"the request holds {items} images and clips; this server takes at most "
                f"{limits.max_images} (--max-images)",
                err_type="RequestTooLargeError",
                param=param,
            )
        cap = limits.max_request_tokens
        if cap is not None and prompt_tokens is not None and prompt_tokens > cap:
            raise RequestError(
                f"the prompt is {prompt_tokens} tokens; this server takes at most {cap} "
                "(--max-request-tokens)",
                err_type="RequestTooLargeError",
                param=param,
            )

    def _check_tokens(self, token_ids: Sequence[int], what: str = "token_ids") -> None:
        if self.vocab_size is not None and token_ids:
            top = max(token_ids)
            if top >= self.vocab_size:
                raise RequestError(f"Token id {top} is out of vocabulary", param=what)

    def _max_tokens(self, requested: int | None, prompt_len: int) -> int:
        if self.max_model_len is None:
            return requested if requested is not None else SamplingParams().max_tokens
        room = self.max_model_len - prompt_len
        if requested is None:
            # vLLM's get_max_tokens: what is left of the context
            if room < 1:
                raise RequestError(
                    f"The prompt (length {prompt_len}) leaves no room to generate in the "
                    f"maximum model length of {self.max_model_len}.",
                    param="token_ids",
                )
            return room
        if requested > room:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {requested} output tokens and your prompt contains "
                f"{prompt_len} input tokens, for a total of {prompt_len + requested} tokens. "
                "Please reduce the length of the input prompt or the number of requested "
                "output tokens.",
                param="max_tokens",
            )
        return requested


# -- helpers ----------------------------------------------------------------------------


def _owner(request: Request) -> str | None:
    """The API key's tag the request was let in with (``ServerGuard``), None without keys:
    a recording keeps each key's sessions apart by it."""
    return request.scope.get("state", {}).get("api_key_tag")


def _sse_chunks(body: dict[str, Any], *, include_usage: bool) -> bytes:
    """A finished chat completion as OpenAI's stream of ``chat.completion.chunk`` events:
    the role, the content, the tool calls (each whole, with its index), the finish
    reason, the usage when asked for, then ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": extra.get("logprobs"),
                                     "finish_reason": finish}]}  # fmt: skip
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    if message.get("reasoning_content"):
        parts.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        parts.append(chunk({"content": message["content"]}, logprobs=choice["logprobs"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        parts.append(chunk({"tool_calls": [{"index": i, **call}]}))
    parts.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        usage = {**base, "choices": [], "usage": body["usage"]}
        parts.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _inner(renderer: Any, attribute: str) -> Any:
    """``renderer.<attribute>``, through a ``RendererPool`` too."""
    if renderer is None:
        return None
    if hasattr(renderer, attribute):
        return getattr(renderer, attribute)
    borrow = getattr(renderer, "renderer", None)
    if callable(borrow):
        with borrow() as r:
            return getattr(r, attribute, None)
    return None


def _clamp(logprob: float) -> float:
    return _MIN_LOGPROB if math.isnan(logprob) else max(float(logprob), _MIN_LOGPROB)


def _token_logprob(token_id: int, logprob: float) -> dict[str, Any]:
    """One ``logprobs.content`` entry of the generate route. Only the sampled token's
    logprob is known (the local engine keeps no top-k), so ``top_logprobs`` holds just
    that token, which vLLM lists first; ``rank`` is unknown (None)."""
    lp = _clamp(logprob)
    entry = {"token_id": token_id, "logprob": lp, "rank": None}
    return {
        **entry,
        "token": f"token_id:{token_id}",
        "top_logprobs": [{**entry, "token": f"token_id:{token_id}"}],
    }


def _chat_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"
    return {
        "token": text,
        "logprob": _clamp(logprob),
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [],
    }


# -- GET /metrics ------------------------------------------------------------------------

# vLLM 0.32's counters (vllm/v1/metrics/loggers.py, PrometheusStatLogger): the name given
# to prometheus_client (which adds the _total and _created series), the help text, and
# the backend attribute that holds the count
_METRICS = (
    ("vllm:prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits",
     "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
)  # fmt: skip
# what prometheus_client answers a scrape that asks for no particular format
_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _label_value(value: str) -> str:
    """A label value escaped as the text format wants (backslash, newline, quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample_value(value: float) -> str:
    """A sample as prometheus_client writes it: Python's shortest float, switched to an
    exponent (at least two digits) once the integer part has more than 6 digits, as Go
    does."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


# -- the app ----------------------------------------------------------------------------


def _route(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc.message, exc.status, err_type=exc.err_type, param=exc.param)
        except HTTPException:
            raise
        except Exception as exc:  # anything unforeseen: 500 with a message, never a traceback
            return error_response(
                f"internal error: {type(exc).__name__}: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR
            )

    return wrapped


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = HTTPStatus(exc.status_code)
    return error_response(str(exc.detail), status, err_type=status.phrase)


def create_app(
    backend: Any,
    *,
    renderer: Any | None = None,
    model_name: str,
    image_policy: ImagePolicy | None = None,
    mm_cache_items: int = 512,
    mm_cache_bytes: int = 4 << 30,
    recorder: Any = None,
    api_keys: Sequence[str] = (),
    limits: ServerLimits | None = None,
) -> Starlette:
    """The HTTP app of ``vf-mm serve`` over ``backend`` (a token-level ``Backend``).

    ``renderer``: needed for ``/v1/chat/completions`` (and tells which token is the
    image pad); ``model_name``: the served name (``model`` fields must match it);
    ``image_policy``: what chat images may be read (default: ``data:`` URLs only);
    ``mm_cache_items`` / ``mm_cache_bytes`` bound the cache of decoded image items that
    hash-only requests resolve against. ``recorder`` (a ``vf_mm.recording.Recorder``):
    chat calls become recorded turns of their sessions, and the session routes are
    served. The caller owns ``backend`` and ``recorder`` (and closes them).
    ``api_keys``: with any, every route but ``/health`` needs ``Authorization: Bearer``
    one of them (``ServerGuard``); a recording keeps each key's sessions apart.
    ``limits``: what one request may cost (``ServerLimits``: body size, images, prompt
    tokens, a slow body, requests in flight per client).
    """
    limits = limits or ServerLimits()
    server = _Server(
        backend, renderer, model_name, image_policy, mm_cache_items, mm_cache_bytes, recorder,
        limits,
    )  # fmt: skip
    routes = [
        Route("/inference/v1/generate", _route(server.generate), methods=["POST"]),
        Route("/v1/chat/completions", _route(server.chat_completions), methods=["POST"]),
        Route("/v1/models", _route(server.models), methods=["GET"]),
        Route("/health", _route(server.health), methods=["GET"]),
        Route("/metrics", _route(server.metrics), methods=["GET"]),
        Route("/v1/sessions", _route(server.sessions), methods=["GET"]),
        Route("/v1/sessions/{session_id}/end", _route(server.end_session), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception},
        middleware=[Middleware(ServerGuard, api_keys=list(api_keys), limits=limits)],
    )
    app.state.server = server
    return app
