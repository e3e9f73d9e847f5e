"""``POST /inference/v1/generate``: vLLM's token-in/token-out route."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vf_mm.errors import ImageError, VfMmError
from vf_mm.images import load_image
from vf_mm.inference._server._base import _clamp, _inner, _ServerBase
from vf_mm.inference._server._errors import _RequestError
from vf_mm.inference._server._models import _UNSUPPORTED_SAMPLING, GenerateRequestModel
from vf_mm.inference._types import GenerateRequest, SamplingParams
from vf_mm.types import MultiModalData, PlaceholderRange


def _decode_item(b64: str) -> dict[str, Any]:
    from vf_mm.inference import _mm_kwargs  # lazy: only image requests need it

    return _mm_kwargs.decode_kwargs_item(b64)


class _GenerateRoutes(_ServerBase):
    # -- POST /inference/v1/generate -----------------------------------------------------

    async def generate(self, request: Request) -> Response:
        req: GenerateRequestModel = await self._body(request, GenerateRequestModel)
        self._check_model(req.model)
        self._check_supported(req)
        self._check_tokens(req.token_ids)
        sp = req.sampling_params
        self._check_tokens(sp.stop_token_ids or [], "sampling_params.stop_token_ids")
        token_ids = req.token_ids
        if req.content_parts:
            token_ids, mm = await run_in_threadpool(
                self._expand_content_parts, req.token_ids, req.content_parts
            )
            # processed images serve later hash-only (features) requests too, as in vLLM
            for h, item in zip(mm.mm_hashes["image"], mm.mm_items["image"], strict=True):
                self.cache.put(("image", h), item)
        else:
            mm = await self._multi_modal_data(req)
        sampling = SamplingParams(
            max_tokens=self._max_tokens(sp.max_tokens, len(token_ids)),
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=max(sp.top_k, 0),
            min_p=sp.min_p,
            seed=sp.seed,
            stop_token_ids=tuple(sp.stop_token_ids or ()),
            logprobs=sp.logprobs is not None,
        )
        result = await self._generate(
            GenerateRequest(
                prompt_ids=token_ids,
                sampling=sampling,
                multi_modal_data=mm,
                request_id=req.request_id,
            )
        )
        logprobs = None
        if sp.logprobs is not None and result.logprobs is not None:
            logprobs = {
                "content": [
                    _token_logprob(t, lp)
                    for t, lp in zip(result.completion_ids, result.logprobs, strict=True)
                ]
            }
        prompt_tokens = result.usage.prompt_tokens or len(token_ids)
        completion_tokens = len(result.completion_ids)
        body: dict[str, Any] = {
            "request_id": f"generate-tokens-{req.request_id}",
            "model": self.model_name,
            "created": int(time.time()),
            "output_mode": "tokens",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": result.finish_reason,
                    "stop_reason": result.stop_reason,
                    "token_ids": list(result.completion_ids),
                    "logprobs": logprobs,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = list(token_ids)
            body["mm_placeholders"] = (
                {
                    m: [{"offset": p.offset, "length": p.length} for p in ranges]
                    for m, ranges in mm.mm_placeholders.items()
                }
                if mm is not None
                else None
            )
        return JSONResponse(body)

    def _check_supported(self, req: GenerateRequestModel) -> None:
        def refuse(what: str, param: str) -> None:
            raise _RequestError(f"{what} is not supported by vf-mm serve", param=param)

        if req.stream:
            refuse("stream=true (streaming)", "stream")
        if req.output_mode != "tokens":
            refuse(f"output_mode={req.output_mode!r}", "output_mode")
        if req.priority != 0:
            raise _RequestError(
                f"Got priority {req.priority} but Priority scheduling is not enabled.",
                param="priority",
            )
        if req.kv_transfer_params:
            refuse("kv_transfer_params", "kv_transfer_params")
        if req.ec_transfer_params:
            refuse("ec_transfer_params", "ec_transfer_params")
        sp = req.sampling_params
        if sp.n != 1:
            refuse(f"sampling_params.n={sp.n} (only 1; send n requests)", "n")
        if sp.logprobs == -1:
            refuse("sampling_params.logprobs=-1 (the whole vocabulary)", "logprobs")
        for name, value in (sp.model_extra or {}).items():
            defaults = _UNSUPPORTED_SAMPLING.get(name)
            if defaults is not None and not any(
                value == d and type(value) is type(d) for d in defaults
            ):
                refuse(f"sampling_params.{name}={value!r}", name)

    async def _multi_modal_data(self, req: GenerateRequestModel) -> MultiModalData | None:
        features = req.features
        pad = self.image_token_id
        ids = np.asarray(req.token_ids, dtype=np.int64)
        if features is None or not any(features.mm_hashes.values()):
            if pad is not None and (n := int((ids == pad).sum())):
                raise _RequestError(
                    f"token_ids hold {n} image pad tokens ({pad}) but the request has no "
                    "features describing their images",
                    param="features",
                )
            return None
        other = sorted(m for m, h in features.mm_hashes.items() if h and m != "image")
        if other:
            raise _RequestError(
                f"modality {other[0]!r} is not supported by vf-mm serve (images only)",
                param="features",
            )
        if pad is None:
            raise _RequestError(
                f"the model {self.model_name} takes no images, but the request has features",
                param="features",
            )
        hashes = features.mm_hashes["image"]
        ranges = features.mm_placeholders["image"]
        for i, p in enumerate(ranges):
            span = ids[p.offset : p.offset + p.length]
            if not bool((span == pad).all()):
                bad = p.offset + int(np.argmax(span != pad))
                raise _RequestError(
                    f"features.mm_placeholders.image[{i}] (offset {p.offset}, length "
                    f"{p.length}) must cover image pad tokens ({pad}) only, but token_ids[{bad}] "
                    f"is {int(ids[bad])}",
                    param="features.mm_placeholders",
                )
        total = int((ids == pad).sum())
        covered = sum(p.length for p in ranges)
        if total != covered:
            raise _RequestError(
                f"token_ids hold {total} image pad tokens ({pad}) but mm_placeholders cover "
                f"{covered}",
                param="features.mm_placeholders",
            )
        data = (features.kwargs_data or {}).get("image") or [None] * len(hashes)

        def decode_all() -> dict[int, dict[str, Any]]:
            # the package's name, so that replacing _server._decode_item takes effect
            from vf_mm.inference import _server

            out: dict[int, dict[str, Any]] = {}
            for i, b64 in enumerate(data):
                if b64 is None:
                    continue
                try:
                    out[i] = self._check_item(_server._decode_item(b64), f"kwargs_data.image[{i}]")
                except _RequestError:
                    raise
                except (VfMmError, ValueError, TypeError) as exc:
                    raise _RequestError(
                        f"features.kwargs_data.image[{i}]: {exc}", param="features.kwargs_data"
                    ) from None
            return out

        decoded = await run_in_threadpool(decode_all) if any(d is not None for d in data) else {}
        items: list[dict[str, Any]] = []
        seen: dict[str, dict[str, Any]] = {}
        for i, h in enumerate(hashes):
            item = decoded.get(i)
            if item is None:
                item = seen.get(h) or self.cache.get(("image", h))
                if item is None:
                    raise _RequestError(
                        f"features.mm_hashes.image[{i}] = {h!r} is not in the server's "
                        "multi-modal cache: send its kwargs_data",
                        param="features.kwargs_data",
                    )
            seen.setdefault(h, item)
            tokens = int(np.prod(item["image_grid_thw"])) // self.merge_size**2
            if tokens != ranges[i].length:
                grid = [int(x) for x in np.asarray(item["image_grid_thw"]).reshape(-1)]
                raise _RequestError(
                    f"image {i} ({h!r}): its placeholder has length {ranges[i].length} but its "
                    f"image_grid_thw {grid} makes prod(grid) / merge_size^2 = {tokens} tokens",
                    param="features.mm_placeholders",
                )
            items.append(item)
        for i, item in decoded.items():
            self.cache.put(("image", hashes[i]), item)
        return MultiModalData(
            mm_hashes={"image": list(hashes)},
            mm_placeholders={"image": [PlaceholderRange(p.offset, p.length) for p in ranges]},
            mm_items={"image": items},
        )

    def _expand_content_parts(
        self, token_ids: list[int], parts: list[dict[str, Any]]
    ) -> tuple[list[int], MultiModalData]:
        """content_parts mode: load each image (server policy), process it with the
        renderer's image processor, and expand its single pad in ``token_ids``."""
        vision = _inner(self.renderer, "vision")
        if vision is None:
            raise _RequestError(
                "content_parts need a server with a multimodal renderer; send features",
                param="content_parts",
            )
        pad = vision.image_token_id
        processed = []
        for i, part in enumerate(parts):
            where = f"content_parts[{i}]"
            kind = part.get("type")
            if kind != "image_url":
                raise _RequestError(
                    f"{where} has type {kind!r}; vf-mm serve takes image_url parts only",
                    param="content_parts",
                )
            url = part.get("url")
            nested = part.get("image_url")
            if url is None and isinstance(nested, dict):
                url = nested.get("url")
            if not isinstance(url, str) or not url:
                raise _RequestError(f"{where} has no image URL", param="content_parts")
            try:
                image = load_image(url, policy=self.image_policy, where=where)
                processed.append(vision.process({"type": "image", "image": image}, where=where))
            except ImageError as exc:
                raise _RequestError(str(exc), param="content_parts") from None
        positions = [k for k, t in enumerate(token_ids) if t == pad]
        if len(positions) != len(processed):
            raise _RequestError(
                f"token_ids hold {len(positions)} image pad tokens ({pad}) but content_parts "
                f"has {len(processed)} images: content_parts mode takes one pad per image",
                param="content_parts",
            )
        ids: list[int] = []
        data = MultiModalData(
            mm_hashes={"image": []}, mm_placeholders={"image": []}, mm_items={"image": []}
        )
        start = 0
        for position, image in zip(positions, processed, strict=True):
            ids.extend(token_ids[start:position])
            data.mm_placeholders["image"].append(PlaceholderRange(len(ids), image.num_tokens))
            data.mm_hashes["image"].append(image.hash)
            data.mm_items["image"].append(image.item)
            ids.extend([pad] * image.num_tokens)
            start = position + 1
        ids.extend(token_ids[start:])
        return ids, data

    def _check_item(self, item: dict[str, Any], where: str) -> dict[str, Any]:
        def bad(message: str) -> _RequestError:
            return _RequestError(f"features.{where}: {message}", param="features.kwargs_data")

        missing = [k for k in ("pixel_values", "image_grid_thw") if k not in item]
        if missing:
            raise bad(f"no {' or '.join(missing)} (got {', '.join(sorted(item)) or 'nothing'})")
        grid = np.asarray(item["image_grid_thw"])
        if grid.shape not in ((1, 3), (3,)) or grid.dtype.kind not in "iu" or (grid <= 0).any():
            raise bad(f"image_grid_thw must be 3 positive ints, got {grid.tolist()}")
        grid = grid.astype(np.int64).reshape(1, 3)
        pv = np.asarray(item["pixel_values"])
        if pv.ndim != 2 or not (pv.dtype.kind == "f" or pv.dtype.name == "bfloat16"):
            raise bad(f"pixel_values must be a 2-D float array, got {pv.dtype} {pv.shape}")
        rows = int(np.prod(grid))
        if pv.shape[0] != rows:
            raise bad(
                f"pixel_values has {pv.shape[0]} rows but image_grid_thw "
                f"{grid[0].tolist()} needs {rows}"
            )
        if self.patch_dim is not None and pv.shape[1] != self.patch_dim:
            raise bad(
                f"pixel_values rows have {pv.shape[1]} values; the model takes {self.patch_dim}"
            )
        if grid[0, 1] % self.merge_size or grid[0, 2] % self.merge_size:
            raise bad(
                f"image_grid_thw {grid[0].tolist()} is not a multiple of merge_size "
                f"{self.merge_size}"
            )
        if pv.dtype != np.float32:
            pv = pv.astype(np.float32)
            pv.flags.writeable = False
        out = dict(item)
        out["pixel_values"] = pv
        out["image_grid_thw"] = grid
        return out


def _token_logprob(token_id: int, logprob: float) -> dict[str, Any]:
    """One ``logprobs.content`` entry of the generate route. Only the sampled token's
    logprob is known (the local engine keeps no top-k), so ``top_logprobs`` holds just
    that token, which vLLM lists first; ``rank`` is unknown (None)."""
    lp = _clamp(logprob)
    entry = {"token_id": token_id, "logprob": lp, "rank": None}
    return {
        **entry,
        "token": f"token_id:{token_id}",
        "top_logprobs": [{**entry, "token": f"token_id:{token_id}"}],
    }
