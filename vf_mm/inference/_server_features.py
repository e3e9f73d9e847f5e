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
placeholder is a run of its modality's pad token (for a family whose image span holds
markers between its pads, ``ItemChecker.sparse``: Gemma 3 and 4, SmolVLM, InternVL, a
range that holds pads, its other positions then taking no embedding) and the pads are
all covered; each item passes its family's ``ItemChecker`` (its inputs, dtypes and
shapes the processor's, Qwen-VL's grids consistent with their patch rows and merge
size, LLaVA's tiles with their ``image_sizes``, ...), and the embeddings the model
fills from it equal the pads of its placeholder. An entry of ``None`` is resolved from
the engine's ``ItemCache`` (items earlier requests sent, keyed by hash, as vLLM does);
decoded items join the cache. With a digest in ``vf_mm_kwargs_digests`` (``VLLMBackend``
sends one with each ``null`` it sends us) only to the item decoded from a string of that
digest. An item the cache lacks is a 400 of type ``MultiModalCacheMissError``, which that client answers by
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
        # the positions each sent modality's placeholders span: a pad shared by images and
        # clips (GLM-4.6V's frames hold the image token) is counted by the span it sits in
        spans = {m: np.zeros(len(ids), dtype=bool) for m in pads}
        for m in sent:
            for p in features.mm_placeholders.get(m, []) if features is not None else []:
                spans[m][max(0, p.offset) : p.offset + p.length] = True
        data = MultiModalData()
        for modality, pad in pads.items():
            foreign = np.zeros(len(ids), dtype=bool)
            for name, mask in spans.items():
                if name != modality and pads[name] == pad:
                    foreign |= mask
            if modality not in sent:
                if pad is not None and (n := int(((ids == pad) & ~foreign).sum())):
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
            part = await self._modality(features, modality, pad, ids, claimed, foreign)
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
        foreign: np.ndarray | None = None,
    ) -> MultiModalData:
        """One modality's features checked (every placeholder a run of its pad tokens, the
        grids' token counts) and its items decoded or found in the cache. ``foreign``: the
        positions of another modality's placeholders holding the same pad, not counted."""
        engine = self.engine
        cache, checker = engine.cache, engine.items
        if checker is None:
            raise RequestError(
                f"this server was started without {engine.model_name}'s renderer, so it "
                f"cannot check processed {modality}s: send none, or start it with one",
                param="features",
            )
        if modality == "video" and not checker.takes_video:
            raise RequestError(
                f"{checker.label}'s processed clips are not checked, so vf-mm serve does not "
                "take them as features: send the clips as content_parts (the server processes "
                "them)",
                param="features",
            )
        hashes = features.mm_hashes[modality]
        ranges = features.mm_placeholders.get(modality, [])
        if len(ranges) != len(hashes):
            raise RequestError(
                f"features has {len(hashes)} {modality} hashes but {len(ranges)} placeholders",
                param="features.mm_placeholders",
            )
        embeds: list[np.ndarray] = []  # per range: which positions take an embedding
        for i, p in enumerate(ranges):
            span = ids[p.offset : p.offset + p.length] == pad
            where = f"features.mm_placeholders.{modality}[{i}] (offset {p.offset}, length {p.length})"  # fmt: skip
            if checker.sparse and not span.any():
                raise RequestError(
                    f"{where} holds no {modality} pad token ({pad})",
                    param="features.mm_placeholders",
                )
            if not checker.sparse and not bool(span.all()):
                bad = p.offset + int(np.argmax(~span))
                raise RequestError(
                    f"{where} must cover {modality} pad tokens ({pad}) only, but "
                    f"token_ids[{bad}] is {int(ids[bad])}",
                    param="features.mm_placeholders",
                )
            embeds.append(span)
        pads_here = ids == pad if foreign is None else (ids == pad) & ~foreign
        total = int(pads_here.sum())
        covered = sum(int(span.sum()) for span in embeds)
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
            tokens = checker.embeds(item, modality=modality)
            pads = int(embeds[i].sum())
            if tokens != pads:
                raise RequestError(
                    f"{modality} {i} ({h!r}): its placeholder holds {pads} {modality} pad "
                    f"tokens but its inputs make {tokens} embeddings "
                    f"({checker.describe(item, modality=modality)})",
                    param="features.mm_placeholders",
                )
            items.append(item)
        for i, item in decoded.items():
            cache.put((modality, hashes[i]), item, digests.get(i))
        return MultiModalData(
            mm_hashes={modality: list(hashes)},
            mm_placeholders={
                modality: [
                    PlaceholderRange(p.offset, p.length, tuple(span.tolist()))
                    for p, span in zip(ranges, embeds, strict=True)
                ]
            },
            mm_items={modality: items},
        )

    def _check_item(
        self, item: dict[str, Any], where: str, modality: str = "image"
    ) -> dict[str, Any]:
        """One decoded item checked by the family's ``ItemChecker``: its inputs as the
        local engine takes them, or a 400 naming the item and the field."""
        checker = self.engine.items
        assert checker is not None  # _modality refuses items without one
        try:
            return checker.check(item, modality=modality)
        except (VfMmError, ValueError, TypeError) as exc:
            raise RequestError(f"features.{where}: {exc}", param="features.kwargs_data") from None
