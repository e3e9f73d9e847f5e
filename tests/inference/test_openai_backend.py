"""OpenAIChatBackend: images as PNG data URLs only, sampling mapped to the API, SDK errors
mapped to vf_mm.errors; against a recording stub and against ``vf-mm serve``'s app."""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vf_mm.errors import (
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
    UnsafeImageSourceError,
)
from vf_mm.inference import ChatBackend, ChatResult, OpenAIChatBackend, SamplingParams


class _ThreadServer:
    """Serve an ASGI app with uvicorn on a free 127.0.0.1 port in a background thread."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class _Stub:
    """A chat completions endpoint that records each request and answers per ``mode``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        self.requests.append(json.loads(await request.body()))
        if self.mode == "400":
            return JSONResponse(
                {
                    "error": {
                        "message": "messages[0]: the frobnicator is unhappy",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                },
                status_code=400,
            )
        if self.mode == "500":
            return JSONResponse(
                {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}},
                status_code=500,
            )
        if self.mode == "garbage":
            return PlainTextResponse("<html>not an API</html>")
        if self.mode == "no choices":
            return JSONResponse(
                {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
            )
        if self.mode == "slow":
            await asyncio.sleep(2)
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "reasoning_content": "think first",
                            "tool_calls": [
                                {
                                    "id": "call_0",
                                    "type": "function",
                                    "function": {"name": "zoom", "arguments": '{"x": 1}'},
                                }
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
            }
        )


@pytest.fixture(scope="module")
def stub_server() -> Iterator[tuple[_Stub, str]]:
    stub = _Stub()
    with _ThreadServer(stub.app) as server:
        yield stub, server.url


@pytest.fixture
def stub(stub_server) -> tuple[_Stub, str]:
    s, url = stub_server
    s.requests.clear()
    s.mode = "ok"
    return s, url


def _image(seed: int = 0, size: tuple[int, int] = (40, 30)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _decode_data_url(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def _run(coro):
    return asyncio.run(coro)


async def _chat(backend: OpenAIChatBackend, *args: Any, **kwargs: Any) -> ChatResult:
    try:
        return await backend.chat(*args, **kwargs)
    finally:
        await backend.aclose()


def _backend(url: str, **kwargs: Any) -> OpenAIChatBackend:
    kwargs.setdefault("max_retries", 0)
    return OpenAIChatBackend("m", base_url=f"{url}/v1", api_key="x", **kwargs)


def test_is_a_chat_backend(stub):
    backend = _backend(stub[1])
    assert isinstance(backend, ChatBackend)
    assert backend.name.startswith("openai:m")
    _run(backend.aclose())


def test_images_become_png_data_urls(stub):
    s, url = stub
    pil = _image(1)
    jpeg = io.BytesIO()
    _image(2).save(jpeg, format="JPEG")
    jpeg_url = "data:image/jpeg;base64," + base64.b64encode(jpeg.getvalue()).decode()
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": pil},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": jpeg_url, "detail": "low"}},
            ],
        },
    ]
    before = copy.deepcopy(messages)
    _run(_chat(_backend(url), messages, SamplingParams(max_tokens=5)))
    sent = s.requests[0]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    parts = sent[1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text", "image_url"]
    assert np.array_equal(
        np.asarray(_decode_data_url(parts[0]["image_url"]["url"])), np.asarray(pil)
    )
    jpeg_pixels = np.asarray(Image.open(io.BytesIO(jpeg.getvalue())).convert("RGB"))
    assert np.array_equal(np.asarray(_decode_data_url(parts[2]["image_url"]["url"])), jpeg_pixels)
    assert parts[2]["image_url"]["detail"] == "low"
    # the caller's messages are untouched
    assert messages[1]["content"][0]["image"] is pil
    assert messages == before


def test_url_images_are_refused_before_sending(stub):
    s, url = stub
    for source in ("http://169.254.169.254/latest/meta-data.png", "https://example.com/a.png"):
        messages = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": source}}]}
        ]
        with pytest.raises(UnsafeImageSourceError):
            _run(_chat(_backend(url), messages, SamplingParams()))
    assert s.requests == []


def test_sampling_params_map_to_the_api(stub):
    s, url = stub
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object"}}}]
    _run(
        _chat(
            _backend(url),
            messages,
            SamplingParams(max_tokens=7, temperature=0.3, top_p=0.9, seed=4),
            tools=tools,
        )
    )
    body = s.requests[-1]
    assert body["model"] == "m"
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.3, 0.9, 4)
    assert body["tools"] == tools
    assert not {"top_k", "min_p", "stop_token_ids"} & set(body)

    _run(
        _chat(
            _backend(url, max_tokens_param="max_tokens"),
            messages,
            SamplingParams(max_tokens=3, top_k=5, min_p=0.1, stop_token_ids=(9,)),
        )
    )
    body = s.requests[-1]
    assert body["max_tokens"] == 3 and "max_completion_tokens" not in body
    assert (body["top_k"], body["min_p"], body["stop_token_ids"]) == (5, 0.1, [9])
    assert "seed" not in body


def test_answer_becomes_a_chat_result(stub):
    result = _run(_chat(_backend(stub[1]), [{"role": "user", "content": "hi"}], SamplingParams()))
    assert result.finish_reason == "tool_calls"
    assert result.message == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "think first",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "zoom", "arguments": '{"x": 1}'},
            }
        ],
    }
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 3)


def test_http_errors_carry_the_server_message(stub):
    s, url = stub
    s.mode = "400"
    with pytest.raises(BackendHTTPError) as info:
        _run(_chat(_backend(url), [{"role": "user", "content": "hi"}], SamplingParams()))
    assert info.value.status == 400
    assert info.value.detail == "messages[0]: the frobnicator is unhappy"
    assert "frobnicator" in str(info.value)
    s.mode = "500"
    with pytest.raises(BackendHTTPError) as info:
        _run(_chat(_backend(url), [{"role": "user", "content": "hi"}], SamplingParams()))
    assert info.value.status == 500 and info.value.detail == "engine died"


def test_bad_answers_are_protocol_errors(stub):
    s, url = stub
    for mode in ("garbage", "no choices"):
        s.mode = mode
        with pytest.raises(BackendProtocolError):
            _run(_chat(_backend(url), [{"role": "user", "content": "hi"}], SamplingParams()))


def test_timeout_is_unavailable(stub):
    s, url = stub
    s.mode = "slow"
    with pytest.raises(BackendUnavailableError, match="timed out"):
        _run(
            _chat(
                _backend(url, timeout_s=0.3), [{"role": "user", "content": "hi"}], SamplingParams()
            )
        )


def test_server_down_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = _backend(f"http://127.0.0.1:{port}")
    with pytest.raises(BackendUnavailableError):
        _run(_chat(backend, [{"role": "user", "content": "hi"}], SamplingParams()))


def test_api_key_rules(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="OpenAI client"):
        OpenAIChatBackend("gpt-x")
    backend = OpenAIChatBackend("m", base_url="http://127.0.0.1:1/v1")  # self-hosted: no key needed
    _run(backend.aclose())


def test_against_vf_mm_serve(tiny_vlm_checkpoint):
    from vf_mm.inference import LocalBackend, create_app
    from vf_mm.renderers import load_renderer

    local = LocalBackend(tiny_vlm_checkpoint)
    app = create_app(local, renderer=load_renderer(tiny_vlm_checkpoint), model_name="tiny")
    try:
        with _ThreadServer(app) as server:

            async def main() -> None:
                api = OpenAIChatBackend(
                    "tiny", base_url=f"{server.url}/v1", api_key="x", max_retries=0
                )
                try:
                    messages = [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image", "image": _image(5, (64, 48))},
                                {"type": "text", "text": "What is it?"},
                            ],
                        }
                    ]
                    result = await api.chat(messages, SamplingParams(max_tokens=4, seed=2))
                    assert result.message["role"] == "assistant"
                    assert isinstance(result.message["content"], str)
                    assert 1 <= result.usage.completion_tokens <= 4
                    with pytest.raises(BackendHTTPError) as info:
                        await api.chat(messages, SamplingParams(max_tokens=10**6))
                    assert (
                        info.value.status == 400 and "maximum context length" in info.value.detail
                    )
                finally:
                    await api.aclose()
                other = OpenAIChatBackend(
                    "nope", base_url=f"{server.url}/v1", api_key="x", max_retries=0
                )
                with pytest.raises(BackendHTTPError) as info:
                    await _chat(
                        other, [{"role": "user", "content": "x"}], SamplingParams(max_tokens=2)
                    )
                assert info.value.status == 404 and "does not exist" in info.value.detail

            _run(main())
    finally:
        _run(local.aclose())
