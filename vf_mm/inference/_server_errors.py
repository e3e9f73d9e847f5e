"""``vf-mm serve``'s refusals: vLLM's error body and its validation messages.

Every refusal is ``{"error": {"message", "type", "param", "code"}}`` with the HTTP
status in ``code``, as vLLM's ``ErrorResponse``. A body that fails validation reads like
vLLM's FastAPI handler (``"1 validation error: ..."``, ``type`` ``"Bad Request"``), so
clients that match on vLLM's messages match on ours.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse


class RequestError(Exception):
    """A refusal that becomes vLLM's error body."""

    def __init__(
        self,
        message: str,
        *,
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        err_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type or _ERROR_TYPES.get(status, status.phrase)
        self.param = param


_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.NOT_IMPLEMENTED: "NotImplementedError",
}


def error_response(
    message: str,
    status: HTTPStatus = HTTPStatus.BAD_REQUEST,
    *,
    err_type: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    """vLLM's ``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {
        "error": {
            "message": message,
            "type": err_type or _ERROR_TYPES.get(status, status.phrase),
            "param": param,
            "code": status.value,
        }
    }
    return JSONResponse(body, status_code=status.value)


# vllm/entrypoints/serve/exception_handling/handlers/validation.py: the message is built
# from the errors (at most 10, each input summarised), type "Bad Request", code 400.
_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000


def _summarize_input(value: object) -> object:
    if isinstance(value, str):
        if len(value) > _MAX_ERROR_INPUT_CHARS:
            return value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
        return value
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    if len(text) > _MAX_ERROR_INPUT_CHARS:
        return text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    return text


def _loc(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in ("body", *loc))


def validation_error(exc: ValidationError) -> RequestError:
    errors = exc.errors(include_url=False, include_context=False)
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = []
    for err in errors[:_MAX_REPORTED_ERRORS]:
        shown = {
            "type": err["type"],
            "loc": _loc(err["loc"]),
            "msg": err["msg"],
            "input": _summarize_input(err.get("input")),
        }
        text = str(shown)
        if len(text) > _MAX_ERROR_CHARS:
            text = text[:_MAX_ERROR_CHARS] + "...[truncated]"
        lines.append(f"  {text}\n")
    message = f"{count} validation {label}:\n" + "".join(lines)
    if count > _MAX_REPORTED_ERRORS:
        message += f"  ...and {count - _MAX_REPORTED_ERRORS} more {label}\n"
    param = _loc(errors[0]["loc"]) if errors else None
    return RequestError(message.rstrip(), err_type=HTTPStatus.BAD_REQUEST.phrase, param=param)


def json_error(exc: json.JSONDecodeError) -> RequestError:
    shown = {
        "type": "json_invalid",
        "loc": f"body.{exc.pos}",
        "msg": f"JSON decode error: {exc.msg}",
    }
    return RequestError(
        f"1 validation error:\n  {shown}", err_type=HTTPStatus.BAD_REQUEST.phrase, param="body"
    )
