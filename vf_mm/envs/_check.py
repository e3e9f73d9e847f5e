"""``check_environment``: what an environment author runs in their own tests.

It checks, and reports every problem at once: the eval dataset has rows with a
``question`` or ``prompt``; every row formats into a prompt whose image parts load
through the dataset image policy; every column a reward function names (``answer``,
``info``) is in every row, unless declared optional; a rollout against a scripted backend on an offline
tiny VLM completes without error; every reward and metric is a finite number; and two
runs with the same seed give the same rewards.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vf_mm.envs._env import Environment
from vf_mm.envs._rubric import asked_columns
from vf_mm.errors import EnvironmentCheckError, VfMmError
from vf_mm.types import image_parts


def check_environment(
    env: Environment,
    *,
    num_examples: int = 2,
    replies: Sequence[str] | Callable[[Any], str] = ("I think the answer is 1.",),
    model_dir: str | Path | None = None,
    image_policy: Any = None,
) -> dict[str, Any]:
    """Run the checks; raise ``EnvironmentCheckError`` listing every problem found, or
    return a small report (rows checked, images loaded, rewards seen)."""
    from vf_mm.client import RendererClient
    from vf_mm.images import ImagePolicy, load_image
    from vf_mm.inference import ScriptedBackend
    from vf_mm.models import build_tiny_vlm
    from vf_mm.renderers import load_renderer

    problems: list[str] = []
    report: dict[str, Any] = {"rows": 0, "images": 0, "rewards": []}
    try:
        rows = env.get_eval_dataset(num_examples)
    except Exception as exc:
        raise EnvironmentCheckError(
            f"the eval dataset cannot be read: {exc}", problems=[str(exc)]
        ) from exc
    if not rows:
        problems.append("the eval dataset is empty")
    policy = image_policy if image_policy is not None else ImagePolicy()
    for i, row in enumerate(rows):
        if row.get("question") is None and row.get("prompt") is None:
            problems.append(f"row {i} has neither a 'question' nor a 'prompt' column")
            continue
        try:
            prompt = env.format_prompt(row)
        except Exception as exc:
            problems.append(f"row {i} does not format into a prompt: {exc}")
            continue
        report["rows"] += 1
        for column in env.missing_columns(row):
            for rf in env.rubric.funcs:
                if column in asked_columns(rf.func):
                    problems.append(
                        f"row {i} has no {column!r} (or it is null) but reward function "
                        f"{rf.name} asks for it: give every row one, or declare "
                        f"optional_columns=[{column!r}]"
                    )
        for m, p, part in image_parts(prompt):
            try:
                load_image(part, policy=policy, where=f"row {i}, message {m}, part {p}")
                report["images"] += 1
            except VfMmError as exc:
                problems.append(str(exc))

    async def run(model: Path, seed: int) -> list[Any]:
        renderer = load_renderer(model)
        client = RendererClient(ScriptedBackend(renderer, replies), renderer)
        return await env.evaluate(
            client, num_examples=num_examples, rollouts_per_example=2, seed=seed
        )

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(model_dir) if model_dir else build_tiny_vlm(Path(tmp) / "tiny", "qwen2_5_vl")
        try:
            first = asyncio.run(run(model, 0))
            second = asyncio.run(run(model, 0))
        except Exception as exc:
            problems.append(
                f"evaluate() raised instead of recording errors: {type(exc).__name__}: {exc}"
            )
            first = second = []
    for out in first:
        if out.error:
            problems.append(f"example {out.example_id}: the rollout failed: {out.error}")
            continue
        values = {"reward": out.reward, **out.metrics}
        for name, value in values.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(
                    f"example {out.example_id}: {name} is {value!r}, not a finite number"
                )
        report["rewards"].append(out.reward)

    def key(outs: list[Any]) -> list[tuple[Any, Any]]:
        return sorted((str(o.example_id), o.reward) for o in outs)

    if first and key(first) != key(second):
        problems.append(
            "two runs with the same seed gave different rewards (non-deterministic env?)"
        )
    if problems:
        raise EnvironmentCheckError(
            f"{env.env_id}: {len(problems)} problem(s):\n- " + "\n- ".join(problems),
            problems=problems,
        )
    return report
