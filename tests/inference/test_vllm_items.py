"""VLLMBackend sends each image's tensors to a server once, and only to a server that
says it keeps them (``vf_mm.inference._vllm_items``). A mock transport plays the server:
no model, no sockets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np

from vf_mm.inference import GenerateRequest, SamplingParams, VLLMBackend
from vf_mm.inference._mm_kwargs import sent_digest
from vf_mm.inference._vllm_items import ITEM_CACHE_HEADER, MISS_ERROR_TYPE
from vf_mm.types import MultiModalData, PlaceholderRange

PAD = 7
ANSWER = {"choices": [{"token_ids": [5], "finish_reason": "stop"}]}


def _item(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "pixel_values": rng.standard_normal((4, 6)).astype(np.float32),
        "image_grid_thw": np.array([[1, 2, 2]], dtype=np.int64),
    }


def _request(*items: tuple[str, dict[str, np.ndarray]]) -> GenerateRequest:
    """A prompt of one pad per image (each its own placeholder), images by (hash, item)."""
    ids = [1]
    ranges = []
    for _ in items:
        ranges.append(PlaceholderRange(len(ids), 1))
        ids += [PAD, 2]
    mmd = MultiModalData(
        mm_hashes={"image": [h for h, _ in items]},
        mm_placeholders={"image": ranges},
        mm_items={"image": [item for _, item in items]},
    )
    return GenerateRequest(ids, SamplingParams(max_tokens=1, logprobs=False), mmd)


class _Server:
    """Answers every generate; with ``instance`` set, advertises its item cache under it
    and holds what it was sent (by hash and string digest), answering a null it lacks
    with the miss error."""

    def __init__(self, instance: str | None) -> None:
        self.instance = instance
        self.bodies: list[dict[str, Any]] = []
        self.held: dict[str, str] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        features = body["features"]
        hashes = features["mm_hashes"]["image"]
        entries = features["kwargs_data"]["image"]
        claimed = body.get("vf_mm_kwargs_digests", {}).get("image", [None] * len(hashes))
        for h, b64, digest in zip(hashes, entries, claimed, strict=True):
            if b64 is None and (self.instance is None or self.held.get(h) != digest):
                error = {"message": f"{h} is not cached", "type": MISS_ERROR_TYPE, "code": 400}
                return httpx.Response(400, json={"error": error})
        if self.instance is None:
            return httpx.Response(200, json=ANSWER)
        for h, b64 in zip(hashes, entries, strict=True):
            if b64 is not None:
                self.held[h] = sent_digest(b64)
        headers = {ITEM_CACHE_HEADER: f"instance={self.instance}; items=64"}
        return httpx.Response(200, json=ANSWER, headers=headers)


def _run(server: _Server, *requests: GenerateRequest) -> VLLMBackend:
    backend = VLLMBackend(
        "http://s.test", max_model_len=4096, transport=httpx.MockTransport(server)
    )

    async def main() -> None:
        try:
            for request in requests:
                await backend.generate(request)
        finally:
            await backend.aclose()

    asyncio.run(main())
    return backend


def _entries(body: dict[str, Any]) -> list[bool]:
    """Per image: whether its tensors were sent."""
    return [e is not None for e in body["features"]["kwargs_data"]["image"]]


A, B = ("ha", _item(1)), ("hb", _item(2))


def test_a_server_that_keeps_items_is_sent_each_image_once():
    server = _Server("i1")
    backend = _run(server, _request(A), _request(A, B), _request(A, B))
    assert [_entries(b) for b in server.bodies] == [[True], [False, True], [False, False]]
    # each null names the digest of the string sent for it
    first = server.bodies[0]["features"]["kwargs_data"]["image"][0]
    assert server.bodies[1]["vf_mm_kwargs_digests"] == {"image": [sent_digest(first), None]}
    assert "vf_mm_kwargs_digests" not in server.bodies[0]
    stats = backend.item_stats["http://s.test"]
    assert stats == {"sent": 2, "skipped": 3, "misses": 0, "held": 2}


def test_a_server_that_does_not_say_it_keeps_items_is_sent_every_image():
    """A real vLLM server: a null it lacks fails in its engine core, so none is sent."""
    server = _Server(None)
    backend = _run(server, _request(A), _request(A, B), _request(A, B))
    assert [_entries(b) for b in server.bodies] == [[True], [True, True], [True, True]]
    assert backend.item_stats["http://s.test"]["skipped"] == 0


def test_another_item_under_a_held_hash_is_sent():
    """vf_mm's image hash is of the pixels: other tensors under it (other processing)
    are sent, never taken from the server's cache."""
    server = _Server("i1")
    _run(server, _request(A), _request(("ha", _item(3))))
    assert [_entries(b) for b in server.bodies] == [[True], [True]]


def test_a_restarted_server_misses_and_the_request_goes_again_in_full_once():
    server = _Server("i1")
    backend = VLLMBackend(
        "http://s.test", max_model_len=4096, transport=httpx.MockTransport(server)
    )

    async def main() -> list[int]:
        try:
            await backend.generate(_request(A))
            server.instance, server.held = "i2", {}  # restarted: holds nothing
            first = await backend.generate(_request(A, B))
            third = await backend.generate(_request(A, B))
            return first.completion_ids + third.completion_ids
        finally:
            await backend.aclose()

    assert asyncio.run(main()) == [5, 5]
    assert [_entries(b) for b in server.bodies] == [
        [True],
        [False, True],  # the miss
        [True, True],  # sent again in full
        [False, False],  # held by the new instance
    ]
    assert backend.item_stats["http://s.test"] == {
        "sent": 3,
        "skipped": 2,
        "misses": 1,
        "held": 2,
    }


def test_a_server_that_stops_advertising_is_sent_every_image_again():
    server = _Server("i1")
    backend = VLLMBackend(
        "http://s.test", max_model_len=4096, transport=httpx.MockTransport(server)
    )

    async def main() -> None:
        try:
            await backend.generate(_request(A))
            server.instance = None  # replaced by a server without an item cache
            await backend.generate(_request(A, B))  # a miss: sent again in full
            await backend.generate(_request(A, B))
        finally:
            await backend.aclose()

    asyncio.run(main())
    assert [_entries(b) for b in server.bodies][-1] == [True, True]
    assert backend.item_stats["http://s.test"]["held"] == 0


def test_a_miss_on_a_body_that_skipped_nothing_is_final():
    """The miss error is answered by a full resend only where items were skipped."""
    from vf_mm.errors import BackendHTTPError

    def handler(request: httpx.Request) -> httpx.Response:
        error = {"message": "no", "type": MISS_ERROR_TYPE, "code": 400}
        return httpx.Response(400, json={"error": error})

    backend = VLLMBackend(
        "http://s.test", max_model_len=4096, transport=httpx.MockTransport(handler)
    )

    async def main() -> None:
        try:
            await backend.generate(_request(A))
        finally:
            await backend.aclose()

    import pytest

    with pytest.raises(BackendHTTPError, match="no"):
        asyncio.run(main())


def test_a_request_counts_in_flight_on_its_server_while_its_body_is_made():
    """The body is made for the chosen server (after the choice): meanwhile the request
    counts as in flight there, so requests chosen meanwhile see the load."""
    import threading

    backend = VLLMBackend(
        "http://s.test", max_model_len=4096, transport=httpx.MockTransport(_Server("i1"))
    )
    started, release = threading.Event(), threading.Event()
    encode = backend._encode

    def slow(*args: Any) -> Any:
        started.set()
        release.wait(10)
        return encode(*args)

    backend._encode = slow  # type: ignore[method-assign]

    async def main() -> int:
        try:
            task = asyncio.create_task(backend.generate(_request(A)))
            await asyncio.to_thread(started.wait, 10)
            during = backend.stats["http://s.test"]["outstanding"]
            release.set()
            await task
            return during
        finally:
            release.set()
            await backend.aclose()

    assert asyncio.run(main()) == 1
    assert backend.stats["http://s.test"]["outstanding"] == 0
