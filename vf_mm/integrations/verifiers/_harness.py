"""``VfMMHarness``: a vf_mm environment's own rollout loop as a verifiers v1 harness.

verifiers' contract for a harness is its interception endpoint, not a process: every
model call must go through ``endpoint`` (an OpenAI-compatible chat route, its bearer
token ``secret``), where verifiers' client renders it (``VfMMRenderer`` with prime-rl:
vf_mm's renderer), samples it, and records the turn on the trace. This harness runs the
environment's rollout (``env.rollout``: its prompt, ``env_response``, tools, stop
conditions) in process against that endpoint with vf_mm's ``OpenAIChatBackend`` (images
go as lossless PNG ``data:`` URLs), then scores it with the environment's rubric and
leaves the result on the trace (``trace.info["vf_mm"]``: reward, metrics, error), where
``VfMMTask`` reads it.

A rollout that fails (the environment, a reward function, a refused model call) exits
non-zero with vf_mm's error, naming the stage: verifiers records a ``HarnessError`` on
the trace and a trainer leaves it out, never trains on it.

Sampling is the run's (verifiers' ``--sampling.*``, prime-rl's): the train client sends
the run's sampling settings, not the environment's ``sampling_args``.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

from vf_mm.integrations.verifiers._taskset import (
    INFO_KEY,
    VfMMTaskData,
    environment,
    environment_rows,
)


class VfMMHarnessConfig(vf.HarnessConfig):
    """No options: the environment and the row come with the task."""


class VfMMHarness(vf.Harness[VfMMHarnessConfig]):
    """Runs one row of a vf_mm environment through the interception endpoint (see the
    module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> ProgramResult:
        """Run the task's row of the vf_mm environment against the interception endpoint.

        The rollout goes through an ``OpenAIChatBackend`` on ``endpoint``; its reward, metrics,
        error and turns are stored in ``trace.info`` for ``VfMMTask`` to read.

        Args:
            ctx: The model context (its model name).
            trace: The trace the result is stored in.
            runtime: verifiers' runtime (unused: nothing runs in a container).
            endpoint: The interception endpoint's base URL.
            secret: Its API key.
            mcp_urls: verifiers' MCP servers (unused).
            data: The task's data (a ``VfMMTaskData``: env, env args, split, example id).
        """
        from vf_mm.client import RendererClient
        from vf_mm.inference import OpenAIChatBackend

        if not isinstance(data, VfMMTaskData):
            extra = getattr(data, "model_extra", None) or {}
            data = VfMMTaskData.model_validate({**data.model_dump(), **extra})
        env = environment(data.env, data.env_args)
        rows = environment_rows(data.env, data.env_args, data.split, data.num_examples)
        row = rows[data.example_id]
        backend = OpenAIChatBackend(ctx.model, base_url=endpoint, api_key=secret, max_retries=0)
        client = RendererClient(backend)
        try:
            state = await env.rollout(client, row, example_id=data.example_id)
            (output,) = await env.score([state])
        finally:
            await client.aclose()
        error = output.error
        trace.info[INFO_KEY] = {
            "reward": output.reward,
            "metrics": dict(output.metrics or {}),
            "error": None if error is None else _describe(error),
            "turns": len(state.get("trajectory") or []),
        }
        if error is not None:
            return ProgramResult(exit_code=1, stdout="", stderr=_describe(error))
        return ProgramResult(exit_code=0, stdout="", stderr="")


def _describe(error: Any) -> str:
    where = getattr(error, "where", None)
    text = f"{getattr(error, 'type', type(error).__name__)}: {getattr(error, 'message', error)}"
    return f"{text} (while {where})" if where else text
