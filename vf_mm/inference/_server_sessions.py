"""Recording sessions of ``vf-mm serve`` (``create_app(..., recorder=...)``,
``vf-mm serve --record DIR``).

With a recorder, each chat call is a turn of the session its ``X-Session-ID`` header
names (else its ``user`` field; neither is a 400), run through the recorder's
``RendererClient`` (bridged onto the session's previous turn) and recorded as a
``TrajectoryStep``. Images and clips are then read by the client's renderer, under its
image policy alone. ``POST /v1/sessions/{id}/end`` ends a session (its recording goes to
the recorder's ``on_end``); ``GET /v1/sessions`` lists the open ones. With API keys
(``ServerGuard``) each key sees and ends only the sessions it opened: the key's tag is
the recorder's ``owner``. Without a recorder the session routes are 404.

A refused call records nothing (the recorder's rule); ``tool_choice="none"`` is refused
rather than recorded, since the reply returned would not be what the model wrote.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vf_mm.errors import BackendError, PromptTooLongError, VfMmError
from vf_mm.inference._server_engine import ServerEngine
from vf_mm.inference._server_errors import RequestError
from vf_mm.inference._types import SamplingParams

__all__ = ["SessionRoutes"]


class SessionRoutes:
    """The recorder behind ``vf-mm serve``: a chat call run as a recorded turn, and the
    routes that list and end sessions. ``recorder`` None: the server does not record.
    The caller owns ``recorder`` (and closes it)."""

    def __init__(self, engine: ServerEngine, recorder: Any) -> None:
        self.engine = engine
        self.recorder = recorder

    @property
    def recording(self) -> bool:
        """Whether chat calls are recorded turns."""
        return self.recorder is not None

    def session_of(self, request: Request, *, user: str | None, tool_choice: Any) -> str:
        """The session a chat call belongs to, or the refusal of a call that cannot be
        recorded (no session named; ``tool_choice="none"``)."""
        session = request.headers.get("x-session-id") or user
        if not session:
            raise RequestError(
                "a recording server needs the session a call belongs to: send the "
                "X-Session-ID header (or the request's user field)",
                param="user",
            )
        if tool_choice == "none":
            raise RequestError(
                "tool_choice='none' is not recorded (the reply would not be what the model "
                "wrote): leave tools out of the request instead",
                param="tool_choice",
            )
        return session

    async def turn(
        self,
        request: Request,
        session: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> Any:
        """The recorder's ``ModelTurn`` for ``messages`` in ``session`` (the caller's key's).
        A prompt over ``--max-request-tokens`` is the same refusal as an unrecorded
        request's; what was sent is a 400, the engine failing a 500."""
        engine = self.engine
        try:
            return await self.recorder.turn(
                session, messages, tools=tools, sampling=sampling, owner=_owner(request),
                max_prompt_tokens=engine.limits.max_request_tokens,
            )  # fmt: skip
        except PromptTooLongError as exc:
            engine.check_limits(prompt_tokens=exc.prompt_tokens, param="messages")
            raise RequestError(str(exc), param="messages") from None
        except BackendError as exc:  # the engine behind the recorder failed
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None
        except (VfMmError, ValueError, TypeError, KeyError) as exc:  # what was sent
            raise RequestError(f"cannot run the turn: {exc}", param="messages") from None
        except Exception as exc:  # the engine failed: 500 with its message
            raise RequestError(
                f"generation failed: {type(exc).__name__}: {exc}",
                status=HTTPStatus.INTERNAL_SERVER_ERROR,
            ) from None

    async def sessions(self, request: Request) -> Response:
        """GET /v1/sessions: the caller's open sessions and their turns so far."""
        recorder = self._require_recorder()
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": s.session_id, "turns": len(s.steps), "index": s.index}
                    for s in recorder.sessions_of(_owner(request)).values()
                ],
            }
        )

    async def end_session(self, request: Request) -> Response:
        """POST /v1/sessions/{id}/end: end a recorded session (404 if none is open)."""
        recorder = self._require_recorder()
        session_id = request.path_params["session_id"]
        ended = await recorder.end(session_id, owner=_owner(request))
        if ended is None:
            raise RequestError(
                f"no open session {session_id!r}", status=HTTPStatus.NOT_FOUND, param="session"
            )
        return JSONResponse({"id": session_id, "turns": len(ended.steps), "ended": True})

    def _require_recorder(self) -> Any:
        if self.recorder is None:
            raise RequestError(
                "this server does not record sessions (start it with --record DIR)",
                status=HTTPStatus.NOT_FOUND,
            )
        return self.recorder


def _owner(request: Request) -> str | None:
    """The API key's tag the request was let in with (``ServerGuard``), None without keys:
    a recording keeps each key's sessions apart by it."""
    owner: str | None = request.scope.get("state", {}).get("api_key_tag")
    return owner
