"""``TRLRollouts``: TRL's ``rollout_func``, answered by a vf_mm environment.

TRL 1.16's ``GRPOTrainer`` hands its ``rollout_func(prompts, trainer)`` one prompt per
completion it wants (each example repeated ``num_generations`` times, consecutively)
and takes back, per completion, ``prompt_ids``, ``completion_ids``, ``logprobs`` and
``env_mask`` (1 on the tokens the model sampled); every other key goes to the reward
functions. Here each completion is one vf_mm rollout of the example the prompt stands
for (``examples``, set by ``vf_mm.integrations.trl.GRPOTrainer`` from the batch's
``EXAMPLE_COLUMN``): the environment's own loop, vf_mm's renderer and bridging, the
environment's rubric scoring each example's rollouts as a group, and vf_mm's
``LocalBackend`` sampling in process.

What holds, and why:

- **The sampler samples the trainer's policy.** Before the first batch and whenever
  TRL's ``global_step`` moved since the last one, the trainer's weights go into the
  sampler (``LocalBackend.load_weights``), so every rollout of a step is sampled by the
  weights that step trains.
- **Sampling follows the ``GRPOConfig``**: its ``temperature``, ``top_p``, ``top_k`` and
  ``min_p`` (TRL's loss divides the logits by that temperature: a sampler at another
  would be off policy); ``max_tokens`` per model turn is the environment's sampling
  args' (or ``sampling_args=``), else ``max_completion_length``. Each rollout has its
  own seed, from the config's ``seed``, the step, the example and the rollout.
- **One rollout is one TRL row**: its steps merged as ``vf_mm.training.build_samples``
  merges them (the first turn's prompt is TRL's prompt, everything after it the
  completion; the loss mask is 1 exactly on sampled tokens, with the sampler's
  logprobs there and 0 elsewhere), with every image's model inputs, in token order, kept
  in ``records`` for the trainer's forward (the images never reach TRL's processor).
- **A rollout that cannot be trained on fails alone**: one that failed in the
  environment, whose steps do not extend each other (TRL takes one sequence per
  completion; its error says where and why, ``vf_mm.training.history_break``: most
  often the template re-rendering the model's own turn, not the environment) or that
  holds videos (TRL 1.16's
  forward takes no video inputs) becomes a row of one pad and one end token with
  nothing to learn (``env_mask`` 0) and reward None, which TRL keeps out of its group's
  mean and gives advantage 0; its error is in ``outputs`` / ``errors`` and logged. A
  first batch in which every rollout failed is refused (``TrajectoryError``, naming the
  first failure): before anything trained, that is an environment, rubric or template
  that cannot work (a run would train on nothing for as long as it lasts). Once a batch
  has trained, such a batch is logged and trains on nothing, so a flaky environment
  does not end a long run.

``outputs`` holds the last batch's scored rollouts (``RolloutOutput``), in TRL's row
order, for the reward function and for users who want to look.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import zlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vf_mm.client import RendererClient
from vf_mm.errors import TrajectoryError
from vf_mm.inference import LocalBackend, SamplingParams
from vf_mm.training import build_samples, history_break
from vf_mm.types import RolloutOutput

logger = logging.getLogger(__name__)

#: the column of the train dataset that names each row's example (its index in the
#: environment's rows); TRL passes it to the trainer with the batch
EXAMPLE_COLUMN = "vf_mm_example"
#: the keys of what a batch's rows carry to the reward function besides TRL's own
REWARD_KEY, METRICS_KEY, ERROR_KEY = "vf_mm_reward", "vf_mm_metrics", "vf_mm_error"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One TRL row as the trainer's forward needs it: its tokens (to check the row it is
    handed is this one), the sampler's logprobs and loss mask over the completion, each
    image's model inputs in the order their tokens appear, where it is in the batch
    (``index`` into ``TRLRollouts.outputs``) and its name in errors (``source``)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    images: list[dict[str, np.ndarray]]
    index: int
    source: str


class TRLRollouts:
    """TRL's ``rollout_func`` over ``env``'s ``rows``, sampling with a ``LocalBackend``.

    Module docstring: what holds.

    Args:
        env: The vf_mm environment.
        model: The checkpoint the ``LocalBackend`` samples with (built on the first call, on
            the trainer's device unless ``backend_options`` name one).
        rows: The training rows; a prompt's example is its index in them.
        sampling_args: Sampling over the environment's defaults (checked now).
        backend_options: ``LocalBackend`` keyword arguments.
        image_backend: The renderer's image processing (``"auto"``, ``"pil"``,
            ``"torchvision"``).
        family: The checkpoint's ``model_type``: the trainer rebuilds the forward's image
            inputs for it.
    """

    def __init__(
        self,
        env: Any,
        model: str | Path,
        rows: Sequence[Mapping[str, Any]],
        *,
        sampling_args: Mapping[str, Any] | None = None,
        backend_options: Mapping[str, Any] | None = None,
        image_backend: str = "auto",
        family: str,
    ) -> None:
        self.env = env
        self.model = Path(model)
        self.rows = rows
        self.family = family
        self.sampling_args = dict(sampling_args or {})
        env.sampling(self.sampling_args)  # refuse unknown or bad sampling args now
        self.backend_options = dict(backend_options or {})
        self.image_backend = image_backend
        #: the example (index into ``rows``) of each prompt of the next call, in order
        self.examples: list[int] | None = None
        self.records: list[Record] = []
        self.outputs: list[RolloutOutput] = []
        self.synced_step: int | None = None  # the trainer step whose weights sample now
        self.trained = False  # whether a batch had a rollout to train on
        self._client: RendererClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.vision: Any = None
        self._pad_id = 0
        self._eos_id = 0
        self._decode: Callable[[list[int]], str] | None = None

    # -- what TRL calls ------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        from vf_mm.integrations.trl._trainer import GRPOTrainer

        if not isinstance(trainer, GRPOTrainer):
            raise TypeError(
                "this rollout_func feeds vf_mm.integrations.trl.GRPOTrainer (TRL's "
                "GRPOTrainer with the sampler's image inputs in its forward), not "
                f"{type(trainer).__module__}.{type(trainer).__name__}: "
                "from vf_mm.integrations.trl import GRPOTrainer"
            )
        examples = self.examples
        self.examples = None
        if examples is None or len(examples) != len(prompts):
            raise TypeError(
                f"{len(prompts)} prompts but {0 if examples is None else len(examples)} "
                f"example ids: the batch must come from trl_inputs(...)['train_dataset'] "
                f"(its {EXAMPLE_COLUMN!r} column names each row's example)"
            )
        if self._client is None:
            self._start(trainer)
        self._sync_weights(trainer)
        sampling = self._sampling(trainer.args)
        step = int(trainer.state.global_step)
        outputs = self._run(self._schedule(examples, sampling, int(trainer.args.seed), step))
        self.outputs = outputs
        self.records = []
        errors: list[str | None] = []
        seen: collections.Counter[int] = collections.Counter()
        for index, (output, example) in enumerate(zip(outputs, examples, strict=True)):
            source = f"example {output.example_id!r}, rollout {seen[example]}"
            seen[example] += 1
            record, error = self._record(output, index, source)
            self.records.append(record)
            errors.append(error)
        args: Any = trainer.args  # a GRPOConfig
        if args.mask_truncated_completions:
            ends = trainer.completion_ends()
            self.records = [self._unmasked(r, ends) for r in self.records]
        failed = [e for e in errors if e is not None]
        if failed and len(failed) == len(errors) and not self.trained:
            raise TrajectoryError(
                f"every rollout of the first batch failed ({len(failed)}), so it has no "
                f"token to learn from; the first: {failed[0]}"
            )
        for error in dict.fromkeys(failed):
            logger.warning("vf_mm: a rollout is left out of training: %s", error)
        self.trained = self.trained or len(failed) < len(errors)
        return {
            "prompt_ids": [r.prompt_ids for r in self.records],
            "completion_ids": [r.completion_ids for r in self.records],
            "logprobs": [r.logprobs for r in self.records],
            "env_mask": [r.env_mask for r in self.records],
            REWARD_KEY: [
                None if e is not None else o.reward for o, e in zip(outputs, errors, strict=True)
            ],
            METRICS_KEY: [dict(o.metrics) for o in outputs],
            ERROR_KEY: errors,
        }

    def close(self) -> None:
        """Stop the sampler (its thread and model) and the event loop the rollouts run on."""
        if self._client is not None and self._loop is not None:
            self._run(self._client.aclose())
            self._client = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join()
            self._loop.close()
            self._loop = None

    # -- the sampler ---------------------------------------------------------------------

    def _start(self, trainer: Any) -> None:
        """The event loop (in a thread of its own: TRL calls from synchronous code) and
        the client: a renderer pool and a ``LocalBackend`` on the checkpoint."""
        from vf_mm.renderers import RendererPool, load_renderer

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vf_mm-trl-rollouts", daemon=True
        )
        self._thread.start()
        options = {"device": str(trainer.accelerator.device), **self.backend_options}
        backend = LocalBackend(self.model, **options)
        pool = RendererPool(
            lambda: load_renderer(self.model, image_backend=self.image_backend), size=2
        )
        self._client = RendererClient(backend, pool)
        with pool.renderer() as renderer:
            self.vision = getattr(renderer, "vision", None)
            tokenizer = renderer.tokenizer
        self._decode = tokenizer.decode
        self._eos_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else self._eos_id

    def _sync_weights(self, trainer: Any) -> None:
        """The trainer's weights into the sampler, once per trainer step."""
        step = int(trainer.state.global_step)
        if self.synced_step == step:
            return
        assert self._client is not None
        backend = self._client.backend
        assert isinstance(backend, LocalBackend)
        model = trainer.accelerator.unwrap_model(trainer.model)
        weights = {k: v.detach() for k, v in model.state_dict().items()}
        try:
            backend.load_weights(weights)
        except RuntimeError as exc:  # the state dict's keys or shapes are not the sampler's
            raise TypeError(
                f"the trainer's model is not the architecture of {self.model} (the "
                f"checkpoint given to trl_inputs, which samples): its weights do not load "
                f"there ({str(exc).splitlines()[0]})"
            ) from None
        self.synced_step = step

    def _sampling(self, args: Any) -> SamplingParams:
        """The environment's sampling with the ``GRPOConfig``'s sampling rules (module
        docstring)."""
        base = self.env.sampling(self.sampling_args)
        explicit = {**getattr(self.env, "sampling_args", {}), **self.sampling_args}
        max_tokens = base.max_tokens
        if "max_tokens" not in explicit and args.max_completion_length is not None:
            max_tokens = args.max_completion_length
        return dataclasses.replace(
            base,
            max_tokens=int(max_tokens),
            temperature=float(args.temperature),
            top_p=float(args.top_p),
            top_k=int(args.top_k or 0),
            min_p=float(args.min_p or 0.0),
            logprobs=True,
        )

    # -- the rollouts --------------------------------------------------------------------

    async def _schedule(
        self, examples: list[int], sampling: SamplingParams, seed: int, step: int
    ) -> list[RolloutOutput]:
        """Every prompt's rollout, run concurrently; each run of consecutive prompts of one
        example is a group, scored together by the rubric. Outputs in prompt order."""
        assert self._client is not None
        client = self._client
        runs: list[list[int]] = []
        for position, example in enumerate(examples):
            if runs and examples[runs[-1][0]] == example:
                runs[-1].append(position)
            else:
                runs.append([position])

        async def group(positions: list[int]) -> list[RolloutOutput]:
            example = examples[positions[0]]
            row = self.rows[example]
            example_id = row.get("example_id", example)
            states = await asyncio.gather(
                *(
                    self.env.rollout(
                        client,
                        row,
                        example_id=example_id,
                        rollout_index=k,
                        sampling=dataclasses.replace(
                            sampling, seed=zlib.crc32(f"{seed}:{step}:{example}:{k}".encode())
                        ),
                    )
                    for k in range(len(positions))
                )
            )
            outputs: list[RolloutOutput] = await self.env.score(states)
            return outputs

        results = await asyncio.gather(*(group(run) for run in runs))
        return [output for outputs in results for output in outputs]

    def _record(self, output: RolloutOutput, index: int, where: str) -> tuple[Record, str | None]:
        """The TRL row of one scored rollout (row ``index`` of the batch, named ``where``),
        and why it is left out of training (None when it is not)."""
        error = None if output.error is None else f"{where}: {output.error}"
        sample = None
        if error is None:
            vision = self.vision
            try:
                samples = build_samples(
                    output,
                    advantage=0.0,
                    image_token_id=vision.image_token_id if vision is not None else -1,
                    video_token_id=None if vision is None else vision.video_embed_token_id,
                )
            except TrajectoryError as exc:
                error = f"{where}: {exc}"
            else:
                if len(samples) != 1:
                    why = history_break(output, decode=self._decode)
                    error = (
                        f"{where}: its {len(output.trajectory)} turns make {len(samples)} "
                        f"sequences, and TRL takes one sequence per completion: {why}"
                    )
                elif samples[0].videos:
                    error = (
                        f"{where}: it holds videos, and TRL 1.16's forward takes no video "
                        "inputs (pixel_values_videos)"
                    )
                else:
                    sample = samples[0]
        if sample is None:
            empty = Record([self._pad_id], [self._eos_id], [0.0], [0], [], index, where)
            return empty, error or f"{where}: the rollout has no model turn"
        split = len(output.trajectory[0].tokens.prompt_ids)  # type: ignore[union-attr]
        mask = sample.loss_mask[split:]
        record = Record(
            prompt_ids=sample.input_ids[:split].tolist(),
            completion_ids=sample.input_ids[split:].tolist(),
            logprobs=np.where(mask > 0, sample.logprobs[split:], 0.0).tolist(),
            env_mask=mask.astype(np.int64).tolist(),
            images=sample.images,
            index=index,
            source=where,
        )
        return record, None

    def _unmasked(self, record: Record, ends: set[int]) -> Record:
        """``record``, or, when TRL's ``mask_truncated_completions`` will zero the attention
        over its completion (it does not end with an end token) and that completion holds
        images, a row with nothing to learn in its place: TRL trains on neither, and
        Qwen's M-RoPE skips masked tokens but not their images' grids, so every later
        row's images would silently take another image's grid. Its reward still counts
        in its group, as TRL counts a masked completion's."""
        if not record.completion_ids or record.completion_ids[-1] in ends:
            return record
        embeds = set(self.vision.embed_token_ids) if self.vision is not None else set()
        if not embeds.intersection(record.completion_ids):
            return record
        return Record([self._pad_id], [self._eos_id], [0.0], [0], [], record.index, record.source)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
