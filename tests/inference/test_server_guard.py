"""``ServerGuard``: API keys on every route but /health, and the limits on what one
request may cost, each refused before it reaches a route (or before the body is read
whole), while other traffic on the same server goes on."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vf_mm.inference import ServerLimits
from vf_mm.inference._server_guard import OPEN_PATHS, ServerGuard, key_tag

KEYS = ["key-one", "key-two"]


def echo_app() -> Starlette:
    """Every route answers with what reached it: body size and the key's tag."""

    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        tag = request.scope.get("state", {}).get("api_key_tag")
        return JSONResponse({"bytes": len(body), "tag": tag})

    paths = ["/health", "/v1/models", "/v1/chat/completions", "/inference/v1/generate",
             "/metrics", "/v1/sessions"]  # fmt: skip
    return Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in paths])


def client(**guard) -> httpx.AsyncClient:
    app = ServerGuard(echo_app(), **guard)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s")


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/inference/v1/generate",
                                  "/metrics", "/v1/sessions"])  # fmt: skip
@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong", "Bearer key-one-", "key-one", "Basic key-one", "Bearer "]
)
def test_no_key_or_a_wrong_one_is_401_on_every_route_but_health(path, auth):
    async def main():
        async with client(api_keys=KEYS) as http:
            headers = {"Authorization": auth} if auth else {}
            response = await http.post(path, content=b"{}", headers=headers)
            health = await http.get("/health")
            return response, health

    response, health = run(main())
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "AuthenticationError" and error["code"] == 401
    assert "key-one" not in response.text and "key-two" not in response.text  # never echoed
    assert response.headers["www-authenticate"] == "Bearer"
    assert health.status_code == 200 and {"/health"} == OPEN_PATHS


def test_a_right_key_passes_and_names_its_tag_not_itself():
    async def main():
        async with client(api_keys=KEYS) as http:
            return [await http.get("/v1/models", headers={"Authorization": f"Bearer {k}"})
                    for k in KEYS]  # fmt: skip

    one, two = run(main())
    assert one.json()["tag"] == key_tag("key-one") != two.json()["tag"] == key_tag("key-two")
    assert "key-one" not in one.text


def test_without_keys_every_route_is_open():
    async def main():
        async with client() as http:
            return await http.post("/v1/chat/completions", content=b"{}")

    assert run(main()).status_code == 200


def test_an_oversized_body_is_refused_by_its_length_before_it_is_read():
    read = []

    async def main():
        app = ServerGuard(echo_app(), limits=ServerLimits(max_body_bytes=1000))

        async def receive():
            read.append(1)
            return {"type": "http.request", "body": b"x" * 10, "more_body": True}

        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "headers": [(b"content-length", b"5000000")], "client": ("10.0.0.1", 5)}  # fmt: skip
        await app(scope, receive, send)
        return sent

    sent = run(main())
    assert sent[0]["status"] == 413 and not read  # not one byte of the body was read
    assert b"RequestTooLargeError" in sent[1]["body"]


def test_a_chunked_body_is_cut_off_when_it_passes_the_limit():
    chunks_read = []

    async def main():
        app = ServerGuard(echo_app(), limits=ServerLimits(max_body_bytes=1000))

        async def receive():  # an endless chunked body: 400 bytes a chunk
            chunks_read.append(1)
            return {"type": "http.request", "body": b"x" * 400, "more_body": True}

        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "headers": [], "client": ("10.0.0.1", 5)}  # fmt: skip
        await app(scope, receive, send)
        return sent

    sent = run(main())
    assert sent[0]["status"] == 413 and len(chunks_read) == 3  # 1200 bytes > 1000: stop


def test_a_body_that_trickles_is_cut_off():
    async def main():
        app = ServerGuard(echo_app(), limits=ServerLimits(body_timeout_s=0.05))
        first = True

        async def receive():
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": b"{", "more_body": True}
            await asyncio.Event().wait()  # the rest never comes

        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/models", "headers": [],
                 "client": ("10.0.0.1", 5)}  # fmt: skip
        await app(scope, receive, send)
        return sent

    sent = run(main())
    assert sent[0]["status"] == 408 and b"RequestTimeoutError" in sent[1]["body"]


def test_too_many_requests_from_one_client_while_others_go_on():
    release = asyncio.Event

    async def main():
        gate = release()

        async def slow(request: Request) -> JSONResponse:
            await gate.wait()
            return JSONResponse({"ok": True})

        inner = Starlette(routes=[Route("/slow", slow), Route("/fast", slow)])
        app = ServerGuard(inner, limits=ServerLimits(max_requests_per_client=2))

        async def call(address: str):
            sent = []

            async def send(message):
                sent.append(message)

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {"type": "http", "method": "GET", "path": "/slow", "headers": [],
                     "client": (address, 1), "query_string": b"", "root_path": ""}  # fmt: skip
            await app(scope, receive, send)
            return sent[0]["status"]

        a1 = asyncio.create_task(call("10.0.0.1"))
        a2 = asyncio.create_task(call("10.0.0.1"))
        await asyncio.sleep(0)
        third = await call("10.0.0.1")  # a third from the same address: refused at once
        other = asyncio.create_task(call("10.0.0.2"))  # another client: let in
        await asyncio.sleep(0)
        gate.set()
        return third, await a1, await a2, await other

    third, *rest = run(main())
    assert third == 429 and rest == [200, 200, 200]


@pytest.mark.parametrize(
    "bad",
    [{"max_body_bytes": 0}, {"max_images": -1}, {"max_request_tokens": 0},
     {"body_timeout_s": 0}, {"max_requests_per_client": True}],
)  # fmt: skip
def test_limits_that_are_no_limits_are_refused(bad):
    with pytest.raises(ValueError):
        ServerLimits(**bad)


def test_an_empty_key_is_refused():
    with pytest.raises(ValueError, match="empty"):
        ServerGuard(echo_app(), api_keys=["ok", ""])
