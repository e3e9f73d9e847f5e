"""The SSRF guard: which URLs, hosts, addresses and local paths an ``ImagePolicy`` allows.

Everything here decides without touching the network; ``check_addresses`` judges the
answer of a resolver that the fetch layer calls. The rules:

- URLs: ``http`` and ``https`` only; no credentials (``user:pw@``), no backslash,
  whitespace or control characters anywhere; a non-empty host of letters, digits,
  ``-``, ``_`` and ``.`` (IDNA ASCII, as httpx spells it), or a bracketed IPv6 address;
  a port in 1..65535.
- Network off (``allow_network=False``) refuses every http(s) URL.
- ``allowed_domains``: the host equals one or is a subdomain of one.
- Host names ``localhost`` and ``*.localhost`` are refused without asking DNS.
- Numeric hosts: if the last label is a number (``127.1``, ``2130706433``,
  ``0x7f.1``, ``0177.0.0.1``), the host is an IPv4 address in the spelling that
  ``inet_aton``/``getaddrinfo`` would accept; only a canonical dotted quad
  (``93.184.216.34``) is taken, anything else is refused rather than reinterpreted.
- Addresses (literal, or every one a host resolves to): public unicast only. Refused:
  loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
  (169.254/16 with the cloud metadata endpoint, fe80::/10), CGNAT 100.64/10,
  multicast, reserved, unspecified, broadcast, documentation and benchmarking ranges
  (whatever ``ipaddress`` does not call global), and IPv6 forms that embed one of
  those: IPv4-mapped ``::ffff:a.b.c.d`` and NAT64 ``64:ff9b::/96`` are judged by the
  IPv4 address inside, 6to4 ``2002::/16`` too; IPv4-compatible ``::a.b.c.d`` and
  Teredo are refused outright. An IPv6 address with a zone index (``%eth0``) is refused.
- Local paths: with ``local_roots=None`` any path; with roots, the path resolved
  (symlinks and ``..`` followed) must lie inside one resolved root.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import httpx

from vf_mm.errors import ImageFetchError, UnsafeImageSourceError
from vf_mm.images._policy import ImagePolicy

__all__ = [
    "HttpTarget",
    "check_addresses",
    "check_http_url",
    "check_local_path",
    "file_url_to_path",
    "is_public_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_HOST_CHARS = re.compile(r"^[a-z0-9_.\-]+$")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_CANONICAL_QUAD = re.compile(rf"^{_OCTET}(?:\.{_OCTET}){{3}}$")
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """An http(s) URL the static checks allowed.

    ``host`` is the ASCII host name (no trailing dot) to resolve, send as ``Host`` and
    use for TLS SNI; ``address`` is set when the URL names an IP address directly.
    """

    url: httpx.URL
    host: str
    port: int
    address: IPAddress | None


def is_public_address(address: IPAddress) -> bool:
    """True for a globally routable unicast address, with embedded IPv4 forms unwrapped."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public_address(address.ipv4_mapped)
        if address in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address.sixtofour is not None and not is_public_address(address.sixtofour):
            return False
        if address.scope_id:  # a zone index has no meaning off the local link
            return False
        # IPv4-compatible ::a.b.c.d and local-use NAT64 64:ff9b:1::/48 lie in ::/8
        # (reserved) and Teredo in 2001::/23 (not global): refused below
    elif address in _CGNAT:
        return False
    return bool(
        address.is_global
        and not address.is_multicast
        and not address.is_private
        and not address.is_loopback
        and not address.is_link_local
        and not address.is_reserved
        and not address.is_unspecified
        and not (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    )


def _check_address(address: IPAddress, what: str) -> None:
    if not is_public_address(address):
        raise UnsafeImageSourceError(
            f"{what} {address}: not a public address "
            f"({_address_kind(address)}); only public hosts are fetched"
        )


def _address_kind(address: IPAddress) -> str:
    probe = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        probe = address.ipv4_mapped
    for attr, name in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(probe, attr):
            return name
    return "not globally routable"


def _numeric_host(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address of a host whose last label is a number; refuses spellings other
    than a canonical dotted quad. None for a host name."""
    labels = host.split(".")
    if not _NUMERIC_LABEL.match(labels[-1]):
        return None
    if not _CANONICAL_QUAD.match(host):
        raise UnsafeImageSourceError(
            f"host {host!r} is a numeric IPv4 address in a non-canonical spelling "
            "(decimal, octal, hex or short form); write it as a dotted quad"
        )
    return ipaddress.IPv4Address(host)


def _parse_ipv6_host(host: str) -> ipaddress.IPv6Address:
    try:
        return ipaddress.IPv6Address(unquote(host))
    except ValueError:
        raise UnsafeImageSourceError(f"host [{host}] is not a valid IPv6 address") from None


def _host_allowed(host: str, domains: Iterable[str]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


def check_http_url(url: str | httpx.URL, policy: ImagePolicy) -> HttpTarget:
    """The checks on an http(s) URL that need no DNS. Raises ``UnsafeImageSourceError``."""
    text = str(url)
    if _FORBIDDEN_CHARS.search(text):
        raise UnsafeImageSourceError(
            "URL holds whitespace, control characters or a backslash; refused as ambiguous"
        )
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise UnsafeImageSourceError(f"malformed URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise UnsafeImageSourceError(
            f"URL scheme {parsed.scheme!r} is not fetched (only http and https)"
        )
    if parsed.userinfo:
        raise UnsafeImageSourceError("URLs with credentials (user:password@host) are refused")
    if not policy.allow_network:
        raise UnsafeImageSourceError(
            "network access is off (ImagePolicy.allow_network=False); "
            "pass ImagePolicy(allow_network=True, ...) to fetch http(s) images"
        )
    raw_host = parsed.raw_host.decode("ascii", "replace").lower()
    if not raw_host:
        raise UnsafeImageSourceError("URL has no host")
    port = parsed.port if parsed.port is not None else (443 if parsed.scheme == "https" else 80)
    if not 0 < port < 65536:
        raise UnsafeImageSourceError(f"URL port {port} is out of range")

    address: IPAddress | None
    if ":" in raw_host:  # httpx keeps an IPv6 literal's text without brackets
        address = _parse_ipv6_host(raw_host)
        host = address.compressed
    else:
        host = raw_host[:-1] if raw_host.endswith(".") else raw_host
        if not host or not _HOST_CHARS.match(host) or ".." in host:
            raise UnsafeImageSourceError(f"host {host!r} is not a valid host name")
        address = _numeric_host(host)
        if address is None and (host == "localhost" or host.endswith(".localhost")):
            raise UnsafeImageSourceError(f"host {host!r} is the local machine")

    if policy.allowed_domains and not _host_allowed(host, policy.allowed_domains):
        raise UnsafeImageSourceError(
            f"host {host!r} is not in allowed_domains {list(policy.allowed_domains)}"
        )
    if address is not None:
        _check_address(address, "URL names address")
    return HttpTarget(url=parsed, host=host, port=port, address=address)


def check_addresses(host: str, addresses: Iterable[str]) -> list[IPAddress]:
    """Parse a resolver's answer for ``host``; refuse unless *every* address is public
    (one private answer among public ones is how rebinding attacks hide). Returns the
    addresses in the resolver's order, duplicates dropped."""
    parsed: list[IPAddress] = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise ImageFetchError(
                f"resolver gave {text!r} for {host!r}, which is not an IP address"
            ) from None
        _check_address(address, f"host {host!r} resolves to")
        if address not in parsed:
            parsed.append(address)
    if not parsed:
        raise ImageFetchError(f"host {host!r} resolved to no address")
    return parsed


def file_url_to_path(url: str) -> Path:
    """The local path of a ``file:`` URL. Only ``file:///path`` and
    ``file://localhost/path``: a remote host (a network share) is refused."""
    if _FORBIDDEN_CHARS.search(url):
        raise UnsafeImageSourceError("file: URL holds whitespace or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UnsafeImageSourceError(f"malformed file: URL ({exc})") from None
    if parts.netloc not in ("", "localhost"):
        raise UnsafeImageSourceError(
            f"file: URL names host {parts.netloc!r}; only local files (file:///path) are read"
        )
    if parts.query or parts.fragment:
        raise UnsafeImageSourceError("file: URL with a query or fragment is ambiguous")
    if not parts.path:
        raise UnsafeImageSourceError("file: URL without a path")
    return Path(url2pathname(parts.path))


def check_local_path(path: str | os.PathLike[str], policy: ImagePolicy) -> Path:
    """The path to open. With ``local_roots``, it is resolved (symlinks, ``..``) and must
    lie inside a root; the resolved path is returned so the file opened is the file
    checked. Raises ``UnsafeImageSourceError`` (outside the roots) or ``ImageFetchError``
    (it does not exist)."""
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raise UnsafeImageSourceError("byte-string paths are not read; pass a str or Path")
    if "\x00" in raw:
        raise UnsafeImageSourceError("path holds a NUL character")
    if not raw:
        raise ImageFetchError("empty path")
    candidate = Path(raw)
    roots = policy.local_roots
    if roots is None:
        return candidate
    if not roots:
        raise UnsafeImageSourceError("local files are not read under this policy (local_roots=())")
    try:
        resolved = candidate.resolve(strict=True)
    except FileNotFoundError:
        # resolve what exists, so a missing file outside the roots is still "outside"
        resolved = candidate.resolve(strict=False)
        if not any(resolved.is_relative_to(root) for root in roots):
            raise _outside(raw, roots) from None
        raise ImageFetchError("no such file") from None
    except (OSError, RuntimeError) as exc:  # symlink loop, permission on a parent
        raise ImageFetchError(f"cannot resolve the path ({exc.__class__.__name__})") from None
    if not any(resolved.is_relative_to(root) for root in roots):
        raise _outside(raw, roots)
    return resolved


def _outside(raw: str, roots: tuple[Path, ...]) -> UnsafeImageSourceError:
    shown = ", ".join(str(r) for r in roots[:3]) + (", ..." if len(roots) > 3 else "")
    return UnsafeImageSourceError(
        f"path resolves outside local_roots ({shown}); symlinks and '..' are followed "
        "before the check"
    )
