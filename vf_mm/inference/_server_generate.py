"""``POST /inference/v1/generate``: vLLM's token-in/token-out protocol over the engine.

The subset of vLLM 0.32's ``GenerateRequest``
(``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``) that a local engine can
honour, so ``VLLMBackend`` and any vLLM client talk to ``vf-mm serve`` unchanged. Images
and clips arrive in one of two modes:

- ``features``: the client processed them (``_server_features``);
- ``content_parts``: ``token_ids`` hold one image pad per image (one video pad per clip,
  Qwen-VL families) and the parts carry them (``{"type": "image_url", "url":
  "data:..."}`` or ``video_url``, vLLM's flat form, or OpenAI's nested
  ``image_url.url``), read under the server's image policy (``data:`` URLs only unless
  ``create_app`` was given another); the renderer processes each and expands its pad,
  and the processed items serve later hash-only requests too, as in vLLM.
  ``return_token_ids`` returns the expanded ids and their placeholders.

What the local engine cannot do is refused by name with a 400, never silently dropped:
``stream``, ``n > 1``, ``logprobs=-1``, ``output_mode="text"``, stop strings, penalties and the other
sampling fields ``UNSUPPORTED_SAMPLING`` lists when not at their defaults, a priority,
KV or encoder-cache transfer, and a ``logit_bias`` other than bans (-100 or less, what
``VLLMBackend`` sends for the family's image and video tokens: honoured). Logprobs are
the sampled tokens' only: with ``sampling_params.logprobs = k > 0`` each entry's
``top_logprobs`` holds just the sampled token (``rank`` is None).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from vf_mm.errors import ImageError, RenderError, VideoError
from vf_mm.images import load_image
from vf_mm.inference._server_engine import ServerEngine, clamp_logprob, json_response
from vf_mm.inference._server_errors import RequestError
from vf_mm.inference._server_features import FeaturesReader
from vf_mm.inference._server_models import UNSUPPORTED_SAMPLING, GenerateRequestModel
from vf_mm.inference._types import GenerateRequest, SamplingParams
from vf_mm.inference._vllm_items import ITEM_CACHE_HEADER
from vf_mm.inference._vllm_protocol import BAN_BIAS
from vf_mm.types import MultiModalData, PlaceholderRange
from vf_mm.videos import load_video

__all__ = ["GenerateRoute"]


class GenerateRoute:
    """The handler of ``POST /inference/v1/generate`` (see the module docstring)."""

    def __init__(self, engine: ServerEngine, features: FeaturesReader) -> None:
        self.engine = engine
        self.features = features

    async def __call__(self, request: Request) -> Response:
        engine = self.engine
        req: GenerateRequestModel = await engine.parse_body(request, GenerateRequestModel)
        engine.check_model(req.model)
        self._check_supported(req)
        engine.check_tokens(req.token_ids)
        items = len(req.content_parts or []) + sum(
            len(h) for h in (req.features.mm_hashes.values() if req.features else ())
        )
        engine.check_limits(prompt_tokens=len(req.token_ids), items=items, param="token_ids")
        sp = req.sampling_params
        engine.check_tokens(sp.stop_token_ids or [], "sampling_params.stop_token_ids")
        banned = self._logit_bias_bans(sp.model_extra or {})
        token_ids = req.token_ids
        mm: MultiModalData | None
        if req.content_parts:
            token_ids, expanded = await run_in_threadpool(
                self._expand_content_parts, req.token_ids, req.content_parts
            )
            # processed items serve later hash-only (features) requests too, as in vLLM
            for modality in expanded.modalities:
                hashes, processed = expanded.mm_hashes[modality], expanded.mm_items[modality]
                for h, item in zip(hashes, processed, strict=True):
                    engine.cache.put((modality, h), item)
            mm = expanded
        else:
            mm = await self.features.read(req)
        sampling = SamplingParams(
            max_tokens=engine.max_tokens(sp.max_tokens, len(token_ids)),
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=max(sp.top_k, 0),
            min_p=sp.min_p,
            seed=sp.seed,
            stop_token_ids=tuple(sp.stop_token_ids or ()),
            logprobs=sp.logprobs is not None,
        )
        result = await engine.generate(
            GenerateRequest(
                prompt_ids=token_ids,
                sampling=sampling,
                multi_modal_data=mm,
                request_id=req.request_id,
                banned_token_ids=banned,
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
            "model": engine.model_name,
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
        advert = engine.cache.advert  # clients may send what we hold as null (_vllm_items)
        return json_response(body, headers={ITEM_CACHE_HEADER: advert} if advert else None)

    def _check_supported(self, req: GenerateRequestModel) -> None:
        def refuse(what: str, param: str) -> None:
            raise RequestError(f"{what} is not supported by vf-mm serve", param=param)

        if req.stream:
            refuse("stream=true (streaming)", "stream")
        if req.output_mode != "tokens":
            refuse(f"output_mode={req.output_mode!r}", "output_mode")
        if req.priority != 0:
            raise RequestError(
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
            if name == "logit_bias":  # bans are honoured (_logit_bias_bans)
                continue
            defaults = UNSUPPORTED_SAMPLING.get(name)
            if defaults is not None and not any(
                value == d and type(value) is type(d) for d in defaults
            ):
                refuse(f"sampling_params.{name}={value!r}", name)

    def _logit_bias_bans(self, extra: dict[str, Any]) -> tuple[int, ...]:
        """The ids a request's ``logit_bias`` bans (a bias of -100 or less, as
        ``VLLMBackend`` sends the family's image and video tokens); any other bias is
        refused: the local engine applies bans only."""
        bias = extra.get("logit_bias")
        if bias is None or bias == {}:
            return ()
        if not isinstance(bias, dict):
            raise RequestError("sampling_params.logit_bias must be an object", param="logit_bias")
        banned: list[int] = []
        for key, value in bias.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if token < 0:
                raise RequestError(
                    f"sampling_params.logit_bias: {key!r} is not a token id", param="logit_bias"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value > BAN_BIAS:
                raise RequestError(
                    f"sampling_params.logit_bias={{{key!r}: {value!r}}} is not supported by "
                    f"vf-mm serve (only bans, a bias of {BAN_BIAS:g} or less)",
                    param="logit_bias",
                )
            banned.append(token)
        self.engine.check_tokens(banned, "sampling_params.logit_bias")
        return tuple(banned)

    def _expand_content_parts(
        self, token_ids: list[int], parts: list[dict[str, Any]]
    ) -> tuple[list[int], MultiModalData]:
        """content_parts mode: load each image or video (server policy), process it with
        the renderer, and expand its single pad in ``token_ids`` (``image_url`` and
        ``video_url`` parts, in the order their pads appear)."""
        vision = self.engine.renderer_attribute("vision")
        if vision is None:
            raise RequestError(
                "content_parts need a server with a multimodal renderer; send features",
                param="content_parts",
            )
        policy = self.engine.image_policy
        pads = {"image": vision.image_token_id}
        if vision.video is not None and vision.video_token_id is not None:
            pads["video"] = vision.video_token_id  # the placeholder, one per clip
        processed = []
        for i, part in enumerate(parts):
            where = f"content_parts[{i}]"
            kind = part.get("type")
            modality = {"image_url": "image", "video_url": "video"}.get(str(kind))
            if modality not in pads:
                takes = " and ".join(f"{m}_url" for m in pads)
                raise RequestError(
                    f"{where} has type {kind!r}; vf-mm serve takes {takes} parts only",
                    param="content_parts",
                )
            extra = sorted(set(part) - {"type", "url", kind})
            if extra:  # per-clip options, frame_rate: the server would drop them silently
                raise RequestError(
                    f"{where} has {', '.join(map(repr, extra))}: content_parts carry only the "
                    f"{modality} (its file states its frame rate); send per-clip options as "
                    "features",
                    param="content_parts",
                )
            url = part.get("url")
            nested = part.get(str(kind))
            if url is None and isinstance(nested, dict):
                url = nested.get("url")
            if not isinstance(url, str) or not url:
                raise RequestError(f"{where} has no {modality} URL", param="content_parts")
            try:
                if modality == "image":
                    image = load_image(url, policy=policy, where=where)
                    item = vision.process({"type": "image", "image": image}, where=where)
                else:  # loaded through the server's policy, never the renderer's
                    video = load_video(url, policy=policy, where=where)
                    item = vision.process_video({"type": "video", "video": video}, where=where)
            except (ImageError, VideoError, RenderError) as exc:
                raise RequestError(str(exc), param="content_parts") from None
            processed.append(item)
        by_pad = {pad: m for m, pad in pads.items()}
        positions = [(k, by_pad[t]) for k, t in enumerate(token_ids) if t in by_pad]
        written = [m for _, m in positions]
        wanted = [item.modality for item in processed]
        if written != wanted:
            raise RequestError(
                f"token_ids hold pads for {written} but content_parts has {wanted}: "
                "content_parts mode takes one pad per image or video, in order",
                param="content_parts",
            )
        tokenizer = vision.tokenizer
        ids: list[int] = []
        data = MultiModalData()
        start = 0
        for (position, modality), item in zip(positions, processed, strict=True):
            ids.extend(token_ids[start:position])
            # text the processor writes around a span (Qwen3-VL's first timestamp) stands
            # next to added tokens, so it tokenizes alone as it does in the prompt
            if item.text_before:
                ids.extend(tokenizer(item.text_before, add_special_tokens=False)["input_ids"])
            data.mm_placeholders.setdefault(modality, []).append(
                PlaceholderRange(len(ids), item.num_tokens, item.is_embed)
            )
            data.mm_hashes.setdefault(modality, []).append(item.hash)
            data.mm_items.setdefault(modality, []).append(item.item)
            ids.extend(item.tokens)
            if item.text_after:
                ids.extend(tokenizer(item.text_after, add_special_tokens=False)["input_ids"])
            start = position + 1
        ids.extend(token_ids[start:])
        return ids, data


def _token_logprob(token_id: int, logprob: float) -> dict[str, Any]:
    """One ``logprobs.content`` entry of the generate route. Only the sampled token's
    logprob is known (the local engine keeps no top-k), so ``top_logprobs`` holds just
    that token, which vLLM lists first; ``rank`` is unknown (None)."""
    lp = clamp_logprob(logprob)
    entry = {"token_id": token_id, "logprob": lp, "rank": None}
    return {
        **entry,
        "token": f"token_id:{token_id}",
        "top_logprobs": [{**entry, "token": f"token_id:{token_id}"}],
    }
