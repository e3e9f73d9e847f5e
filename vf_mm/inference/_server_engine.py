"""``ServerEngine``: what every route of ``vf-mm serve`` shares, behind one facade.

The routes (``_server_generate``, ``_server_chat``, ``_server_sessions``,
``_server_metrics``) speak their protocols; none of them touches the backend, the
renderer or the limits but through this class, so every route checks a request the same
way and reaches the engine the same way:

- the model's facts, read once at start: vocabulary size, image and video pad tokens,
  the checks of a client's processed images (``items``: the family's ``ItemChecker``,
  over the renderer's processor), context length, the renderer's stop tokens and the
  tokens it bans (``VisionSpec.banned_token_ids``);
- the checks a request meets whatever its route: the ``model`` name (404 as vLLM's
  ``_check_model``), token ids inside the vocabulary, ``ServerLimits`` (images and clips,
  prompt tokens), ``max_tokens`` against the context (vLLM's ``get_max_tokens``);
- body parsing into a pydantic model, off the event loop for a large body;
- ``generate``: one request to the backend with the renderer's bans added, its failure a
  400 (a prompt too long) or a 500 with the engine's message;
- the ``ItemCache`` of decoded multi-modal items that hash-only requests resolve against.

Every vision family whose processed images ``ItemChecker`` checks is served, and text
models; a family it cannot check (``VisionFamily.item_layout`` None: LFM2-VL) is refused
at start with ``UnsupportedModelError`` saying why, rather than served wrong. A vision
model served without its renderer takes text only: its images' checks read the
renderer's processor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import msgspec
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from vf_mm.errors import PromptTooLongError, UnsupportedModelError
from vf_mm.images import ImagePolicy
from vf_mm.inference._server_errors import RequestError, json_error, validation_error
from vf_mm.inference._server_guard import ServerLimits
from vf_mm.inference._types import GenerateRequest, GenerateResult, SamplingParams
from vf_mm.inference._vllm_items import item_cache_advert
from vf_mm.models import VISION_FAMILIES, family_info
from vf_mm.models._internal import ItemChecker

__all__ = [
    "ItemCache",
    "ServerEngine",
    "clamp_logprob",
    "json_response",
    "loads_body",
    "renderer_attribute",
]

# parse bodies larger than this off the event loop
_THREAD_PARSE_BYTES = 64 * 1024
# vLLM clamps logprobs to this so that JSON never carries -inf
_MIN_LOGPROB = -9999.0


class ItemCache:
    """LRU of decoded multi-modal items by (modality, mm_hash), bounded in items and bytes.

    An item larger than the byte bound, or any item when ``max_items`` is 0, is not
    kept: the cache never holds more than its bounds, whatever clients send.

    Each item keeps a digest of the ``kwargs_data`` string it was decoded from:
    ``get(key, digest)`` returns it for a request that sends the same string again, so a client
    that re-sends every image of a growing conversation each turn (``VLLMBackend``'s
    default) costs one decode per image, not one per image per turn. Only a string equal
    to the one decoded matches (the same bytes decode to the same item): a client that
    sends other tensors under a known hash has them decoded and checked as any new item.
    Lookups run on the decoding threads and ``put`` on the event loop, so one lock
    orders them.

    ``advert`` is what the generate route tells clients in its ``vf-mm-item-cache``
    header: this cache's instance (new at every start, so a client learns that a
    restarted server holds nothing it sent before) and its item bound; None when it
    keeps nothing. A client that has seen it sends an item it sent before as a null
    entry with that string's digest, which ``get(key, digest)`` resolves exactly."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.instance = uuid.uuid4().hex
        self.nbytes = 0
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], int, str | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def advert(self) -> str | None:
        if self.max_items <= 0 or self.max_bytes <= 0:
            return None
        return item_cache_advert(self.instance, self.max_items)

    def get(self, key: tuple[str, str], digest: str | None = None) -> dict[str, Any] | None:
        """The item cached under ``key``; with ``digest``, only if it was decoded from a
        string of that digest."""
        with self._lock:
            found = self._items.get(key)
            if found is None or (digest is not None and found[2] != digest):
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


def loads_body(raw: bytes) -> Any:
    """A request body's JSON as ``json.loads`` reads it, by msgspec's decoder (in C:
    about twice as fast on bodies of long base64 strings). A body msgspec refuses is read
    again by ``json.loads``, so every error a client sees, and every value ``json`` takes
    that msgspec does not (``NaN``, a lone surrogate escape, a UTF-16 body), is json's."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def json_response(body: Any, *, headers: Mapping[str, str] | None = None) -> Response:
    """A 200 JSON answer encoded by msgspec: the JSON ``JSONResponse`` writes (compact,
    UTF-8) for bodies of strings, ints, None and finite floats, the only values the routes
    put in an answer (logprobs go through ``clamp_logprob``), several times faster on a
    completion's per-token logprobs."""
    return Response(msgspec.json.encode(body), media_type="application/json", headers=headers)


def renderer_attribute(renderer: Any, attribute: str) -> Any:
    """``renderer.<attribute>``, through a ``RendererPool`` too (None without a renderer
    or the attribute)."""
    if renderer is None:
        return None
    if hasattr(renderer, attribute):
        return getattr(renderer, attribute)
    borrow = getattr(renderer, "renderer", None)
    if callable(borrow):
        with borrow() as r:
            return getattr(r, attribute, None)
    return None


def clamp_logprob(logprob: float) -> float:
    """A logprob as every route writes it, vLLM's way: NaN and -inf (not JSON) clamped
    to -9999.0."""
    return _MIN_LOGPROB if math.isnan(logprob) else max(float(logprob), _MIN_LOGPROB)


class ServerEngine:
    """The backend, the renderer, the model's facts, the checks and the item cache that
    ``vf-mm serve``'s routes share (see the module docstring). The caller owns
    ``backend`` and closes it."""

    def __init__(
        self,
        backend: Any,
        *,
        renderer: Any | None,
        model_name: str,
        image_policy: ImagePolicy,
        limits: ServerLimits,
        cache: ItemCache,
    ) -> None:
        family = getattr(backend, "family", None)
        if family not in VISION_FAMILIES and renderer_attribute(renderer, "vision") is not None:
            # a vision renderer is named for its family
            family = renderer_attribute(renderer, "name")
        if family in VISION_FAMILIES and family_info(family).item_layout is None:
            raise UnsupportedModelError(
                f"the vf_mm server does not serve {family!r}: its processed images "
                f"({', '.join(family_info(family).image_inputs)}) are not checked yet, and a "
                "server must check what clients send; use LocalBackend in-process, or vLLM"
            )
        self.family: str | None = family if family in VISION_FAMILIES else None
        self.backend = backend
        self.renderer = renderer
        self.model_name = model_name
        self.image_policy = image_policy
        self.limits = limits
        self.cache = cache
        self.created_at = time.time()  # the server's start (the counters' _created series)
        self.created = int(self.created_at)
        self.max_model_len: int | None = getattr(backend, "max_model_len", None)
        vision = renderer_attribute(renderer, "vision")
        config = getattr(getattr(backend, "model", None), "config", None)
        text_config = getattr(config, "text_config", config)
        self.image_token_id: int | None = (
            vision.image_token_id
            if vision is not None
            else getattr(backend, "image_token_id", None)
        )
        self.video_token_id: int | None = (
            vision.video_embed_token_id
            if vision is not None and vision.video is not None
            else getattr(backend, "video_token_id", None)
        )
        # the checks of a client's processed images: the family's, over its processor
        self.items: ItemChecker | None = (
            ItemChecker(self.family, processor=vision.processor)
            if self.family is not None and vision is not None
            else None
        )
        vocab = getattr(backend, "vocab_size", None) or getattr(text_config, "vocab_size", None)
        if vocab is None:
            tokenizer = renderer_attribute(renderer, "tokenizer")
            vocab = len(tokenizer) if tokenizer is not None else None
        self.vocab_size: int | None = vocab
        self.stop_token_ids: tuple[int, ...] = tuple(getattr(renderer, "stop_token_ids", ()) or ())
        self.banned_token_ids = frozenset(getattr(vision, "banned_token_ids", None) or ())

    def renderer_attribute(self, attribute: str) -> Any:
        """The renderer's ``attribute`` (its ``vision``, ``tokenizer``), looked up at each
        call: a ``RendererPool`` lends one of its renderers for the look-up."""
        return renderer_attribute(self.renderer, attribute)

    # -- what every route checks -----------------------------------------------------------

    async def parse_body(self, request: Request, model: type[BaseModel]) -> Any:
        """The request's JSON body validated by ``model``; every failure is vLLM's 400."""
        raw = await request.body()

        def parse() -> Any:
            try:
                data = loads_body(raw)
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

    def check_model(self, model: str | None) -> None:
        # vLLM's OpenAIServing._check_model: an unknown name is 404 NotFoundError
        if model is not None and model != self.model_name:
            raise RequestError(
                f"The model `{model}` does not exist.",
                status=HTTPStatus.NOT_FOUND,
                param="model",
            )

    def check_limits(self, *, prompt_tokens: int | None = None, items: int = 0, param: str) -> None:
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

    def check_tokens(self, token_ids: Sequence[int], what: str = "token_ids") -> None:
        """Every id inside the vocabulary (a wrong id would index past the embedding)."""
        if self.vocab_size is not None and token_ids:
            top = max(token_ids)
            if top >= self.vocab_size:
                raise RequestError(f"Token id {top} is out of vocabulary", param=what)

    def max_tokens(self, requested: int | None, prompt_len: int) -> int:
        """``requested`` checked against the context; unset, what is left of it."""
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

    # -- the engine ------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """``request`` run by the backend, the renderer's image and video tokens banned
        whatever the route asked; a prompt too long is a 400, any other failure a 500."""
        if not self.banned_token_ids.issubset(request.banned_token_ids):
            banned = self.banned_token_ids.union(request.banned_token_ids)
            request = dataclasses.replace(request, banned_token_ids=tuple(sorted(banned)))
        try:
            result: GenerateResult = await self.backend.generate(request)
        except PromptTooLongError as exc:
            raise RequestError(str(exc), param="token_ids") from None
        except (RequestError, HTTPException):
            raise
        except Exception as exc:  # the engine failed: 500 with its message
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None
        return result
