"""``create_app``: the Starlette app of ``vf-mm serve`` over its routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vf_mm.images import ImagePolicy
from vf_mm.inference._server._chat import _ChatRoutes
from vf_mm.inference._server._errors import _error_response, _RequestError
from vf_mm.inference._server._generate import _GenerateRoutes


class _Server(_GenerateRoutes, _ChatRoutes):
    """The routes' handlers over one backend (``_ServerBase`` holds the state)."""


def _route(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except _RequestError as exc:
            return _error_response(exc.message, exc.status, err_type=exc.err_type, param=exc.param)
        except HTTPException:
            raise
        except Exception as exc:  # anything unforeseen: 500 with a message, never a traceback
            return _error_response(
                f"internal error: {type(exc).__name__}: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR
            )

    return wrapped


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = HTTPStatus(exc.status_code)
    return _error_response(str(exc.detail), status, err_type=status.phrase)


def create_app(
    backend: Any,
    *,
    renderer: Any | None = None,
    model_name: str,
    image_policy: ImagePolicy | None = None,
    mm_cache_items: int = 512,
    mm_cache_bytes: int = 4 << 30,
) -> Starlette:
    """The HTTP app of ``vf-mm serve`` over ``backend`` (a token-level ``Backend``).

    ``renderer``: needed for ``/v1/chat/completions`` (and tells which token is the
    image pad); ``model_name``: the served name (``model`` fields must match it);
    ``image_policy``: what chat images may be read (default: ``data:`` URLs only);
    ``mm_cache_items`` / ``mm_cache_bytes`` bound the cache of decoded image items that
    hash-only requests resolve against. The caller owns ``backend`` (and closes it).
    """
    server = _Server(backend, renderer, model_name, image_policy, mm_cache_items, mm_cache_bytes)
    routes = [
        Route("/inference/v1/generate", _route(server.generate), methods=["POST"]),
        Route("/v1/chat/completions", _route(server.chat_completions), methods=["POST"]),
        Route("/v1/models", _route(server.models), methods=["GET"]),
        Route("/health", _route(server.health), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})
    app.state.server = server
    return app
