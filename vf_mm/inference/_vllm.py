"""``VLLMBackend``: the ``Backend`` contract over vLLM's token-in/token-out HTTP route.

``POST {base}/inference/v1/generate`` (the server must run with ``--enable-scale-out``
or ``--tokens-only``; otherwise the route answers 403/404). One shared
``httpx.AsyncClient`` (HTTP/1.1 keep-alive) talks to one or more servers; each attempt
goes to the server with the fewest requests in flight (ties broken round-robin), and a
retry prefers a server this request has not tried yet.

Features mode and pixel normalisation
-------------------------------------
In ``features`` mode we send ``pixel_values`` exactly as the transformers processor makes
them: already rescaled and normalised. vLLM 0.32 enables ``--mm-device-do-normalize`` by
default for Qwen2-VL / 2.5-VL / 3-VL: its own processor then ships raw uint8 patches and
the vision tower normalises whatever arrives, so our pixels would be normalised twice and
the model would see the wrong image **with no error**. Start servers that receive
features with ``--no-mm-device-do-normalize`` (the vllm test tier does, and checks the
outputs against the server's own processing), or use ``mode="content_parts"``.

Schema followed
---------------
vLLM's pydantic models in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``
(the 0.33 field set FACTS.md records; read at vllm-project/vllm commit
``006ebac240f34ddcd36383832b28c25840d2ea80``, a main-branch version with the same
fields, and compared with the older ``5dfbdc4d4318831ef9b1cc4baf5946e3bd10fa8a``, which
predates ``content_parts`` and used OpenAI-style logprobs); ``serving.py`` of the same
directory (how ``content_parts`` are read: ``part.get("url")`` of ``image_url`` parts;
``_create_tokens_logprobs``; the ``sampled`` logprob list of newer main); and vLLM's
tests ``tests/entrypoints/scale_out/token_in_token_out/test_content_parts.py`` and
``test_stop_reason.py``. The exact commit of the 0.33 release was not identified.

Request (``GenerateRequest``; only the fields we send)::

    {"token_ids": [int, ...],                       # non-empty, >= 0
     "sampling_params": {                           # vLLM SamplingParams, all explicit
         "max_tokens", "temperature", "top_p", "top_k" (0 = off), "min_p",
         "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
         "seed" (if set), "stop_token_ids", "logprobs": 0 (if wanted),
         "skip_special_tokens": false, "detokenize": false},
     "model": str (if given), "request_id": str (if given),
     # either (features mode)
     "features": {"mm_hashes": {"image": [str]},
                  "mm_placeholders": {"image": [{"offset", "length"}]},
                  "kwargs_data": {"image": [base64 str | null]} | null},
     # or (content_parts mode)
     "content_parts": [{"type": "image_url", "url": "data:image/png;base64,..."}],
     "return_token_ids": true}

Every sampling field is sent, penalties included, so a server's generation-config
defaults (``repetition_penalty`` 1.05 in some Qwen checkpoints) never change what is
sampled. ``logprobs: 0`` returns the sampled token's log-probability only (vLLM always
includes the sampled token in each position's logprob dict). ``content_parts`` use
vLLM's flat form: the server reads ``part["url"]`` of ``image_url`` parts (the OpenAI
nested ``{"image_url": {"url"}}`` form would reach it as no URL at all).

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
Newer main may answer ``{"logprobs": {"content": null, "sampled": [float]}}``; read too.
Errors come back as vLLM's ``ErrorResponse`` ``{"error": {"message", "type", "param",
"code"}}`` (older: the same keys at the top level) or FastAPI's ``{"detail": ...}``.

Images (content_parts mode)
---------------------------
vLLM fetches any URL it is given (link-local cloud metadata included) and can read its
own filesystem, so no URL is ever forwarded: every image part is loaded here with
``vf_mm.images.load_image(part, policy=image_policy)`` (``ImagePolicy()`` when None: any
local path, no network) and re-sent as a PNG ``data:`` URL of the decoded RGB pixels,
so the server processes exactly what the policy let through. A refused image fails
the request with its ``ImageError`` before anything is sent. The result's
``multi_modal_data`` holds the server's placeholders, ``image_hash`` of each image as
sent, and an empty item dict per image (the pixels were processed on the server). The
length check before sending sees the unexpanded prompt (one pad per image), so only the
server can refuse a prompt that its images make too long.

Retries
-------
Connection errors, connect/read/write timeouts, a connection closed before or while the
body was read, 408, 429 and 5xx (not 501) are retried up to ``max_retries`` times with
exponential backoff and jitter (``Retry-After`` seconds honoured, capped at
``max_backoff_s``); a retry on a server the request has not tried yet starts at once. A
body that is not JSON is retried too (a proxy may have cut it); an answer that is JSON
but breaks the schema is not (it would break again). Other 4xx are final. After the last
try: ``BackendUnavailableError`` (no answer), ``BackendHTTPError`` (status, the server's
message) or ``BackendProtocolError``; each message names the server(s) and the number of
attempts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vf_mm.errors import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
    MultiModalDataError,
)
from vf_mm.images import ImagePolicy
from vf_mm.inference._types import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Usage,
    check_prompt_length,
)
from vf_mm.types import MultiModalData, PlaceholderRange

__all__ = ["VLLMBackend"]

logger = logging.getLogger(__name__)

GENERATE_PATH = "/inference/v1/generate"
MODELS_PATH = "/v1/models"

#: Connections kept per client: far more than any one server's batch, so requests
#: queue in vLLM's scheduler, not in our pool.
_MAX_CONNECTIONS = 4096
_MAX_KEEPALIVE = 1024
_KEEPALIVE_EXPIRY_S = 60.0
_MAX_DETAIL_CHARS = 500
_FINISH_REASONS = frozenset({"stop", "length", "abort"})


# -- vLLM's response, as far as we read it (pydantic: validated in Rust from the bytes) --


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _LogprobEntry(_Model):
    logprob: float
    token_id: int | None = None


class _Logprobs(_Model):
    content: list[_LogprobEntry] | None = None
    # newer vLLM main: with return_token_logprobs and logprobs=0, only this flat list
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


# -- attempts ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Server:
    url: str
    outstanding: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    down_until: float = 0.0


class _Retryable(Exception):
    """One attempt failed in a way worth trying again."""

    def __init__(self, error: BackendError, *, delay: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.delay = delay  # the server's Retry-After, when it gave one


@dataclass(slots=True)
class _Prepared:
    body: bytes
    image_hashes: list[str] | None = None  # content_parts mode: hashes of what we sent


class VLLMBackend:
    """Generate with one or more vLLM servers through ``/inference/v1/generate``.

    ``base_urls``: the servers' roots (``http://host:8000``; a trailing ``/v1`` is
    dropped). ``mode``: ``"features"`` (the request carries rendered images in
    ``multi_modal_data``: exact token parity with the client's renderer; the server must
    run with ``--no-mm-device-do-normalize``, see the module docstring) or
    ``"content_parts"`` (the request carries raw image parts, one image pad each in
    ``prompt_ids``; the server expands them and the result carries the expanded
    ``prompt_ids`` and placeholders; prerendered ``multi_modal_data`` is still sent as
    features). ``max_model_len``: None reads ``data[0].max_model_len`` of
    ``GET {base}/v1/models`` on first use. ``timeout_s`` bounds each read (for a
    generate: the wait for the whole answer), ``connect_timeout_s`` each connect.
    ``send_kwargs_data=False`` sends ``kwargs_data: null``: the server looks every item
    up by hash in its cache. ``transport`` replaces httpx's (tests, a Unix socket);
    ``api_key`` is sent as ``Authorization: Bearer`` (vLLM's ``--api-key``). Proxy
    environment variables are ignored: inference servers are reached directly.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        model: str | None = None,
        mode: Literal["features", "content_parts"] = "features",
        max_model_len: int | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        image_policy: ImagePolicy | None = None,
        send_kwargs_data: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("VLLMBackend needs at least one base URL")
        self._servers = [_Server(_normalise_base_url(u)) for u in urls]
        if len({s.url for s in self._servers}) != len(self._servers):
            raise ValueError(f"duplicate base URLs: {[s.url for s in self._servers]}")
        if mode not in ("features", "content_parts"):
            raise ValueError(f"mode must be 'features' or 'content_parts', got {mode!r}")
        if max_model_len is not None and (
            isinstance(max_model_len, bool)
            or not isinstance(max_model_len, int)
            or max_model_len < 1
        ):
            raise ValueError(f"max_model_len must be a positive int or None, got {max_model_len!r}")
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if not (isinstance(max_retries, int) and max_retries >= 0):
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("backoff_s and max_backoff_s must be >= 0")
        if image_policy is not None and not isinstance(image_policy, ImagePolicy):
            raise TypeError(
                f"image_policy must be an ImagePolicy, not {type(image_policy).__name__}"
            )

        self.model = model
        self.mode = mode
        self.max_model_len = max_model_len
        self.name = f"vllm:{model}" if model else f"vllm:{self._servers[0].url}"
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.image_policy = image_policy
        self.send_kwargs_data = send_kwargs_data
        self._transport = transport
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client: httpx.AsyncClient | None = None
        self._closed = False
        self._rr = 0
        self._discovered = max_model_len is not None
        self._discovery_next = 0.0
        self._discovery_lock: asyncio.Lock | None = None

    # -- public ---------------------------------------------------------------------

    @property
    def base_urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        """Per base URL: attempts sent (``requests``), of which ``retries``, attempts that
        failed (``failures``), and attempts in flight now (``outstanding``)."""
        return {
            s.url: {
                "requests": s.requests,
                "retries": s.retries,
                "failures": s.failures,
                "outstanding": s.outstanding,
            }
            for s in self._servers
        }

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._closed:
            raise BackendError(f"{self.name} is closed", backend=self.name)
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty (vLLM needs at least one token)")
        client = self._get_client()
        if not self._discovered:
            await self._discover_max_model_len(client)
        check_prompt_length(
            len(request.prompt_ids), request.sampling, self.max_model_len, backend=self.name
        )
        prepared = await self._prepare(request)
        return await self._send(client, request, prepared)

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> VLLMBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"VLLMBackend({self.base_urls!r}, mode={self.mode!r}, model={self.model!r})"

    # -- the request body -----------------------------------------------------------

    async def _prepare(self, request: GenerateRequest) -> _Prepared:
        parts = request.content_parts
        mmd = request.multi_modal_data
        has_parts = bool(parts)
        has_features = mmd is not None and not mmd.is_empty
        if has_parts and has_features:
            raise MultiModalDataError(
                "a request carries either content_parts (raw images) or multi_modal_data "
                "(rendered images), not both"
            )
        if has_parts and self.mode != "content_parts":
            raise MultiModalDataError(
                "this VLLMBackend is in 'features' mode: render the images on the client "
                "(multi_modal_data), or create the backend with mode='content_parts'"
            )
        if has_parts or has_features:
            # image decoding / encoding and base64 of the tensors: off the event loop
            return await asyncio.to_thread(self._build_body, request)
        return self._build_body(request)

    def _build_body(self, request: GenerateRequest) -> _Prepared:
        body: dict[str, Any] = {
            "token_ids": request.prompt_ids,
            "sampling_params": _sampling_params(request.sampling),
        }
        if self.model is not None:
            body["model"] = self.model
        if request.request_id is not None:
            body["request_id"] = request.request_id
        prepared = _Prepared(body=b"")
        if request.content_parts:
            urls, hashes = _load_image_parts(request.content_parts, self.image_policy)
            if urls:
                body["content_parts"] = [{"type": "image_url", "url": url} for url in urls]
                body["return_token_ids"] = True
                prepared.image_hashes = hashes
        elif request.multi_modal_data is not None and not request.multi_modal_data.is_empty:
            body["features"] = self._features(request.multi_modal_data, len(request.prompt_ids))
        prepared.body = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        return prepared

    def _features(self, mmd: MultiModalData, num_tokens: int) -> dict[str, Any]:
        modalities = list(mmd.mm_placeholders)
        items = (
            mmd.mm_items
            if self.send_kwargs_data
            else {m: [None] * len(mmd.mm_placeholders[m]) for m in modalities}
        )
        MultiModalData(mmd.mm_hashes, mmd.mm_placeholders, items).validate(num_tokens=num_tokens)
        kwargs_data: dict[str, list[str | None]] | None = None
        if self.send_kwargs_data:
            from vf_mm.inference._mm_kwargs import encode_kwargs_item

            # an item with no inputs ({} or None) is one the server holds in its cache
            kwargs_data = {
                m: [
                    encode_kwargs_item(item, modality=m) if item else None
                    for item in mmd.mm_items[m]
                ]
                for m in modalities
            }
        return {
            "mm_hashes": {m: list(mmd.mm_hashes[m]) for m in modalities},
            "mm_placeholders": {
                m: [{"offset": r.offset, "length": r.length} for r in mmd.mm_placeholders[m]]
                for m in modalities
            },
            "kwargs_data": kwargs_data,
        }

    # -- sending, with retries ------------------------------------------------------

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport,
                http1=True,
                http2=False,
                trust_env=False,  # an inference server is reached directly, never via a proxy
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s, pool=None),
                limits=httpx.Limits(
                    max_connections=_MAX_CONNECTIONS,
                    max_keepalive_connections=_MAX_KEEPALIVE,
                    keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                ),
            )
        return self._client

    def _pick(self, tried: set[int]) -> int:
        """Least outstanding, ties broken round-robin; servers recently refusing
        connections last, and among the others those this request has not tried first."""
        n = len(self._servers)
        start = self._rr % n
        self._rr += 1
        now = time.monotonic()
        best: int | None = None
        best_key: tuple[int, int, int] | None = None
        for k in range(n):
            i = (start + k) % n
            s = self._servers[i]
            key = (int(s.down_until > now), int(i in tried), s.outstanding)
            if best_key is None or key < best_key:
                best, best_key = i, key
        assert best is not None
        return best

    def _backoff(self, retry: int) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * (2 ** (retry - 1)))
        return delay / 2 + random.uniform(0, delay / 2)

    async def _send(
        self, client: httpx.AsyncClient, request: GenerateRequest, prepared: _Prepared
    ) -> GenerateResult:
        attempts = self.max_retries + 1
        tried: set[int] = set()
        used: list[str] = []
        last: _Retryable | None = None
        for attempt in range(attempts):
            index = self._pick(tried)
            server = self._servers[index]
            if attempt and last is not None and (index in tried or len(self._servers) == 1):
                delay = self._backoff(attempt)
                if last.delay is not None:
                    delay = min(self.max_backoff_s, last.delay)
                await asyncio.sleep(delay)
            tried.add(index)
            if server.url not in used:
                used.append(server.url)
            try:
                content = await self._attempt(client, server, prepared.body, retry=attempt > 0)
                try:
                    return self._result(content, request, prepared, server.url)
                except (BackendError, _Retryable):
                    server.failures += 1
                    raise
            except _Retryable as exc:
                last = exc
                logger.debug("%s: attempt %d/%d failed: %s", server.url, attempt + 1, attempts, exc)
            except BackendError as exc:
                exc.args = (f"{exc.args[0]} (final, after {attempt + 1} attempt(s))",)
                raise
        assert last is not None
        error = last.error
        where = used[0] if len(used) == 1 else f"{len(used)} servers ({', '.join(used)})"
        error.args = (f"{error.args[0]}; gave up after {attempts} attempt(s) on {where}",)
        raise error

    async def _attempt(
        self, client: httpx.AsyncClient, server: _Server, body: bytes, *, retry: bool
    ) -> bytes:
        """One POST; the answer's bytes on 200. Raises ``_Retryable`` or a final error."""
        url = server.url + GENERATE_PATH
        server.outstanding += 1
        server.requests += 1
        server.retries += int(retry)
        failed = True
        try:
            try:
                response = await client.post(
                    url, content=body, headers={"Content-Type": "application/json"}
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self._mark_down(server)
                raise _Retryable(
                    BackendUnavailableError(
                        f"cannot connect to vLLM server {server.url}: {_describe(exc)}",
                        backend=server.url,
                    )
                ) from exc
            except httpx.TimeoutException as exc:
                raise _Retryable(
                    BackendUnavailableError(
                        f"vLLM server {server.url} timed out ({type(exc).__name__}, "
                        f"timeout_s={self.timeout_s:g})",
                        backend=server.url,
                    )
                ) from exc
            except (httpx.TransportError, httpx.DecodingError) as exc:
                # connection reset or closed before / while the answer was read
                raise _Retryable(
                    BackendUnavailableError(
                        f"vLLM server {server.url} closed the connection without a whole "
                        f"answer: {_describe(exc)}",
                        backend=server.url,
                    )
                ) from exc
            server.consecutive_failures = 0
            server.down_until = 0.0
            status = response.status_code
            if status == 200:
                failed = False
                return response.content
            detail = _error_detail(response)
            error = BackendHTTPError(
                f"vLLM server {server.url} answered {status}: {detail}{_hint(status)}",
                backend=server.url,
                status=status,
                detail=detail,
            )
            if status in (408, 429) or (status >= 500 and status != 501):
                raise _Retryable(error, delay=_retry_after(response))
            raise error
        finally:
            server.outstanding -= 1
            server.failures += int(failed)

    def _mark_down(self, server: _Server) -> None:
        server.consecutive_failures += 1
        cooldown = min(
            self.max_backoff_s, self.backoff_s * (2 ** (server.consecutive_failures - 1))
        )
        server.down_until = time.monotonic() + cooldown

    # -- the answer -----------------------------------------------------------------

    def _result(
        self, content: bytes, request: GenerateRequest, prepared: _Prepared, url: str
    ) -> GenerateResult:
        try:
            parsed = _GenerateResponse.model_validate_json(content)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            if any(e["type"] == "json_invalid" for e in errors):
                raise _Retryable(
                    BackendProtocolError(
                        f"vLLM server {url} answered 200 with a body that is not JSON: "
                        f"{_shorten(content.decode('utf-8', 'replace'), 120)!r}",
                        backend=url,
                    )
                ) from exc
            raise self._schema_error(url, _describe_validation(errors)) from exc
        choice = parsed.choices[0]
        finish_reason = choice.finish_reason or "stop"
        if finish_reason not in _FINISH_REASONS:
            raise self._schema_error(
                url, f"choices[0].finish_reason is {finish_reason!r}, not stop/length/abort"
            )
        logprobs: list[float] | None = None
        if request.sampling.logprobs:
            logprobs = self._logprobs(choice, url)

        prompt_ids: list[int] | None = None
        mm: MultiModalData | None = None
        if prepared.image_hashes is not None:
            prompt_ids, mm = self._expanded_prompt(parsed, prepared, url)
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

    def _logprobs(self, choice: _Choice, url: str) -> list[float]:
        lp = choice.logprobs
        content = lp.content if lp is not None else None
        if content is None and lp is not None and lp.sampled is not None:
            values = list(lp.sampled)
        elif content is None:
            raise self._schema_error(url, "logprobs were asked for but none came back")
        else:
            for j, (entry, token) in enumerate(zip(content, choice.token_ids, strict=False)):
                if entry.token_id is not None and entry.token_id != token:
                    raise self._schema_error(
                        url,
                        f"choices[0].logprobs.content[{j}].token_id is {entry.token_id}, "
                        f"but token_ids[{j}] is {token}",
                    )
            values = [entry.logprob for entry in content]
        if len(values) != len(choice.token_ids):
            raise self._schema_error(
                url,
                f"{len(values)} logprobs for {len(choice.token_ids)} tokens "
                "(choices[0].logprobs must be parallel to token_ids)",
            )
        return values

    def _expanded_prompt(
        self, parsed: _GenerateResponse, prepared: _Prepared, url: str
    ) -> tuple[list[int], MultiModalData]:
        if parsed.prompt_token_ids is None:
            raise self._schema_error(
                url, "prompt_token_ids missing although return_token_ids was sent"
            )
        prompt_ids = list(parsed.prompt_token_ids)
        placeholders = parsed.mm_placeholders or {}
        extra = sorted(set(placeholders) - {"image"})
        if extra:
            raise self._schema_error(url, f"mm_placeholders for modalities {extra} we never sent")
        ranges = [PlaceholderRange(p.offset, p.length) for p in placeholders.get("image", [])]
        hashes = prepared.image_hashes or []
        if len(ranges) != len(hashes):
            raise self._schema_error(
                url,
                f"{len(ranges)} image placeholders came back for {len(hashes)} images sent "
                "(is return_token_ids supported by this server?)",
            )
        if not hashes:
            return prompt_ids, MultiModalData()
        mm = MultiModalData(
            mm_hashes={"image": list(hashes)},
            mm_placeholders={"image": ranges},
            # the server processed the pixels: the client holds no model inputs for them
            mm_items={"image": [{} for _ in hashes]},
        )
        try:
            mm.validate(num_tokens=len(prompt_ids))
        except MultiModalDataError as exc:
            raise self._schema_error(url, str(exc)) from exc
        return prompt_ids, mm

    def _schema_error(self, url: str, what: str) -> BackendProtocolError:
        return BackendProtocolError(
            f"vLLM server {url} answered 200 with a response that breaks the generate "
            f"schema: {what}",
            backend=url,
        )

    # -- max_model_len --------------------------------------------------------------

    async def _discover_max_model_len(self, client: httpx.AsyncClient) -> None:
        """Read ``data[0].max_model_len`` of ``GET /v1/models`` once. Best effort: a server
        that does not answer leaves it unknown (the generate call reports the outage) and
        is asked again later; one that answers without the field settles it as None."""
        if self._discovery_lock is None:
            self._discovery_lock = asyncio.Lock()
        async with self._discovery_lock:
            if self._discovered or time.monotonic() < self._discovery_next:
                return
            for index in sorted(
                range(len(self._servers)), key=lambda i: self._servers[i].outstanding
            ):
                server = self._servers[index]
                try:
                    response = await client.get(
                        server.url + MODELS_PATH,
                        timeout=httpx.Timeout(self.connect_timeout_s),
                    )
                except httpx.HTTPError as exc:
                    logger.debug("%s%s: %s", server.url, MODELS_PATH, _describe(exc))
                    continue
                self._discovered = True
                value = None
                if response.status_code == 200:
                    try:
                        data = response.json()["data"][0]
                        value = data.get("max_model_len")
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                        value = None
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    self.max_model_len = value
                else:
                    logger.warning(
                        "%s%s gave no max_model_len (status %d); prompt lengths are not "
                        "checked before sending",
                        server.url,
                        MODELS_PATH,
                        response.status_code,
                    )
                return
            self._discovery_next = time.monotonic() + max(1.0, self.max_backoff_s)


# -- helpers ----------------------------------------------------------------------------


def _normalise_base_url(url: str) -> str:
    if not isinstance(url, str):
        raise TypeError(f"a base URL must be a str, not {type(url).__name__}")
    text = url.strip().rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(f"invalid base URL {url!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"a base URL must be http(s)://host[:port], got {url!r}")
    return text


def _sampling_params(sampling: SamplingParams) -> dict[str, Any]:
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
    return params


def _load_image_parts(
    parts: Sequence[Mapping[str, Any]], policy: ImagePolicy | None
) -> tuple[list[str], list[str]]:
    """Each image part loaded under ``policy`` and re-encoded as a PNG data URL; with the
    image hashes. Text parts are skipped (vLLM reads only media parts)."""
    from vf_mm.images import image_hash, load_image, png_data_url

    urls: list[str] = []
    hashes: list[str] = []
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise MultiModalDataError(
                f"content_parts[{i}] must be a dict, not {type(part).__name__}"
            )
        kind = part.get("type")
        if kind == "text":
            continue
        if kind not in ("image", "image_url"):
            raise MultiModalDataError(
                f"content_parts[{i}] has type {kind!r}; the vLLM backend sends image parts "
                "('image_url' or 'image') only"
            )
        source: Any = dict(part)
        if kind == "image_url" and "image_url" not in part and "url" in part:
            # vLLM's own flat form {"type": "image_url", "url": ...}
            source = {"type": "image_url", "image_url": {"url": part["url"]}}
        image = load_image(source, policy=policy, where=f"content_parts[{i}]")
        urls.append(png_data_url(image))
        hashes.append(image_hash(image))
    return urls, hashes


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _shorten(text: str, limit: int = _MAX_DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_detail(response: httpx.Response) -> str:
    """The server's message: vLLM's ``{"error": {"message"}}``, older vLLM's top-level
    ``{"message"}``, FastAPI's ``{"detail"}``, or the raw text; shortened."""
    text = response.text
    try:
        data = json.loads(text)
    except ValueError:
        return _shorten(text) or response.reason_phrase or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _shorten(error["message"])
        if isinstance(error, str):
            return _shorten(error)
        for key in ("message", "detail"):
            value = data.get(key)
            if isinstance(value, str):
                return _shorten(value)
            if value is not None:
                return _shorten(json.dumps(value))
    return _shorten(text)


def _hint(status: int) -> str:
    if status in (403, 404):
        return (
            f" (is {GENERATE_PATH} enabled? vLLM serves it only with --enable-scale-out "
            "or --tokens-only)"
        )
    return ""


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    return seconds if seconds >= 0 else None


def _describe_validation(errors: list[Any]) -> str:
    shown = []
    for e in errors[:3]:
        where = ".".join(str(p) for p in e.get("loc", ())) or "(body)"
        shown.append(f"{where}: {e.get('msg')}")
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(shown) + more
