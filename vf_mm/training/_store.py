"""The shared image store behind ``ref`` frames: where the sampler writes each image's
bytes once, and how the trainer reads a reference back under the image guard.

A store is a directory on a filesystem the sampler and the trainer share (``file://``),
or a prefix in an fsspec filesystem (``s3://bucket/images``, ``gs://...``, ``memory://``
in tests: any protocol fsspec has a driver for, its extra installed). An image's bytes
live at ``<root>/<sha[:2]>/<sha>``, named by their sha256, so:

- a write is idempotent (bytes already there are not written again) and any number of
  samplers may share one store;
- a reader checks the bytes it gets against the name's sha256, so a half-written,
  changed or swapped object is caught, never decoded as the image.

**Reading is confined.** A frame is data from the network: a reference must not make the
trainer read whatever it names. ``file://`` references are read only under the
rebuilder's ``roots`` (``vf_mm.images.check_local_path``: symlinks and ``..`` resolved
first), and not at all under a policy that names no roots (one for trusted code, which
reads any path); any other scheme only under a store prefix the operator allow-listed
(``ImageRebuilder(..., stores=["s3://bucket/images"])``), and there only the exact
``<store>/<sha[:2]>/<sha>`` a store writes (``s3://bucket/images-evil/...``, a ``..``, a
query: all refused). Store URLs have one spelling (``store_url``: no trailing slash, no
empty, ``.`` or ``..`` segment, no bare ``proto://`` root), the same for the writer and
the reader. ``http(s)`` is refused as a store: those reads belong to the image guard's
SSRF rules, and a store is written, which HTTP is not. Every read is bounded by the
policy's ``max_bytes``: a network object's size is checked before a ranged read of at
most that many bytes; how long a read may take is the fsspec driver's setting.

**Pruning.** A store grows with every distinct image. ``ImageStore.prune(older_than_s=)``
deletes what no sampler has written for that long: a ``put`` of bytes already present
refreshes their time on a local store, so an image still shown by new groups stays, and
a ``put`` racing a ``prune`` never loses its file (``ImageStore.prune`` says how). A file
of the wrong size (a crash mid-write elsewhere) is written again by the next ``put``.
Choose ``older_than_s`` above the longest a group may wait between its packing and the
trainer reading it (sender buffers, a trainer restart). Object stores keep no writable
access time: prune them with the bucket's own lifecycle rule (expire objects after N
days), which ``prune`` refuses to stand in for.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vf_mm.errors import ImageError, ImageRefError
from vf_mm.images import ImagePolicy
from vf_mm.images._internal import check_local_path, file_url_to_path, read_local_file

__all__ = ["ImageStore", "PruneReport", "StoreReader"]

_SHA = re.compile(r"[0-9a-f]{64}")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
_NOT_STORES = ("http", "https")
#: a writer's temporary file is left for at least this long (a put may be writing it)
_TMP_AGE_S = 3600.0


_LOOKS_LIKE_A_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]+:")


def _scheme(text: str) -> str | None:
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else None


def store_url(text: str) -> str:
    """A network store's URL in the one spelling writers and readers compare: no trailing
    slash, and refused (``ValueError``) for ``http(s)`` (no store: module docstring), and
    where two spellings could name one place or the URL names no place of its own: a bare ``proto://`` root, empty, ``.`` or ``..``
    segments, a query or a fragment."""
    scheme = _scheme(text)
    if scheme is None:
        raise ValueError(f"a store URL is scheme://path, not {text!r}")
    if scheme in _NOT_STORES:
        raise ValueError(
            f"an image store cannot be {scheme}:// ({text}): name a directory on a shared "
            "filesystem or an object store (s3://, gs://, ...)"
        )
    rest = text[len(scheme) + 3 :].rstrip("/")
    if not rest:
        raise ValueError(f"a store URL names a path under its root, not {text!r} alone")
    if "?" in rest or "#" in rest:
        raise ValueError(f"a store URL has no query or fragment: {text!r}")
    if any(segment in ("", ".", "..") for segment in rest.split("/")):
        raise ValueError(f"a store URL has no empty, '.' or '..' segments: {text!r}")
    return f"{text[: len(scheme)]}://{rest}"


def _fsspec(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    """``(filesystem, path)`` for an fsspec URL; a clear error when its driver is absent."""
    try:
        from fsspec.core import url_to_fs
    except ImportError as exc:  # fsspec comes with datasets; a trimmed install may lack it
        from vf_mm.errors import MissingDependencyError

        raise MissingDependencyError(f"a store at {url} needs fsspec (pip install fsspec)") from exc
    try:
        return url_to_fs(url, **dict(options))
    except (ImportError, ValueError) as exc:  # an unknown protocol or a driver not installed
        raise ValueError(f"store {url}: fsspec cannot open it ({exc})") from exc


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What ``ImageStore.prune`` did.

    Attributes:
        deleted: Files deleted (with ``dry_run``, that would have been).
        deleted_bytes: Their bytes.
        kept: Files kept.
    """

    deleted: int
    deleted_bytes: int
    kept: int


class ImageStore:
    """A shared store for ``ref`` frames (module docstring).

    ``put(data)`` stores bytes once and gives their ``(uri, sha256)``; ``uri(sha)`` is the
    reference a frame carries. Local writes are atomic (a temporary file renamed into
    place). An object store's put is atomic per object; on other fsspec filesystems a reader
    may meet a partial write, which its sha256 check refuses.

    Args:
        root: A local directory (or its ``file://`` URL), created if absent, or an fsspec
            URL (``s3://bucket/prefix``).
        storage_options: Passed to fsspec.

    Raises:
        ValueError: fsspec cannot open ``root``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        text = os.fspath(root)
        if not text.strip():  # an unset shell variable: never "the current directory"
            raise ValueError("an image store needs a directory or a URL, not an empty string")
        scheme = _scheme(text)
        if scheme is None and _LOOKS_LIKE_A_SCHEME.match(text):
            raise ValueError(
                f"{text!r} looks like a URL without '//' (s3://bucket/images); a directory "
                "whose name starts like a URL scheme: write it as ./" + text
            )
        self._fs: Any = None
        if scheme in (None, "file"):
            path = file_url_to_path(text) if scheme == "file" else Path(text)
            root = Path(path).expanduser().resolve()
            root.mkdir(parents=True, exist_ok=True)
            self.root: Path | str = root
            self.url = root.as_uri()
        else:
            self.url = store_url(text)
            self._fs, remote = _fsspec(self.url, storage_options or {})
            self.root = remote.rstrip("/")

    @property
    def is_local(self) -> bool:
        return self._fs is None

    def path(self, sha: str) -> Path | str:
        """Where ``sha``'s bytes live: a local ``Path``, or the fsspec path.

        Args:
            sha: The bytes' sha256 (hex).
        """
        if isinstance(self.root, Path):
            return self.root / sha[:2] / sha
        return f"{self.root}/{sha[:2]}/{sha}"

    def uri(self, sha: str) -> str:
        """The reference a frame carries for the bytes with this sha256.

        Args:
            sha: The bytes' sha256 (hex).
        """
        return f"{self.url}/{sha[:2]}/{sha}"

    def put(self, data: bytes) -> tuple[str, str]:
        """Store ``data`` (once); return its ``(uri, sha256)``.

        Args:
            data: The encoded image's bytes.
        """
        sha = hashlib.sha256(data).hexdigest()
        path = self.path(sha)
        if isinstance(path, Path):
            if not self._present(path, len(data)):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{sha}.{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as file:
                    file.write(data)
                os.replace(tmp, path)
        else:
            try:
                present = self._fs.size(path) == len(data)
            except FileNotFoundError:
                present = False
            if not present:  # absent, or a partial write to repair
                self._fs.pipe_file(path, data)
        return self.uri(sha), sha

    @staticmethod
    def _present(path: Path, size: int) -> bool:
        """Whether ``path`` holds the image already (its size right: a file cut short by a
        crash is written again, never kept), its time refreshed so ``prune`` keeps it.
        A file another user wrote may refuse the refresh: it is there all the same."""
        try:
            if path.stat().st_size != size:
                return False
            os.utime(path)
        except FileNotFoundError:
            return False
        except PermissionError:
            pass
        return True

    def prune(self, *, older_than_s: float, dry_run: bool = False) -> PruneReport:
        """Delete the images no ``put`` has touched for ``older_than_s`` seconds.

        And the temporary files of writers killed at least an hour, or ``older_than_s``, ago.
        Local stores only: an object store expires objects with its own lifecycle rule.

        Safe beside samplers writing the store: an old file is first renamed aside, then
        looked at again, and put back if a ``put`` touched it meanwhile (a ``put`` that finds
        it gone writes it again), so no reference a ``put`` handed out loses its file. Files
        that vanish under it (another ``prune``) are skipped.

        Args:
            older_than_s: The age past which an untouched image goes.
            dry_run: Delete nothing; the report counts what would have gone.
        """
        if not isinstance(self.root, Path):
            raise ValueError(
                f"prune works on a local store; expire objects under {self.url} with the "
                "object store's lifecycle rule instead"
            )
        if (
            isinstance(older_than_s, bool)
            or not isinstance(older_than_s, (int, float))
            or not math.isfinite(older_than_s)
            or older_than_s < 0
        ):
            raise ValueError(f"older_than_s must be a finite number >= 0, got {older_than_s!r}")
        now = time.time()
        cutoff = now - float(older_than_s)
        tmp_cutoff = now - max(float(older_than_s), _TMP_AGE_S)
        deleted = deleted_bytes = kept = 0
        for shard in os.scandir(self.root):
            if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                continue  # not the store's layout: never touched
            for entry in os.scandir(shard.path):
                # a writer's, or a prune's killed between its rename and its delete
                temporary = entry.name.startswith(".") and entry.name.endswith((".tmp", ".pruning"))
                if not (_SHA.fullmatch(entry.name) or temporary):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                if stat.st_mtime >= (tmp_cutoff if temporary else cutoff):
                    kept += 1
                    continue
                if dry_run or self._remove_if_old(Path(entry.path), cutoff, temporary):
                    deleted, deleted_bytes = deleted + 1, deleted_bytes + stat.st_size
                else:
                    kept += 1
        return PruneReport(deleted, deleted_bytes, kept)

    @staticmethod
    def _remove_if_old(path: Path, cutoff: float, temporary: bool) -> bool:
        """Remove ``path`` unless a ``put`` touches it while this looks: renamed aside,
        checked again, deleted, or renamed back. True when it was deleted."""
        if temporary:
            path.unlink(missing_ok=True)
            return True
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.pruning")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if aside.stat().st_mtime >= cutoff:  # touched between the look and the rename
            with contextlib.suppress(FileExistsError):  # a put may have written it again
                os.link(aside, path)
            aside.unlink()
            return False
        aside.unlink()
        return True

    def __repr__(self) -> str:
        return f"ImageStore({self.url!r})"


class StoreReader:
    """Reads ``ref`` entries for the trainer under the guard (module docstring):
    ``file://`` under ``policy``'s local roots, other schemes under ``stores`` only."""

    def __init__(
        self,
        policy: ImagePolicy,
        *,
        stores: Iterable[str] = (),
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(stores, str):
            stores = (stores,)
        self.policy = policy
        self.stores: tuple[str, ...] = ()
        for store in stores:
            scheme = _scheme(str(store))
            if scheme is None or scheme == "file":
                raise ValueError(
                    f"stores= names network stores (s3://..., gs://...); a local directory "
                    f"goes in roots=, not stores ({store!r})"
                )
            self.stores += (store_url(str(store)),)
        self._options = dict(storage_options or {})
        self._filesystems: dict[str, tuple[Any, str]] = {}

    def read(self, uri: Any, sha: Any, where: str, h: str) -> bytes:
        """The bytes ``uri`` names, checked against ``sha``; ``ImageRefError`` else."""
        if not isinstance(uri, str) or not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise ImageRefError(
                f"{where}: a reference needs 'uri' and 'sha256' (64 hex digits)", image_hash=h
            )
        scheme = _scheme(uri)
        if scheme == "file":
            data = self._read_file(uri, where, h)
        elif scheme is None or scheme in _NOT_STORES:
            raise ImageRefError(
                f"{where}: reference {uri[:60]!r} is no store's: only file:// under the "
                "rebuilder's roots and allow-listed stores (stores=[...]) are read",
                image_hash=h,
            )
        else:
            data = self._read_store(uri, sha, where, h)
        if hashlib.sha256(data).hexdigest() != sha:
            raise ImageRefError(
                f"{where}: reference {uri}: its bytes do not match their sha256 {sha[:16]}... "
                "(changed or corrupt in the store)",
                image_hash=h,
            )
        return data

    def _read_file(self, uri: str, where: str, h: str) -> bytes:
        if self.policy.local_roots is None:  # a policy for trusted code reads any path
            raise ImageRefError(
                f"{where}: reference {uri}: file:// references are read only under named "
                "roots (ImageRebuilder(..., roots=[STORE]), or a policy with local_roots)",
                image_hash=h,
            )
        try:
            path = check_local_path(file_url_to_path(uri), self.policy)
            return read_local_file(
                path, max_bytes=self.policy.max_bytes, confined=self.policy.local_roots is not None
            )
        except ImageError as exc:
            hint = (
                " (name the store with ImageRebuilder(..., roots=[STORE]))"
                if not self.policy.local_roots
                else ""
            )
            raise ImageRefError(f"{where}: reference {uri}: {exc}{hint}", image_hash=h) from exc

    def _read_store(self, uri: str, sha: str, where: str, h: str) -> bytes:
        store = self._store_of(uri, sha)
        if store is None:
            named = ", ".join(self.stores) if self.stores else "none"
            raise ImageRefError(
                f"{where}: reference {uri[:80]} is under no allow-listed store (allowed: "
                f"{named}; name it with ImageRebuilder(..., stores=[PREFIX]))",
                image_hash=h,
            )
        fs, root = self._filesystem(store)
        path = f"{root}/{sha[:2]}/{sha}"
        limit = self.policy.max_bytes
        try:
            # its size first, then a ranged read of at most limit + 1 bytes: no driver's
            # read-ahead, and no object larger than the policy allows is fetched whole
            if fs.size(path) > limit:
                raise ImageRefError(
                    f"{where}: reference {uri}: over max_bytes={limit}", image_hash=h
                )
            data = fs.cat_file(path, start=0, end=limit + 1)
        except ImageRefError:
            raise
        except FileNotFoundError as exc:
            raise ImageRefError(f"{where}: reference {uri}: no such object", image_hash=h) from exc
        except Exception as exc:  # a driver's own errors: permissions, network, throttling
            raise ImageRefError(
                f"{where}: reference {uri}: the store could not be read "
                f"({type(exc).__name__}: {exc})",
                image_hash=h,
            ) from exc
        if len(data) > limit:
            raise ImageRefError(f"{where}: reference {uri}: over max_bytes={limit}", image_hash=h)
        return bytes(data)

    def _store_of(self, uri: str, sha: str) -> str | None:
        """The allow-listed store ``uri`` lies in, as exactly ``<store>/<sha[:2]>/<sha>``."""
        for store in self.stores:
            if uri == f"{store}/{sha[:2]}/{sha}":
                return store
        # the same place spelled with redundant separators or dots is not accepted:
        # a store writes one spelling, and a reader compares that one
        return None

    def _filesystem(self, store: str) -> tuple[Any, str]:
        known = self._filesystems.get(store)
        if known is None:
            fs, path = _fsspec(store, self._options)
            known = self._filesystems[store] = (fs, path.rstrip("/"))
        return known
