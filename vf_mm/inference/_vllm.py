"""``VLLMBackend``: the ``Backend`` contract over vLLM's token-in/token-out HTTP route.

``POST {base}/inference/v1/generate`` (the server must run with ``--enable-scale-out``
or ``--tokens-only``; otherwise the route answers 403/404). One shared
``httpx.AsyncClient`` (HTTP/1.1 keep-alive) talks to one or more servers; which server
an attempt goes to is the routing policy's choice (``Routing``; the ``Router`` of
``vf_mm.inference._vllm_routing`` applies it), and a retry prefers a server this request
has not tried yet.

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
default for Qwen2-VL / 2.5-VL / 3-VL and Kimi-K2.5: its own processor then ships raw
uint8 patches and the vision tower normalises whatever arrives, so our pixels would be
normalised twice and the model would see the wrong image **with no error**. Start servers that receive
features with ``--no-mm-device-do-normalize`` (the vllm test tier does, and checks the
outputs against the server's own processing), or use ``mode="content_parts"``.

Kimi-K2.5's images go as vLLM's ``vision_chunk`` modality with the grid as ``grid_thws``,
what vLLM's Kimi-K2.5 model takes, in both modes (``vf_mm.inference._vllm_protocol``).

The request and response bodies, and how images are loaded and sent in
``content_parts`` mode, are the wire format's: ``vf_mm.inference._vllm_protocol``. In
that mode the length check before sending sees the unexpanded prompt (one pad per
image), so only the server can refuse a prompt that its images make too long.

Retries
-------
Connection errors, connect/read/write timeouts, a connection closed before or while the
body was read, 408, 429 and 5xx (not 501) are retried up to ``max_retries`` times with
exponential backoff and jitter (``Retry``: ``Retry-After`` seconds honoured, capped at
``max_backoff_s``); a retry on a server the request has not tried yet starts at once. A
body that is not JSON is retried too (a proxy may have cut it); an answer that is JSON
but breaks the schema is not (it would break again). Other 4xx are final. After the last
try: ``BackendUnavailableError`` (no answer), ``BackendHTTPError`` (status, the server's
message) or ``BackendProtocolError``; each message names the server(s) and the number of
attempts. What each answer means is ``vf_mm.inference._vllm_transport``'s
(``VLLMTransport``); the backend chooses servers and decides whether to try again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

from vf_mm.errors import (
    BackendError,
    MultiModalDataError,
)
from vf_mm.images import ImagePolicy
from vf_mm.inference._types import GenerateRequest, GenerateResult, check_prompt_length
from vf_mm.inference._vllm_config import (
    ROUTINGS,
    UNSET,
    Auth,
    Expansion,
    Retry,
    Routing,
    RoutingPolicy,
    Unset,
    with_keywords,
)
from vf_mm.inference._vllm_items import HeldItems
from vf_mm.inference._vllm_protocol import (
    ItemStrings,
    RequestBody,
    check_features,
    encode_request,
)
from vf_mm.inference._vllm_routing import Router, Server
from vf_mm.inference._vllm_transport import ItemsMissing, Retryable, VLLMTransport

__all__ = ["ROUTINGS", "Auth", "Retry", "Routing", "VLLMBackend"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Prepared:
    """One request made ready to send: its body (the same for every server), or its
    items' strings, from which each attempt's body is made for its server."""

    fixed: RequestBody | None = None
    strings: ItemStrings | None = None


class VLLMBackend:
    """Generate with one or more vLLM servers through ``/inference/v1/generate``.

    Proxy environment variables are ignored: inference servers are reached directly.

    The settings of one concern are one object, checked when it is made (``retry``,
    ``routing``, ``auth``). The keywords ``max_retries``, ``backoff_s``,
    ``max_backoff_s`` (a ``Retry``), ``shed_margin``, ``session_idle_s`` (a ``Routing``) and
    ``api_key`` (an ``Auth``) build those objects, as ``VLLMBackend(urls,
    max_retries=5)``; one of them given with its object is refused (``TypeError``). The
    objects are the backend's ``retry``, ``routing`` and ``auth``.

    Args:
        base_urls: The servers' roots (``http://host:8000``; a trailing ``/v1`` is
            dropped).
        model: The ``model`` field of each request (None: left out).
        mode: ``"features"`` (the request carries rendered images in ``multi_modal_data``:
            exact token parity with the client's renderer; the server must run with
            ``--no-mm-device-do-normalize``, see the module docstring) or
            ``"content_parts"`` (the request carries raw image parts, one image pad each in
            ``prompt_ids``; the server expands them and the result carries the expanded
            ``prompt_ids`` and placeholders; prerendered ``multi_modal_data`` is still sent
            as features).
        max_model_len: None reads ``data[0].max_model_len`` of ``GET {base}/v1/models``
            on first use.
        timeout_s: Bounds each read (for a generate: the wait for the whole answer).
        connect_timeout_s: Bounds each connect.
        retry: A ``Retry`` (how many retries, the backoff and its cap).
        routing: A ``Routing`` (the policy, ``shed_margin``, ``session_idle_s``; see the
            module docstring), or just the policy's name (``"sticky"``, the default,
            ``"least_outstanding"`` or ``"round_robin"``).
        auth: An ``Auth`` (the API keys, sent as ``Authorization: Bearer``: vLLM's
            ``--api-key``; one for every server, or one per base URL in order).
        image_policy: What image sources content_parts mode may read.
        send_kwargs_data: True sends each image's tensors; to a server that advertises
            its item cache (``vf-mm serve``) only once: an item it holds from an earlier
            answered request goes as ``null`` with the digest of what was sent, and a miss
            is sent again in full (``item_stats``; ``vf_mm.inference._vllm_items`` says why
            a real vLLM server is always sent every item). False sends ``kwargs_data:
            null``: the server looks every item up by hash in its cache.
        transport: Replaces the default one (``KeepAliveTransport`` for ``http://``
            servers, httpx's own for ``https://``): tests, a Unix socket.
        expansion: content_parts mode: how the server's expansion of raw parts is read
            against the renderer's (its embedding ids, the ids vLLM writes otherwise, the
            parts it cannot take): ``Expansion.of(renderer.vision)``, which ``make_client``
            passes. Without one every returned position counts as an embedding (a later
            bridge or batch refuses that for families whose ranges hold text) and a clip is
            refused before sending.
        embed_token_ids: Builds ``expansion`` (not with it).
        embed_swaps: Builds ``expansion`` (not with it).
        refusals: Builds ``expansion`` (not with it).
        max_retries: Builds ``retry`` (not with it).
        backoff_s: Builds ``retry`` (not with it).
        max_backoff_s: Builds ``retry`` (not with it).
        api_key: Builds ``auth`` (not with it).
        shed_margin: Builds ``routing`` (not with a ``Routing``).
        session_idle_s: Builds ``routing`` (not with a ``Routing``).

    Raises:
        TypeError: A keyword given with the object it builds.
        ValueError: A bad setting (named).
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
        retry: Retry | None = None,
        routing: Routing | RoutingPolicy = "sticky",
        auth: Auth | None = None,
        image_policy: ImagePolicy | None = None,
        send_kwargs_data: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        expansion: Expansion | None = None,
        embed_token_ids: Mapping[str, Sequence[int]] | Unset | None = UNSET,
        embed_swaps: Mapping[str, Mapping[int, int]] | Unset | None = UNSET,
        refusals: Mapping[str, str | None] | Unset | None = UNSET,
        max_retries: int | Unset = UNSET,
        backoff_s: float | Unset = UNSET,
        max_backoff_s: float | Unset = UNSET,
        api_key: str | Sequence[str | None] | Unset | None = UNSET,
        shed_margin: int | Unset | None = UNSET,
        session_idle_s: float | Unset = UNSET,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("VLLMBackend needs at least one base URL")
        self.retry = with_keywords(Retry, retry, "retry", max_retries=max_retries,
                                   backoff_s=backoff_s, max_backoff_s=max_backoff_s)  # fmt: skip
        loose: dict[str, object] = {"shed_margin": shed_margin, "session_idle_s": session_idle_s}
        if isinstance(routing, str):  # the policy's name: a Routing with the keywords
            loose["policy"] = routing
            routing_given = None
        else:
            routing_given = routing
        self.routing: Routing = with_keywords(Routing, routing_given, "routing", **loose)
        if api_key is not UNSET and not (api_key is None or isinstance(api_key, str)):
            api_key = tuple(api_key)
        self.auth = with_keywords(Auth, auth, "auth", api_key=api_key)
        servers = [
            Server(_normalise_base_url(u), headers)
            for u, headers in zip(urls, self.auth.headers(len(urls)), strict=True)
        ]
        if len({s.url for s in servers}) != len(servers):
            raise ValueError(f"duplicate base URLs: {[s.url for s in servers]}")
        _check_options(mode, max_model_len, timeout_s, connect_timeout_s, image_policy)
        self.expansion = with_keywords(Expansion, expansion, "expansion",
                                       embed_token_ids=embed_token_ids,
                                       embed_swaps=embed_swaps, refusals=refusals)  # fmt: skip
        self.model = model
        self.mode = mode
        self.max_model_len = max_model_len
        self.name = f"vllm:{model}" if model else f"vllm:{servers[0].url}"
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.image_policy = image_policy
        self.send_kwargs_data = send_kwargs_data
        self._servers = servers
        self._router = Router(servers, self.routing)
        self._held = [HeldItems() for _ in servers]  # parallel to servers
        self._http = VLLMTransport(
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            retry=self.retry,
            transport=transport,
        )
        self._closed = False
        self._discovered = max_model_len is not None
        self._discovery_next = 0.0
        self._discovery_lock: asyncio.Lock | None = None

    # -- public ---------------------------------------------------------------------

    @property
    def embed_token_ids(self) -> dict[str, frozenset[int]] | None:
        """``expansion``'s embedding ids by modality; None without any."""
        return dict(self.expansion.embed_token_ids) or None

    @property
    def embed_swaps(self) -> dict[str, dict[int, int]] | None:
        """``expansion``'s swaps by modality; None without any."""
        return {m: dict(p) for m, p in self.expansion.embed_swaps.items()} or None

    @property
    def refusals(self) -> dict[str, str]:
        """``expansion``'s refused modalities, with why."""
        return dict(self.expansion.refusals)

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
    def item_stats(self) -> dict[str, dict[str, int]]:
        """Per base URL, the images' (and clips') tensors in features mode, in the
        requests it answered: items ``sent`` with their tensors, ``skipped`` (sent as
        ``null``: the server held them from an earlier request), ``misses`` (requests
        the server answered that it lacked one, sent again in full) and ``held`` (items
        recorded as held now). A
        server is sent ``null`` items only if it advertises its item cache (``vf-mm
        serve``; see ``vf_mm.inference._vllm_items``), never a real vLLM server."""
        return {
            s.url: {"sent": h.sent, "skipped": h.skipped, "misses": h.misses, "held": len(h.items)}
            for s, h in zip(self._servers, self._held, strict=True)
        }

    @property
    def routing_stats(self) -> dict[str, int | str]:
        """What sticky routing did with sessions' turns: ``placed`` (a new session's first
        turn), ``kept`` (a turn on its session's server), ``shed_load`` / ``shed_failure``
        (a turn, and its session, moved off a saturated / failing server), ``expired``
        (sessions forgotten after ``session_idle_s``), and ``sessions`` live now."""
        return self._router.stats

    def end_session(self, session_id: str) -> None:
        """Forget a session (its rollout is over): its server stops counting it.

        Unknown ids are ignored, so ending twice is harmless.

        Args:
            session_id: The rollout's session id.
        """
        self._router.end_session(session_id)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._closed:
            raise BackendError(f"{self.name} is closed", backend=self.name)
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty (vLLM needs at least one token)")
        if not self._discovered:
            await self._discover_max_model_len()
        check_prompt_length(request, self.max_model_len, backend=self.name)
        prepared = await self._prepare(request)
        return await self._send(request, prepared)

    async def aclose(self) -> None:
        self._closed = True
        await self._http.aclose()

    async def __aenter__(self) -> VLLMBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"VLLMBackend({self.base_urls!r}, mode={self.mode!r}, model={self.model!r})"

    # -- the request body ---------------------------------------------------------------

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
        for i, part in enumerate(parts or ()):
            refusal = self.refusals.get(_part_modality(part) or "")
            if refusal:
                raise MultiModalDataError(f"content_parts[{i}] is refused: {refusal}")
        if has_parts and not (self.embed_token_ids or {}).get("video"):
            assert parts is not None
            clips = [i for i, p in enumerate(parts) if _is_clip_part(p)]
            if clips:
                raise MultiModalDataError(
                    f"content_parts[{clips[0]}] is a clip, and this VLLMBackend has no "
                    "embed_token_ids for 'video': without the renderer's embedding ids it "
                    "cannot check that the server expanded the clip to the renderer's ids "
                    "(vLLM 0.32 writes an InternVL3 clip's frames with <video>, not the "
                    "renderer's <IMG_CONTEXT>); create the backend with "
                    "expansion=Expansion.of(renderer.vision) (make_client does)"
                )
        if has_features and self.send_kwargs_data:
            assert mmd is not None  # checked before a server is chosen; bodies made by _body
            check_features(mmd, len(request.prompt_ids), send_kwargs_data=True)
            return _Prepared(strings=ItemStrings())
        if has_parts or has_features:
            # image decoding / encoding and base64 of the tensors: off the event loop
            return _Prepared(fixed=await asyncio.to_thread(self._encode, request, None, None))
        return _Prepared(fixed=self._encode(request, None, None))

    def _encode(
        self,
        request: GenerateRequest,
        items: ItemStrings | None,
        held: dict[tuple[str, str], tuple[str, str]] | None,
    ) -> RequestBody:
        body = encode_request(
            request,
            model=self.model,
            image_policy=self.image_policy,
            send_kwargs_data=self.send_kwargs_data,
            items=items,
            held=held,
        )
        body.embed_token_ids = self.embed_token_ids
        body.embed_swaps = self.embed_swaps
        return body

    async def _body(
        self, request: GenerateRequest, prepared: _Prepared, held: HeldItems | None
    ) -> RequestBody:
        """The body for one attempt: the same for every server, or (features with
        tensors) each item a server ``held`` from us sent as ``null`` (see
        ``vf_mm.inference._vllm_items``)."""
        if prepared.fixed is not None:
            return prepared.fixed
        # only a server that may keep items costs fingerprints (and only one that said
        # so holds any items: the others get no nulls)
        snapshot = dict(held.items) if held is not None and held.may_keep else None
        return await asyncio.to_thread(self._encode, request, prepared.strings, snapshot)

    async def _body_for(
        self, request: GenerateRequest, prepared: _Prepared, index: int
    ) -> RequestBody:
        """``_body`` for server ``index``, counted in flight there from its choice on: a
        request chosen meanwhile sees it (``_attempt`` counts it again, with no await
        between)."""
        server = self._servers[index]
        server.outstanding += 1
        try:
            return await self._body(request, prepared, self._held[index])
        finally:
            server.outstanding -= 1

    # -- sending, with retries ------------------------------------------------------

    async def _send(self, request: GenerateRequest, prepared: _Prepared) -> GenerateResult:
        attempts = self.retry.max_retries + 1
        tried: set[int] = set()
        used: list[str] = []
        last: Retryable | None = None
        for attempt in range(attempts):
            index = self._router.pick(tried, request.session_id)
            server = self._servers[index]
            if attempt and last is not None and (index in tried or len(self._servers) == 1):
                delay = self.retry.backoff(attempt)
                if last.delay is not None:
                    delay = min(self.retry.max_backoff_s, last.delay)
                await asyncio.sleep(delay)
            tried.add(index)
            if server.url not in used:
                used.append(server.url)
            held = self._held[index]
            body = await self._body_for(request, prepared, index)
            try:
                try:
                    content, advert = await self._http.post(server, body, retry=attempt > 0)
                except ItemsMissing:
                    # the server lost what we sent it (restarted, evicted): once, in full
                    held.misses += 1
                    held.forget()
                    body = await self._body_for(request, prepared, index)  # holds nothing
                    content, advert = await self._http.post(server, body, retry=True)
                result = self._http.decode(content, request, body, server)
                self._router.touch(request.session_id)
                held.sent += body.sent
                held.skipped += body.skipped
                held.confirm(advert, body.held)
                return result
            except Retryable as exc:
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

    # -- max_model_len --------------------------------------------------------------

    async def _discover_max_model_len(self) -> None:
        """Read ``data[0].max_model_len`` of ``GET /v1/models`` once. Best effort: a server
        that does not answer leaves it unknown (the generate call reports the outage) and
        is asked again later; one that answers without the field settles it as None."""
        if self._discovery_lock is None:
            self._discovery_lock = asyncio.Lock()
        async with self._discovery_lock:
            if self._discovered or time.monotonic() < self._discovery_next:
                return
            answered, value = await self._http.read_max_model_len(self._servers)
            if answered:
                self._discovered = True
                if value is not None:
                    self.max_model_len = value
                return
            self._discovery_next = time.monotonic() + max(1.0, self.retry.max_backoff_s)


# -- helpers ----------------------------------------------------------------------------


def _check_options(
    mode: str,
    max_model_len: int | None,
    timeout_s: float,
    connect_timeout_s: float,
    image_policy: object,
) -> None:
    """``VLLMBackend``'s settings that are not a settings object, checked."""
    if mode not in ("features", "content_parts"):
        raise ValueError(f"mode must be 'features' or 'content_parts', got {mode!r}")
    if max_model_len is not None and (
        isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
    ):
        raise ValueError(f"max_model_len must be a positive int or None, got {max_model_len!r}")
    for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if image_policy is not None and not isinstance(image_policy, ImagePolicy):
        raise TypeError(f"image_policy must be an ImagePolicy, not {type(image_policy).__name__}")


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


def _is_clip_part(part: object) -> bool:
    """A content part that is a clip (``video`` or ``video_url``)."""
    return isinstance(part, Mapping) and part.get("type") in ("video", "video_url")


def _part_modality(part: object) -> str | None:
    """The modality of a content part (``"image"`` or ``"video"``; None for another)."""
    if _is_clip_part(part):
        return "video"
    if isinstance(part, Mapping) and part.get("type") in ("image", "image_url"):
        return "image"
    return None
