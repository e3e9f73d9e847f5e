"""A writer to be killed: writes every (example, rollout) of a fixed run, resuming.

Run as ``python _kill_worker.py OUTDIR NUM_EXAMPLES ROLLOUTS [CALL:N]`` (test_kill.py
starts it and SIGKILLs it at random moments). Prints ``open <truncated bytes>`` once the
writer is open and ``done`` at the end. ``make_output`` is imported by the test to know
which images each rollout must reference.

``CALL:N`` (``write``, ``fsync`` or ``replace``) makes the process SIGKILL itself at the
N-th call of ``os.CALL``: before an fsync or a rename (a temporary asset or metadata file
left complete but unnamed), or half-way through a results line (``write`` writes the
first half of the line, then dies): a real kill -9 at a chosen syscall.
"""

from __future__ import annotations

import base64
import io
import os
import random
import signal
import sys

from PIL import Image

from vf_mm.results import ResultsWriter
from vf_mm.types import ResponseTokens, RolloutOutput, TrajectoryStep

METADATA = {"env_id": "kill-test", "config": {"env_id": "kill-test", "rollouts_per_example": 0}}


def noise_image(seed: int, size: int = 96) -> Image.Image:
    """Random pixels (so PNG encoding takes a while and every seed is a new asset)."""
    return Image.frombytes("RGB", (size, size), random.Random(seed).randbytes(size * size * 3))


def shared_image(example_id: int) -> Image.Image:
    """The example's prompt image: the same for every rollout of the example."""
    return Image.new("RGB", (16, 16), (example_id * 7 % 256, 40, 200))


def make_output(example_id: int, rollout_index: int) -> RolloutOutput:
    seed = example_id * 1000 + rollout_index
    buf = io.BytesIO()
    noise_image(seed + 500_000).save(buf, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    long = (example_id + rollout_index) % 5 == 0  # some lines are large (slow to write)
    text = ("é" if long else "x") * (300_000 if long else 50)
    prompt = [
        {"role": "system", "content": "look"},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": shared_image(example_id)},
                {"type": "text", "text": f"example {example_id}"},
            ],
        },
    ]
    completion = [
        {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [
                {"type": "image", "image": noise_image(seed)},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        },
        {"role": "assistant", "content": "done"},
    ]
    steps = [
        TrajectoryStep(
            prompt=[],
            completion=[],
            tokens=ResponseTokens([1] * 10, [2] * 3, [0.0] * 3, [1] * 3, "stop"),
        )
        for _ in range(2)
    ]
    return RolloutOutput(
        example_id=example_id,
        prompt=prompt,
        completion=completion,
        answer=str(example_id),
        reward=float(rollout_index % 2),
        metrics={"seed": float(seed)},
        trajectory=steps,
    )


def die_at(spec: str) -> None:
    """Arm ``os.<call>`` to SIGKILL this process at its N-th call (see module doc)."""
    name, n = spec.split(":")
    real = getattr(os, name)
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == int(n):
            if name == "write":
                fd, data = args
                real(fd, bytes(data[: max(1, len(data) // 2)]))
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(os, name, wrapper)


def main() -> None:
    outdir, num_examples, rollouts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        die_at(sys.argv[4])
    metadata = {**METADATA, "config": {**METADATA["config"], "rollouts_per_example": rollouts}}
    with ResultsWriter(outdir, resume=True, metadata=metadata, fsync_every=1) as writer:
        print("open", writer.truncated_bytes, flush=True)
        for example_id, rollout_index in writer.pending(range(num_examples), rollouts):
            writer.write(make_output(example_id, rollout_index), rollout_index=rollout_index)
        writer.finalize()
    print("done", flush=True)


if __name__ == "__main__":
    main()
