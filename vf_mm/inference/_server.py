"""``vf-mm serve``: a token-in/token-out HTTP server over a ``Backend`` (the local engine).

``create_app(backend, renderer=..., model_name=...)`` returns a Starlette app that
serves seven routes, each protocol in its own module over one shared ``ServerEngine``
(``_server_engine``: the backend, the renderer, the model's facts, the checks every
request meets, the multi-modal item cache):

- ``POST /inference/v1/generate``: vLLM's token-in/token-out route, images and clips in
  ``features`` or ``content_parts`` mode (``_server_generate``, ``_server_features``), so
  ``VLLMBackend`` and any vLLM client talk to it unchanged;
- ``POST /v1/chat/completions`` and ``GET /v1/models``: OpenAI-compatible, messages in /
  message out, streamed as server-sent events on request (``_server_chat``);
- ``GET /v1/sessions`` and ``POST /v1/sessions/{id}/end``: the recording's sessions
  (``create_app(..., recorder=...)``, ``vf-mm serve --record DIR``: each chat call a
  recorded turn of its session; ``_server_sessions``); 404 on a server that does not
  record;
- ``GET /metrics``: the backend's prefix-cache counters in Prometheus' text format, as
  vLLM publishes them (``_server_metrics``);
- ``GET /health``: 200, and open without a key (a load balancer's check holds none).

Images and clips are both served: on the generate route in either mode, on the chat
route as ``image_url`` / ``video_url`` parts (clips need a family that reads video:
Qwen-VL's). A route reads a URL only under the server's ``image_policy``
(default ``DEFAULT_SERVER_IMAGE_POLICY``: ``data:`` URLs only), never the renderer's:
a server must never fetch what a client names (a recorded chat call is read by the
recorder's client, under its policy alone). Every vision family whose processed images
``vf_mm.models``' ``ItemChecker`` checks is served, and text models; another (LFM2-VL) is
refused at start (``UnsupportedModelError``), saying why.

Every request, whichever route, first passes ``ServerGuard`` (``_server_guard``): with
``api_keys`` every route but ``/health`` needs ``Authorization: Bearer`` one of them
(401 otherwise); without keys the routes are open, so serve on 127.0.0.1 (the default)
or to trusted clients only. ``ServerLimits`` bound what one request may cost: the guard
checks the body's size and pace and the requests in flight per client, the engine the
images and clips and the prompt's tokens. Every generation, whichever route, bans the
renderer's image and video tokens (``VisionSpec.banned_token_ids``; a recorded turn's
client bans its renderer's).

Request bodies are validated with pydantic models whose rules and messages follow
vLLM's (``_server_models``); every refusal is vLLM's error body
``{"error": {"message", "type", "param", "code"}}`` (``_server_errors``): 400 for what
was sent (validation failures read like vLLM's FastAPI handler, ``"1 validation error:
..."``, ``type`` ``"Bad Request"``; other refusals ``"BadRequestError"``), 404
``"NotFoundError"`` for an unknown model, 500 ``"InternalServerError"`` with its message
when the backend fails, never a traceback. What the local engine cannot do (``n > 1``,
stop strings, penalties, ``output_mode="text"``, ...) is refused by name, never silently
dropped. Work that blocks (JSON parsing and validation of large bodies, base64/msgpack
decoding, image and video loading and processing, rendering) runs in worker threads,
never on the event loop.

The item cache trusts the client's hashes as vLLM does: a client that sends the pixels
of one image under another image's hash poisons later hash-only requests for it, for
every client of the server (API keys keep sessions apart, not the cache). A ``null``
entry sent with the digest of its string (``vf_mm_kwargs_digests``, as ``VLLMBackend``
sends it; ``_vllm_items``) resolves only to the item decoded from those bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vf_mm.images import ImagePolicy
from vf_mm.inference._server_chat import ChatRoutes
from vf_mm.inference._server_engine import ItemCache, ServerEngine
from vf_mm.inference._server_errors import RequestError, error_response
from vf_mm.inference._server_features import FeaturesReader
from vf_mm.inference._server_generate import GenerateRoute
from vf_mm.inference._server_guard import ServerGuard, ServerLimits
from vf_mm.inference._server_metrics import MetricsRoute
from vf_mm.inference._server_metrics import sample_value as _sample_value  # noqa: F401  (its tests)
from vf_mm.inference._server_sessions import SessionRoutes

__all__ = ["DEFAULT_SERVER_IMAGE_POLICY", "create_app"]

#: What the routes read when no policy is given: ``data:`` URLs only (no network, no
#: local path). A server must never fetch what a client names.
DEFAULT_SERVER_IMAGE_POLICY = ImagePolicy.dataset(roots=())


def _decode_item(b64: str) -> dict[str, Any]:
    """One ``kwargs_data`` entry decoded. ``create_app`` hands the features reader a call
    that looks this module global up at each call, so tests can stand in a codec of
    their own."""
    from vf_mm.inference import _mm_kwargs  # lazy: only image requests need it

    return _mm_kwargs.decode_kwargs_item(b64)


async def _health(request: Request) -> Response:
    return Response(status_code=200)


# -- the app ----------------------------------------------------------------------------


def _route(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc.message, exc.status, err_type=exc.err_type, param=exc.param)
        except HTTPException:
            raise
        except Exception as exc:  # anything unforeseen: 500 with a message, never a traceback
            return error_response(
                f"internal error: {type(exc).__name__}: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR
            )

    return wrapped


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = HTTPStatus(exc.status_code)
    return error_response(str(exc.detail), status, err_type=status.phrase)


def create_app(
    backend: Any,
    *,
    renderer: Any | None = None,
    model_name: str,
    image_policy: ImagePolicy | None = None,
    mm_cache_items: int = 512,
    mm_cache_bytes: int = 4 << 30,
    recorder: Any = None,
    api_keys: Sequence[str] = (),
    limits: ServerLimits | None = None,
) -> Starlette:
    """The HTTP app of ``vf-mm serve`` over ``backend``.

    The caller owns ``backend`` and ``recorder`` (and closes them).

    Args:
        backend: A token-level ``Backend``.
        renderer: Needed for ``/v1/chat/completions`` (and tells which token is the image
            pad).
        model_name: The served name (``model`` fields must match it).
        image_policy: What images and clips a route may read (chat parts and
            ``content_parts``; default: ``data:`` URLs only).
        mm_cache_items: Bounds the cache of decoded image and clip items that hash-only
            requests resolve against (items).
        mm_cache_bytes: Bounds the same cache (bytes).
        recorder: A ``vf_mm.recording.Recorder``: chat calls become recorded turns of
            their sessions, and the session routes are served.
        api_keys: With any, every route but ``/health`` needs ``Authorization: Bearer``
            one of them (``ServerGuard``); a recording keeps each key's sessions apart.
        limits: What one request may cost (``ServerLimits``: body size, images, prompt
            tokens, a slow body, requests in flight per client).
    """
    limits = limits or ServerLimits()
    engine = ServerEngine(
        backend,
        renderer=renderer,
        model_name=model_name,
        image_policy=image_policy or DEFAULT_SERVER_IMAGE_POLICY,
        limits=limits,
        cache=ItemCache(mm_cache_items, mm_cache_bytes),
    )
    # the codec looked up at each call (see _decode_item), not bound here
    features = FeaturesReader(engine, decode=lambda b64: _decode_item(b64))
    generate = GenerateRoute(engine, features)
    sessions = SessionRoutes(engine, recorder)
    chat = ChatRoutes(engine, sessions)
    routes = [
        Route("/inference/v1/generate", _route(generate), methods=["POST"]),
        Route("/v1/chat/completions", _route(chat.chat_completions), methods=["POST"]),
        Route("/v1/models", _route(chat.models), methods=["GET"]),
        Route("/health", _route(_health), methods=["GET"]),
        Route("/metrics", _route(MetricsRoute(engine)), methods=["GET"]),
        Route("/v1/sessions", _route(sessions.sessions), methods=["GET"]),
        Route("/v1/sessions/{session_id}/end", _route(sessions.end_session), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception},
        middleware=[Middleware(ServerGuard, api_keys=list(api_keys), limits=limits)],
    )
    app.state.server = engine  # what a caller (a test) may inspect: the backend, the start
    return app
