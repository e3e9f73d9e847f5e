"""``VLLMTransport``: the HTTP side of ``VLLMBackend``: one shared client (plain HTTP on
``KeepAliveTransport``, TLS through httpx), one POST to one
server and what its answer means, and the ``GET /v1/models`` that reads
``max_model_len``.

Each attempt ends in exactly one of: the answer's bytes (200), ``Retryable`` (no answer,
a cut connection, 408, 429, 5xx but 501, a 200 body that is not JSON: worth trying
again, the server marked down for a growing cooldown where it is failing),
``ItemsMissing`` (the server lacks an item the body sent as ``null``) or a final
``BackendError``. Which server an attempt goes to, and whether to try again, is the
backend's (``vf_mm.inference._vllm``): this module only classifies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx

from vf_mm.errors import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
)
from vf_mm.inference._http import KeepAliveTransport
from vf_mm.inference._types import GenerateRequest, GenerateResult
from vf_mm.inference._vllm_config import Retry
from vf_mm.inference._vllm_items import ITEM_CACHE_HEADER, MISS_ERROR_TYPE
from vf_mm.inference._vllm_protocol import (
    GENERATE_PATH,
    RequestBody,
    ResponseNotJSON,
    ResponseSchemaError,
    decode_response,
    error_detail,
    error_type,
)
from vf_mm.inference._vllm_routing import Server

__all__ = ["MODELS_PATH", "ItemsMissing", "Retryable", "VLLMTransport", "describe_error"]

logger = logging.getLogger("vf_mm.inference._vllm")

MODELS_PATH = "/v1/models"

#: Connections kept per client: far more than any one server's batch, so requests
#: queue in vLLM's scheduler, not in our pool.
_MAX_CONNECTIONS = 4096
_MAX_KEEPALIVE = 1024
_KEEPALIVE_EXPIRY_S = 60.0


class Retryable(Exception):
    """One attempt failed in a way worth trying again.

    Args:
        error: The error to raise if no attempt is left.
        delay: The server's ``Retry-After`` seconds, when it gave one.
    """

    def __init__(self, error: BackendError, *, delay: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.delay = delay


class ItemsMissing(Exception):
    """The server does not hold an item the body sent as ``null``: send it in full."""


class VLLMTransport:
    """One ``httpx.AsyncClient`` (HTTP/1.1 keep-alive, no proxy) to every server, made on
    first use, and the meaning of each answer.

    Args:
        timeout_s: Bounds each read (for a generate: the wait for the whole answer).
        connect_timeout_s: Bounds each connect.
        retry: Its cooldown marks a failing server down.
        transport: Replaces the default one (``KeepAliveTransport`` for ``http://``
            servers, httpx's own for ``https://``): tests, a Unix socket.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        retry: Retry,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retry = retry
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        """The shared client (made on first use)."""
        if self._client is None:
            transport = self._transport
            if transport is None:  # plain HTTP on our own pool; TLS through httpx's
                tls = httpx.AsyncHTTPTransport(
                    http1=True,
                    http2=False,
                    trust_env=False,
                    limits=httpx.Limits(
                        max_connections=_MAX_CONNECTIONS,
                        max_keepalive_connections=_MAX_KEEPALIVE,
                        keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                    ),
                )
                transport = KeepAliveTransport(
                    max_idle=_MAX_KEEPALIVE, keepalive_expiry_s=_KEEPALIVE_EXPIRY_S, fallback=tls
                )
            self._client = httpx.AsyncClient(
                transport=transport,
                trust_env=False,  # an inference server is reached directly, never via a proxy
                headers={"Accept": "application/json"},
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s, pool=None),
            )
        return self._client

    async def aclose(self) -> None:
        """Close the client; a later ``client()`` makes a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def post(
        self, server: Server, sent: RequestBody, *, retry: bool
    ) -> tuple[bytes, str | None]:
        """One POST of ``sent`` to ``server``, counted in its stats.

        Args:
            server: The server chosen for this attempt.
            sent: The body.
            retry: Whether this attempt is a retry (counted as one).

        Returns:
            On 200, the answer's bytes and its item-cache header (None without).

        Raises:
            Retryable: Worth trying again.
            ItemsMissing: The body has ``null`` items the server does not hold.
            BackendHTTPError: A final status.
        """
        url = server.url + GENERATE_PATH
        server.outstanding += 1
        server.requests += 1
        server.retries += int(retry)
        failed = True
        try:
            try:
                response = await self.client().post(
                    url,
                    content=sent.body,
                    headers={"Content-Type": "application/json", **server.headers},
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.mark_down(server)
                raise Retryable(
                    BackendUnavailableError(
                        f"cannot connect to vLLM server {server.url}: {describe_error(exc)}",
                        backend=server.url,
                    )
                ) from exc
            except httpx.TimeoutException as exc:
                raise Retryable(
                    BackendUnavailableError(
                        f"vLLM server {server.url} timed out ({type(exc).__name__}, "
                        f"timeout_s={self.timeout_s:g})",
                        backend=server.url,
                    )
                ) from exc
            except (httpx.TransportError, httpx.DecodingError) as exc:
                # connection reset or closed before / while the answer was read
                self.mark_down(server)
                raise Retryable(
                    BackendUnavailableError(
                        f"vLLM server {server.url} closed the connection without a whole "
                        f"answer: {describe_error(exc)}",
                        backend=server.url,
                    )
                ) from exc
            status = response.status_code
            if status == 200:
                failed = False
                server.consecutive_failures = 0
                server.down_until = 0.0
                return response.content, response.headers.get(ITEM_CACHE_HEADER)
            if status == 400 and sent.skipped and error_type(response.text) == MISS_ERROR_TYPE:
                failed = False
                raise ItemsMissing
            detail = error_detail(response.text, response.reason_phrase or "(empty body)")
            error = BackendHTTPError(
                f"vLLM server {server.url} answered {status}: {detail}{_hint(status)}",
                backend=server.url,
                status=status,
                detail=detail,
            )
            if status in (408, 429) or (status >= 500 and status != 501):
                self.mark_down(server)  # overloaded or broken: others first, for a while
                raise Retryable(error, delay=_retry_after(response))
            server.consecutive_failures = 0
            server.down_until = 0.0
            raise error
        finally:
            server.outstanding -= 1
            server.failures += int(failed)

    @staticmethod
    def decode(
        content: bytes, request: GenerateRequest, sent: RequestBody, server: Server
    ) -> GenerateResult:
        """The answer of a 200: a body that is not JSON is retried, one that breaks the
        schema is final (either counts as the server's failure).

        Args:
            content: The answer's bytes.
            request: The request it answers.
            sent: The body that was sent.
            server: The server that answered.

        Raises:
            Retryable: Not JSON (a proxy may have cut it).
            BackendProtocolError: JSON that breaks the generate schema.
        """
        try:
            return decode_response(content, request, sent)
        except ResponseNotJSON as exc:
            server.failures += 1
            raise Retryable(
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

    def mark_down(self, server: Server) -> None:
        """Count a failure of ``server`` and avoid it for the retry policy's cooldown.

        Args:
            server: The failing server.
        """
        server.consecutive_failures += 1
        server.down_until = time.monotonic() + self.retry.cooldown(server.consecutive_failures)

    async def read_max_model_len(self, servers: Sequence[Server]) -> tuple[bool, int | None]:
        """``data[0].max_model_len`` of ``GET /v1/models``, from the first server that
        answers (least loaded first).

        Args:
            servers: The servers to ask.

        Returns:
            Whether one answered, and the value (None when its answer has none).
        """
        for server in sorted(servers, key=lambda s: s.outstanding):
            try:
                response = await self.client().get(
                    server.url + MODELS_PATH,
                    headers=server.headers,
                    timeout=httpx.Timeout(self.connect_timeout_s),
                )
            except httpx.HTTPError as exc:
                logger.debug("%s%s: %s", server.url, MODELS_PATH, describe_error(exc))
                continue
            value = None
            if response.status_code == 200:
                try:
                    data = response.json()["data"][0]
                    value = data.get("max_model_len")
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    value = None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return True, value
            logger.warning(
                "%s%s gave no max_model_len (status %d); prompt lengths are not "
                "checked before sending",
                server.url,
                MODELS_PATH,
                response.status_code,
            )
            return True, None
        return False, None


def describe_error(exc: BaseException) -> str:
    """An exception as ``Type: message`` (its type alone when it says nothing).

    Args:
        exc: The exception.
    """
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
