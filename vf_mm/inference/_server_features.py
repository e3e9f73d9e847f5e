"""The ``features`` mode of ``POST /inference/v1/generate``: images and clips the client
has already processed, checked before they reach the model.

Per item the client sends its ``mm_hash``, its placeholder range and (optionally) its
``kwargs_data`` (base64 msgpack of vLLM's ``MultiModalKwargsItem``; ``image_grid_thw``
comes as shape ``(3,)``, as vLLM sends it, or ``(1, 3)``, as a transformers processor
makes it). ``pixel_values`` are taken as the transformers processor makes them (rescaled
and normalised), which is what a vLLM server started with ``--no-mm-device-do-normalize``
takes too. Clips (Qwen-VL families) come under ``"video"`` (``pixel_values_videos``,
``video_grid_thw``, ...).

What is checked, so that nothing reaches the model that would be read wrong: every
placeholder is a run of its modality's pad token and the pads are all covered; each item
has its pixels and grid, the grid is three positive ints divisible by the merge size,
the pixel rows match the grid and the model's patch width; a clip has exactly its
family's inputs. An entry of ``None`` is resolved from the engine's ``ItemCache`` (items
earlier requests sent, keyed by hash, as vLLM does); decoded items join the cache. With
a digest in ``vf_mm_kwargs_digests`` (``VLLMBackend`` sends one with each ``null`` it
sends us) only to the item decoded from a string of that digest. An item the cache
lacks is a 400 of type ``MultiModalCacheMissError``, which that client answers by
sending the request again in full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from vf_mm.errors import VfMmError
from vf_mm.inference._mm_kwargs import sent_digest
from vf_mm.inference._server_engine import ServerEngine
from vf_mm.inference._server_errors import RequestError
from vf_mm.inference._server_models import GenerateRequestModel
from vf_mm.inference._vllm_items import DIGESTS_FIELD, MISS_ERROR_TYPE
from vf_mm.models import family_info
from vf_mm.types import MultiModalData, PlaceholderRange

__all__ = ["FeaturesReader"]


class FeaturesReader:
    """A generate request's ``features`` as ``MultiModalData``: checked against its
    ``token_ids`` and the model, items decoded by ``decode`` (vLLM's ``kwargs_data``
    codec) off the event loop or found in the engine's cache."""

    def __init__(self, engine: ServerEngine, *, decode: Callable[[str], dict[str, Any]]) -> None:
        self.engine = engine
        self.decode = decode

    async def read(self, req: GenerateRequestModel) -> MultiModalData | None:
        """The request's multi-modal data (None when it has none). Pads in ``token_ids``
        without features, features of a modality the model has no pad for, and any
        modality but images and videos are refused."""
        engine = self.engine
        features = req.features
        ids = np.asarray(req.token_ids, dtype=np.int64)
        pads = {"image": engine.image_token_id, "video": engine.video_token_id}
        sent = {m: h for m, h in features.mm_hashes.items() if h} if features is not None else {}
        other = sorted(m for m in sent if m not in pads)
        if other:
            raise RequestError(
                f"modality {other[0]!r} is not supported by vf-mm serve (images and videos only)",
                param="features",
            )
        data = MultiModalData()
        for modality, pad in pads.items():
            if modality not in sent:
                if pad is not None and (n := int((ids == pad).sum())):
                    raise RequestError(
                        f"token_ids hold {n} {modality} pad tokens ({pad}) but the request has "
                        f"no features describing their {modality}s",
                        param="features",
                    )
                continue
            if pad is None:
                raise RequestError(
                    f"the model {engine.model_name} takes no {modality}s, but the request has "
                    f"{modality} features",
                    param="features",
                )
            assert features is not None
            claimed = (req.vf_mm_kwargs_digests or {}).get(modality)
            part = await self._modality(features, modality, pad, ids, claimed)
            data.mm_hashes[modality] = part.mm_hashes[modality]
            data.mm_placeholders[modality] = part.mm_placeholders[modality]
            data.mm_items[modality] = part.mm_items[modality]
        return data if data.modalities else None

    async def _modality(
        self,
        features: Any,
        modality: str,
        pad: int,
        ids: np.ndarray,
        claimed: list[str | None] | None = None,
    ) -> MultiModalData:
        """One modality's features checked (every placeholder a run of its pad tokens, the
        grids' token counts) and its items decoded or found in the cache."""
        cache, merge_size = self.engine.cache, self.engine.merge_size
        hashes = features.mm_hashes[modality]
        ranges = features.mm_placeholders.get(modality, [])
        if len(ranges) != len(hashes):
            raise RequestError(
                f"features has {len(hashes)} {modality} hashes but {len(ranges)} placeholders",
                param="features.mm_placeholders",
            )
        for i, p in enumerate(ranges):
            span = ids[p.offset : p.offset + p.length]
            if not bool((span == pad).all()):
                bad = p.offset + int(np.argmax(span != pad))
                raise RequestError(
                    f"features.mm_placeholders.{modality}[{i}] (offset {p.offset}, length "
                    f"{p.length}) must cover {modality} pad tokens ({pad}) only, but "
                    f"token_ids[{bad}] is {int(ids[bad])}",
                    param="features.mm_placeholders",
                )
        total = int((ids == pad).sum())
        covered = sum(p.length for p in ranges)
        if total != covered:
            raise RequestError(
                f"token_ids hold {total} {modality} pad tokens ({pad}) but mm_placeholders "
                f"cover {covered}",
                param="features.mm_placeholders",
            )
        data = (features.kwargs_data or {}).get(modality) or [None] * len(hashes)
        if claimed is not None and len(claimed) != len(hashes):
            raise RequestError(
                f"{DIGESTS_FIELD}.{modality} has {len(claimed)} entries for {len(hashes)} "
                f"{modality} hashes",
                param=DIGESTS_FIELD,
            )

        digests: dict[int, str] = {}

        def decode_all() -> dict[int, dict[str, Any]]:
            out: dict[int, dict[str, Any]] = {}
            for i, b64 in enumerate(data):
                if b64 is None:
                    continue
                if isinstance(b64, str):  # the same string again: the item decoded then
                    digests[i] = sent_digest(b64)
                    cached = cache.get((modality, hashes[i]), digests[i])
                    if cached is not None:
                        out[i] = cached
                        continue
                where = f"kwargs_data.{modality}[{i}]"
                try:
                    out[i] = self._check_item(self.decode(b64), where, modality)
                except RequestError:
                    raise
                except (VfMmError, ValueError, TypeError) as exc:
                    raise RequestError(
                        f"features.{where}: {exc}", param="features.kwargs_data"
                    ) from None
            return out

        decoded = await run_in_threadpool(decode_all) if any(d is not None for d in data) else {}
        items: list[dict[str, Any]] = []
        # the first item of each hash in this request, and the digest it was decoded from
        seen: dict[str, tuple[dict[str, Any], str | None]] = {}
        grid_key = f"{modality}_grid_thw"
        for i, h in enumerate(hashes):
            item = decoded.get(i)
            digest = digests.get(i)
            if item is None:
                digest = claimed[i] if claimed is not None else None
                first = seen.get(h)
                if first is not None and (digest is None or first[1] == digest):
                    item = first[0]
                else:
                    item = cache.get((modality, h), digest)
                if item is None:
                    which = "" if digest is None else f" (as sent with digest {digest})"
                    raise RequestError(
                        f"features.mm_hashes.{modality}[{i}] = {h!r}{which} is not in the "
                        "server's multi-modal cache: send its kwargs_data",
                        err_type=MISS_ERROR_TYPE,
                        param="features.kwargs_data",
                    )
            seen.setdefault(h, (item, digest))
            tokens = int(np.prod(item[grid_key])) // merge_size**2
            if tokens != ranges[i].length:
                grid = [int(x) for x in np.asarray(item[grid_key]).reshape(-1)]
                raise RequestError(
                    f"{modality} {i} ({h!r}): its placeholder has length {ranges[i].length} but "
                    f"its {grid_key} {grid} makes prod(grid) / merge_size^2 = {tokens} tokens",
                    param="features.mm_placeholders",
                )
            items.append(item)
        for i, item in decoded.items():
            cache.put((modality, hashes[i]), item, digests.get(i))
        return MultiModalData(
            mm_hashes={modality: list(hashes)},
            mm_placeholders={modality: [PlaceholderRange(p.offset, p.length) for p in ranges]},
            mm_items={modality: items},
        )

    def _check_item(
        self, item: dict[str, Any], where: str, modality: str = "image"
    ) -> dict[str, Any]:
        """One decoded item checked against the model; its pixels float32, its grid
        ``(1, 3)`` int64 (the shapes the local engine takes)."""
        engine = self.engine

        def bad(message: str) -> RequestError:
            return RequestError(f"features.{where}: {message}", param="features.kwargs_data")

        pixels_key = "pixel_values" if modality == "image" else "pixel_values_videos"
        grid_key = f"{modality}_grid_thw"
        missing = [k for k in (pixels_key, grid_key) if k not in item]
        if missing:
            raise bad(f"no {' or '.join(missing)} (got {', '.join(sorted(item)) or 'nothing'})")
        grid = np.asarray(item[grid_key])
        if grid.shape not in ((1, 3), (3,)) or grid.dtype.kind not in "iu" or (grid <= 0).any():
            raise bad(f"{grid_key} must be 3 positive ints, got {grid.tolist()}")
        grid = grid.astype(np.int64).reshape(1, 3)
        pv = np.asarray(item[pixels_key])
        if pv.ndim != 2 or not (pv.dtype.kind == "f" or pv.dtype.name == "bfloat16"):
            raise bad(f"{pixels_key} must be a 2-D float array, got {pv.dtype} {pv.shape}")
        rows = int(np.prod(grid))
        if pv.shape[0] != rows:
            raise bad(
                f"{pixels_key} has {pv.shape[0]} rows but {grid_key} "
                f"{grid[0].tolist()} needs {rows}"
            )
        if engine.patch_dim is not None and pv.shape[1] != engine.patch_dim:
            raise bad(
                f"{pixels_key} rows have {pv.shape[1]} values; the model takes {engine.patch_dim}"
            )
        merge_size = engine.merge_size
        if grid[0, 1] % merge_size or grid[0, 2] % merge_size:
            raise bad(f"{grid_key} {grid[0].tolist()} is not a multiple of merge_size {merge_size}")
        if pv.dtype != np.float32:
            pv = pv.astype(np.float32)
            pv.flags.writeable = False
        out = dict(item)
        out[pixels_key] = pv
        out[grid_key] = grid
        if "second_per_grid_ts" in out:
            seconds = np.asarray(out["second_per_grid_ts"])
            if (
                seconds.size != 1
                or seconds.dtype.kind != "f"
                or not np.isfinite(seconds).all()
                or (seconds <= 0).any()
            ):
                raise bad(
                    "second_per_grid_ts must be one finite positive float, got "
                    f"{seconds.dtype} {seconds.tolist()}"
                )
            out["second_per_grid_ts"] = seconds.astype(np.float32).reshape(1)
        if modality == "video" and engine.family is not None:
            expected = set(family_info(engine.family).video_inputs)
            if set(out) != expected:
                raise bad(f"a {engine.family} video takes {sorted(expected)}, got {sorted(out)}")
        return out
