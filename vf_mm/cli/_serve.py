"""``vf-mm serve``: the local engine over HTTP (vLLM's token-in/token-out route + chat)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from pathlib import Path
from typing import Any

from vf_mm.cli._common import (
    add_engine_arguments,
    add_image_backend_argument,
    local_backend_options,
)


def register(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a checkpoint over HTTP: vLLM's /inference/v1/generate, "
        "/v1/chat/completions, /v1/models, /health, /metrics",
        description="Serve a checkpoint with the in-process transformers engine. Routes: "
        "POST /inference/v1/generate (vLLM's token-in/token-out schema; images as features "
        "or as content_parts data: URLs), POST /v1/chat/completions (OpenAI-compatible, "
        "images as data: URLs), GET /v1/models, GET /health, GET /metrics (prefix-cache "
        "counters, as vLLM's). No authentication: keep it "
        "on 127.0.0.1 or a trusted network.",
    )
    serve.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    add_image_backend_argument(serve)
    add_engine_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="most requests generated in one batch (default 32)",
    )
    serve.add_argument(
        "--batch-window-ms",
        type=float,
        default=5.0,
        help="how long the engine waits for more requests to batch (default 5)",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients send as `model` (default: --model as given)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (default info)",
    )
    serve.set_defaults(run=run_serve)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        print(
            f"vf-mm serve needs starlette and uvicorn ({exc}): "
            "pip install 'starlette>=1.10' 'uvicorn>=0.54'",
            file=sys.stderr,
        )
        return 1

    from vf_mm.errors import VfMmError
    from vf_mm.inference import LocalBackend, create_app
    from vf_mm.renderers import load_renderer

    if args.max_batch < 1:
        print("vf-mm serve: --max-batch must be at least 1", file=sys.stderr)
        return 2
    if args.batch_window_ms < 0:
        print("vf-mm serve: --batch-window-ms must be >= 0", file=sys.stderr)
        return 2
    if not _is_loopback(args.host):
        print(
            f"vf-mm serve: warning: listening on {args.host} with no authentication; "
            "anyone who can reach it can run the model",
            file=sys.stderr,
        )
    try:
        renderer = load_renderer(args.model, image_backend=args.image_backend)
        backend = LocalBackend(
            args.model,
            max_batch=args.max_batch,
            batch_window_ms=args.batch_window_ms,
            **local_backend_options(args),
        )
    except (VfMmError, OSError, ValueError) as exc:
        print(f"vf-mm serve: cannot load {args.model}: {exc}", file=sys.stderr)
        return 1
    name = args.served_model_name or str(args.model)
    app = create_app(backend, renderer=renderer, model_name=name)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        asyncio.run(backend.aclose())
    return 0
