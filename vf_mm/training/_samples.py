"""Training samples: a rollout's steps, merged where they extend each other.

A step *extends* the previous one when its prompt starts with the previous prompt and
completion tokens (bridging guarantees this across ordinary turns). Extending steps
merge into one sample: the whole token sequence once, with

- ``loss_mask`` 1 exactly on the tokens the model sampled (each step's completion where
  its ``completion_mask`` is 1), 0 on prompts and on what the environment inserted;
- ``logprobs``: the sampler's log-probability at each sampled token, 0 elsewhere;
- ``advantages``: the rollout's advantage on sampled tokens, 0 elsewhere (a finite number:
  a missing or NaN advantage is refused, since it would turn the loss into NaN and cost
  the run; ``group_advantages`` computes them);
- ``mm_token_type_ids``: 1 on image tokens, 2 on video pad tokens;
- ``images``: every image's model inputs (``pixel_values``, ``image_grid_thw``, ...), in
  placeholder order (the last merged step's multi-modal data covers all of them), and
  ``placeholders`` their ranges (with ``is_embed`` where an image's span holds tokens
  that are not embeddings, e.g. Gemma 3's begin/end markers).

A step that does not extend the previous one (the environment compacted or rewrote the
history) starts a new sample. ``Sample.validate`` checks what a trainer relies on: image
tokens sit exactly at the placeholders' embedding positions (and match Qwen's grids),
placeholders lie inside the sequence, logprobs sit only on sampled tokens; a failure
names the rollout and step.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vf_mm.errors import TrajectoryError
from vf_mm.types import MultiModalData, PlaceholderRange


@dataclass(slots=True)
class Sample:
    """One training sequence (numpy arrays; the batcher makes tensors).

    Attributes:
        input_ids: int64 ``(T,)``.
        loss_mask: int8 ``(T,)``: 1 on the tokens the model sampled.
        logprobs: float32 ``(T,)``: the sampler's, on the sampled tokens.
        advantages: float32 ``(T,)``.
        mm_token_type_ids: int8 ``(T,)``.
        images: Each image's model inputs, in order.
        placeholders: One per image.
        source: ``"example E, rollout R, steps A-B"``: named in every error.
        videos: Each video's model inputs, in order.
        video_placeholders: One per video.
    """

    input_ids: np.ndarray  # int64 (T,)
    loss_mask: np.ndarray  # int8 (T,)
    logprobs: np.ndarray  # float32 (T,)
    advantages: np.ndarray  # float32 (T,)
    mm_token_type_ids: np.ndarray  # int8 (T,)
    images: list[dict[str, np.ndarray]] = field(default_factory=list)  # model inputs, in order
    placeholders: list[PlaceholderRange] = field(default_factory=list)  # one per image
    source: str = ""  # "example E, rollout R, steps A-B": named in every error
    videos: list[dict[str, np.ndarray]] = field(default_factory=list)  # model inputs, in order
    video_placeholders: list[PlaceholderRange] = field(default_factory=list)  # one per video

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_multimodal(self) -> bool:
        return bool(self.images) or bool(self.videos)

    @property
    def pixel_values(self) -> np.ndarray | None:
        """Every image's ``pixel_values`` concatenated along axis 0 (the Qwen-VL and Gemma
        layouts); None for text, or when the images' tiles do not stack that way (the
        forward's layout is ``vf_mm.models.model_inputs``'s)."""
        return concat_images(self.images, "pixel_values")

    @property
    def image_grid_thw(self) -> np.ndarray | None:
        """Qwen-VL: every image's grid, ``(images, 3)`` int64 (None for text or other
        families)."""
        grids = concat_images(self.images, "image_grid_thw")
        return None if grids is None else grids.reshape(-1, 3).astype(np.int64, copy=False)

    def validate(
        self,
        *,
        image_token_id: int,
        merge_size: int = 2,
        video_token_id: int | None = None,
        video_pooled_chunks: bool = False,
    ) -> None:
        """Check the sample's rules.

        Parallel arrays, one placeholder per image, pads matching grids, logprobs only on
        sampled tokens.

        Args:
            image_token_id: The id at an image's embedding positions.
            merge_size: The vision tower's spatial merge (Qwen-VL: 2).
            video_token_id: The id at a clip's embedding positions; needed when the sample
                has videos.
            video_pooled_chunks: The family's tower pools each ``video_grid_thw`` row's
                frames into one frame's tokens (``VisionFamily.video_pooled_chunks``:
                Kimi-K2.5), so a row ``(t, h, w)`` fills ``h * w / merge_size**2`` video
                tokens; ``make_batches`` passes its family's.

        Raises:
            TrajectoryError: A rule broken, naming the sample.
        """
        n = self.num_tokens
        for name in ("loss_mask", "logprobs", "advantages", "mm_token_type_ids"):
            if getattr(self, name).shape != (n,):
                raise TrajectoryError(
                    f"{self.source}: {name} has shape {getattr(self, name).shape}, not ({n},)"
                )
        if len(self.images) != len(self.placeholders):
            raise TrajectoryError(
                f"{self.source}: {len(self.images)} images but {len(self.placeholders)} placeholders"
            )
        if self.videos and video_token_id is None:  # first: the token counts below need it
            raise TrajectoryError(
                f"{self.source}: the sample has videos: pass video_token_id (the model's "
                "<|video_pad|> id; SmolVLM and GLM-4.6V: the image's, renderer.vision."
                "video_embed_token_id)"
            )
        for p in self.placeholders:
            if p.offset < 0 or p.end > n:
                raise TrajectoryError(
                    f"{self.source}: placeholder ({p.offset}, {p.length}) outside {n} tokens"
                )
        pads = int(np.count_nonzero(self.input_ids == image_token_id))
        expected = sum(p.num_embeds for p in self.placeholders)
        grids = self.image_grid_thw
        if grids is not None:
            expected = int(grids.prod(axis=1).sum()) // merge_size**2
        if video_token_id == image_token_id:  # a clip's frames hold it (SmolVLM, GLM-4.6V)
            expected += sum(p.num_embeds for p in self.video_placeholders)
        if pads != expected:
            what = "the images' grids" if grids is not None else "the placeholders"
            raise TrajectoryError(f"{self.source}: {pads} image tokens but {what} need {expected}")
        for p in self.placeholders:
            if not np.all(self.input_ids[p.embed_positions()] == image_token_id):
                raise TrajectoryError(
                    f"{self.source}: placeholder ({p.offset}, {p.length}) has embedding "
                    "positions that do not hold the image token"
                )
        if np.any((self.loss_mask == 0) & (self.logprobs != 0)):
            raise TrajectoryError(f"{self.source}: logprobs on tokens the model did not sample")
        if not np.all(np.isfinite(self.logprobs[self.loss_mask == 1])):
            raise TrajectoryError(f"{self.source}: a sampled token has no finite logprob")
        if not np.all(np.isfinite(self.advantages)):
            raise TrajectoryError(
                f"{self.source}: its advantages are not all finite numbers (build samples "
                "with a finite advantage: vf_mm.training.group_advantages)"
            )
        if grids is not None:  # Qwen-VL: the patch rows are the grids' product
            pixel_values = self.pixel_values
            rows = int(grids.prod(axis=1).sum())
            if pixel_values is None or pixel_values.shape[0] != rows:
                raise TrajectoryError(
                    f"{self.source}: pixel_values has "
                    f"{None if pixel_values is None else pixel_values.shape[0]} rows, grids need {rows}"
                )
        self._validate_videos(video_token_id, merge_size, image_token_id, video_pooled_chunks)

    def item_order(self) -> list[str]:
        """Each image's and video's modality, in the order their tokens appear."""
        ranges = [(p.offset, "image") for p in self.placeholders]
        ranges += [(p.offset, "video") for p in self.video_placeholders]
        return [modality for _, modality in sorted(ranges)]

    def _validate_videos(
        self, video_token_id: int | None, merge_size: int, image_token_id: int, pooled: bool
    ) -> None:
        """Each video's placeholder, pads and inputs agree (Qwen-VL: grids and patch rows,
        Kimi-K2.5's ``pooled`` chunks one frame's tokens each; LLaVA-OneVision, SmolVLM: the
        placeholders' embeddings)."""
        n = self.num_tokens
        if len(self.videos) != len(self.video_placeholders):
            raise TrajectoryError(
                f"{self.source}: {len(self.videos)} videos but "
                f"{len(self.video_placeholders)} video placeholders"
            )
        if not self.videos and video_token_id is None:
            return
        assert video_token_id is not None  # validate() refused videos without it
        for p in self.video_placeholders:
            if p.offset < 0 or p.end > n:
                raise TrajectoryError(
                    f"{self.source}: video placeholder ({p.offset}, {p.length}) outside {n} tokens"
                )
            if not np.all(self.input_ids[p.embed_positions()] == video_token_id):
                raise TrajectoryError(
                    f"{self.source}: video placeholder ({p.offset}, {p.length}) has embedding "
                    "positions that do not hold the video token"
                )
            if not np.all(self.mm_token_type_ids[p.embed_positions()] == 2):
                raise TrajectoryError(
                    f"{self.source}: video placeholder ({p.offset}, {p.length}) is not marked "
                    "2 in mm_token_type_ids (M-RoPE would place the clip as text)"
                )
        if video_token_id == image_token_id:
            return  # SmolVLM: validate() counted images' and clips' shared token together
        pads = int(np.count_nonzero(self.input_ids == video_token_id))
        if any("video_grid_thw" not in v for v in self.videos):  # LLaVA-OneVision's frames
            expected = sum(p.num_embeds for p in self.video_placeholders)
            if pads != expected:
                raise TrajectoryError(
                    f"{self.source}: {pads} video tokens but the placeholders need {expected}"
                )
            return
        grids = concat_images(self.videos, "video_grid_thw")
        grids = np.zeros((0, 3), np.int64) if grids is None else grids.reshape(-1, 3)
        # a pooled chunk (t, h, w) fills one frame's h * w / merge^2 tokens
        per_row = grids[:, 1:].prod(axis=1) if pooled else grids.prod(axis=1)
        expected = int(per_row.sum()) // merge_size**2
        if pads != expected:
            raise TrajectoryError(
                f"{self.source}: {pads} video tokens but the videos' grids need {expected}"
            )
        rows = int(grids.prod(axis=1).sum())
        pixels = concat_images(self.videos, "pixel_values_videos")
        if self.videos and (pixels is None or pixels.shape[0] != rows):
            raise TrajectoryError(
                f"{self.source}: pixel_values_videos has "
                f"{None if pixels is None else pixels.shape[0]} rows, grids need {rows}"
            )


def concat_images(images: Sequence[dict[str, np.ndarray]], name: str) -> np.ndarray | None:
    """The images' ``name`` inputs concatenated along axis 0, or None when an image lacks
    it or their other axes differ (tiles of different counts: SmolVLM, LLaVA-OneVision)."""
    if not images or any(name not in image for image in images):
        return None
    arrays = [np.asarray(image[name]) for image in images]
    if len({a.shape[1:] for a in arrays}) != 1:
        return None
    return np.concatenate(arrays)


def build_samples(
    rollout: Any,
    *,
    advantage: float,
    image_token_id: int,
    video_token_id: int | None = None,
    example_id: Any = None,
    rollout_index: Any = None,
) -> list[Sample]:
    """The samples of one rollout.

    Steps without tokens are refused: an API backend's turns cannot be trained on.
    ``group_advantages`` computes a group's advantages; a failed rollout has none (its
    reward is None) and is skipped, not trained on.

    Args:
        rollout: An object or dict with ``trajectory``/``steps`` whose entries have
            ``tokens`` or token fields.
        advantage: Must be a finite number: every sampled token carries it into the loss,
            so a None or NaN would make the loss NaN with no error.
        image_token_id: The id at an image's embedding positions.
        video_token_id: The id at a clip's embedding positions.
        example_id: Names the rollout in errors (default: the rollout's own).
        rollout_index: Names the rollout in errors (default: the rollout's own).

    Raises:
        TrajectoryError: A bad advantage, a step without tokens, or steps that disagree,
            naming the rollout.
    """
    for name, value in (("image_token_id", image_token_id), ("video_token_id", video_token_id)):
        if value is None and name == "video_token_id":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"build_samples: {name} must be a token id (an int), not {value!r}")
    if example_id is None:
        example_id = _field(rollout, "example_id")
    if rollout_index is None:
        rollout_index = _field(rollout, "rollout_index")
    advantage = _check_advantage(
        rollout, advantage, f"example {example_id}, rollout {rollout_index}"
    )
    steps = _steps(rollout)
    samples: list[Sample] = []
    start = 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or not _extends(steps[i - 1], steps[i]):
            where = f"example {example_id}, rollout {rollout_index}, steps {start}-{i - 1}"
            samples.append(_merge(steps[start:i], advantage, image_token_id, video_token_id, where))
            start = i
    return samples


def _field(rollout: Any, name: str) -> Any:
    return rollout.get(name) if isinstance(rollout, dict) else getattr(rollout, name, None)


def _check_advantage(rollout: Any, advantage: Any, where: str) -> float:
    """``advantage`` as a float, or ``TrajectoryError`` saying why it is none and how to
    get one."""
    if advantage is None:
        error = _field(rollout, "error")
        if error:
            raise TrajectoryError(
                f"{where}: advantage is None because the rollout failed ({error}): training "
                "skips failed rollouts (rollout.error is not None), never trains on them"
            )
        raise TrajectoryError(
            f"{where}: advantage is None (a group streamed with vf-mm rollout --advantages "
            "none, or packed without advantages=): compute the group's advantages with "
            "vf_mm.training.group_advantages([r.reward for r in group]) and pass each "
            "rollout's as build_samples(..., advantage=...)"
        )
    scalar = tuple(getattr(advantage, "shape", (None,))) == ()  # a 0-d array or tensor
    if isinstance(advantage, bool) or not (isinstance(advantage, numbers.Real) or scalar):
        raise TrajectoryError(
            f"{where}: advantage must be a real number, not {type(advantage).__name__}"
        )
    value = float(advantage)
    if not math.isfinite(value):
        raise TrajectoryError(
            f"{where}: advantage is {value}, not a finite number (its group's rewards? "
            "vf_mm.training.group_advantages refuses a NaN or infinite reward)"
        )
    return value


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
        get: Callable[[str], Any] = (
            tokens.get if isinstance(tokens, dict) else functools.partial(getattr, tokens)
        )
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
    if video_token_id is not None and video_token_id != image_token_id:
        types[input_ids == video_token_id] = 2
    images: list[dict[str, np.ndarray]] = []
    placeholders: list[PlaceholderRange] = []
    videos: list[dict[str, np.ndarray]] = []
    video_placeholders: list[PlaceholderRange] = []
    data = last["mm"]
    if data is not None:
        data = data if isinstance(data, MultiModalData) else MultiModalData.from_dict(data)
        data.validate(len(last["prompt_ids"]))
        unknown = set(data.modalities) - {"image", "video"}
        if unknown:
            raise TrajectoryError(f"{where}: modalities {sorted(unknown)} cannot be trained on")

        def arrays(modality: str) -> list[dict[str, np.ndarray]]:
            return [
                {name: np.asarray(value) for name, value in item.items()}
                for item in data.mm_items.get(modality, [])
            ]

        images, videos = arrays("image"), arrays("video")
        if videos and video_token_id is None:
            # without it the video tokens would be marked as text (mm_token_type_ids 0):
            # M-RoPE would place every clip as text, and every logprob after it changes
            raise TrajectoryError(
                f"{where}: the rollout holds videos: pass build_samples(..., "
                "video_token_id=...) (renderer.vision.video_embed_token_id: <|video_pad|>, "
                "or the image token where a clip holds it)"
            )
        placeholders = list(data.mm_placeholders.get("image", []))
        video_placeholders = list(data.mm_placeholders.get("video", []))
        if video_token_id == image_token_id:  # SmolVLM's frames hold the image token
            for p in video_placeholders:
                types[p.embed_positions()] = 2
        # every position an item's embeddings fill must be marked as that item's kind: a
        # wrong token id marks none of them, and the trainer's forward would then run the
        # images as text with no error (logprobs off, nothing refused)
        for code, name, given, ranges in (
            (1, "image_token_id", image_token_id, placeholders),
            (2, "video_token_id", video_token_id, video_placeholders),
        ):
            for p in ranges:
                marked = types[p.embed_positions()]
                if not bool((marked == code).all()):
                    found = sorted({int(t) for t in input_ids[p.embed_positions()]})
                    raise TrajectoryError(
                        f"{where}: {name}={given!r} does not mark the tokens of the item at "
                        f"offset {p.offset} (they are {found[:3]}): pass the model's own id "
                        "(the renderer's vision spec, or the model config's "
                        f"{name.removesuffix('_id')}_index)"
                    )
    return Sample(
        input_ids=input_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        advantages=(loss_mask * np.float32(advantage)).astype(np.float32),
        mm_token_type_ids=types,
        images=images,
        placeholders=placeholders,
        source=where,
        videos=videos,
        video_placeholders=video_placeholders,
    )


def group_advantages(
    rewards: Sequence[float | None], *, eps: float = 1e-4, scale: bool = True
) -> list[float | None]:
    """GRPO's group-normalised advantages of one example's rollouts, in order.

    Each reward minus the mean of the group's rewards, divided by their (population)
    standard deviation plus ``eps`` when ``scale``.

    A reward of None (a rollout that failed, or that nobody scored) gets advantage None and
    takes no part in the mean or the deviation: a failed rollout is skipped by training,
    never averaged in as if it had scored 0. A group whose rewards are all equal (a group
    of one included) has advantage 0 for each: there is nothing to learn from it, and no
    division by a zero deviation. An empty group gives ``[]``.

    Args:
        rewards: The group's rewards.
        eps: Added to the deviation.
        scale: False: centred only, as Dr. GRPO.

    Raises:
        TrajectoryError: A reward that is not a finite number (NaN, infinity, a string),
            naming its position: it would turn every advantage of the group, and then the
            loss, into NaN.
    """
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (eps >= 0):
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    rewards = list(rewards)
    scored: list[float] = []
    for i, reward in enumerate(rewards):
        if reward is None:
            continue
        scalar = tuple(getattr(reward, "shape", (None,))) == ()  # a 0-d array or tensor
        if not isinstance(reward, numbers.Real) and not scalar:  # a bool is 0 or 1
            raise TrajectoryError(
                f"reward {i} of the group is a {type(reward).__name__}, not a number"
            )
        if not math.isfinite(float(reward)):
            raise TrajectoryError(
                f"reward {i} of the group is {float(reward)}, not a finite number: a failed "
                "score is recorded as None (the rollout is then skipped), never as NaN"
            )
        scored.append(float(reward))
    values = np.asarray(scored, dtype=np.float64)
    if not scored or np.all(values == values[0]):  # no signal, and never 0 / 0
        centered = np.zeros_like(values)
    else:
        # scaled to the largest magnitude first: the mean and the deviation of rewards
        # near the float range (1e200) would overflow to inf and give 0 or NaN advantages
        size = float(np.max(np.abs(values)))
        unit = values / size
        centered = (unit - unit.mean()) * size
        if scale:
            centered = (unit - unit.mean()) / (unit.std() + eps / size)
    out = iter(centered.tolist())
    return [None if reward is None else next(out) for reward in rewards]
