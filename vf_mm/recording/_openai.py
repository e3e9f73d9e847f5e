"""``openai_client``: an ``openai.AsyncOpenAI`` whose requests reach a ``Recorder`` in process.

The client's HTTP transport is ``httpx.ASGITransport`` over the very app ``vf-mm serve``
runs (``vf_mm.inference.create_app`` with the recorder), so the in-process client and
the server parse, validate and answer requests with one piece of code: no network, no
port, no server process. Each client is bound to one session (its ``X-Session-ID``
header): the turns its calls make are recorded together.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

#: where the in-process client sends its requests (never resolved: ASGI in process)
RECORDING_BASE_URL = "http://vf-mm.recording/v1"


def openai_client(
    recorder: Any,
    *,
    session_id: str | None = None,
    model: str = "vf-mm",
) -> Any:
    """An ``openai.AsyncOpenAI`` bound to ``session_id``, its calls run through ``recorder``.

    Images are read by the recorder's renderer, under its image policy alone. Close it with
    ``await client.close()``.

    Args:
        recorder: The ``Recorder``.
        session_id: The session (a new unique id when None; read it back from
            ``client.session_id``).
        model: The name requests must use.
    """
    import httpx
    import openai

    from vf_mm.inference import create_app

    session = session_id or uuid.uuid4().hex
    app = create_app(
        recorder.client.backend,
        renderer=recorder.client.renderer,
        model_name=model,
        recorder=recorder,
    )
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=RECORDING_BASE_URL, timeout=None
    )
    client = openai.AsyncOpenAI(
        api_key="vf-mm-in-process",
        base_url=RECORDING_BASE_URL,
        http_client=cast(Any, http),  # openai's stubs name httpx's fork; the client is httpx's
        default_headers={"X-Session-ID": session},
        max_retries=0,
    )
    client.session_id = session  # type: ignore[attr-defined]
    return client
