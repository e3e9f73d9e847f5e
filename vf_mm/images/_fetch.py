"""Fetching an image over http(s), behind the guard.

One narrow interface: ``Fetcher(transport=..., resolver=...)``. The transport is any
``httpx.BaseTransport`` (tests pass ``httpx.MockTransport``); the resolver maps
``(host, port)`` to IP address strings (default: ``socket.getaddrinfo``; tests pass a
dict lookup, so no test asks real DNS). For each hop:

1. ``check_http_url``: scheme, credentials, network on, host syntax, allowed domains,
   numeric-host spellings, IP literals (no DNS, no connection).
2. Resolve the host and refuse unless *every* address is public.
3. Connect to the checked address, pinned: the request URL names the IP, the ``Host``
   header and TLS SNI (``extensions["sni_hostname"]``, so certificates are checked
   against the host name) name the host. No second DNS lookup can rebind it.
4. No redirects are followed by httpx; a 3xx ``Location`` is resolved against the
   hop's URL and goes back to step 1, at most ``max_redirects`` times.
5. ``Content-Length`` over ``max_bytes`` is refused before the body is read; the body
   is streamed and the read stops as soon as it passes ``max_bytes``. A body sent
   with a ``Content-Encoding`` is refused (we ask for ``identity``: a gzip bomb could
   otherwise expand past the limit inside one chunk).
6. ``timeout_s`` bounds each network operation and the fetch as a whole.

The default transport is a fresh ``httpx.HTTPTransport`` per fetch (environment proxy
settings are not used, no retries, certificates verified): connections are never
reused across host names that share an address. DNS lookups through
``socket.getaddrinfo`` cannot be interrupted, so a slow resolver can outlast
``timeout_s``.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from vf_mm._text import describe_exception
from vf_mm.errors import ImageError, ImageFetchError, UnsafeImageSourceError
from vf_mm.images._guard import HttpTarget, check_addresses, check_http_url
from vf_mm.images._policy import ImagePolicy
from vf_mm.images._source import describe

__all__ = ["Fetcher", "Resolver", "system_resolver"]

#: ``(host, port) -> IP address strings``; raise ``OSError`` when the name does not resolve.
Resolver = Callable[[str, int], Iterable[str]]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_USER_AGENT = "vf-mm-images/0.1"


def system_resolver(host: str, port: int) -> list[str]:
    """``socket.getaddrinfo`` for TCP: every address the host has, in its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    """One verifying context (certifi's roots), shared: building one costs ~10 ms."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _in_redirect(exc: UnsafeImageSourceError, hop: int, url: str) -> None:
    """Say that the refusal came at a redirect (the source named is the first URL)."""
    exc.reason = f"redirect {hop} to {describe(url)} refused: {exc.reason}"


@dataclass(frozen=True, slots=True)
class Fetcher:
    """Gets the bytes of an http(s) URL that the policy allows, or raises.

    Attributes:
        transport: An ``httpx.BaseTransport`` to send requests through; ``None`` builds a
            fresh ``httpx.HTTPTransport`` for each fetch. A transport passed here is used as
            it is and never closed.
        resolver: ``(host, port) -> IP address strings`` (see ``Resolver``); the default
            uses ``socket.getaddrinfo``.
    """

    transport: httpx.BaseTransport | None = None
    resolver: Resolver = system_resolver

    def fetch(self, url: str, policy: ImagePolicy) -> bytes:
        """The body of ``url``: guard, resolve, pin, follow redirects, cap.

        Args:
            url: An http(s) URL.
            policy: What may be fetched, and the limits.

        Raises:
            UnsafeImageSourceError: Before any connection to a refused target.
            ImageFetchError: The fetch fails.
        """
        deadline = time.monotonic() + policy.timeout_s
        target = check_http_url(url, policy)  # refuses before we build a transport
        transport = self.transport
        owned = transport is None
        if transport is None:
            transport = httpx.HTTPTransport(verify=_default_ssl_context(), trust_env=False)
        try:
            hops = 0
            while True:
                try:
                    response = self._send(transport, target, policy, deadline)
                except UnsafeImageSourceError as exc:
                    if hops:
                        _in_redirect(exc, hops, str(target.url))
                    raise
                try:
                    if response.status_code in _REDIRECTS:
                        location = response.headers.get("location")
                        if not location:
                            raise ImageFetchError(
                                f"HTTP {response.status_code} redirect without a Location",
                                status=response.status_code,
                            )
                        hops += 1
                        if hops > policy.max_redirects:
                            raise ImageFetchError(
                                f"more than max_redirects={policy.max_redirects} redirects",
                                status=response.status_code,
                            )
                        next_url = self._join(target.url, location)
                        try:
                            target = check_http_url(next_url, policy)
                        except UnsafeImageSourceError as exc:
                            _in_redirect(exc, hops, next_url)
                            raise
                        continue
                    if not 200 <= response.status_code < 300:
                        phrase = response.reason_phrase or ""
                        raise ImageFetchError(
                            f"HTTP {response.status_code} {phrase}".rstrip()
                            + (f" from {describe(str(target.url))}" if hops else ""),
                            status=response.status_code,
                        )
                    return self._read_body(response, policy, deadline)
                finally:
                    response.close()
        finally:
            if owned:
                transport.close()

    @staticmethod
    def _join(base: httpx.URL, location: str) -> str:
        try:
            return str(base.join(location))
        except (httpx.InvalidURL, ValueError) as exc:
            raise UnsafeImageSourceError(f"redirect to a malformed URL ({exc})") from None

    def _resolve(self, target: HttpTarget) -> str:
        if target.address is not None:
            return target.address.compressed
        try:
            answer = list(self.resolver(target.host, target.port))
        except ImageError:
            raise
        except (OSError, UnicodeError) as exc:
            raise ImageFetchError(f"cannot resolve host {target.host!r} ({exc})") from None
        return check_addresses(target.host, answer)[0].compressed

    def _send(
        self,
        transport: httpx.BaseTransport,
        target: HttpTarget,
        policy: ImagePolicy,
        deadline: float,
    ) -> httpx.Response:
        pinned = self._resolve(target)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ImageFetchError(f"timed out after timeout_s={policy.timeout_s}")
        default_port = 443 if target.url.scheme == "https" else 80
        host_header = target.host if ":" not in target.host else f"[{target.host}]"
        if target.port != default_port:
            host_header += f":{target.port}"
        extensions: dict[str, object] = {"timeout": httpx.Timeout(remaining).as_dict()}
        if target.url.scheme == "https" and target.address is None:
            extensions["sni_hostname"] = target.host
        request = httpx.Request(
            "GET",
            target.url.copy_with(host=pinned, port=target.port, fragment=None),
            headers={
                "Host": host_header,
                "Accept": "image/*",
                "Accept-Encoding": "identity",
                "User-Agent": _USER_AGENT,
            },
            extensions=extensions,
        )
        try:
            return transport.handle_request(request)
        except httpx.TimeoutException:
            raise ImageFetchError(f"timed out after timeout_s={policy.timeout_s}") from None
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            raise ImageFetchError(
                f"request failed ({exc.__class__.__name__}: {describe_exception(exc)})"
            ) from None

    @staticmethod
    def _read_body(response: httpx.Response, policy: ImagePolicy, deadline: float) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ImageFetchError(
                f"response has Content-Encoding {encoding!r}; only identity is read"
            )
        declared = response.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise ImageFetchError(f"invalid Content-Length {declared!r}") from None
            if size > policy.max_bytes:
                raise ImageFetchError(f"Content-Length {size} is over max_bytes={policy.max_bytes}")
        chunks: list[bytes] = []
        total = 0
        try:
            for chunk in response.iter_bytes():
                total += len(chunk)
                if total > policy.max_bytes:
                    raise ImageFetchError(
                        f"body is over max_bytes={policy.max_bytes} (stopped reading)"
                    )
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise ImageFetchError(f"timed out after timeout_s={policy.timeout_s}")
        except httpx.TimeoutException:
            raise ImageFetchError(f"timed out after timeout_s={policy.timeout_s}") from None
        except (httpx.HTTPError, OSError) as exc:
            raise ImageFetchError(
                f"reading the body failed ({exc.__class__.__name__}: {describe_exception(exc)})"
            ) from None
        return b"".join(chunks)
