"""Training samples: a rollout's steps, merged where they extend each other.

A step *extends* the previous one when its prompt starts with the previous prompt and
completion tokens (bridging guarantees this across ordinary turns). Extending steps
merge into one sample: the whole token sequence once, with

- ``loss_mask`` 1 exactly on the tokens the model sampled (each step's completion where
  its ``completion_mask`` is 1), 0 on prompts and on what the environment inserted;
- ``logprobs``: the sampler's log-probability at each sampled token, 0 elsewhere;
- ``advantages``: the rollout's advantage on sampled tokens, 0 elsewhere;
- ``mm_token_type_ids``: 1 on image pad tokens, 2 on video pad tokens;
- ``pixel_values`` / ``image_grid_thw``: every image of the sample, concatenated in
  placeholder order (the last merged step's multi-modal data covers all of them).

A step that does not extend the previous one (the environment compacted or rewrote the
history) starts a new sample. ``Sample.validate`` checks what a trainer relies on: pad
tokens match the images' grids, placeholders lie inside the sequence, logprobs sit only
on sampled tokens; a failure names the rollout and step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vf_mm.errors import TrajectoryError
from vf_mm.types import MultiModalData


@dataclass(slots=True)
class Sample:
    """One training sequence (numpy arrays; the batcher makes tensors)."""

    input_ids: np.ndarray  # int64 (T,)
    loss_mask: np.ndarray  # int8 (T,)
    logprobs: np.ndarray  # float32 (T,)
    advantages: np.ndarray  # float32 (T,)
    mm_token_type_ids: np.ndarray  # int8 (T,)
    pixel_values: np.ndarray | None  # (sum patches, dim) or None for text-only
    image_grid_thw: np.ndarray | None  # (images, 3) int64
    placeholders: list[tuple[int, int]] = field(default_factory=list)  # (offset, length)
    source: str = ""  # "example E, rollout R, steps A-B": named in every error

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_multimodal(self) -> bool:
        return self.pixel_values is not None

    def validate(self, *, image_token_id: int, merge_size: int = 2) -> None:
        n = self.num_tokens
        for name in ("loss_mask", "logprobs", "advantages", "mm_token_type_ids"):
            if getattr(self, name).shape != (n,):
                raise TrajectoryError(
                    f"{self.source}: {name} has shape {getattr(self, name).shape}, not ({n},)"
                )
        pads = int(np.count_nonzero(self.input_ids == image_token_id))
        expected = (
            0
            if self.image_grid_thw is None
            else int(self.image_grid_thw.prod(axis=1).sum()) // merge_size**2
        )
        if pads != expected:
            raise TrajectoryError(
                f"{self.source}: {pads} image pad tokens but the images' grids need {expected}"
            )
        for offset, length in self.placeholders:
            if offset < 0 or offset + length > n:
                raise TrajectoryError(
                    f"{self.source}: placeholder ({offset}, {length}) outside {n} tokens"
                )
        if np.any((self.loss_mask == 0) & (self.logprobs != 0)):
            raise TrajectoryError(f"{self.source}: logprobs on tokens the model did not sample")
        if not np.all(np.isfinite(self.logprobs[self.loss_mask == 1])):
            raise TrajectoryError(f"{self.source}: a sampled token has no finite logprob")
        if self.pixel_values is not None and self.image_grid_thw is not None:
            rows = int(self.image_grid_thw.prod(axis=1).sum())
            if self.pixel_values.shape[0] != rows:
                raise TrajectoryError(
                    f"{self.source}: pixel_values has {self.pixel_values.shape[0]} rows, grids need {rows}"
                )


def build_samples(
    rollout: Any,
    *,
    advantage: float,
    image_token_id: int,
    video_token_id: int | None = None,
    example_id: Any = None,
    rollout_index: Any = None,
) -> list[Sample]:
    """The samples of one rollout (an object or dict with ``trajectory``/``steps`` whose
    entries have ``tokens`` or token fields). Steps without tokens are refused: an
    API backend's turns cannot be trained on."""
    steps = _steps(rollout)
    samples: list[Sample] = []
    start = 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or not _extends(steps[i - 1], steps[i]):
            where = f"example {example_id}, rollout {rollout_index}, steps {start}-{i - 1}"
            samples.append(_merge(steps[start:i], advantage, image_token_id, video_token_id, where))
            start = i
    return samples


def _steps(rollout: Any) -> list[dict[str, Any]]:
    raw = (
        rollout.get("steps") if isinstance(rollout, dict) else getattr(rollout, "trajectory", None)
    )
    if raw is None and isinstance(rollout, dict):
        raw = rollout.get("trajectory")
    out = []
    for i, step in enumerate(raw or []):
        tokens = step.get("tokens", step) if isinstance(step, dict) else step.tokens
        if tokens is None:
            raise TrajectoryError(
                f"step {i} has no token ids (a message-level backend): not trainable"
            )
        get = tokens.get if isinstance(tokens, dict) else lambda k, t=tokens: getattr(t, k)
        mm = (
            get("multi_modal_data")
            if _has(tokens, "multi_modal_data")
            else step.get("multi_modal_data")
        )
        out.append(
            {
                "prompt_ids": list(get("prompt_ids")),
                "completion_ids": list(get("completion_ids")),
                "completion_logprobs": list(get("completion_logprobs")),
                "completion_mask": list(get("completion_mask")),
                "mm": mm,
            }
        )
    return out


def _has(obj: Any, key: str) -> bool:
    return key in obj if isinstance(obj, dict) else hasattr(obj, key)


def _extends(previous: dict[str, Any], step: dict[str, Any]) -> bool:
    head = previous["prompt_ids"] + previous["completion_ids"]
    return step["prompt_ids"][: len(head)] == head


def _merge(
    steps: Sequence[dict[str, Any]],
    advantage: float,
    image_token_id: int,
    video_token_id: int | None,
    where: str,
) -> Sample:
    last = steps[-1]
    ids = last["prompt_ids"] + last["completion_ids"]
    n = len(ids)
    loss_mask = np.zeros(n, dtype=np.int8)
    logprobs = np.zeros(n, dtype=np.float32)
    for step in steps:
        begin = len(step["prompt_ids"])
        comp, lps, mask = (
            step["completion_ids"],
            step["completion_logprobs"],
            step["completion_mask"],
        )
        if not len(comp) == len(lps) == len(mask):
            raise TrajectoryError(f"{where}: completion ids, logprobs and mask differ in length")
        for j, (m, lp) in enumerate(zip(mask, lps, strict=True)):
            if m:
                if lp is None or not math.isfinite(lp):
                    raise TrajectoryError(f"{where}: sampled token {begin + j} has logprob {lp!r}")
                loss_mask[begin + j] = 1
                logprobs[begin + j] = lp
    input_ids = np.asarray(ids, dtype=np.int64)
    types = np.zeros(n, dtype=np.int8)
    types[input_ids == image_token_id] = 1
    if video_token_id is not None:
        types[input_ids == video_token_id] = 2
    pixel_values = grids = None
    placeholders: list[tuple[int, int]] = []
    data = last["mm"]
    if data is not None:
        data = data if isinstance(data, MultiModalData) else MultiModalData.from_dict(data)
        data.validate(len(last["prompt_ids"]))
        items = data.mm_items.get("image", [])
        if items:
            pixel_values = np.concatenate([np.asarray(it["pixel_values"]) for it in items])
            grids = np.concatenate(
                [np.asarray(it["image_grid_thw"]).reshape(-1, 3) for it in items]
            )
            grids = grids.astype(np.int64, copy=False)
        ranges = data.mm_placeholders.get("image", [])
        if any(r.is_embed is not None for r in ranges):  # a sample keeps (offset, length)
            raise TrajectoryError(
                f"{where}: an image placeholder marks only some of its positions as "
                "embeddings (is_embed); training samples do not carry that mask yet"
            )
        placeholders = [(r.offset, r.length) for r in ranges]
    return Sample(
        input_ids=input_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        advantages=(loss_mask * np.float32(advantage)).astype(np.float32),
        mm_token_type_ids=types,
        pixel_values=pixel_values,
        image_grid_thw=grids,
        placeholders=placeholders,
        source=where,
    )


def group_advantages(
    rewards: Sequence[float], *, eps: float = 1e-4, scale: bool = True
) -> list[float]:
    """GRPO advantages: each reward minus its group's mean (over the std when ``scale``)."""
    values = np.asarray(rewards, dtype=np.float64)
    centered = values - values.mean()
    if scale:
        centered = centered / (values.std() + eps)
    return centered.tolist()
