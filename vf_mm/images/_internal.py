"""The images package's internal tier: what sibling packages (``videos``, ``training``,
``results``) use to read their sources under the image guard's rules, and what users
have no need of. Only vf_mm's own packages import this module (the architecture test
allows ``vf_mm.<package>._internal`` and no other private module); it carries no
stability promise.

- ``SourceKind`` / ``classify_source``: how a source (a string, bytes, a path, a content
  part) is sorted, so a scheme means the same for every medium;
- ``unwrap_part``: the source inside an image or video content part;
- ``describe_source``: how errors name a source (short, without secrets);
- ``check_local_path`` / ``file_url_to_path`` / ``read_local_file``: local files under
  the policy's roots, read within a byte bound;
- ``read_encoded``: a sorted source's encoded bytes (bytes, data URL, http(s), file),
  read by the same rules for images and videos.
"""

from __future__ import annotations

from vf_mm.images._fetch import Resolver, system_resolver
from vf_mm.images._guard import check_local_path, file_url_to_path, is_public_address
from vf_mm.images._key import SourceKey
from vf_mm.images._local import read_local_file
from vf_mm.images._policy import (
    DEFAULT_FORMATS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_TIMEOUT_S,
)
from vf_mm.images._read import read_encoded
from vf_mm.images._source import Kind as SourceKind
from vf_mm.images._source import classify as classify_source
from vf_mm.images._source import describe as describe_source
from vf_mm.images._source import unwrap_part

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_TIMEOUT_S",
    "Resolver",
    "SourceKey",
    "SourceKind",
    "check_local_path",
    "classify_source",
    "describe_source",
    "file_url_to_path",
    "is_public_address",
    "read_encoded",
    "read_local_file",
    "system_resolver",
    "unwrap_part",
]
