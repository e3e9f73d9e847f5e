"""``stream_rollouts``: run an environment's train split and send each scored group to a trainer.

The producer half of training (``vf-mm rollout`` is this plus a terminal). Each example's
rollouts are packed into one group frame (``pack_group``: each distinct image's tensors
once) as soon as the group is scored, and sent through a ``GroupSender``. When the
trainer is slow, the send blocks, which holds back the rollouts behind it: memory stays
bounded. A rollout that failed is sent too, with its ``error`` set; a group that cannot be
packed is sent stripped to its scores, with the reason as each rollout's error. Nothing
is dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from vf_mm.errors import TransportError
from vf_mm.training._groups import pack_group
from vf_mm.types import RolloutError


@dataclasses.dataclass(slots=True)
class RolloutProgress:
    """Counts so far, handed to the progress callback after each sent group."""

    total_groups: int
    groups: int = 0
    rollouts: int = 0
    errors: int = 0  # rollouts sent with an error
    repacked: int = 0  # groups sent stripped because packing or encoding them failed
    bytes_sent: int = 0
    rewards: list[float] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def rate(self) -> float:
        elapsed = self.elapsed
        return self.rollouts / elapsed if elapsed > 0 else 0.0


async def stream_rollouts(
    env: Any,
    client: Any,
    sender: Any,
    *,
    num_examples: int = -1,
    rollouts_per_example: int = 1,
    concurrency: int = 32,
    sampling_args: Mapping[str, Any] | None = None,
    seed: int | None = None,
    on_progress: Callable[[RolloutProgress], None] | None = None,
) -> RolloutProgress:
    """Run the train split's groups and send each through ``sender`` once it is scored."""
    rows = env.get_dataset(num_examples)
    progress = RolloutProgress(total_groups=len(rows))
    # media are read again to hash them into group frames: under the renderer's rules
    policy, video_limits = getattr(client, "media_rules", (None, None))
    pending: dict[Any, list[tuple[int, Any]]] = {}
    if on_progress is not None:
        on_progress(progress)

    async def deliver(example_id: Any, done: list[tuple[int, Any]]) -> None:
        done.sort(key=lambda pair: pair[0])
        indices = [index for index, _ in done]
        outputs = [output for _, output in done]
        try:
            group = await asyncio.to_thread(
                pack_group, outputs, rollout_indices=indices, example_id=example_id,
                policy=policy, video_limits=video_limits,
            )  # fmt: skip
            nbytes = await sender.asend(group)
        except TransportError:
            raise
        except Exception as exc:  # keep the scores and say why the rest is missing
            packing = RolloutError.from_exception(exc, where="packing the group")
            outputs = [
                dataclasses.replace(
                    o,
                    prompt=[],
                    completion=[],
                    trajectory=[],
                    info={},
                    answer=None,
                    error=_with_packing(o.error, packing),
                )
                for o in outputs
            ]
            group = pack_group(outputs, rollout_indices=indices, example_id=example_id)
            nbytes = await sender.asend(group)
            progress.repacked += 1
        progress.groups += 1
        progress.bytes_sent += nbytes
        for output in outputs:
            progress.rollouts += 1
            if output.error:
                progress.errors += 1
            elif output.reward is not None:
                progress.rewards.append(output.reward)
        if on_progress is not None:
            on_progress(progress)

    async def collect(output: Any, rollout_index: int) -> None:
        # evaluate hands over a group's rollouts one after another once it is scored
        done = pending.setdefault(output.example_id, [])
        done.append((rollout_index, output))
        if len(done) == rollouts_per_example:
            del pending[output.example_id]
            await deliver(output.example_id, done)

    await env.evaluate(
        client,
        rows=rows,
        rollouts_per_example=rollouts_per_example,
        concurrency=concurrency,
        sampling_args=sampling_args,
        seed=seed,
        on_result=collect,
    )
    for example_id, done in list(pending.items()):  # never expected; never dropped either
        del pending[example_id]
        await deliver(example_id, done)
    return progress


def _with_packing(error: Any, packing: RolloutError) -> RolloutError:
    """The rollout's own error (any form a ``RolloutOutput`` may hold), with why its group
    was sent stripped added to ``where``; or the packing failure itself."""
    own = RolloutError.coerce(error) if error else None
    if own is None:
        return packing
    return RolloutError(own.type, own.message, f"{own.where}; {packing}".lstrip("; "))
