"""Images on the trainer wire as encoded bytes or shared-store references, rebuilt
bit-exactly on the trainer side.

A group frame carries each distinct image in one of three **image modes**
(``IMAGE_MODES``; ``pack_group(..., images=...)``):

- ``"tensors"``: the renderer's model inputs (``pixel_values``, ...) as tensors: the
  ``vf_mm.group/1`` frame, unchanged.
- ``"encoded"``: the image's encoded bytes, once per group: the bytes as received when
  the source was encoded (bytes, a ``data:`` URL, a file), else a lossless PNG of the
  decoded RGB image (a PIL image or an array). A 1280x720 photo is ~22.5 MB of Qwen2.5-VL
  ``pixel_values`` and a few hundred KB as JPEG.
- ``"ref"``: a URI under a store the operator names (``ImageStore``: a directory on a
  filesystem the trainer shares, or an object store's prefix) and the sha256 of its
  bytes; the bytes are written there once, named by their sha256 (``_store.py``).

**Exactness** is the requirement: the trainer must compute exactly the tensors the
sampler trained its logprobs on. The frame ships the *original bytes* (smaller than
pixels for photos) and everything the rebuild depends on, and the rebuild is checked:
the bytes go through ``vf_mm.images.load_image`` (the decode rules the renderer applied:
EXIF orientation, alpha onto white, palette, grey), the trainer's own processor
(``ImageProcessing``: the family's ``vf_mm.models.expand_image`` with the processor's call
options) makes the model inputs, and they must hash (``inputs_hash``: keys, dtypes,
shapes, bytes) to what the sampler's renderer made, recorded per image in the frame.
That one check covers decoding and processing both: equal inputs are what training
needs. Only when it fails are the decoded pixels hashed (``image_hash`` against the
image's ``mm_hash``) to say which stage differs: the bytes (corrupt, another decoder)
or the processing. The sampler's side hashed its pixels anyway; the trainer's happy path
does not pay for a second hash.

Any mismatch is a typed error for that group (``ProcessingMismatchError``, naming which
of ``config``, ``backend`` and ``versions`` differ between the frame's recorded
``processing`` and the trainer's; ``ImageRefError`` for bytes that are missing, corrupt,
or decode to other pixels), never silent drift (the train/inference mismatch class of
prime-rl #2786). A recorded config or backend that differs from the trainer's is refused
before any image is processed: it is drift whatever this group's images happen to give.
Library versions that differ are allowed while every rebuilt hash matches (a patch
release of numpy rarely changes pixels, and the hash proves it did not here);
``ImageRebuilder.version_differences`` records them.

The trainer side is ``ImageRebuilder``: it decodes and processes a group's images in a
thread pool (the image processors release the GIL in their C loops), caches rebuilt
inputs by their hash (bounded in bytes: an image shown in many groups is processed
once), and ``submit(frame)`` unpacks a whole group off the caller's thread, so a receive
loop can take the next frame while the last one is rebuilt. Its ``on_missing`` policy
decides what an unusable image does: ``"fail"`` (the default) fails the group;
``"skip"`` returns the rollouts that show it with ``error`` set and no steps (nothing is
trained on them) and records it in ``failures``.

Reading a reference goes through the guard (``_store.py``): ``file://`` only under the
rebuilder's roots (``ImageRebuilder(..., roots=[store])``), other stores (fsspec URLs:
``s3://``, ``gs://``) only under prefixes allow-listed with ``stores=[...]``, so a frame
cannot make the trainer read anything it names.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from vf_mm.errors import (
    ImageError,
    ImageRebuildError,
    ImageRefError,
    ProcessingMismatchError,
)
from vf_mm.images import ImagePolicy, image_hash, load_image
from vf_mm.training._store import StoreReader

__all__ = [
    "IMAGE_MODES",
    "ImageProcessing",
    "ImageRebuilder",
    "RebuildFailure",
    "inputs_hash",
]

#: How a group frame carries its images (``pack_group(..., images=...)``).
IMAGE_MODES = ("tensors", "encoded", "ref")
#: What an unusable image does on the trainer side.
ON_MISSING = ("fail", "skip")
_INPUTS_PREFIX = b"vf_mm.inputs.v1\0"
_DEFAULT_CACHE_BYTES = 1 << 30


def inputs_hash(item: Mapping[str, Any]) -> str:
    """32 hex characters: XXH3-128 of one image's model inputs.

    Each key in sorted order with its array's dtype, shape and raw bytes. Equal exactly
    when the tensors are bit for bit equal (NaNs by their bits), so it proves a rebuild.

    XXH3 rather than sha256: a 1280x720 image's Qwen2.5-VL inputs are 22.5 MB, which
    sha256 takes ~22 ms to hash here (a third of processing the image) and XXH3 ~2 ms. The
    hash detects drift between a trusted sampler and its trainer, not forgery: a party that
    can send the trainer groups can send it any tensors anyway (the hop is authenticated:
    CURVE).

    Args:
        item: One image's model inputs.
    """
    import xxhash

    digest = xxhash.xxh3_128(_INPUTS_PREFIX)
    for key in sorted(item):
        array = _as_numpy(item[key])
        header = f"{key}\0{array.dtype.str}\0{','.join(map(str, array.shape))}\0"
        digest.update(header.encode())
        digest.update(np.ascontiguousarray(array).data.cast("B"))
    return digest.hexdigest()[:32]


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


class ImageProcessing:
    """One image processing: the family's processor, its call options, its description.

    The description a group frame records (``description``: ``classes`` and ``config``, the
    image processor's configuration and call options; ``backend``, ``"pil"`` or
    ``"torchvision"``; ``versions`` of the libraries that decode and process). The sampler
    records it; the trainer rebuilds with its own and compares.

    Build it the way the renderer was built: ``from_checkpoint(path, image_backend=...)``
    (what ``load_renderer(path, image_backend=...)`` uses), ``from_vision(vision)`` (a
    renderer's ``VisionSpec``: the very processor it uses), or ``from_processor``.

    Args:
        processor: The family's HF processor.
        options: Processor call options (``processor_kwargs``).
    """

    def __init__(self, processor: Any, *, options: Mapping[str, Any] | None = None) -> None:
        from vf_mm.models import image_backend_of
        from vf_mm.models._internal import image_kwargs

        self.processor = processor
        self.options = dict(options or {})
        self.kwargs = image_kwargs(processor, self.options)
        self.backend: str = image_backend_of(processor.image_processor)
        self.description = _describe(processor, self.kwargs, self.options, self.backend)

    @classmethod
    def from_processor(
        cls, processor: Any, *, options: Mapping[str, Any] | None = None
    ) -> ImageProcessing:
        """The processing of a loaded HF processor.

        Args:
            processor: The processor.
            options: Processor call options.
        """
        return cls(processor, options=options)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        image_backend: str = "auto",
        options: Mapping[str, Any] | None = None,
    ) -> ImageProcessing:
        """The processing of a checkpoint directory, as ``load_renderer`` builds it.

        Args:
            path: The checkpoint directory.
            image_backend: ``"auto"``, ``"pil"``, ``"torchvision"`` or ``"torch"``, as the
                renderer's.
            options: Processor call options, as the renderer's.
        """
        from vf_mm.models import load_processor

        return cls(load_processor(os.fspath(path), image_backend=image_backend), options=options)

    @classmethod
    def from_vision(cls, vision: Any) -> ImageProcessing:
        """The processing of a renderer's ``VisionSpec``: the very processor it uses.

        Args:
            vision: ``renderer.vision`` or ``RendererClient.vision``.
        """
        return cls(vision.processor, options=vision.options)

    def process(self, image: Any) -> dict[str, np.ndarray]:
        """One decoded RGB image's model inputs, as the renderer computes them.

        Args:
            image: A decoded RGB image.
        """
        from vf_mm.models import expand_image

        _, item = expand_image(self.processor, image, kwargs=self.kwargs)
        return item

    def differences(self, recorded: Mapping[str, Any]) -> dict[str, str]:
        """What differs between a frame's recorded description and this one, by part.

        Args:
            recorded: The frame's recorded description.

        Returns:
            ``{"config" | "backend" | "versions": a short account}`` for each part that
                differs.
        """
        return _differences(recorded, self.description)


def _versions() -> dict[str, str | None]:
    """The versions of what decodes and processes an image (a different one may compute
    other pixels): transformers, Pillow and its codecs, numpy, torch, torchvision."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("transformers", "pillow", "numpy", "torch", "torchvision"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        from PIL import features

        for codec in ("jpg", "zlib", "webp"):
            out[f"pil.{codec}"] = features.version(codec)
    except Exception:  # an old Pillow without features.version: the Pillow version stands
        pass
    return out


def _describe(processor: Any, kwargs: Any, options: Any, backend: str) -> dict[str, Any]:
    image_processor = processor.image_processor
    try:
        config = image_processor.to_dict()
    except Exception:  # a processor without to_dict: its public attributes
        config = {k: v for k, v in vars(image_processor).items() if not k.startswith("_")}
    return {
        # vf_mm's torch-only port of a torchvision processor is recorded as the class whose
        # numbers it computes (``torchvision_class``): a trainer without torchvision then
        # rebuilds a torchvision sampler's images, the hashes proving them equal
        "classes": [
            type(processor).__name__,
            getattr(image_processor, "torchvision_class", type(image_processor).__name__),
        ],
        "config": _plain({"image_processor": config, "kwargs": kwargs, "options": options}),
        "backend": backend,
        "versions": _versions(),
    }


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it (what travels in the frame and is compared)."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _differences(recorded: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    config_a = {"classes": recorded.get("classes"), **dict(recorded.get("config") or {})}
    config_b = {"classes": ours.get("classes"), **dict(ours.get("config") or {})}
    if _plain(config_a) != _plain(config_b):
        out["config"] = _diff_text(_flatten(_plain(config_a)), _flatten(_plain(config_b)))
    if recorded.get("backend") != ours.get("backend"):
        out["backend"] = f"sampler {recorded.get('backend')!r}, trainer {ours.get('backend')!r}"
    versions_a = dict(recorded.get("versions") or {})
    versions_b = dict(ours.get("versions") or {})
    if versions_a != versions_b:
        out["versions"] = _diff_text(versions_a, versions_b)
    return out


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _diff_text(a: Mapping[str, Any], b: Mapping[str, Any], limit: int = 4) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    shown = [f"{k}: sampler {a.get(k)!r}, trainer {b.get(k)!r}" for k in keys[:limit]]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return "; ".join(shown) + more


class RebuildFailure:
    """One image the rebuilder could not use: its group, hash, and the error.

    Args:
        group_id: The group's id (kept as ``group_id``).
        image_hash: The image's hash.
        error: Why it could not be used.
        skipped: How many rollouts were skipped for it (kept as ``skipped_rollouts``).
    """

    __slots__ = ("error", "group_id", "image_hash", "skipped_rollouts")

    def __init__(self, group_id: Any, image_hash: str, error: Exception, skipped: int) -> None:
        self.group_id = group_id
        self.image_hash = image_hash
        self.error = error
        self.skipped_rollouts = skipped

    def __repr__(self) -> str:
        return (
            f"RebuildFailure(group={self.group_id!r}, image={self.image_hash}, "
            f"{type(self.error).__name__}: {self.error})"
        )


class ImageRebuilder:
    """The trainer side of ``encoded`` and ``ref`` frames.

    It rebuilds each image's model inputs with ``processing``, checks them against the
    frame's hashes, caches them by hash. ``unpack_group(frame, images=rebuilder)`` uses
    it; ``submit(frame)`` unpacks on the rebuilder's own thread (a ``Future`` of the
    rollouts). Counters: ``rebuilt``, ``cache_hits``, ``rebuild_s`` (time in decode +
    process + hash), ``failures`` (the newest 1000), ``version_differences`` (the first
    seen, when library versions differ from the sampler's and every hash still matched).
    Close it (or use ``with``).

    Args:
        processing: The trainer's ``ImageProcessing``: load it as the sampler loaded its
            renderer.
        policy: The image guard that reads the bytes.
        roots: The ``ImageStore`` directories: they confine ``file://`` references. The
            default reads no local file, so a ``ref`` frame fails until roots are named.
        stores: The network stores (fsspec URL prefixes, ``s3://bucket/images``) whose
            references may be read; none by default.
        storage_options: Passed to fsspec for ``stores``.
        on_missing: ``"fail"`` (a group with an unusable image raises its
            ``ImageRefError``) or ``"skip"`` (its rollouts that show the image come back
            with ``error`` set and no steps; ``failures`` records it). A processing mismatch
            always fails the group: it is systematic, skipping would drop every group
            silently.
        workers: Threads that decode and process.
        cache_bytes: The cache's bound.
    """

    def __init__(
        self,
        processing: ImageProcessing,
        *,
        policy: ImagePolicy | None = None,
        roots: Iterable[str | os.PathLike[str]] | None = None,
        stores: Iterable[str] = (),
        storage_options: Mapping[str, Any] | None = None,
        on_missing: str = "fail",
        workers: int = 4,
        cache_bytes: int = _DEFAULT_CACHE_BYTES,
    ) -> None:
        if on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {list(ON_MISSING)}, not {on_missing!r}")
        if policy is not None and roots is not None:
            raise ValueError("pass policy or roots, not both (roots go in the policy)")
        if policy is None:
            policy = ImagePolicy.dataset(roots=() if roots is None else roots)
        self.processing = processing
        self.policy = policy
        self._reader = StoreReader(policy, stores=stores, storage_options=storage_options)
        self.on_missing = on_missing
        self.cache_bytes = int(cache_bytes)
        self._pool = ThreadPoolExecutor(max(1, int(workers)), thread_name_prefix="vf-mm-rebuild")
        self._groups = ThreadPoolExecutor(1, thread_name_prefix="vf-mm-unpack")
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._cached_bytes = 0
        self._inflight: dict[str, Future[dict[str, np.ndarray]]] = {}
        self.rebuilt = 0
        self.cache_hits = 0
        self.rebuild_s = 0.0
        self.failures: deque[RebuildFailure] = deque(maxlen=1000)
        self.version_differences: str | None = None

    # -- public ---------------------------------------------------------------------

    def submit(self, frame: Mapping[str, Any]) -> Future[Any]:
        """``unpack_group(frame, images=self)`` on the rebuilder's thread.

        Args:
            frame: The decoded group frame.

        Returns:
            A ``Future`` of the rollouts (or of the group's error).
        """
        from vf_mm.training._groups import unpack_group

        return self._groups.submit(unpack_group, frame, images=self)

    def close(self) -> None:
        self._groups.shutdown(wait=True)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ImageRebuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what unpack_group calls ------------------------------------------------------

    def rebuild(
        self, mode: str, processing: Mapping[str, Any], sources: Mapping[str, Any], where: str
    ) -> tuple[dict[str, Any], dict[str, ImageRebuildError]]:
        """Every source's model inputs, ``{hash: item}``, and the unusable images' errors.

        The second map is ``{hash: error}``.

        Args:
            mode: The frame's image mode (``"encoded"`` or ``"ref"``).
            processing: The frame's recorded processing description.
            sources: The frame's image sources, by hash.
            where: The group, for errors.

        Raises:
            ProcessingMismatchError: A recorded config or backend that is not ours, before any
                image is read.
            ImageRefError: An image that cannot be used, under ``on_missing="fail"`` (the
                first such error; under ``"skip"`` they are returned instead).
        """
        differs = self.processing.differences(processing)
        fatal = [part for part in ("config", "backend") if part in differs]
        if fatal:
            raise ProcessingMismatchError(
                f"{where}: the group's images were processed with another "
                + " and ".join(fatal)
                + " than this trainer's ("
                + "; ".join(f"{part}: {differs[part]}" for part in fatal)
                + "): its tensors cannot be rebuilt exactly",
                differs=tuple(differs),
            )
        futures = {
            h: self._item(h, entry, mode, differs, f"{where}, image {h}")
            for h, entry in sources.items()
        }
        items: dict[str, Any] = {}
        failed: dict[str, ImageRebuildError] = {}
        for h, future in futures.items():
            try:
                items[h] = future.result()
            except ImageRefError as exc:
                if self.on_missing == "fail":
                    raise
                failed[h] = exc
        return items, failed

    def record_failure(self, group_id: Any, h: str, error: Exception, skipped: int) -> None:
        """Record an image that could not be used (kept in ``failures``).

        Args:
            group_id: The group's id.
            h: The image's hash.
            error: Why it could not be used.
            skipped: How many rollouts were skipped for it.
        """
        with self._lock:
            self.failures.append(RebuildFailure(group_id, h, error, skipped))

    # -- one image --------------------------------------------------------------------

    def _item(
        self, h: str, entry: Any, mode: str, differs: Mapping[str, str], where: str
    ) -> Future[dict[str, np.ndarray]]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("inputs"), str):
            raise ImageRebuildError(f"{where}: a source entry must be a map with 'inputs'")
        key = entry["inputs"]
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                done: Future[dict[str, np.ndarray]] = Future()
                done.set_result(cached)
                return done
            running = self._inflight.get(key)
            if running is not None:
                self.cache_hits += 1
                return running
            future = self._pool.submit(self._run, key, h, entry, mode, differs, where)
            self._inflight[key] = future
        return future

    def _run(
        self, key: str, h: str, entry: Mapping[str, Any], mode: str, differs: Any, where: str
    ) -> dict[str, np.ndarray]:
        """``_compute``, then the cache updated and the in-flight entry dropped *before*
        the future completes (a caller woken by a failure must not find it in flight)."""
        item = None
        try:
            item = self._compute(h, entry, mode, differs, where)
            return item
        finally:
            with self._lock:
                self._inflight.pop(key, None)
                if item is not None:
                    self._remember(key, item)

    def _remember(self, key: str, item: dict[str, np.ndarray]) -> None:
        """Cache ``item`` (the lock held), evicting the least recently used past the bound."""
        size = sum(int(a.nbytes) for a in item.values())
        if size > self.cache_bytes:
            return
        self._cache[key] = item
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= sum(int(a.nbytes) for a in old.values())

    def _compute(
        self, h: str, entry: Mapping[str, Any], mode: str, differs: Mapping[str, str], where: str
    ) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        data = self._bytes(entry, mode, where, h)
        try:
            image = load_image(data, policy=self.policy, where=where)
        except ImageError as exc:
            raise ImageRefError(f"{where}: the image does not decode: {exc}", image_hash=h) from exc
        try:
            item = self.processing.process(image)
        except Exception as exc:
            wrong = self._other_pixels(image, h, differs, where)
            if wrong is not None:  # not the sampler's image: the bytes, not the processor
                raise wrong from exc
            raise ImageRebuildError(
                f"{where}: the image processor failed: {exc}", image_hash=h
            ) from exc
        got = inputs_hash(item)
        if got != entry["inputs"]:
            raise self._mismatch(image, h, got, entry["inputs"], differs, where)
        for array in item.values():
            array.flags.writeable = False
        with self._lock:
            self.rebuilt += 1
            self.rebuild_s += time.perf_counter() - start
            if "versions" in differs and self.version_differences is None:
                self.version_differences = differs["versions"]
        return item

    @staticmethod
    def _mismatch(
        image: Any, h: str, got: str, want: str, differs: Mapping[str, str], where: str
    ) -> ImageRebuildError:
        """Why the rebuilt inputs differ: the decoded pixels are not the sampler's (the
        bytes are corrupt or another image, or another decoder read them), or the same
        pixels were processed differently."""
        wrong = ImageRebuilder._other_pixels(image, h, differs, where)
        if wrong is not None:
            return wrong
        named = ", ".join(f"{part} ({text})" for part, text in differs.items())
        return ProcessingMismatchError(
            f"{where}: the rebuilt model inputs differ from the sampler's (inputs hash "
            f"{got} != {want}); "
            + (
                f"what differs: {named}"
                if differs
                else "config, backend and versions all match (nondeterministic processing?)"
            ),
            differs=tuple(differs),
            image_hash=h,
        )

    @staticmethod
    def _other_pixels(
        image: Any, h: str, differs: Mapping[str, str], where: str
    ) -> ImageRebuildError | None:
        """The error for decoded pixels that are not the image ``h`` the sampler decoded
        (None when they are): another decoder's (``versions`` differ), or bytes that are
        corrupt or another image's."""
        if image_hash(image) == h:
            return None
        if "versions" in differs:
            return ProcessingMismatchError(
                f"{where}: the bytes decode to other pixels than the sampler's "
                f"(versions differ: {differs['versions']})",
                differs=("versions",),
                image_hash=h,
            )
        return ImageRefError(
            f"{where}: the bytes decode to other pixels than the sampler decoded "
            "(corrupt, or not this image)",
            image_hash=h,
        )

    def _bytes(self, entry: Mapping[str, Any], mode: str, where: str, h: str) -> bytes:
        """The image's encoded bytes: in the frame (``encoded``), or read through the
        guard from its reference and checked against its sha256 (``ref``)."""
        if mode == "encoded":
            data = entry.get("data")
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ImageRefError(
                    f"{where}: an encoded image needs its 'data' bytes", image_hash=h
                )
            return data if isinstance(data, bytes) else bytes(data)
        return self._reader.read(entry.get("uri"), entry.get("sha256"), where, h)
