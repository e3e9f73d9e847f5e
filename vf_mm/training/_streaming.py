"""``stream_rollouts``: run an environment's train split and send each scored group to a trainer.

The producer half of training (``vf-mm rollout`` is this plus a terminal). Each example's
rollouts are packed into one group frame (``pack_group``: each distinct image's tensors
once) as soon as the group is scored, and sent through a ``GroupSender``. When the
trainer is slow, the send blocks, which holds back the rollouts behind it: memory stays
bounded. A rollout that failed is sent too, with its ``error`` set; a group that cannot be
packed is sent stripped to its scores, with the reason as each rollout's error. Nothing
is dropped.

Each group carries its rollouts' advantages, computed here by default (``advantages=
"grpo"``: ``group_advantages`` over the group's rewards, a failed rollout's None, and
the frame's ``advantage_method`` ``"grpo"``): the whole group is in hand when it is
packed, which is all GRPO's normalisation needs, and a trainer can then pass
``rollout.advantage`` to ``build_samples`` as it comes. ``advantages="none"`` leaves
them out for a trainer that computes its own (another estimator, or normalisation over
a whole batch) from the rewards every group carries; ``build_samples`` then refuses a
rollout until the trainer gives it one.

Every group carries an id, ``f"{run_id}/{example_id}"``, so that a trainer takes it
exactly once: the sender holds it until the trainer has committed it and sends it again
to a trainer that restarted, and the trainer skips an id it has committed (a worker
restarted with the same arguments sends its groups again, with the same ids). ``run_id``
names the run; when none is given it is derived from what defines the run's groups, so
that the same arguments give the same ids (``run_id_for``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vf_mm.errors import TransportError
from vf_mm.training._groups import pack_group
from vf_mm.training._images import IMAGE_MODES, ImageProcessing
from vf_mm.training._samples import group_advantages
from vf_mm.training._store import ImageStore
from vf_mm.types import RolloutError

#: ``stream_rollouts(advantages=...)``: who computes the advantages (module docstring)
ADVANTAGE_METHODS = ("grpo", "none")


@dataclasses.dataclass(slots=True)
class RolloutProgress:
    """Counts so far, handed to the progress callback after each sent group.

    Attributes:
        total_groups: None: a streamed dataset, whose size is known at its end.
        groups: Groups sent.
        rollouts: Rollouts sent.
        errors: Rollouts sent with an error.
        truncated: Rollouts that ran out of context (scored on what they have).
        repacked: Groups sent stripped because packing or encoding them failed.
        flat_groups: Groups whose scored rollouts all got the same reward: their GRPO
            advantages are all 0, so they teach nothing (every group, when the rubric has
            no reward function).
        bytes_sent: Bytes sent.
        reward_sum: Over the rollouts with a reward (a running sum: no list kept).
        rewarded: Rollouts with a reward.
        started: When the run started (``time.perf_counter()``).
        run_id: The run's groups are ``f"{run_id}/{example_id}"``.
        stopped: Why ``max_errors`` ended the run early (None: it did not).
    """

    total_groups: int | None  # None: a streamed dataset, whose size is known at its end
    groups: int = 0
    rollouts: int = 0
    errors: int = 0  # rollouts sent with an error
    truncated: int = 0  # rollouts that ran out of context (scored on what they have)
    repacked: int = 0  # groups sent stripped because packing or encoding them failed
    flat_groups: int = 0  # groups whose scored rewards are all equal: advantages all 0
    bytes_sent: int = 0
    reward_sum: float = 0.0  # over the rollouts with a reward (a running sum: no list kept)
    rewarded: int = 0
    started: float = dataclasses.field(default_factory=time.perf_counter)
    run_id: str | None = None  # the run's groups are f"{run_id}/{example_id}"
    stopped: str | None = None  # why max_errors ended the run early (None: it did not)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

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
    run_id: str | None = None,
    workers: Any = None,
    shard: Any = None,
    images: str = "tensors",
    image_processing: Any = None,
    image_store: Any = None,
    advantages: str = "grpo",
    max_errors: int | None = None,
) -> RolloutProgress:
    """Run the train split's groups and send each through ``sender`` once it is scored.

    Each group's id is ``f"{run_id}/{example_id}"`` (its frame's ``group_id``, which
    ``GroupSender`` sends it under), so a worker restarted with the same arguments sends
    the same ids and the trainer skips those it already has.

    Args:
        env: The environment.
        client: The ``RendererClient`` (None with ``workers``).
        sender: A ``GroupSender``.
        num_examples: How many rows (-1: all).
        rollouts_per_example: The group size.
        concurrency: The most rollouts running at once.
        sampling_args: Sampling over the environment's defaults.
        seed: Seeds sampling per rollout.
        on_progress: Called with a ``RolloutProgress`` after each sent group.
        run_id: Names the run; ``None`` derives one from the environment, its rows, the
            group size, the sampling arguments and the seed (``run_id_for``). Two passes
            over the same examples that a trainer should both train on (epochs, a new
            policy) need different run ids: pass one (or a different seed).
        workers: A started ``vf_mm.workers.WorkerPool`` that runs the rollouts in its
            workers (``client`` may then be None; the pool's media rules stand in for the
            client's); every group is still packed and sent here, once.
        shard: A ``vf_mm.workers.Shard``; only the examples whose id falls in it run (the
            run id is the whole run's, so shards of one run share it and their group ids
            never collide).
        images: How each group carries its images (``pack_group``'s image modes:
            ``"tensors"``, ``"encoded"``, ``"ref"``).
        image_processing: Recorded by ``"encoded"`` and ``"ref"``: an ``ImageProcessing``
            or its description; by default the client's renderer's, or with ``workers`` the
            one their renderers report.
        image_store: Where ``"ref"`` writes.
        advantages: ``"grpo"`` (the default) fills each rollout's advantage with
            ``group_advantages`` of its group's rewards (None for a failed rollout) and
            records ``advantage_method="grpo"`` in the frame; ``"none"`` sends no
            advantages, for a trainer that computes its own (module docstring).
        max_errors: Stop the run once that many rollouts have been sent with an error
            (``evaluate_to_dir``'s rule): the group that reached it is sent whole, no new
            rollout starts, and ``progress.stopped`` says why; the caller closes
            ``sender`` with that reason, so the trainer's end marker says the stream ended
            early.
    """
    if max_errors is not None and max_errors < 1:
        raise ValueError(f"max_errors must be >= 1, got {max_errors}")
    if advantages not in ADVANTAGE_METHODS:
        raise ValueError(f"advantages must be one of {list(ADVANTAGE_METHODS)}, not {advantages!r}")
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {list(IMAGE_MODES)}, not {images!r}")
    if images != "tensors" and image_processing is None:
        if workers is not None:  # what the workers' renderers process with, as they said
            image_processing = getattr(workers, "image_processing", None)
        else:
            vision = getattr(client, "vision", None)
            image_processing = None if vision is None else ImageProcessing.from_vision(vision)
        if image_processing is None:
            raise ValueError(
                f'images="{images}" needs a renderer with vision (the client\'s or the '
                "workers'), or image_processing= (an ImageProcessing built as the renderer was)"
            )
    if images == "ref" and image_store is None:
        raise ValueError('images="ref" needs image_store= (an ImageStore or its directory)')
    if images == "ref" and not isinstance(image_store, ImageStore):
        image_store = ImageStore(image_store)  # made once: the directory is created here
    modes: dict[str, Any] = {}
    if images != "tensors":
        modes = {"images": images, "processing": image_processing, "store": image_store}
    if run_id is None:  # one pass over the rows to name the run, then the run's own pass
        run_id = run_id_for(
            env, env.iter_dataset(num_examples), rollouts_per_example=rollouts_per_example,
            sampling_args=sampling_args, seed=seed,
        )  # fmt: skip
    elif not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_id must be a non-empty str, got {run_id!r}")
    # rows are read as the run has room for them, never listed: a dataset of any size
    rows: Iterable[Any] = env.iter_dataset(num_examples)
    example_ids: Iterable[Any] | None = None
    if shard is not None:
        rows, example_ids = shard.select(rows)
    total = env.dataset_size(num_examples, holds=shard.holds if shard is not None else None)
    progress = RolloutProgress(total_groups=total, run_id=run_id)
    # media are read again to hash them into group frames: under the renderer's rules
    runner = workers if workers is not None else client
    policy, video_limits = getattr(runner, "media_rules", (None, None))
    pending: dict[Any, list[tuple[int, Any]]] = {}
    if on_progress is not None:
        on_progress(progress)

    async def deliver(example_id: Any, done: list[tuple[int, Any]]) -> None:
        done.sort(key=lambda pair: pair[0])
        indices = [index for index, _ in done]
        outputs = [output for _, output in done]
        group_id = f"{run_id}/{example_id}"
        try:
            scores: dict[str, Any] = {}
            if advantages == "grpo":
                scores["advantages"] = group_advantages([o.reward for o in outputs])
                scores["advantage_method"] = advantages
            group = await asyncio.to_thread(
                pack_group, outputs, rollout_indices=indices, example_id=example_id,
                policy=policy, video_limits=video_limits, group_id=group_id, **modes, **scores,
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
            group = pack_group(
                outputs, rollout_indices=indices, example_id=example_id, group_id=group_id
            )
            nbytes = await sender.asend(group)
            progress.repacked += 1
        progress.groups += 1
        progress.flat_groups += _flat(outputs)
        progress.bytes_sent += nbytes
        for output in outputs:
            progress.rollouts += 1
            progress.truncated += bool(output.truncated)
            if output.error:
                progress.errors += 1
            elif output.reward is not None:
                progress.reward_sum += output.reward
                progress.rewarded += 1
        if on_progress is not None:
            on_progress(progress)
        if max_errors is not None and progress.errors >= max_errors and progress.stopped is None:
            planned = "" if progress.total_groups is None else f" of {progress.total_groups}"
            progress.stopped = (
                f"stopped after {progress.errors} failed rollouts (--max-errors {max_errors}); "
                f"{progress.groups}{planned} groups sent"
            )
            run.cancel()

    async def collect(output: Any, rollout_index: int) -> None:
        # evaluate hands over a group's rollouts one after another once it is scored
        done = pending.setdefault(output.example_id, [])
        done.append((rollout_index, output))
        if len(done) == rollouts_per_example:
            del pending[output.example_id]
            await deliver(output.example_id, done)

    options: dict[str, Any] = {
        "rows": rows,
        "example_ids": example_ids,
        "rollouts_per_example": rollouts_per_example,
        "concurrency": concurrency,
        "sampling_args": sampling_args,
        "seed": seed,
        "on_result": collect,
    }
    run = asyncio.ensure_future(
        workers.evaluate(env, **options) if workers is not None else env.evaluate(client, **options)
    )
    try:
        await run
    except asyncio.CancelledError:
        if progress.stopped is None:
            raise
        return progress  # the groups still running were never scored: none is sent
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


def run_id_for(
    env: Any,
    rows: Iterable[Mapping[str, Any]],
    *,
    rollouts_per_example: int = 1,
    sampling_args: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> str:
    """The run id ``stream_rollouts`` derives when given none (``"<env_id>-<12 hex>"``).

    The hex is a sha256 over what decides the run's groups. The same arguments give the
    same id, in any process. What it cannot see it leaves out: the model, the
    environment's arguments beyond what shows in its rows, and anything that differs
    between two runs that share all of the above; a caller that knows more (a CLI with its
    whole configuration) should pass its own ``run_id``.

    Args:
        env: The environment (its ``env_id`` and ``sampling_args``).
        rows: The rows: each row's values as JSON; a value JSON cannot hold, such as an
            image, by its type and size only; a string over 4096 characters, such as a
            ``data:`` URL, by its length and its first and last 256.
        rollouts_per_example: The group size.
        sampling_args: Merged over the environment's.
        seed: The run's seed.
    """
    sampling = {**getattr(env, "sampling_args", {}), **dict(sampling_args or {})}
    spec = {
        "env": getattr(env, "env_id", type(env).__name__),
        "rollouts_per_example": rollouts_per_example,
        "sampling": sampling,
        "seed": seed,
    }
    digest = hashlib.sha256(_canonical(spec).encode())
    for row in rows:
        digest.update(b"\n")
        digest.update(_canonical(row).encode())
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(spec["env"]))[:64]
    return f"{name or 'run'}-{digest.hexdigest()[:12]}"


_LONG = 4096  # characters: a longer string counts by its length and its ends


def _canonical(value: Any) -> str:
    """``value`` as JSON with sorted keys; what JSON cannot hold counts by its type."""
    return json.dumps(_plain(value), sort_keys=True, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it, at a bounded cost: a long string (a ``data:`` URL)
    by its length and ends, an object JSON cannot hold by its type (and shape, if any)."""
    if isinstance(value, str) and len(value) > _LONG:
        return f"<str {len(value)} {value[:256]}...{value[-256:]}>"
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    shape = getattr(value, "shape", getattr(value, "size", None))
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return f"<{kind} {shape!r}>" if isinstance(shape, tuple) else f"<{kind}>"


def _flat(outputs: Sequence[Any]) -> bool:
    """Whether a group's scored rewards are all equal (at least one scored): GRPO gives
    every rollout of it advantage 0, so a run of such groups trains on nothing."""
    rewards = {o.reward for o in outputs if o.reward is not None and not o.error}
    return len(rewards) == 1
