"""``GRPOTrainer``: TRL 1.16's ``GRPOTrainer``, its forward fed the sampler's image inputs.

TRL builds the image inputs of its forward itself: it runs its processor on the
dataset's ``image`` / ``images`` columns and the chat-templated *first* prompt, and
extends the per-token type ids of that prompt with zeros over the completion. Images
that arrive in later turns (an environment's answer, a tool result) then have tokens
but no features ("Image features and image tokens do not match"), and M-RoPE would
place them as text; SmolVLM's processor call needs a video processor (torchvision), and
LLaVA-OneVision's returns ``batch_num_images``, which TRL passes to a function that
does not take it. The public ``rollout_func`` cannot hand TRL image inputs, and TRL
shuffles and splits a generated batch before the loss, so nothing but the batch's own
entries can say which images a row has.

So this subclass overrides three methods of TRL 1.16.0 (its version is checked, since
the three are private), and nothing else:

- ``_generate_and_score_completions``: tells the rollout function which example each
  prompt is (the batch's ``EXAMPLE_COLUMN``) and adds each row's ``Record`` (tokens,
  sampler logprobs, every image's model inputs) to the generated batch under
  ``ROWS_KEY``, a list TRL shuffles and splits along with the rows;
- ``_compute_loss``: makes the records of the rows it is handed the ones the forward
  uses;
- ``_get_per_token_logps_and_entropies``: builds the image inputs of each chunk of rows
  from their records (``vf_mm.models.model_inputs``: exactly the tensors the sampler
  used, type ids from the tokens over the whole sequence), after checking each row's
  tokens are its record's (a row out of step is a ``TrajectoryError``, never a silent
  mix-up), then runs TRL's own. Outside the loss (TRL's old-policy and reference
  forwards) the rows are the batch the rollout function just returned, in its order.

It also logs the sampler/trainer mismatch over the sampled tokens
(``vf_mm.training.logprob_mismatch``) as ``vf_mm/mismatch_kl`` and
``vf_mm/logprob_diff_max`` (each micro-batch's largest, averaged over the logging
interval as TRL averages its metrics), from each loss forward whose weights are the
ones that sampled (the trainer step the sampler last synced: with ``num_iterations`` > 1
or ``steps_per_generation`` above the accumulation steps, later passes over a batch
train a policy that has moved on, and their gap is that move, not a mismatch), when the
config's temperature is 1 (the sampler's logprobs are the model's raw ones; TRL
divides the logits by the temperature).

Settings whose TRL code path builds its forward another way, or samples with its own
engine, are refused at construction with what to do instead (``REFUSED``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import trl

from vf_mm.errors import MissingDependencyError, TrajectoryError
from vf_mm.integrations.trl._rollouts import EXAMPLE_COLUMN, Record, TRLRollouts

#: the TRL versions whose private methods this subclass overrides (tested: 1.16.0)
TRL_VERSIONS = ("1.16.",)
#: the key of a generated batch that holds each row's ``Record``
ROWS_KEY = "vf_mm_rows"
#: the forward inputs TRL's ``_get_per_token_logps_and_entropies`` takes for images
_MEDIA = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
    "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip


#: TRL's GRPOTrainer parameters, in order (for settings given by position)
_PARAMETERS = tuple(inspect.signature(trl.GRPOTrainer.__init__).parameters)[1:]


def _refusals(args: Any, tools: Any, environment_factory: Any) -> list[str]:
    """What in the trainer's settings this integration cannot honour, each with why."""
    out: list[str] = []
    if args is None:  # TRL's defaults
        return out
    if args.use_vllm:
        out.append(
            "use_vllm=True: vf_mm samples the rollouts itself (its LocalBackend, weights "
            "synced every step); leave use_vllm off"
        )
    if getattr(args, "use_liger_kernel", False):
        out.append(
            "use_liger_kernel=True: TRL's Liger loss runs its own forward, without the "
            "rollouts' image inputs"
        )
    if args.repetition_penalty != 1.0:
        out.append(
            f"repetition_penalty={args.repetition_penalty}: vf_mm's sampler has no "
            "repetition penalty, and TRL's loss would not see one"
        )
    if args.generation_kwargs:
        out.append(
            "generation_kwargs: they configure TRL's own generation, which the rollouts "
            "replace (sampling follows temperature, top_p, top_k and min_p)"
        )
    if args.off_policy_mask_threshold is not None and args.temperature != 1.0:
        out.append(
            "off_policy_mask_threshold with temperature != 1: it compares the sampler's "
            "logprobs (the model's raw ones) with TRL's tempered ones"
        )
    if tools or environment_factory is not None:
        out.append(
            "tools / environment_factory: TRL's own tool loop; a vf_mm environment's tools "
            "run in its rollouts (vf.ToolEnv)"
        )
    return out


class GRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc, unused-ignore]  # (misc: where trl is installed)
    """TRL's ``GRPOTrainer``, trained on a vf_mm environment's rollouts: construct it
    with ``**trl_inputs(env, model_dir)`` (the module docstring says what differs from
    TRL's, and why)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        version = trl.__version__
        if not version.startswith(TRL_VERSIONS):
            raise MissingDependencyError(
                f"vf_mm.integrations.trl overrides private methods of TRL's GRPOTrainer as "
                f"TRL {', '.join(v + 'x' for v in TRL_VERSIONS)} has them, and TRL {version} "
                "is installed: pip install 'vf-mm[trl]' (trl==1.16.0)"
            )
        named = dict(zip(_PARAMETERS, args, strict=False)) | kwargs
        if not isinstance(named.get("rollout_func"), TRLRollouts):
            raise TypeError(
                "vf_mm.integrations.trl.GRPOTrainer trains on a vf_mm environment: pass "
                "**trl_inputs(env, model_dir) (its rollout_func and train_dataset)"
            )
        refused = _refusals(named.get("args"), named.get("tools"), named.get("environment_factory"))
        if refused:
            raise ValueError(
                "GRPOConfig settings vf_mm's rollouts cannot honour:\n- " + "\n- ".join(refused)
            )
        super().__init__(*args, **kwargs)
        self._vf_mm_rows: list[Record] | None = None

    # -- the three overrides -------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        rollouts = self.rollouts
        try:
            rollouts.examples = [int(x[EXAMPLE_COLUMN]) for x in inputs]
        except KeyError:
            raise TypeError(
                f"a batch without the {EXAMPLE_COLUMN!r} column: train on "
                "trl_inputs(env, model_dir)['train_dataset'] (an eval_dataset too must be one "
                "of trl_inputs')"
            ) from None
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        output[ROWS_KEY] = list(rollouts.records)
        return output

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        with self._rows(inputs[ROWS_KEY]):
            loss: torch.Tensor = super()._compute_loss(model, inputs)
        return loss

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **media: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        given = sorted(k for k, v in media.items() if v is not None)
        if given:  # TRL processed images itself: the dataset was not trl_inputs'
            raise TrajectoryError(
                f"TRL built image inputs of its own ({', '.join(given)}): train on "
                "trl_inputs(...)['train_dataset'], whose images reach the forward from the "
                "rollouts"
            )
        in_loss = self._vf_mm_rows is not None
        rows = self._vf_mm_rows if in_loss else self.rollouts.records
        assert rows is not None
        if len(rows) != input_ids.shape[0]:
            raise TrajectoryError(
                f"the forward got {input_ids.shape[0]} rows but the batch holds "
                f"{len(rows)} rollouts"
            )
        step = batch_size or input_ids.shape[0]
        logps, entropies, aux = [], [], []
        for start in range(0, input_ids.shape[0], step):
            end = min(start + step, input_ids.shape[0])
            chunk = rows[start:end]
            ids = input_ids[start:end]
            _check_rows(chunk, ids, logits_to_keep, start)
            lp, ent, ax = super()._get_per_token_logps_and_entropies(
                model,
                ids,
                attention_mask[start:end],
                logits_to_keep,
                batch_size=end - start,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **self._media(chunk, ids),
            )
            logps.append(lp)
            if ent is not None:
                entropies.append(ent)
            if ax is not None:
                aux.append(ax)
        out = torch.cat(logps)
        on_policy = self.state.global_step == self.rollouts.synced_step
        if in_loss and on_policy and cast(trl.GRPOConfig, self.args).temperature == 1.0:
            self._log_mismatch(rows, out, logits_to_keep)
        return (
            out,
            torch.cat(entropies) if entropies else None,
            torch.stack(aux).mean() if aux else None,
        )

    # -- helpers -------------------------------------------------------------------------

    @property
    def rollouts(self) -> TRLRollouts:
        """The rollout function (``trl_inputs``'), typed."""
        return cast(TRLRollouts, self.rollout_func)

    def completion_ends(self) -> set[int]:
        """The tokens TRL takes as a completion's end (``mask_truncated_completions`` masks
        a completion that ends otherwise): the model's end tokens and the pad token."""
        return {*self.eos_token_ids, self._tokenizer.pad_token_id}

    @contextlib.contextmanager
    def _rows(self, rows: list[Record]) -> Iterator[None]:
        self._vf_mm_rows = rows
        try:
            yield
        finally:
            self._vf_mm_rows = None

    def _media(self, rows: Sequence[Record], ids: torch.Tensor) -> dict[str, Any]:
        """The image inputs TRL's forward takes for ``rows`` (``ids``, padded as TRL
        padded them): the records' images in token order, through the family's
        ``model_inputs``, and how many each row has."""
        vision = self.rollouts.vision
        if vision is None:  # a text model
            return {}
        from vf_mm.models import model_inputs

        images = [image for row in rows for image in row.images]
        inputs = model_inputs(
            self.rollouts.family, ids.cpu(), images, image_token_ids=vision.embed_token_ids
        )
        inputs.pop("batch_num_images", None)  # LLaVA-OneVision: None = each image anyres, as 1
        media = {k: v.to(ids.device) for k, v in inputs.items() if k in _MEDIA}
        if images:
            media["num_images"] = [len(row.images) for row in rows]
            if _tile_indexed(inputs, len(images)):
                # TRL splits tile-indexed pixels (InternVL's, LFM2-VL's) by each row's tiles
                media["num_tiles"] = [
                    sum(len(image["pixel_values"]) for image in row.images) for row in rows
                ]
        return media

    def _log_mismatch(self, rows: Sequence[Record], logps: torch.Tensor, width: int) -> None:
        """``vf_mm/mismatch_kl`` and ``vf_mm/logprob_diff_max`` of this forward's
        completions against the sampler's logprobs."""
        from vf_mm.training import MicroBatch, logprob_mismatch

        shape = (len(rows), width)
        sampler = torch.zeros(shape, dtype=torch.float32)
        mask = torch.zeros(shape, dtype=torch.float32)
        for i, row in enumerate(rows):
            n = len(row.completion_ids)
            sampler[i, :n] = torch.tensor(row.logprobs, dtype=torch.float32)
            mask[i, :n] = torch.tensor(row.env_mask, dtype=torch.float32)
        zeros = torch.zeros(shape, dtype=torch.long)
        batch = MicroBatch(
            input_ids=zeros, attention_mask=zeros, loss_mask=mask, logprobs=sampler,
            advantages=mask * 0, mm_token_type_ids=zeros, images=None,
            sources=[row.source for row in rows],
        )  # fmt: skip
        stats = logprob_mismatch(batch, logps.detach().float().cpu())
        mode = "train" if self.model is not None and self.model.training else "eval"
        self._metrics[mode]["vf_mm/mismatch_kl"].append(stats["mismatch_kl"])
        self._metrics[mode]["vf_mm/logprob_diff_max"].append(stats["max_abs_diff"])


def _tile_indexed(inputs: dict[str, Any], images: int) -> bool:
    """Whether ``pixel_values`` holds a row per tile rather than per image (InternVL,
    LFM2-VL): TRL's forward then needs ``num_tiles`` to give each row its own. Qwen's
    rows are patches, told by ``image_grid_thw``; Gemma 4's carry ``image_position_ids``.
    LFM2-VL's always count as tiles (TRL's forward splits any batch with
    ``spatial_shapes`` by ``num_tiles``), even when every image is one crop."""
    pixels = inputs.get("pixel_values")
    if pixels is None or "image_grid_thw" in inputs or "image_position_ids" in inputs:
        return False
    if "spatial_shapes" in inputs:
        return True
    return bool(pixels.ndim in (3, 4) and pixels.shape[0] != images)


def _check_rows(rows: Sequence[Record], ids: torch.Tensor, width: int, first: int) -> None:
    """Each row of ``ids`` (prompt left-padded, completion right-padded, ``width`` the
    completion part) holds its record's tokens: the forward's images are that row's."""
    split = ids.shape[1] - width
    for i, row in enumerate(rows):
        prompt, completion = row.prompt_ids, row.completion_ids
        got_prompt = ids[i, split - len(prompt) : split].tolist()
        got_completion = ids[i, split : split + len(completion)].tolist()
        if got_prompt != prompt or got_completion != completion:
            raise TrajectoryError(
                f"row {first + i} of TRL's forward does not hold the tokens of its rollout "
                f"({row.source}): the batch's rows and their images are out of step"
            )
