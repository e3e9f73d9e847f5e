"""``vf-mm serve``: the local engine over HTTP (vLLM's token-in/token-out route + chat).

With ``--record DIR`` it is a recording endpoint: each chat call is a turn of its session
(``X-Session-ID``, else ``user``), run through a ``RendererClient`` over the local engine
or vLLM servers (``--backend vllm -b URL``) and recorded; a session that ends (``POST
/v1/sessions/ID/end``), goes idle (``--session-idle-s``) or is open when the server stops
lands in DIR: a row of DIR/results.jsonl (with its images in DIR/assets/, ``vf-mm view
DIR`` shows it) and a group frame in DIR/groups.vfmm (a trainer stream file).

``--model embedded`` serves the embedded tiny model (``vf_mm.models.embedded_model``,
random weights, built offline), under the name ``embedded``: the whole HTTP path on a
fresh machine, with no download.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import ipaddress
import os
import signal
import sys
from pathlib import Path
from typing import Any

from vf_mm.cli._common import (
    add_engine_arguments,
    add_image_backend_argument,
    local_backend_options,
    server_url,
)
from vf_mm.inference import ServerLimits

#: ``--model``'s name for the embedded tiny model (``vf_mm.models.embedded_model``)
EMBEDDED = "embedded"


def register(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a checkpoint over HTTP: vLLM's /inference/v1/generate, "
        "/v1/chat/completions, /v1/models, /health, /metrics",
        description="Serve a checkpoint with the in-process transformers engine. Routes: "
        "POST /inference/v1/generate (vLLM's token-in/token-out schema; images as features "
        "or as content_parts data: URLs), POST /v1/chat/completions (OpenAI-compatible, "
        "images as data: URLs), GET /v1/models, GET /health, GET /metrics (prefix-cache "
        "counters, as vLLM's). With --record DIR, chat calls are recorded per session "
        "(X-Session-ID header, else the request's user) as exact trajectories, written to DIR "
        "when a session ends (POST /v1/sessions/ID/end), goes idle or the server stops. "
        "Give --api-key (or $VF_MM_API_KEY) before serving beyond 127.0.0.1: every route but "
        "/health then needs Authorization: Bearer KEY. docs/security.md has the threat model. "
        "--model embedded serves the embedded tiny model (no download), as model `embedded`.",
    )
    serve.add_argument(
        "--model",
        required=True,
        type=Path,
        metavar="DIR|embedded",
        help="checkpoint directory, or `embedded`: the embedded tiny model (random weights, "
        "built offline on first use, as vf-mm eval runs with no -m), served as `embedded`",
    )
    serve.add_argument(
        "--backend",
        choices=["local", "vllm"],
        default="local",
        help="local: the in-process engine; vllm: vLLM servers (-b), this server renders",
    )
    serve.add_argument(
        "-b",
        "--base-url",
        action="append",
        default=[],
        type=server_url,
        help="--backend vllm: a server URL",
    )
    serve.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="DIR",
        help="record chat sessions into DIR (results.jsonl, assets/, groups.vfmm)",
    )
    serve.add_argument(
        "--session-idle-s",
        type=float,
        default=600.0,
        help="with --record: a session with no call for this long ends (default 600)",
    )
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
        "--api-key",
        action="append",
        default=None,
        help="a key clients must send as Authorization: Bearer KEY on every route but /health "
        "(repeat for several; default $VF_MM_API_KEY); with --record, each key's sessions "
        "are its own. Never logged",
    )
    limits = ServerLimits()
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=limits.max_body_bytes / 2**20,
        help="largest request body, MiB; refused (413) before it is read whole",
    )
    serve.add_argument(
        "--max-images",
        type=int,
        default=limits.max_images,
        help="most images and clips in one request",
    )
    serve.add_argument(
        "--max-request-tokens",
        type=int,
        default=None,
        help="most prompt tokens in one request (default: the model's context)",
    )
    serve.add_argument(
        "--body-timeout-s",
        type=float,
        default=limits.body_timeout_s,
        help="longest wait for the next part of a request body (408 after it)",
    )
    serve.add_argument(
        "--max-requests-per-client",
        type=int,
        default=limits.max_requests_per_client,
        help="requests in flight from one client address (429 past it)",
    )
    serve.add_argument(
        "--timeout-keep-alive",
        type=float,
        default=5.0,
        help="seconds an idle connection is kept open",
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
    keys = args.api_key or (
        [os.environ["VF_MM_API_KEY"]] if os.environ.get("VF_MM_API_KEY") else []
    )
    if any(not k for k in keys):
        print("vf-mm serve: an --api-key must not be empty", file=sys.stderr)
        return 2
    try:
        limits = ServerLimits(
            max_body_bytes=max(1, int(args.max_body_mb * 2**20)),
            max_images=args.max_images,
            max_request_tokens=args.max_request_tokens,
            body_timeout_s=args.body_timeout_s,
            max_requests_per_client=args.max_requests_per_client,
        )
    except ValueError as exc:
        print(f"vf-mm serve: {exc}", file=sys.stderr)
        return 2
    if not _is_loopback(args.host) and not keys:
        print(
            f"vf-mm serve: warning: listening on {args.host} with no API key; anyone who can "
            "reach it can run the model (give --api-key)",
            file=sys.stderr,
        )
    guard: dict[str, Any] = {"api_keys": keys, "limits": limits}
    if args.backend == "vllm" and (not args.base_url or args.record is None):
        print("vf-mm serve: --backend vllm needs -b URL and --record DIR", file=sys.stderr)
        return 2
    if args.backend == "local" and args.base_url:
        print("vf-mm serve: -b is for --backend vllm", file=sys.stderr)
        return 2
    if str(args.model) == EMBEDDED:
        if args.model.exists():  # never a silent choice between the two
            print(
                f"vf-mm serve: --model {EMBEDDED} is the embedded tiny model, and ./{EMBEDDED} "
                f"exists here too: write ./{EMBEDDED} to serve that folder",
                file=sys.stderr,
            )
            return 2
        from vf_mm.models import embedded_model

        args.served_model_name = args.served_model_name or EMBEDDED
        args.model = embedded_model()
    try:
        # a recording reads chat images through its renderer: under the server's policy
        renderer = load_renderer(
            args.model,
            image_backend=args.image_backend,
            image_policy=recording_policy() if args.record is not None else None,
        )
        if args.backend == "vllm":
            from vf_mm.inference import VLLMBackend

            backend: Any = VLLMBackend(args.base_url, model=str(args.model))
        else:
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
    if args.record is None:
        app = create_app(backend, renderer=renderer, model_name=name, **guard)
        try:
            uvicorn.run(
                app,
                host=args.host,
                port=args.port,
                log_level=args.log_level,
                timeout_keep_alive=args.timeout_keep_alive,
            )
        finally:
            asyncio.run(backend.aclose())
        return 0
    try:
        asyncio.run(_serve_recording(args, backend, renderer, name, guard))
    except VfMmError as exc:  # DIR in use by another recording, a different model
        print(f"vf-mm serve: {exc}", file=sys.stderr)
        return 1
    return 0


def recording_policy() -> Any:
    """What a recording reads: ``data:`` URLs only (the images come inside the requests),
    as vf-mm serve's chat route."""
    from vf_mm.images import ImagePolicy

    return ImagePolicy.dataset(roots=())


async def _serve_recording(
    args: argparse.Namespace, backend: Any, renderer: Any, name: str, guard: dict[str, Any]
) -> None:
    """Serve with a recorder until stopped; every session lands in ``args.record``."""
    import uvicorn

    import vf_mm
    from vf_mm.inference import create_app
    from vf_mm.recording import Recorder
    from vf_mm.results import ResultsWriter, read_results, summarize
    from vf_mm.training import GroupSender, pack_group

    client = vf_mm.RendererClient(backend, renderer)
    metadata = {
        "config": {"recording": True, "model": str(args.model), "backend": args.backend},
        "server": {"base_url": args.base_url or None},
        "vf_mm_version": vf_mm.__version__,
    }
    with (
        ResultsWriter(
            args.record, resume=True, metadata=metadata, policy=recording_policy()
        ) as writer,
        # appended: a recording resumed on the same DIR keeps the groups it sent before
        GroupSender(args.record / "groups.vfmm", append=True) as groups,
    ):

        async def land(session: Any) -> None:
            output = session.as_rollout()
            await writer.awrite(output, rollout_index=session.index)
            group = await asyncio.to_thread(
                functools.partial(
                    pack_group,
                    [output],
                    rollout_indices=[session.index],
                    example_id=output.example_id,
                    # unique in DIR (a session id goes on counting across restarts): the
                    # key a trainer deduplicates by, as vf-mm rollout's groups have one
                    group_id=f"{output.example_id}/{session.index}",
                )
            )
            await groups.asend(group)

        recorded: dict[str, int] = {}
        for example_id, index in writer.done:  # a resumed recording: ids go on counting
            recorded[str(example_id)] = max(recorded.get(str(example_id), 0), index + 1)
        recorder = Recorder(client, idle_s=args.session_idle_s, on_end=land, recorded=recorded)
        app = create_app(backend, renderer=renderer, model_name=name, recorder=recorder, **guard)
        server = _stoppable_server_class()(
            uvicorn.Config(
                app,
                host=args.host,
                port=args.port,
                log_level=args.log_level,
                timeout_keep_alive=args.timeout_keep_alive,
            )
        )

        async def sweep() -> None:
            while True:
                await asyncio.sleep(min(args.session_idle_s, 30.0) / 2 or 0.5)
                await recorder.sweep()

        sweeper = asyncio.create_task(sweep())
        try:
            await server.serve()
        finally:
            sweeper.cancel()
            await recorder.aclose()  # the sessions still open land too
            await backend.aclose()
            writer.finalize(summarize(read_results(args.record)))


def _stoppable_server_class() -> Any:
    import uvicorn

    class StoppableServer(uvicorn.Server):
        """uvicorn's server, stopped by SIGINT / SIGTERM without re-raising the signal
        afterwards (uvicorn does, which would cancel the recording's last writes)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    return StoppableServer
