"""``evaluate_to_dir``: run an environment's evaluation into a results directory.

What ``vf-mm eval`` does, without the terminal: open (or resume) the results store,
skip the (example, rollout) pairs already written, run the rest concurrently, append
each rollout as its example's group is scored, then write the aggregates. A progress
callback sees every stored rollout; the CLI draws its progress bar from it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf_mm.results._reader import iter_results, read_metadata
from vf_mm.results._summary import summarize
from vf_mm.results._writer import ResultsWriter
from vf_mm.videos import VideoLimits


@dataclass(slots=True)
class EvalProgress:
    """Counts so far, handed to the progress callback after each stored rollout.

    Running sums only, so it costs the same after a million rollouts as after one.

    Attributes:
        total: Rollouts in the whole run; None when the dataset is streamed.
        done_before: Already in the directory when a resumed run started.
        done: Stored by this run.
        errors: This run's rollouts that failed.
        reward_sum: Over this run's rollouts with a reward.
        rewarded: This run's rollouts with a reward.
        started: When the run started (``time.perf_counter()``).
    """

    total: int | None  # rollouts in the whole run; None when the dataset is streamed
    done_before: int  # already in the directory when a resumed run started
    done: int = 0  # stored by this run
    errors: int = 0
    reward_sum: float = 0.0  # over this run's rollouts with a reward
    rewarded: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0


async def evaluate_to_dir(
    env: Any,
    client: Any,
    outdir: str | Path,
    *,
    metadata: Mapping[str, Any],
    num_examples: int = -1,
    rollouts_per_example: int = 1,
    concurrency: int = 32,
    sampling_args: Mapping[str, Any] | None = None,
    seed: int | None = None,
    resume: bool = False,
    retry_errors: bool = True,
    max_errors: int | None = None,
    on_progress: Callable[[EvalProgress], None] | None = None,
    config_defaults: Mapping[str, Any] | None = None,
    video_limits: VideoLimits | None = None,
    workers: Any = None,
    shard: Any = None,
) -> dict[str, Any]:
    """Evaluate ``env`` with ``client`` into ``outdir``; return the aggregates.

    The aggregates, written to metadata.json, are ``summarize`` of every row, this run's and
    earlier ones. A failed rollout is a row with its error, never the end of the run. Stored
    media are read under the client's renderer's image policy (``RendererClient.media_rules``).

    Args:
        env: The environment.
        client: The ``RendererClient`` (None with ``workers``).
        outdir: The run directory.
        metadata: Describes the run (see ``ResultsWriter``).
        num_examples: How many rows (-1: all).
        rollouts_per_example: Rollouts per row.
        concurrency: The most rollouts running at once.
        sampling_args: Sampling over the environment's defaults.
        seed: Seeds sampling per rollout.
        resume: Continue the run in ``outdir``, running the failed rollouts again.
        retry_errors: False keeps a resumed run's failed rollouts as they are.
        max_errors: Stops the run once this many of this run's rollouts have failed (a
            broken environment should not burn a GPU hour): the rollouts in flight are
            cancelled, everything stored so far stays (a later ``resume`` continues), and
            the aggregates say why in ``"stopped"`` (null for a run that finished).
        on_progress: Called with an ``EvalProgress`` after each stored rollout.
        config_defaults: See ``ResultsWriter``.
        video_limits: What a stored clip may cost to load (default: the client's
            renderer's); see ``ResultsWriter``.
        workers: A started ``vf_mm.workers.WorkerPool`` that runs the rollouts in its
            workers (``client`` may then be None: the pool's media rules and summed client
            counts stand in for the client's); every rollout is still written here, once.
        shard: A ``vf_mm.workers.Shard``; only the examples whose id falls in it run
            (``vf-mm merge`` joins the shards' directories).

    Raises:
        ResumeMismatchError: ``resume`` with a different run configuration.
        ResultsError: An outdir already holding results (without ``resume``), or held by
            another writer.
    """
    if max_errors is not None and max_errors < 1:
        raise ValueError(f"max_errors must be >= 1, got {max_errors}")
    outdir = Path(outdir)
    earlier = _earlier_client_stats(outdir) if resume else {}
    runner = workers if workers is not None else client
    # stored media are read under the renderer's rules unless told otherwise
    policy, renderer_limits = getattr(runner, "media_rules", (None, None))
    with ResultsWriter(
        outdir,
        resume=resume,
        retry_errors=retry_errors,
        metadata=dict(metadata),
        config_defaults=config_defaults,
        policy=policy,
        video_limits=video_limits if video_limits is not None else renderer_limits,
    ) as writer:
        # rows are read as the run has room for them, never listed: a dataset of any size
        rows: Iterable[Any] = env.iter_eval_dataset(num_examples)
        example_ids: Iterable[Any] | None = None
        holds = shard.holds if shard is not None else None
        if shard is not None:
            rows, example_ids = shard.select(rows)
        examples = env.eval_dataset_size(num_examples, holds=holds)
        progress = EvalProgress(
            total=examples * rollouts_per_example if examples is not None else None,
            done_before=len(writer.done),
        )
        if on_progress is not None:
            on_progress(progress)

        stopped: list[str] = []

        async def store(output: Any, rollout_index: int) -> None:
            # the row written says whether it failed (the writer records content it cannot
            # store as an error); PNGs encode off the event loop
            row = await writer.awrite(output, rollout_index=rollout_index)
            progress.done += 1
            if row["error"]:
                progress.errors += 1
            elif row["reward"] is not None:
                progress.reward_sum += row["reward"]
                progress.rewarded += 1
            if on_progress is not None:
                on_progress(progress)
            if max_errors is not None and progress.errors >= max_errors and not stopped:
                planned = (
                    f" of {progress.total - progress.done_before}"
                    if progress.total is not None
                    else ""
                )
                stopped.append(
                    f"stopped after {progress.errors} failed rollouts (--max-errors "
                    f"{max_errors}); {progress.done}{planned} done"
                )
                run.cancel()

        options: dict[str, Any] = {
            "rows": rows,
            "example_ids": example_ids,
            "rollouts_per_example": rollouts_per_example,
            "concurrency": concurrency,
            "sampling_args": sampling_args,
            "seed": seed,
            "skip": writer.done,
            "on_result": store,
            "keep_outputs": False,  # each is written, then released
        }
        run = asyncio.ensure_future(
            # process workers store the assets themselves: the same files, none encoded here
            workers.evaluate(env, **options, assets_dir=outdir)
            if workers is not None
            else env.evaluate(client, **options)
        )
        try:
            await run
        except asyncio.CancelledError:
            if not stopped:
                raise
        # the one reader, streamed: the rows are summed as they are read, never held
        aggregates = summarize(iter_results(outdir))
        aggregates["stopped"] = stopped[0] if stopped else None
        aggregates["time_s"] = time.perf_counter() - progress.started
        stats = getattr(runner, "stats", None)
        if stats is not None:  # the whole run's: earlier sessions' counts plus this one's
            fallbacks = Counter(earlier.get("fallbacks") or {})
            fallbacks.update(dict(stats.fallbacks))
            aggregates["client"] = {
                "turns": stats.turns + int(earlier.get("turns") or 0),
                "bridges": stats.bridges + int(earlier.get("bridges") or 0),
                "renders": stats.renders + int(earlier.get("renders") or 0),
                "fallbacks": dict(fallbacks),
            }
        writer.finalize(aggregates)
    return aggregates


def _earlier_client_stats(outdir: Path) -> dict[str, Any]:
    """The client counts a resumed run's earlier sessions stored (``{}`` if none)."""
    try:
        results = read_metadata(outdir).get("results") or {}
    except (OSError, ValueError):  # no run there yet, or a metadata file the writer refuses
        return {}
    client = results.get("client")
    return client if isinstance(client, dict) else {}
