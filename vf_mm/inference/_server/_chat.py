"""``POST /v1/chat/completions``: OpenAI-compatible, messages in / message out."""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vf_mm.errors import ImageError, VfMmError
from vf_mm.images import load_image
from vf_mm.inference._server._base import _clamp, _inner, _ServerBase
from vf_mm.inference._server._errors import _RequestError
from vf_mm.inference._server._models import ChatCompletionRequestModel
from vf_mm.inference._types import GenerateRequest, SamplingParams


class _ChatRoutes(_ServerBase):
    # -- POST /v1/chat/completions -------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        if self.renderer is None:
            raise _RequestError(
                "this server has no renderer: /v1/chat/completions is unavailable",
                status=HTTPStatus.NOT_IMPLEMENTED,
            )
        req: ChatCompletionRequestModel = await self._body(request, ChatCompletionRequestModel)
        self._check_model(req.model)
        self._check_chat_supported(req)
        messages = [m.model_dump(exclude_unset=True) for m in req.messages]
        for m in messages:
            if m["role"] == "developer":
                m["role"] = "system"
        tools = [t.model_dump(exclude_unset=True) for t in req.tools] if req.tools else None
        rendered = await run_in_threadpool(self._render_chat, messages, tools)
        self._check_tokens(req.stop_token_ids or [], "stop_token_ids")
        prompt_len = len(rendered.token_ids)
        try:
            sampling = SamplingParams(
                max_tokens=self._max_tokens(
                    req.max_completion_tokens or req.max_tokens, prompt_len
                ),
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                min_p=req.min_p or 0.0,
                seed=req.seed,
                stop_token_ids=tuple(
                    dict.fromkeys([*self.stop_token_ids, *(req.stop_token_ids or [])])
                ),
                logprobs=bool(req.logprobs),
            )
        except ValueError as exc:
            raise _RequestError(str(exc)) from None
        result = await self._generate(
            GenerateRequest(rendered.token_ids, sampling, rendered.multi_modal_data)
        )
        parsed = await run_in_threadpool(self.renderer.parse_response, result.completion_ids)
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
            tokenizer = _inner(self.renderer, "tokenizer")
            logprobs = {
                "content": [
                    _chat_logprob(tokenizer, t, lp)
                    for t, lp in zip(result.completion_ids, result.logprobs, strict=True)
                ]
            }
        completion_tokens = len(result.completion_ids)
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                        "stop_reason": result.stop_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_len,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_len + completion_tokens,
                },
            }
        )

    def _check_chat_supported(self, req: ChatCompletionRequestModel) -> None:
        def refuse(what: str, param: str) -> None:
            raise _RequestError(f"{what} is not supported by vf-mm serve", param=param)

        if req.stream:
            refuse("stream=true (streaming)", "stream")
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

    def _render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Any:
        """Images loaded through the server's policy (never the renderer's), then render."""
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                if part.get("type") == "image_url":
                    try:
                        image = load_image(
                            part, policy=self.image_policy, where=f"message {i}, part {j}"
                        )
                    except ImageError as exc:
                        raise _RequestError(str(exc), param=f"messages.{i}.content.{j}") from None
                    content[j] = {"type": "image", "image": image}
        try:
            return self.renderer.render(messages, tools=tools)
        except (VfMmError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise _RequestError(f"cannot render the messages: {exc}", param="messages") from None
        except Exception as exc:
            if any(c.__name__ == "TemplateError" for c in type(exc).__mro__):
                raise _RequestError(f"chat template error: {exc}", param="messages") from None
            raise


def _chat_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"
    return {
        "token": text,
        "logprob": _clamp(logprob),
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [],
    }
