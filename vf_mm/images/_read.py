"""``read_encoded``: the encoded bytes a source holds or names, read under the guard.

One intake for every medium: bytes as they are, a ``data:`` URL decoded, an http(s) URL
fetched behind the guard, a path or ``file://`` URL checked against the policy's local
roots and read within its byte bound. ``load_image`` decodes what it returns as an image,
``vf_mm.videos`` as a video (with the video byte cap as the policy's ``max_bytes``), so
both media read a source by the same rules.
"""

from __future__ import annotations

from vf_mm.images._data_url import decode_data_url
from vf_mm.images._fetch import Fetcher
from vf_mm.images._guard import check_local_path, file_url_to_path
from vf_mm.images._local import read_local_file
from vf_mm.images._policy import ImagePolicy
from vf_mm.images._source import Kind, Source

__all__ = ["read_encoded"]


def read_encoded(
    found: Source, policy: ImagePolicy, fetcher: Fetcher, *, medium: str = "image"
) -> bytes | bytearray | memoryview:
    """The encoded bytes of a sorted source that holds or names them.

    Args:
        found: The source, sorted (``classify_source``): bytes, a data, file or http(s)
            URL, or a path.
        policy: Where it may be read from; ``max_bytes`` bounds what is read.
        fetcher: How http(s) is fetched.
        medium: ``"image"`` or ``"video"``: which errors refuse a bad ``data:`` URL.

    Raises:
        UnsafeImageSourceError: The guard refuses where it comes from.
        ImageFetchError: Reading it failed.
        ImageDecodeError: A ``data:`` URL that is not base64 of the medium.
        ImageTooLargeError: Over ``policy.max_bytes``.
    """
    if found.kind is Kind.BYTES:
        data: bytes | bytearray | memoryview = found.value
        return data
    if found.kind is Kind.DATA_URL:
        return decode_data_url(found.value, max_bytes=policy.max_bytes, medium=medium)
    if found.kind is Kind.HTTP_URL:
        return fetcher.fetch(found.value, policy)
    if found.kind not in (Kind.PATH, Kind.FILE_URL):
        raise ValueError(f"a {found.kind.value} source holds no encoded bytes")
    path = file_url_to_path(found.value) if found.kind is Kind.FILE_URL else found.value
    checked = check_local_path(path, policy)
    return read_local_file(
        checked, max_bytes=policy.max_bytes, confined=policy.local_roots is not None
    )
