"""``VLLMServers`` (vf_mm/inference/_spawn.py) starting a real vLLM server.

One server of the tiny text checkpoint, started through the Python context manager with
the flags ``server_flags`` adds (features mode: ``--enable-scale-out`` and
``--no-mm-device-do-normalize``) on top of this tier's recipe; ``VLLMBackend`` generates
through it; leaving the block leaves no process of its group behind (vLLM's engine
process included).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.vllm.conftest import STARTUP_TIMEOUT_S
from vf_mm.inference import GenerateRequest, SamplingParams, VLLMBackend, VLLMServers
from vf_mm.renderers import load_renderer

pytestmark = pytest.mark.vllm

#: this tier's server recipe (tests/vllm/conftest.py), less what VLLMServers sets itself
RECIPE = ["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "8"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip


def group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def test_a_spawned_server_generates_and_leaves_nothing_behind(
    vllm_py, checkpoint_dirs, tmp_path
) -> None:
    model = checkpoint_dirs["text"]
    prompt = list(load_renderer(model).render([{"role": "user", "content": "Hi."}]).token_ids)
    seen: list[tuple[int, int]] = []
    servers = VLLMServers(
        model,
        1,
        gpus_per_server=0,
        command=[vllm_py, "-m", "vllm.entrypoints.openai.api_server"],
        extra_args=RECIPE,
        env=ENV,
        log_dir=tmp_path,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        on_progress=lambda ready, total, _: seen.append((ready, total)),
    )

    async def generate(urls: list[str]):
        async with VLLMBackend(urls, model=str(model)) as backend:
            request = GenerateRequest(
                prompt, SamplingParams(max_tokens=6, temperature=0.0), session_id="one"
            )
            return await backend.generate(request), backend.stats

    with servers:
        assert seen[-1] == (1, 1)
        (pid,) = servers.pids
        members = group(pid)
        result, stats = asyncio.run(generate(servers.base_urls))
    assert len(result.completion_ids) == 6 and len(result.logprobs) == 6
    assert stats[servers.base_urls[0]]["requests"] == 1
    log = servers.log_paths[0].read_text()
    assert "--enable-scale-out" in log.splitlines()[0]
    assert "--no-mm-device-do-normalize" in log.splitlines()[0]
    assert pid in members and len(members) >= 2, members  # the API server and its engine
    # after the block: nothing of the group is left, the engine process included
    assert group(pid) == []
