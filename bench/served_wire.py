"""What one request of the served route costs on the CPU, turn by turn: ``vf-mm eval
--backend vllm`` against ``vf-mm serve``, for a ``gridnav`` rollout.

A ``gridnav`` rollout (medium: 8 turns, a new rendered image each turn) runs through a
``RendererClient`` (bridging, the Qwen2.5-VL renderer at the real checkpoint's pixel
limits) over an instant scripted engine that keeps each request. Each request is then
put through the served route's two ends, each step timed alone:

  client encode   ``VLLMBackend``'s body (``encode_request``, features mode, the default
                  ``send_kwargs_data=True``: every image of the prompt with its tensors)
  server parse    ``json.loads`` and the pydantic model of the body (``vf-mm serve``'s
                  ``_body``)
  server decode   every ``kwargs_data`` item decoded (``_decode_item``), as the server
                  does for each item a request carries, cached or not

Then the whole rollout's requests are POSTed in order to ``vf-mm serve``'s app (in
process, over an instant scripted engine), timed end to end per rollout, twice side by
side: with the server's item cache off (``mm_cache_items=0``: every item a request
carries is decoded, what the server did before it kept the digest of each decoded
string) and with its default cache (an item sent again is found by its string's digest
and not decoded again).

Baseline, side by side: the bytes of the images' tensors the turn adds (what one new
image costs on the wire). A request at turn t carries t images, so a rollout of T turns
sends T(T+1)/2 image tensors: the sum row is what one rollout costs the server's one
process (under its GIL, beside the engine's own thread).

    python bench/served_wire.py [--turns 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

import vf_mm
from vf_mm.inference import ScriptedBackend, create_app
from vf_mm.inference._server import _decode_item
from vf_mm.inference._server_models import GenerateRequestModel
from vf_mm.inference._vllm_protocol import encode_request
from vf_mm.renderers import load_renderer

sys.path.insert(0, str(Path(__file__).parent))
from _machine import cpu_name
from client_cpu import build_checkpoint


def best_of(fn: Any, n: int = 5) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(n):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2_5_vl")
        engine = ScriptedBackend(load_renderer(path), ["<move>up</move>"])
        client = vf_mm.make_client(path, backend=engine)
        env = vf_mm.load_environment("gridnav", seed=0, max_turns=args.turns)
        asyncio.run(env.evaluate(client, num_examples=1, sampling_args={"max_tokens": 32}))
        requests = engine.requests
        print(f"gridnav: one rollout, {len(requests)} requests\n")
        header = (
            f"{'turn':>5}{'images':>8}{'body MB':>9}{'new image MB':>14}{'client encode ms':>18}"
            f"{'server parse ms':>17}{'server decode ms':>18}"
        )
        print(header)
        total = [0.0, 0.0, 0.0, 0.0]
        for turn, request in enumerate(requests, start=1):
            mmd = request.multi_modal_data
            items = mmd.mm_items.get("image", []) if mmd is not None else []
            new = sum(int(getattr(v, "nbytes", 0)) for v in (items[-1].values() if items else []))
            t_enc, body = best_of(
                lambda r=request: (
                    encode_request(r, model="m", image_policy=None, send_kwargs_data=True).body
                )
            )
            t_parse, model = best_of(
                lambda b=body: GenerateRequestModel.model_validate(json.loads(b))
            )
            data = (model.features.kwargs_data or {}).get("image") or []
            t_decode, _ = best_of(lambda d=data: [_decode_item(x) for x in d if x is not None])
            for i, v in enumerate((len(body), t_enc, t_parse, t_decode)):
                total[i] += v
            print(
                f"{turn:>5}{len(items):>8}{len(body) / 1e6:>9.2f}{new / 1e6:>14.2f}"
                f"{t_enc * 1e3:>18.1f}{t_parse * 1e3:>17.1f}{t_decode * 1e3:>18.1f}"
            )
        print(
            f"{'sum':>5}{'':>8}{total[0] / 1e6:>9.2f}{'':>14}{total[1] * 1e3:>18.1f}"
            f"{total[2] * 1e3:>17.1f}{total[3] * 1e3:>18.1f}"
        )
        server = (total[2] + total[3]) * 1e3
        print(
            f"\nparse + decode of every item: {server:.0f} ms a rollout in the server's one "
            f"process (at most {1e3 / server:.1f} rollouts/s before anything else it does)"
        )
        bodies = [
            encode_request(r, model="m", image_policy=None, send_kwargs_data=True).body
            for r in requests
        ]
        for label, items in (("item cache off (every item decoded)", 0), ("item cache on", 512)):
            walls = []
            for _ in range(3):  # a fresh app each time: nothing cached from the last
                app = create_app(engine, renderer=client.renderer, model_name="m",
                                 mm_cache_items=items)  # fmt: skip
                with TestClient(app) as http:
                    start = time.perf_counter()
                    for body in bodies:
                        r = http.post("/inference/v1/generate", content=body,
                                      headers={"content-type": "application/json"})  # fmt: skip
                        assert r.status_code == 200, r.text
                    walls.append(time.perf_counter() - start)
            print(f"vf-mm serve's app, one rollout's {len(bodies)} requests, {label}: "
                  f"best {min(walls) * 1e3:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
