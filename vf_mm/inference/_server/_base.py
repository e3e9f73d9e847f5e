"""``vf-mm serve``'s state and plumbing shared by its routes: the multi-modal item cache,
body parsing, model / token / length checks, the GET routes."""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vf_mm.errors import PromptTooLongError
from vf_mm.images import ImagePolicy
from vf_mm.inference._server._errors import _json_error, _RequestError, _validation_error
from vf_mm.inference._types import GenerateRequest, GenerateResult, SamplingParams

#: What ``/v1/chat/completions`` reads when no policy is given: ``data:`` URLs only
#: (no network, no local path). A server must never fetch what a client names.
DEFAULT_SERVER_IMAGE_POLICY = ImagePolicy.dataset(roots=())

# vLLM clamps logprobs to this so that JSON never carries -inf
_MIN_LOGPROB = -9999.0
# parse bodies larger than this off the event loop
_THREAD_PARSE_BYTES = 64 * 1024

# -- the multi-modal item cache --------------------------------------------------------


class _ItemCache:
    """LRU of decoded image items by (modality, mm_hash), bounded in items and bytes."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, str]) -> dict[str, Any] | None:
        found = self._items.get(key)
        if found is None:
            return None
        self._items.move_to_end(key)
        return found[0]

    def put(self, key: tuple[str, str], item: dict[str, Any]) -> None:
        size = sum(int(getattr(v, "nbytes", 0)) for v in item.values())
        if self.max_items <= 0 or size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._items[key] = (item, size)
        self.nbytes += size
        while len(self._items) > self.max_items or self.nbytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.nbytes -= dropped


class _ServerBase:
    def __init__(
        self,
        backend: Any,
        renderer: Any | None,
        model_name: str,
        image_policy: ImagePolicy | None,
        mm_cache_items: int,
        mm_cache_bytes: int,
    ) -> None:
        self.backend = backend
        self.renderer = renderer
        self.model_name = model_name
        self.image_policy = image_policy or DEFAULT_SERVER_IMAGE_POLICY
        self.cache = _ItemCache(mm_cache_items, mm_cache_bytes)
        self.created = int(time.time())
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

    # -- plumbing ------------------------------------------------------------------------

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()

        def parse() -> Any:
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise _json_error(exc) from None
            except UnicodeDecodeError as exc:
                raise _RequestError(f"the body is not UTF-8 JSON: {exc}") from None
            if not isinstance(data, dict):
                raise _RequestError(
                    f"the body must be a JSON object, got {type(data).__name__}", param="body"
                )
            try:
                return model.model_validate(data)
            except ValidationError as exc:
                raise _validation_error(exc) from None

        if len(raw) > _THREAD_PARSE_BYTES:
            return await run_in_threadpool(parse)
        return parse()

    def _check_model(self, model: str | None) -> None:
        # vLLM's OpenAIServing._check_model: an unknown name is 404 NotFoundError
        if model is not None and model != self.model_name:
            raise _RequestError(
                f"The model `{model}` does not exist.",
                status=HTTPStatus.NOT_FOUND,
                param="model",
            )

    async def _generate(self, request: GenerateRequest) -> GenerateResult:
        try:
            return await self.backend.generate(request)
        except PromptTooLongError as exc:
            raise _RequestError(str(exc), param="token_ids") from None
        except (_RequestError, HTTPException):
            raise
        except Exception as exc:  # the engine failed: 500 with its message
            raise _RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None

    def _check_tokens(self, token_ids: Sequence[int], what: str = "token_ids") -> None:
        if self.vocab_size is not None and token_ids:
            top = max(token_ids)
            if top >= self.vocab_size:
                raise _RequestError(f"Token id {top} is out of vocabulary", param=what)

    def _max_tokens(self, requested: int | None, prompt_len: int) -> int:
        if self.max_model_len is None:
            return requested if requested is not None else SamplingParams().max_tokens
        room = self.max_model_len - prompt_len
        if requested is None:
            # vLLM's get_max_tokens: what is left of the context
            if room < 1:
                raise _RequestError(
                    f"The prompt (length {prompt_len}) leaves no room to generate in the "
                    f"maximum model length of {self.max_model_len}.",
                    param="token_ids",
                )
            return room
        if requested > room:
            raise _RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {requested} output tokens and your prompt contains "
                f"{prompt_len} input tokens, for a total of {prompt_len + requested} tokens. "
                "Please reduce the length of the input prompt or the number of requested "
                "output tokens.",
                param="max_tokens",
            )
        return requested

    # -- GET routes ----------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

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
