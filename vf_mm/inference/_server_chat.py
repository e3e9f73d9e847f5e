"""``POST /v1/chat/completions`` and ``GET /v1/models``: the OpenAI-compatible protocol of
``vf-mm serve`` over the engine.

Messages in, one assistant message out (content, ``reasoning_content``, tool calls as
the renderer parses them). Images (``image_url``) and clips (``video_url``, with
per-clip ``fps`` / ``num_frames`` / ...) are read only as ``data:`` URLs unless
``create_app`` was given a wider ``image_policy``; the server reads them under that
policy, never the renderer's. With ``stream=true`` the whole reply is generated, then
sent as server-sent events in OpenAI's chunk format (role, content, tool calls, finish
reason; usage with ``stream_options.include_usage``), ending with ``data: [DONE]``.
``logprobs=true`` gives each sampled token's logprob and text (``top_logprobs`` is
refused: the local engine keeps no top-k). With a recorder each call is a recorded turn
(``_server_sessions``); the reply has the same format either way.

What the local engine cannot do is refused by name with a 400: ``n > 1``, stop strings
(``stop_token_ids`` are honoured), penalties, structured output,
``chat_template_kwargs``, a ``tool_choice`` other than ``auto`` / ``none``. Without a
renderer the route is 501.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vf_mm.errors import ImageError, VfMmError, VideoError
from vf_mm.images import load_image
from vf_mm.inference._server_engine import ServerEngine, clamp_logprob
from vf_mm.inference._server_errors import RequestError
from vf_mm.inference._server_models import ChatCompletionRequestModel
from vf_mm.inference._server_sessions import SessionRoutes
from vf_mm.inference._types import GenerateRequest, SamplingParams
from vf_mm.types import Messages
from vf_mm.videos import load_video

__all__ = ["ChatRoutes"]


class ChatRoutes:
    """The handlers of ``POST /v1/chat/completions`` and ``GET /v1/models`` (see the
    module docstring); recorded turns go through ``sessions``."""

    def __init__(self, engine: ServerEngine, sessions: SessionRoutes) -> None:
        self.engine = engine
        self.sessions = sessions

    async def models(self, request: Request) -> Response:
        """GET /v1/models: the one served model, with vLLM's ``max_model_len``."""
        engine = self.engine
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": engine.model_name,
                        "object": "model",
                        "created": engine.created,
                        "owned_by": "vf-mm",
                        "root": engine.model_name,
                        "parent": None,
                        "max_model_len": engine.max_model_len,
                    }
                ],
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        engine = self.engine
        if engine.renderer is None:
            raise RequestError(
                "this server has no renderer: /v1/chat/completions is unavailable",
                status=HTTPStatus.NOT_IMPLEMENTED,
            )
        req: ChatCompletionRequestModel = await engine.parse_body(
            request, ChatCompletionRequestModel
        )
        engine.check_model(req.model)
        _check_supported(req)
        messages = [m.model_dump(exclude_unset=True) for m in req.messages]
        for m in messages:
            if m["role"] == "developer":
                m["role"] = "system"
            if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
                m["content"] = ""  # an empty reply echoed as null (a template would print None)
            if isinstance(m.get("content"), list):
                # a key sent as null is no key (Arrow-backed datasets add ``image_url: null``
                # to text parts, which a template would take for an image), as vLLM's typed
                # parsing drops it
                m["content"] = [
                    {k: v for k, v in part.items() if v is not None} for part in m["content"]
                ]
        tools = [t.model_dump(exclude_unset=True) for t in req.tools] if req.tools else None
        engine.check_tokens(req.stop_token_ids or [], "stop_token_ids")
        items = sum(
            1
            for m in messages
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") in ("image_url", "video_url")
        )
        engine.check_limits(items=items, param="messages")
        if self.sessions.recording:
            return await self._recorded(request, req, messages, tools)
        rendered = await run_in_threadpool(self._render, messages, tools)
        prompt_len = len(rendered.token_ids)
        engine.check_limits(prompt_tokens=prompt_len, param="messages")
        sampling = self._sampling(req, prompt_len=prompt_len)
        result = await engine.generate(
            GenerateRequest(
                rendered.token_ids,
                sampling,
                rendered.multi_modal_data,
                messages=cast(Messages, messages),
            )
        )
        parsed = await run_in_threadpool(engine.renderer.parse_response, result.completion_ids)
        message: dict[str, Any] = {"role": "assistant"}
        content: str | None = parsed.content
        tool_calls = list(parsed.tool_calls) if req.tool_choice != "none" else []
        if req.tool_choice == "none" or (parsed.tool_call_errors and not tool_calls):
            # keep what the model wrote rather than drop a call that did not parse
            text = parsed.text
            if parsed.reasoning is not None:
                text = text.partition("</think>")[2].lstrip("\n")
            content = text
        if tool_calls and not content:
            content = None
        message["content"] = content
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "tool_calls" if tool_calls else result.finish_reason
        logprobs = None
        if req.logprobs and result.logprobs is not None:
            logprobs = self._logprobs(result.completion_ids, result.logprobs)
        return self._response(
            req, message, logprobs, finish, result.stop_reason, prompt_len,
            len(result.completion_ids),
        )  # fmt: skip

    async def _recorded(
        self,
        request: Request,
        req: ChatCompletionRequestModel,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> Response:
        """A chat call as a recorded turn of its session, answered in the same format."""
        session = self.sessions.session_of(request, user=req.user, tool_choice=req.tool_choice)
        sampling = self._sampling(req, prompt_len=None)
        turn = await self.sessions.turn(request, session, messages, tools, sampling)
        tokens = turn.tokens
        message = dict(turn.message)
        logprobs = None
        if req.logprobs and tokens is not None:
            logprobs = self._logprobs(tokens.completion_ids, tokens.completion_logprobs)
        finish = "tool_calls" if message.get("tool_calls") else tokens.finish_reason
        return self._response(
            req, message, logprobs, finish, None, len(tokens.prompt_ids),
            len(tokens.completion_ids),
        )  # fmt: skip

    def _response(
        self,
        req: ChatCompletionRequestModel,
        message: dict[str, Any],
        logprobs: dict[str, Any] | None,
        finish: str | None,
        stop_reason: Any,
        prompt_len: int,
        completion_tokens: int,
    ) -> Response:
        """The reply as one JSON body, or (``stream=true``) as server-sent events."""
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.engine.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_len,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_len + completion_tokens,
            },
        }
        if not req.stream:
            return JSONResponse(body)
        usage = bool((req.stream_options or {}).get("include_usage"))
        return Response(_sse_chunks(body, include_usage=usage), media_type="text/event-stream")

    def _logprobs(self, completion_ids: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
        """OpenAI's ``logprobs`` of a reply: each sampled token's text, logprob and bytes."""
        tokenizer = self.engine.renderer_attribute("tokenizer")
        return {
            "content": [
                _chat_logprob(tokenizer, t, lp)
                for t, lp in zip(completion_ids, logprobs, strict=True)
            ]
        }

    def _sampling(
        self, req: ChatCompletionRequestModel, *, prompt_len: int | None
    ) -> SamplingParams:
        """The request's sampling. ``prompt_len`` None (a recorded turn, rendered by the
        recorder's client): an unset ``max_tokens`` is ``SamplingParams``' default, not
        the context's room."""
        engine = self.engine
        requested = req.max_completion_tokens or req.max_tokens
        if prompt_len is None:
            max_tokens = requested if requested is not None else SamplingParams().max_tokens
        else:
            max_tokens = engine.max_tokens(requested, prompt_len)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                min_p=req.min_p or 0.0,
                seed=req.seed,
                stop_token_ids=tuple(
                    dict.fromkeys([*engine.stop_token_ids, *(req.stop_token_ids or [])])
                ),
                logprobs=bool(req.logprobs),
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
        """Images and videos loaded through the server's policy (never the renderer's), then
        render."""
        engine = self.engine
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                where = f"message {i}, part {j}"
                try:
                    if part.get("type") == "image_url":
                        image = load_image(part, policy=engine.image_policy, where=where)
                        content[j] = {"type": "image", "image": image}
                    elif part.get("type") == "video_url":
                        video = load_video(part, policy=engine.image_policy, where=where)
                        options = {k: v for k, v in part.items() if k not in ("type", "video_url")}
                        content[j] = {"type": "video", "video": video, **options}
                except (ImageError, VideoError) as exc:
                    raise RequestError(str(exc), param=f"messages.{i}.content.{j}") from None
        assert engine.renderer is not None, "chat routes need a renderer (checked at the route)"
        try:
            return engine.renderer.render(messages, tools=tools)
        except (VfMmError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise RequestError(f"cannot render the messages: {exc}", param="messages") from None
        except Exception as exc:
            if any(c.__name__ == "TemplateError" for c in type(exc).__mro__):
                raise RequestError(f"chat template error: {exc}", param="messages") from None
            raise


def _check_supported(req: ChatCompletionRequestModel) -> None:
    def refuse(what: str, param: str) -> None:
        raise RequestError(f"{what} is not supported by vf-mm serve", param=param)

    if req.n not in (None, 1):
        refuse(f"n={req.n} (only 1)", "n")
    if req.stop not in (None, "", []):
        refuse("stop strings (use stop_token_ids)", "stop")
    if req.top_logprobs:
        refuse("top_logprobs > 0", "top_logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            refuse(f"{name}={getattr(req, name)}", name)
    if req.response_format not in (None, {}) and req.response_format.get("type") != "text":
        refuse("response_format (structured output)", "response_format")
    if req.chat_template_kwargs:
        refuse("chat_template_kwargs", "chat_template_kwargs")
    if req.tool_choice not in (None, "auto", "none"):
        refuse(f"tool_choice={req.tool_choice!r} (only 'auto' and 'none')", "tool_choice")


def _chat_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"
    return {
        "token": text,
        "logprob": clamp_logprob(logprob),
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [],
    }


def _sse_chunks(body: dict[str, Any], *, include_usage: bool) -> bytes:
    """A finished chat completion as OpenAI's stream of ``chat.completion.chunk`` events:
    the role, the content, the tool calls (each whole, with its index), the finish
    reason, the usage when asked for, then ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": extra.get("logprobs"),
                                     "finish_reason": finish}]}  # fmt: skip
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    if message.get("reasoning_content"):
        parts.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        parts.append(chunk({"content": message["content"]}, logprobs=choice["logprobs"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        parts.append(chunk({"tool_calls": [{"index": i, **call}]}))
    parts.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        usage = {**base, "choices": [], "usage": body["usage"]}
        parts.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)
