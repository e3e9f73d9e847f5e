"""``vf-mm serve``: a token-in/token-out HTTP server over a ``Backend`` (the local engine).

``create_app(backend, renderer=..., model_name=...)`` returns a Starlette app with

- ``POST /inference/v1/generate``: vLLM's token-in/token-out route (the subset of vLLM
  0.33's ``GenerateRequest`` in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``
  that a local engine can honour), so ``VLLMBackend`` and any vLLM client talk to it
  unchanged. Images arrive in ``features`` mode: per image its ``mm_hash``, its
  placeholder range and (optionally) its ``kwargs_data`` (base64 msgpack of vLLM's
  ``MultiModalKwargsItem``). An entry of ``None`` is resolved from a bounded cache of
  items that earlier requests sent, keyed by hash, as vLLM does. Or in
  ``content_parts`` mode: ``token_ids`` hold one image pad per image and the parts
  carry the images (``{"type": "image_url", "url": "data:..."}``, vLLM's flat form, or
  OpenAI's nested ``image_url.url``); the renderer's image processor expands each pad,
  and ``return_token_ids`` returns the expanded ids and their placeholders.
- ``POST /v1/chat/completions``: OpenAI-compatible, messages in / message out; images
  only as ``data:`` URLs unless an explicit ``image_policy`` allows more.
- ``GET /v1/models`` and ``GET /health``.

Request bodies are validated with pydantic models whose rules and messages follow
vLLM's (``MultiModalFeatures._validate_parallel_fields``, ``GenerateRequest``'s
validators, ``validate_cache_salt``, ``SamplingParams._verify_args``); every refusal is
HTTP 400 with vLLM's error body ``{"error": {"message", "type", "param", "code"}}``.
Validation failures read like vLLM's FastAPI handler (``"1 validation error: ..."``,
``type`` ``"Bad Request"``); other refusals have ``type`` ``"BadRequestError"``; an
unknown model is 404 ``"NotFoundError"``; a backend failure is 500
``"InternalServerError"`` with its message.

What the local engine cannot do is refused by name with a 400, never silently dropped:
streaming, ``n > 1``, stop strings, penalties, ``output_mode="text"``, video.
Logprobs are the sampled tokens' only: with ``sampling_params.logprobs = k > 0`` each
entry's ``top_logprobs`` holds just the sampled token (``rank`` is None).

Work that blocks (JSON parsing and validation of large bodies, base64/msgpack decoding,
image loading and processing, rendering) runs in worker threads, never on the event loop.

The hash cache trusts the client's hashes as vLLM does: a client that sends the pixels
of one image under another image's hash poisons later hash-only requests for it. Serve
on 127.0.0.1 (the default) or to trusted clients only: there is no authentication.
"""

from vf_mm.inference._server._app import create_app
from vf_mm.inference._server._base import DEFAULT_SERVER_IMAGE_POLICY

# the decoder of kwargs_data items: looked up here by the generate route, so tests can
# replace it (``monkeypatch.setattr(vf_mm.inference._server, "_decode_item", ...)``)
from vf_mm.inference._server._generate import _decode_item as _decode_item
from vf_mm.inference._server._models import (
    ChatCompletionRequestModel as ChatCompletionRequestModel,
)
from vf_mm.inference._server._models import GenerateRequestModel as GenerateRequestModel
from vf_mm.inference._server._models import (
    GenerateSamplingParams as GenerateSamplingParams,
)
from vf_mm.inference._server._models import MultiModalFeatures as MultiModalFeatures
from vf_mm.inference._server._models import PlaceholderRangeInfo as PlaceholderRangeInfo

__all__ = ["DEFAULT_SERVER_IMAGE_POLICY", "create_app"]
