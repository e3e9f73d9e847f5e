"""``VLLMBackend``: the ``Backend`` contract over vLLM's token-in/token-out HTTP route.

``POST {base}/inference/v1/generate`` (the server must run with ``--enable-scale-out``
or ``--tokens-only``; otherwise the route answers 403/404). One shared
``httpx.AsyncClient`` (HTTP/1.1 keep-alive) talks to one or more servers; which server
an attempt goes to is the routing policy's choice, and a retry prefers a server this
request has not tried yet.

Routing
-------
A multi-turn rollout sends its whole history again every turn; only the server that
served its earlier turns holds that history in its prefix cache. ``routing="sticky"``
(the default) keeps each session (``GenerateRequest.session_id``: the client passes one
per rollout) on one server:

- a new session goes to the server with the fewest live sessions (then the fewest
  requests in flight, then the one least recently given a session): sessions, not
  requests, are what a server will be asked for next, and a tie never pins a burst of
  new sessions onto one server;
- a session's later turns go to its server, unless that server is failing (refusing
  connections, answering 408/429/5xx: it is avoided for a short, growing cooldown) or
  saturated: ``shed_margin`` or more requests in flight above the least-loaded other
  server. Then the turn goes elsewhere and the session moves with it (the new server
  holds its history from then on); a retry moves it likewise;
- a session ends with ``end_session`` (the environment's rollout ends it) or after
  ``session_idle_s`` without a turn.

Sessions are never hashed onto servers: a hash ignores load, and under saturation the
busiest server keeps its sessions while others idle. Requests without a session go to
the server with the fewest requests in flight. ``"least_outstanding"`` routes every
request that way, ``"round_robin"`` in turn; both ignore sessions (the baselines
``bench/routing.py`` measures against); their ties are broken round-robin.

Features mode and pixel normalisation
-------------------------------------
In ``features`` mode we send ``pixel_values`` exactly as the transformers processor makes
them: already rescaled and normalised. vLLM 0.32 enables ``--mm-device-do-normalize`` by
default for Qwen2-VL / 2.5-VL / 3-VL: its own processor then ships raw uint8 patches and
the vision tower normalises whatever arrives, so our pixels would be normalised twice and
the model would see the wrong image **with no error**. Start servers that receive
features with ``--no-mm-device-do-normalize`` (the vllm test tier does, and checks the
outputs against the server's own processing), or use ``mode="content_parts"``.

The request and response bodies, and how images are loaded and sent in
``content_parts`` mode, are the wire format's: ``vf_mm.inference._vllm_protocol``. In
that mode the length check before sending sees the unexpanded prompt (one pad per
image), so only the server can refuse a prompt that its images make too long.

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
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from vf_mm.errors import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
    MultiModalDataError,
)
from vf_mm.images import ImagePolicy
from vf_mm.inference._types import GenerateRequest, GenerateResult, check_prompt_length
from vf_mm.inference._vllm_protocol import (
    GENERATE_PATH,
    RequestBody,
    ResponseNotJSON,
    ResponseSchemaError,
    decode_response,
    encode_request,
    error_detail,
)

__all__ = ["ROUTINGS", "VLLMBackend"]

logger = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"

#: Connections kept per client: far more than any one server's batch, so requests
#: queue in vLLM's scheduler, not in our pool.
_MAX_CONNECTIONS = 4096
_MAX_KEEPALIVE = 1024
_KEEPALIVE_EXPIRY_S = 60.0

Routing = Literal["sticky", "least_outstanding", "round_robin"]
#: the routing policies ``VLLMBackend`` takes
ROUTINGS: tuple[str, ...] = ("sticky", "least_outstanding", "round_robin")


# -- attempts ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Server:
    """One base URL and its counters (what ``stats`` reports and ``_pick`` weighs)."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)  # its Authorization, if any
    outstanding: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    down_until: float = 0.0
    sessions: int = 0  # live sessions bound here
    placed_at: int = 0  # when a session was last placed here (the placement count then)


@dataclass(slots=True)
class _Session:
    """Where one session's turns go, and when it last had one (idle sessions expire)."""

    server: int
    last_used: float


class _Retryable(Exception):
    """One attempt failed in a way worth trying again."""

    def __init__(self, error: BackendError, *, delay: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.delay = delay  # the server's Retry-After, when it gave one


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
    ``api_key`` is sent as ``Authorization: Bearer`` (vLLM's ``--api-key``): one key for
    every server, or a sequence of one key (or None) per base URL, in order. Proxy
    environment variables are ignored: inference servers are reached directly.
    ``embed_token_ids`` (content_parts mode): per modality, the token ids that take
    embeddings (``renderer.vision.embed_ids("video")``), so the returned placeholders say
    which of their positions are embeddings (``is_embed``) where a range also holds
    text: Qwen3-VL's clips (timestamps), Gemma 3's images (markers). Without them every
    returned position counts as an embedding, which a later bridge or training batch
    then refuses for those families (never silently wrong).
    ``routing``: ``"sticky"`` (sessions stay on one server, new ones go to the least
    loaded; see the module docstring), ``"least_outstanding"`` or ``"round_robin"``.
    ``shed_margin``: a session leaves its server when that server has this many more
    requests in flight than the least-loaded other one (None: only when it fails).
    ``session_idle_s``: a session with no turn for this long is forgotten.
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
        api_key: str | Sequence[str | None] | None = None,
        embed_token_ids: Mapping[str, Sequence[int]] | None = None,
        routing: Routing = "sticky",
        shed_margin: int | None = 4,
        session_idle_s: float = 600.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("VLLMBackend needs at least one base URL")
        self.embed_token_ids = (
            {m: frozenset(int(t) for t in ids) for m, ids in embed_token_ids.items()}
            if embed_token_ids
            else None
        )
        keys = (
            [api_key] * len(urls) if api_key is None or isinstance(api_key, str) else list(api_key)
        )
        if len(keys) != len(urls):
            raise ValueError(f"{len(keys)} API keys for {len(urls)} base URLs: give one per URL")
        self._servers = [
            _Server(_normalise_base_url(u), {"Authorization": f"Bearer {k}"} if k else {})
            for u, k in zip(urls, keys, strict=True)
        ]
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
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if shed_margin is not None and (
            isinstance(shed_margin, bool) or not isinstance(shed_margin, int) or shed_margin < 1
        ):
            raise ValueError(f"shed_margin must be an int >= 1 or None, got {shed_margin!r}")
        if not session_idle_s > 0:
            raise ValueError(f"session_idle_s must be > 0, got {session_idle_s!r}")

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
        self._client: httpx.AsyncClient | None = None
        self._closed = False
        self._rr = 0
        self.routing = routing
        self.shed_margin = shed_margin
        self.session_idle_s = float(session_idle_s)
        # by last use, oldest first: expiry pops from the front
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._placements = 0
        self._routed: Counter[str] = Counter()
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
        failed (``failures``), attempts in flight now (``outstanding``) and live sessions
        bound to it (``sessions``)."""
        return {
            s.url: {
                "requests": s.requests,
                "retries": s.retries,
                "failures": s.failures,
                "outstanding": s.outstanding,
                "sessions": s.sessions,
            }
            for s in self._servers
        }

    @property
    def routing_stats(self) -> dict[str, int | str]:
        """What sticky routing did with sessions' turns: ``placed`` (a new session's first
        turn), ``kept`` (a turn on its session's server), ``shed_load`` / ``shed_failure``
        (a turn, and its session, moved off a saturated / failing server), ``expired``
        (sessions forgotten after ``session_idle_s``), and ``sessions`` live now."""
        counts = {k: self._routed[k] for k in ("placed", "kept", "shed_load", "shed_failure")}
        return {
            "routing": self.routing,
            **counts,
            "expired": self._routed["expired"],
            "sessions": len(self._sessions),
        }

    def end_session(self, session_id: str) -> None:
        """Forget a session (its rollout is over): its server stops counting it. Unknown
        ids are ignored, so ending twice is harmless."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self._servers[entry.server].sessions -= 1

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

    # -- the request body ---------------------------------------------------------------

    async def _prepare(self, request: GenerateRequest) -> RequestBody:
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
            return await asyncio.to_thread(self._encode, request)
        return self._encode(request)

    def _encode(self, request: GenerateRequest) -> RequestBody:
        body = encode_request(
            request,
            model=self.model,
            image_policy=self.image_policy,
            send_kwargs_data=self.send_kwargs_data,
        )
        body.embed_token_ids = self.embed_token_ids
        return body

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

    def _pick(self, tried: set[int], session_id: str | None = None) -> int:
        """The server for the next attempt, under the routing policy. Whatever the policy,
        failing servers (in their cooldown) come last, and among the others those this
        request has not tried first."""
        now = time.monotonic()
        if self.routing == "sticky" and session_id is not None:
            return self._pick_sticky(session_id, tried, now)
        if self.routing == "round_robin":
            return self._least(tried, now, lambda s: 0)
        return self._least(tried, now, lambda s: s.outstanding)

    def _least(
        self, tried: set[int], now: float, load: Callable[[_Server], Any], *, rotate: bool = True
    ) -> int:
        """The server with the least ``load``, failing and tried servers last; ties go
        round-robin (``rotate``) or to the first in order."""
        n = len(self._servers)
        start = 0
        if rotate:
            start = self._rr % n
            self._rr += 1
        best: int | None = None
        best_key: tuple[Any, ...] | None = None
        for k in range(n):
            i = (start + k) % n
            s = self._servers[i]
            key = (s.down_until > now, i in tried, load(s))
            if best_key is None or key < best_key:
                best, best_key = i, key
        assert best is not None
        return best

    def _pick_sticky(self, session_id: str, tried: set[int], now: float) -> int:
        self._expire(now)
        entry = self._sessions.get(session_id)
        if entry is None:
            index = self._place(tried, now)
            self._sessions[session_id] = _Session(index, now)
            self._servers[index].sessions += 1
            self._routed["placed"] += 1
            return index
        self._sessions.move_to_end(session_id)
        entry.last_used = now
        home = self._servers[entry.server]
        if entry.server not in tried and home.down_until <= now:
            target = self._unloaded(entry.server, now)
            if target is None:
                self._routed["kept"] += 1
                return entry.server
            self._routed["shed_load"] += 1
        else:
            target = self._place(tried, now)
            self._routed["shed_failure"] += 1
        home.sessions -= 1
        self._servers[target].sessions += 1
        entry.server = target
        return target

    def _place(self, tried: set[int], now: float) -> int:
        """Where a new (or moving) session goes: fewest live sessions, then fewest requests
        in flight, then the server least recently given a session."""
        index = self._least(
            tried, now, lambda s: (s.sessions, s.outstanding, s.placed_at), rotate=False
        )
        self._placements += 1
        self._servers[index].placed_at = self._placements
        return index

    def _unloaded(self, home: int, now: float) -> int | None:
        """The least-loaded other server when ``home`` is saturated (``shed_margin`` or more
        requests in flight above it), else None."""
        if self.shed_margin is None:
            return None
        best: _Server | None = None
        index = None
        for i, s in enumerate(self._servers):
            if (
                i != home
                and s.down_until <= now
                and (best is None or s.outstanding < best.outstanding)
            ):
                best, index = s, i
        if best is None or best.outstanding > self._servers[home].outstanding - self.shed_margin:
            return None
        return index

    def _expire(self, now: float) -> None:
        """Forget sessions idle for ``session_idle_s`` (the oldest are first in line)."""
        cutoff = now - self.session_idle_s
        while self._sessions:
            session_id, entry = next(iter(self._sessions.items()))
            if entry.last_used >= cutoff:
                return
            del self._sessions[session_id]
            self._servers[entry.server].sessions -= 1
            self._routed["expired"] += 1

    def _backoff(self, retry: int) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * (2 ** (retry - 1)))
        return delay / 2 + random.uniform(0, delay / 2)

    async def _send(
        self, client: httpx.AsyncClient, request: GenerateRequest, prepared: RequestBody
    ) -> GenerateResult:
        attempts = self.max_retries + 1
        tried: set[int] = set()
        used: list[str] = []
        last: _Retryable | None = None
        for attempt in range(attempts):
            index = self._pick(tried, request.session_id)
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
                result = self._result(content, request, prepared, server)
                entry = self._sessions.get(request.session_id) if request.session_id else None
                if entry is not None:  # a long generation is not idleness
                    entry.last_used = time.monotonic()
                return result
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
                    url,
                    content=body,
                    headers={"Content-Type": "application/json", **server.headers},
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
                self._mark_down(server)
                raise _Retryable(
                    BackendUnavailableError(
                        f"vLLM server {server.url} closed the connection without a whole "
                        f"answer: {_describe(exc)}",
                        backend=server.url,
                    )
                ) from exc
            status = response.status_code
            if status == 200:
                failed = False
                server.consecutive_failures = 0
                server.down_until = 0.0
                return response.content
            detail = error_detail(response.text, response.reason_phrase or "(empty body)")
            error = BackendHTTPError(
                f"vLLM server {server.url} answered {status}: {detail}{_hint(status)}",
                backend=server.url,
                status=status,
                detail=detail,
            )
            if status in (408, 429) or (status >= 500 and status != 501):
                self._mark_down(server)  # overloaded or broken: others first, for a while
                raise _Retryable(error, delay=_retry_after(response))
            server.consecutive_failures = 0
            server.down_until = 0.0
            raise error
        finally:
            server.outstanding -= 1
            server.failures += int(failed)

    def _result(
        self, content: bytes, request: GenerateRequest, prepared: RequestBody, server: _Server
    ) -> GenerateResult:
        """The answer of a 200; a body that is not JSON is retried, one that breaks the
        schema is final (either counts as the server's failure)."""
        try:
            return decode_response(content, request, prepared)
        except ResponseNotJSON as exc:
            server.failures += 1
            raise _Retryable(
                BackendProtocolError(
                    f"vLLM server {server.url} answered 200 with a body that is not JSON: {exc}",
                    backend=server.url,
                )
            ) from exc
        except ResponseSchemaError as exc:
            server.failures += 1
            raise BackendProtocolError(
                f"vLLM server {server.url} answered 200 with a response that breaks the "
                f"generate schema: {exc}",
                backend=server.url,
            ) from exc

    def _mark_down(self, server: _Server) -> None:
        server.consecutive_failures += 1
        cooldown = min(
            self.max_backoff_s, self.backoff_s * (2 ** (server.consecutive_failures - 1))
        )
        server.down_until = time.monotonic() + cooldown

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
                        headers=server.headers,
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


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
