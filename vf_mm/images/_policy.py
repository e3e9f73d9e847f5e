"""``ImagePolicy``: what ``load_image`` may read, and how much of it.

A policy is plain frozen data (hashable, picklable, safe to share between threads and
processes). It holds no client, resolver or open file: those live in ``Fetcher``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_TIMEOUT_S",
    "ImagePolicy",
]

#: 32 MiB of encoded bytes (a file, a data: URL's payload, an HTTP body).
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
#: 64 Mi pixels (8192 x 8192). Stricter than Pillow's own decompression-bomb warning
#: (``PIL.Image.MAX_IMAGE_PIXELS`` = 89,478,485) and error (twice that).
DEFAULT_MAX_PIXELS = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_REDIRECTS = 5
#: Pillow format ids ``load_image`` decodes by default: the raster formats images
#: in datasets and on the web come in. Everything else Pillow could open (EPS, which
#: runs Ghostscript; PSD, FITS, ICNS, ...) is refused with ``ImageDecodeError``.
#: (Multi-picture JPEGs from phones, "MPO", open through "JPEG".)
DEFAULT_FORMATS: tuple[str, ...] = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF", "AVIF")


def _normalise_domain(domain: str) -> str:
    """``domain`` as the guard spells a URL's host: IDNA ASCII, lower case, no trailing dot
    (an IPv6 address in its compressed form, without brackets)."""
    if not isinstance(domain, str) or not domain.strip(". "):
        raise ValueError(f"allowed_domains entries must be non-empty host names, got {domain!r}")
    text = domain.strip().strip(".")
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text.strip("[]")).compressed
        except ValueError:
            raise ValueError(
                f"allowed_domains entries are host names (example.com), not URLs: {domain!r}"
            ) from None
    if any(c in text for c in "/@?#[]\\% "):
        raise ValueError(
            f"allowed_domains entries are host names (example.com), not URLs: {domain!r}"
        )
    try:
        host = httpx.URL(f"http://{text}/").raw_host
    except httpx.InvalidURL as exc:
        raise ValueError(f"allowed_domains entry {domain!r} is not a valid host name") from exc
    return host.decode("ascii").lower().rstrip(".")


def _normalise_roots(roots: Any) -> tuple[Path, ...] | None:
    if roots is None:
        return None
    if isinstance(roots, (str, os.PathLike)):
        roots = (roots,)  # one root given bare: never iterate a str character by character
    out: list[Path] = []
    for root in roots:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"local_roots entries must be paths, not {type(root).__name__}")
        if isinstance(root, str) and root[:5].lower() == "file:":  # a directory by its URL
            root = _root_of_url(root)
        # resolved now, so a check later compares real paths with real paths
        out.append(Path(root).expanduser().resolve())
    return tuple(dict.fromkeys(out))


def _root_of_url(url: str) -> Path:
    """A ``file:`` URL root as its directory, read by the guard's own rules (no remote
    host, no query): taken as a relative path it would confine to a folder named
    ``file:``, which nothing lies in."""
    from vf_mm.errors import ImageError
    from vf_mm.images._guard import file_url_to_path  # the guard imports this module

    try:
        return file_url_to_path(url)
    except ImageError as exc:
        raise ValueError(f"local_roots entry {url!r}: {exc}") from None


def _positive(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    of_kind = isinstance(value, kind) and not isinstance(value, bool)
    if not of_kind or not value > 0:
        raise ValueError(f"ImagePolicy.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    """What ``load_image`` may read.

    The defaults suit trusted code: any local path, no network. For data you did not write
    (a dataset row, a tool result, a model's output) use ``ImagePolicy.dataset(roots=...)``.

    Attributes:
        allow_network: Fetch ``http(s)://`` URLs at all. Off by default.
        allowed_domains: When non-empty, the URL's host must equal one of these or be a
            subdomain of one (``example.com`` allows ``cdn.example.com``). Empty means any
            host. Either way every address the host resolves to must be public: loopback,
            private, link-local (cloud metadata at 169.254.169.254), CGNAT, multicast,
            reserved and unspecified addresses are always refused, in any spelling.
        local_roots: ``None`` allows any local path (trusted code). A tuple confines
            paths, after resolving symlinks and ``..``, to those directories; ``()`` allows
            no local path at all. A single path may be given bare, and a root as its
            ``file:`` URL.
        max_bytes: The most encoded bytes read from any source.
        max_pixels: The most pixels (width x height) decoded; checked from the header,
            before any pixel is decoded.
        timeout_s: The limit for each network operation (connect, each read) and for a
            whole fetch, redirects included.
        max_redirects: HTTP redirects followed (each hop checked like the first).
        formats: Pillow format ids decoded (``DEFAULT_FORMATS``).
    """

    allow_network: bool = False
    allowed_domains: tuple[str, ...] = ()
    local_roots: tuple[Path, ...] | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    formats: tuple[str, ...] = DEFAULT_FORMATS

    def __post_init__(self) -> None:
        if not isinstance(self.allow_network, bool):
            raise TypeError(f"ImagePolicy.allow_network must be a bool, got {self.allow_network!r}")
        domains = self.allowed_domains
        if isinstance(domains, str):
            domains = (domains,)
        object.__setattr__(
            self,
            "allowed_domains",
            tuple(dict.fromkeys(_normalise_domain(d) for d in domains)),
        )
        object.__setattr__(self, "local_roots", _normalise_roots(self.local_roots))
        _positive("max_bytes", self.max_bytes, int)
        _positive("max_pixels", self.max_pixels, int)
        _positive("timeout_s", self.timeout_s, (int, float))
        if (
            isinstance(self.max_redirects, bool)
            or not isinstance(self.max_redirects, int)
            or self.max_redirects < 0
        ):
            raise ValueError(
                f"ImagePolicy.max_redirects must be an int >= 0, got {self.max_redirects!r}"
            )
        formats = (self.formats,) if isinstance(self.formats, str) else self.formats
        formats = tuple(dict.fromkeys(str(f).upper() for f in formats))
        if not formats:
            raise ValueError("ImagePolicy.formats must name at least one format")
        object.__setattr__(self, "formats", formats)

    @classmethod
    def trusted(cls, **overrides: Any) -> ImagePolicy:
        """For code you wrote: any local path, and the network (any public host)."""
        return cls(**{"allow_network": True, "local_roots": None, **overrides})

    @classmethod
    def dataset(
        cls,
        roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        *,
        allow_network: bool = False,
        allowed_domains: Iterable[str] = (),
        **overrides: Any,
    ) -> ImagePolicy:
        """A policy for data you did not write.

        Args:
            roots: Local paths are allowed only under these (none if empty).
            allow_network: Whether http(s) may be fetched at all.
            allowed_domains: When given, the only hosts fetched (and their subdomains).
            **overrides: Any other field of the policy.
        """
        return cls(
            allow_network=allow_network,
            allowed_domains=tuple(allowed_domains)
            if not isinstance(allowed_domains, str)
            else (allowed_domains,),
            local_roots=roots,  # type: ignore[arg-type]  # normalised in __post_init__
            **overrides,
        )

    def replace(self, **changes: Any) -> ImagePolicy:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)
