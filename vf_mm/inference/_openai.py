"""``OpenAIChatBackend``: any OpenAI-compatible chat endpoint, message in / message out.

For evaluating API models (OpenAI, a vLLM or ``vf-mm serve`` chat route, ...). It sees
no token ids, so its turns are never training data (``RendererClient`` records them
with ``tokens=None``).

Every image part is loaded through ``vf_mm.images.load_image`` with this backend's
``ImagePolicy`` and sent as a ``data:image/png;base64,...`` URL: a URL from a dataset
is never forwarded for the provider to fetch (it could point at internal hosts), and
what the model sees is exactly what vf_mm decoded.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from vf_mm.errors import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
    MissingDependencyError,
)
from vf_mm.images import ImagePolicy, image_hash, load_image, png_data_url
from vf_mm.inference._types import ChatResult, SamplingParams, Usage
from vf_mm.types import IMAGE_PART_TYPES, Messages

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OpenAIChatBackend"]


class OpenAIChatBackend:
    """The ``ChatBackend`` contract over the ``openai`` SDK's ``AsyncOpenAI``.

    Args:
        model: The model name sent with each request.
        base_url: The API root (``http://host:port/v1`` for a self-hosted server; None for
            OpenAI's, or ``OPENAI_BASE_URL``).
        api_key: None reads ``OPENAI_API_KEY``; a self-hosted ``base_url`` without a key
            gets ``"EMPTY"``.
        image_policy: What image sources may be read (``ImagePolicy()`` when None: any
            local path, no network).
        timeout_s: Per request, as the SDK applies it.
        max_retries: Per request, as the SDK applies them (retries on connection errors,
            408/409/429 and 5xx).
        client: An ``AsyncOpenAI`` to use instead (not closed by ``aclose``).
        max_tokens_param: The request field that carries ``SamplingParams.max_tokens``
            (``max_tokens`` for older servers).
        image_cache_size: How many encoded images (PNG data URLs, by pixel hash) are kept,
            so a conversation's earlier images are not encoded again each turn (0: none).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        image_policy: ImagePolicy | None = None,
        timeout_s: float = 600,
        max_retries: int = 3,
        client: AsyncOpenAI | None = None,
        max_tokens_param: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens",
        image_cache_size: int = 128,
    ) -> None:
        self.model = model
        self.image_policy = image_policy
        self.max_tokens_param = max_tokens_param
        self._owns_client = client is None
        if client is None:
            openai = _openai_module()
            if api_key is None and not os.environ.get("OPENAI_API_KEY") and base_url is not None:
                api_key = "EMPTY"  # self-hosted servers usually take any key
            try:
                client = openai.AsyncOpenAI(
                    base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
                )
            except openai.OpenAIError as exc:
                raise ValueError(f"cannot create the OpenAI client: {exc}") from None
        self.client = client
        url = str(getattr(client, "base_url", base_url or "")).rstrip("/")
        self.name = f"openai:{model}" + (f"@{url}" if url else "")
        self._image_cache_size = image_cache_size
        self._image_urls: OrderedDict[str, str] = OrderedDict()
        self._image_lock = threading.Lock()  # images are encoded in worker threads

    # -- the contract --------------------------------------------------------------------

    async def chat(
        self,
        messages: Messages,
        sampling: SamplingParams,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ChatResult:
        wire_messages = await asyncio.to_thread(self._wire_messages, messages)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages,
            self.max_tokens_param: sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            kwargs["seed"] = sampling.seed
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        extra: dict[str, Any] = {}
        if sampling.top_k > 0:
            extra["top_k"] = sampling.top_k
        if sampling.min_p > 0:
            extra["min_p"] = sampling.min_p
        if sampling.stop_token_ids:
            extra["stop_token_ids"] = list(sampling.stop_token_ids)
        if extra:
            kwargs["extra_body"] = extra
        response = await self._create(kwargs)
        return self._result(response)

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.close()

    # -- internals -----------------------------------------------------------------------

    async def _create(self, kwargs: dict[str, Any]) -> Any:
        openai = _openai_module()
        try:
            return await self.client.chat.completions.create(**kwargs)
        except openai.APIConnectionError as exc:  # APITimeoutError included
            kind = "timed out" if isinstance(exc, openai.APITimeoutError) else "unreachable"
            raise BackendUnavailableError(
                f"{self.name}: {kind}: {_cause(exc)}", backend=self.name
            ) from exc
        except openai.APIStatusError as exc:
            detail = _detail(exc)
            raise BackendHTTPError(
                f"{self.name}: HTTP {exc.status_code}: {detail}",
                backend=self.name,
                status=exc.status_code,
                detail=detail,
            ) from exc
        except openai.APIResponseValidationError as exc:
            raise BackendProtocolError(
                f"{self.name}: the answer breaks the chat completion schema: {exc}",
                backend=self.name,
            ) from exc
        except openai.OpenAIError as exc:
            raise BackendError(
                f"{self.name}: {type(exc).__name__}: {exc}", backend=self.name
            ) from exc

    def _result(self, response: Any) -> ChatResult:
        choices = getattr(response, "choices", None)
        if not choices:
            raise BackendProtocolError(
                f"{self.name}: the answer has no choices ({str(response)[:200]!r})",
                backend=self.name,
            )
        choice = choices[0]
        msg = getattr(choice, "message", None)
        if msg is None:
            raise BackendProtocolError(
                f"{self.name}: the first choice has no message", backend=self.name
            )
        message: dict[str, Any] = {"role": "assistant", "content": msg.content}
        extra = getattr(msg, "model_extra", None) or {}
        reasoning = getattr(msg, "reasoning_content", None) or extra.get("reasoning_content")
        if reasoning is None:
            reasoning = extra.get("reasoning")
        if isinstance(reasoning, str):
            message["reasoning_content"] = reasoning
        calls = []
        for call in msg.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: keep it as sent
                calls.append(call.model_dump(exclude_none=True))
                continue
            calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": function.arguments},
                }
            )
        if calls:
            message["tool_calls"] = calls
        usage = getattr(response, "usage", None)
        return ChatResult(
            message=message,
            finish_reason=choice.finish_reason or "stop",
            usage=Usage(
                prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            ),
        )

    def _wire_messages(self, messages: Messages) -> list[dict[str, Any]]:
        """The messages as the API takes them: new dicts, every image a PNG data URL."""
        out: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                out.append(dict(message))
                continue
            parts: list[Any] = []
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                    url = self._data_url(part, where=f"message {i}, part {j}")
                    image_url: dict[str, Any] = {"url": url}
                    source = part.get("image_url") if part.get("type") == "image_url" else None
                    detail = source.get("detail") if isinstance(source, Mapping) else None
                    if detail is not None:
                        image_url["detail"] = detail
                    parts.append({"type": "image_url", "image_url": image_url})
                else:
                    parts.append(part)
            out.append({**message, "content": parts})
        return out

    def _data_url(self, part: Any, *, where: str) -> str:
        image = load_image(part, policy=self.image_policy, where=where)
        key = image_hash(image)
        with self._image_lock:
            url = self._image_urls.get(key)
            if url is not None:
                self._image_urls.move_to_end(key)
                return url
        url = png_data_url(image)
        if self._image_cache_size > 0:
            with self._image_lock:
                self._image_urls[key] = url
                while len(self._image_urls) > self._image_cache_size:
                    self._image_urls.popitem(last=False)
        return url


def _openai_module() -> Any:
    try:
        import openai
    except ImportError:
        raise MissingDependencyError(
            "OpenAIChatBackend needs the openai package: pip install 'openai>=3.54'"
        ) from None
    return openai


def _detail(exc: Any) -> str:
    """The server's own message from an ``APIStatusError`` (vLLM / OpenAI error bodies)."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        message = body.get("message")
        if message is None and isinstance(body.get("error"), Mapping):
            message = body["error"].get("message")
        if message is None and "detail" in body:
            message = body["detail"]
        if message is not None:
            return str(message)
    if isinstance(body, str) and body:
        return body[:2000]
    return str(getattr(exc, "message", exc))


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    text = str(exc)
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({type(cause).__name__}: {cause})"
    return text
