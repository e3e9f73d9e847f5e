"""The training wire form of rollouts: one frame per example's group, images and videos
stored once.

``pack_group(outputs)`` turns the rollouts of one example (a GRPO group) into one plain
dict for ``vf_mm.wire.packb`` / ``write_stream``; ``unpack_group(frame)`` turns a decoded
frame back into ``TrainingRollout`` objects (``RolloutOutput`` with ``rollout_index`` and
``advantage``) whose steps carry a ``MultiModalData`` equal to what the renderer made:
the same hashes, placeholders and items.

Each distinct image's or video's tensors travel **once per group**, keyed by its
``mm_hash``; steps refer to items by hash *and* position. So the bytes grow with the
number of distinct images and videos, never with turns x items, whatever the steps do:
plain extension (each turn adds an image), branching (rollouts, or steps of one rollout, that
share a prefix), compaction (a later step drops earlier images: its sidecar is *not* a
superset of the previous one) and repeats (the same image twice in a step is two entries
with one hash). Nothing rests on "the last step holds every image" (the assumption that
lost images for verifiers once rollouts compacted or branched), and the only copy of the
tensors is the group's item table (the ``images`` field, which holds every modality's
items: images and videos): steps and messages hold hashes, never pixels.

Frame schema (``format`` ``"vf_mm.group/1"``)::

    {"format": "vf_mm.group/1",
     "example_id": int | str,
     "images": {mm_hash: {"pixel_values": array, "image_grid_thw": array, ...}},
                        # every item, once per hash, as the renderer made it (any keys):
                        # images and videos ({"pixel_values_videos", "video_grid_thw",
                        # ...}); a step's mm says which modality a hash is
     "rollouts": [
        {"rollout_index": int,
         "reward": float | None, "metrics": {str: float},
         "error": {"type", "message", "where"} | None,
         "answer": Any, "info": dict,
         "advantage": float,            # only when pack_group got advantages
         "prompt": messages, "completion": messages,
                        # image parts -> {"type": "image_ref", "hash": h},
                        # video parts -> {"type": "video_ref", "hash": h}; see below
         "steps": [
            # a step with tokens (a token-level backend):
            {"prompt_ids": int32 array (int64 if an id needs it),
             "completion_ids": int32/int64 array,
             "completion_logprobs": float64 array,   # exactly the floats given (NaN kept)
             "completion_mask": uint8 array,
             "finish_reason": str | None,
             "reward": float | None,                 # TrajectoryStep.reward
             "mm": None                              # the step had multi_modal_data=None
                   | {modality: {"hashes": [h, ...],
                                 "placeholders": [[offset, length], ...]}}},
                        # [offset, length, mask] where only some positions take the
                        # item's embeddings: mask = np.packbits(is_embed) bytes
            # a step without tokens (a message-level backend such as an OpenAI API):
            {"tokens": None, "reward": float | None}]}]}

Token lists travel as numpy arrays (4 bytes a token instead of msgpack's 5 for ids over
65535, and no per-element work to encode or decode); ``unpack_group`` gives lists back.
A reader without vf_mm sees plain msgpack maps, lists and tensors.

Messages: an image part whose image is in memory (a PIL image, encoded bytes, a local
path or ``file://`` URL) becomes ``{"type": "image_ref", "hash": h}`` with
``h = image_hash(load_image(image))``, the same hash the renderer puts in ``mm_hashes``
(so a trainer can find its tensors in ``images`` when a step used it) and the results
store uses for ``assets/<h>.png``; a results-store URL ``assets/<h>.png`` becomes the same
reference without being read. A video part whose video is in memory or local (frames, an
array, a ``Video``, encoded bytes, a path or ``file://`` URL) becomes ``{"type":
"video_ref", "hash": h}`` with ``h`` the renderer's ``mm_hash`` of it
(``vf_mm.videos.video_mm_hash``: the clip's ``video_hash``, combined with the part's
processing options when it sets any: the same clip sampled two ways is two items); a
results-store URL ``assets/<h>.<ext>`` becomes the reference by that rule without being
read (the results store names a video's file by its ``video_hash``). ``http(s)://`` and
``data:`` URLs, of images and videos, are kept as they are (never fetched or decoded).
Step-level messages and ``TrajectoryStep.extras`` are not carried (the trainer needs
tokens; the rollout's own prompt and completion are), so the rebuilt steps have empty
``prompt``/``completion`` lists; ``RolloutOutput.timing`` is not carried either.

Checks, each a ``vf_mm.errors.GroupFrameError`` naming the rollout and step: two different
tensors under one hash within a group (shapes, dtypes and bytes are compared, only when
the two item objects differ: items shared by bridging cost nothing), one hash used for
two modalities (an image in one step, a video in another), a step that refers to a hash
the group does not carry, placeholders that fail ``MultiModalData.validate`` against the
step's prompt length, token lists of different lengths, a frame that is not a
``vf_mm.group/1``. ``unpack_group`` checks the same of what it reads: every hash a step
names is in the item table, under one modality in the whole group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vf_mm._text import shorten
from vf_mm.errors import GroupFrameError, MultiModalDataError, TrajectoryError
from vf_mm.images import ImagePolicy, image_hash, load_image
from vf_mm.types import (
    IMAGE_PART_TYPES,
    VIDEO_PART_TYPES,
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutError,
    RolloutOutput,
    TrajectoryStep,
    image_part_source,
    video_part_source,
)
from vf_mm.videos import VIDEO_EXTENSIONS, VideoLimits, load_video, video_hash, video_mm_hash

__all__ = ["GROUP_FORMAT", "TrainingRollout", "pack_group", "unpack_group"]

#: The ``format`` value of a group frame; a reader refuses any other.
GROUP_FORMAT = "vf_mm.group/1"

_INT32 = np.iinfo(np.int32)
_KEPT_URL = re.compile(r"^(https?:|data:)", re.IGNORECASE)
_ASSET_URL = re.compile(r"^assets/([0-9a-f]{32})\.png$")
#: a results-store video asset: its file is named by the clip's video_hash
_VIDEO_ASSET_URL = re.compile(rf"^assets/([0-9a-f]{{32}})\.({'|'.join(VIDEO_EXTENSIONS)})$")


@dataclass(slots=True)
class TrainingRollout(RolloutOutput):
    """A rollout as ``unpack_group`` rebuilds it: a ``RolloutOutput`` (``trajectory``
    steps hold the tokens and multi-modal data; their ``prompt``/``completion`` messages
    are not carried and are empty) plus its place in the group and its advantage."""

    rollout_index: int = 0
    advantage: float | None = None

    @property
    def trainable(self) -> bool:
        """True when every step has token ids (no message-level backend turns)."""
        return all(step.tokens is not None for step in self.trajectory)


# -- packing -------------------------------------------------------------------------


def pack_group(
    outputs: Sequence[RolloutOutput],
    *,
    rollout_indices: Sequence[int] | None = None,
    example_id: int | str | None = None,
    advantages: Sequence[float] | None = None,
    policy: ImagePolicy | None = None,
    video_limits: VideoLimits | None = None,
) -> dict[str, Any]:
    """One frame for one example's rollouts (see the module docstring for the schema).

    ``rollout_indices`` default to ``0..n-1``; ``example_id`` defaults to the rollouts'
    (they must all agree, and agree with it when given); ``advantages``, if given, one per
    rollout. ``policy`` is the ``ImagePolicy`` used to read in-memory images and videos
    and local paths in messages in order to hash them (default: any local path, no
    network); ``video_limits`` bound a video read for its hash (``VideoLimits()`` when
    None; pass the renderer's).

    The frame holds references to the rollouts' own arrays (nothing is copied here);
    ``packb`` copies each distinct image's and video's tensors once.
    """
    outputs = list(outputs)
    n = len(outputs)
    ids = {o.example_id for o in outputs}
    if example_id is None:
        if len(ids) != 1:
            raise GroupFrameError(
                "pack_group needs the rollouts of one example"
                + (f", got example ids {sorted(map(str, ids))}" if ids else " (got none)")
            )
        example_id = outputs[0].example_id
    elif ids - {example_id}:
        raise GroupFrameError(
            f"pack_group(example_id={example_id!r}) got rollouts of example ids "
            f"{sorted(map(str, ids))}"
        )
    indices = list(range(n)) if rollout_indices is None else [int(i) for i in rollout_indices]
    if len(indices) != n or len(set(indices)) != n:
        raise GroupFrameError(f"rollout_indices must be {n} distinct ints, got {rollout_indices!r}")
    if advantages is not None:
        advantages = [float(a) for a in advantages]
        if len(advantages) != n:
            raise GroupFrameError(f"{len(advantages)} advantages for {n} rollouts")

    packer = _Packer(policy, video_limits)
    rollouts = []
    for r, output in enumerate(outputs):
        where = f"example {example_id!r}, rollout {indices[r]}"
        entry: dict[str, Any] = {
            "rollout_index": indices[r],
            "reward": output.reward,
            "metrics": output.metrics,
            "error": _dict_or_none(_error_from_frame(output.error, where)),
            "answer": output.answer,
            "info": output.info,
        }
        if advantages is not None:
            entry["advantage"] = advantages[r]
        entry["prompt"] = packer.messages(output.prompt, f"{where}, prompt")
        entry["completion"] = packer.messages(output.completion, f"{where}, completion")
        entry["steps"] = [
            packer.step(step, f"{where}, step {s}") for s, step in enumerate(output.trajectory)
        ]
        rollouts.append(entry)
    return {
        "format": GROUP_FORMAT,
        "example_id": example_id,
        "images": packer.images,
        "rollouts": rollouts,
    }


class _Packer:
    """Per-group state: the item table (every modality) and what has been checked against it."""

    def __init__(self, policy: ImagePolicy | None, video_limits: VideoLimits | None) -> None:
        self.policy = policy
        self.video_limits = video_limits
        self.images: dict[str, Any] = {}  # mm_hash -> item, images and videos alike
        self._modality: dict[str, str] = {}  # mm_hash -> the modality that uses it
        self._checked: set[tuple[str, int]] = set()  # (hash, id(item)) found equal
        # message source (id or str) -> hash: images' image_hash, videos' video_hash
        self._hashes: dict[tuple[str, Any], str] = {}
        self._keep: list[Any] = []  # keeps hashed sources alive so their ids stay unique

    def step(self, step: TrajectoryStep, where: str) -> dict[str, Any]:
        tokens = step.tokens
        if tokens is None:
            return {"tokens": None, "reward": step.reward}
        try:
            tokens.validate()
        except (TrajectoryError, MultiModalDataError) as exc:
            raise GroupFrameError(f"{where}: {exc}") from exc
        mm = tokens.multi_modal_data
        return {
            "prompt_ids": _ids(tokens.prompt_ids),
            "completion_ids": _ids(tokens.completion_ids),
            "completion_logprobs": np.asarray(tokens.completion_logprobs, dtype=np.float64),
            "completion_mask": np.asarray(tokens.completion_mask, dtype=np.uint8),
            "finish_reason": tokens.finish_reason,
            "reward": step.reward,
            "mm": None if mm is None else self._mm(mm, where),
        }

    def _mm(self, mm: MultiModalData, where: str) -> dict[str, Any]:
        out = {}
        for modality, hashes in mm.mm_hashes.items():
            items = mm.mm_items[modality]
            for i, (h, item) in enumerate(zip(hashes, items, strict=True)):
                self._intern(h, item, modality, f"{where}, {modality} {i}")
            out[modality] = {
                "hashes": list(hashes),
                "placeholders": [_pack_range(r) for r in mm.mm_placeholders[modality]],
            }
        return out

    def _intern(self, h: str, item: Any, modality: str, where: str) -> None:
        if not isinstance(item, Mapping):
            raise GroupFrameError(
                f"{where}: an item must be a dict of tensors, not {type(item).__name__}"
            )
        _check_modality(self._modality, h, modality, where)
        known = self.images.get(h)
        if known is None:
            self.images[h] = item
            return
        if known is item or (h, id(item)) in self._checked:
            return
        problem = _difference(known, item)
        if problem is not None:
            raise GroupFrameError(
                f"{where}: two different tensors claim {modality} hash {h} in one group "
                f"({problem}); a hash must name one {modality}'s model inputs (were two "
                "processors or processor settings mixed?)"
            )
        self._checked.add((h, id(item)))

    def messages(self, messages: Sequence[Mapping[str, Any]], where: str) -> list[Any]:
        out: list[Any] = []
        for m, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list):
                out.append(message)
                continue
            parts = []
            for p, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind in IMAGE_PART_TYPES:
                    part = self._image_part(part, f"{where}, message {m}, part {p}")
                elif kind in VIDEO_PART_TYPES:
                    part = self._video_part(part, f"{where}, message {m}, part {p}")
                parts.append(part)
            out.append({**message, "content": parts})
        return out

    def _image_part(self, part: Mapping[str, Any], where: str) -> Any:
        source = image_part_source(part)
        if isinstance(source, str):
            if _KEPT_URL.match(source):
                return part  # http(s) is never fetched here; a data: URL is already text
            asset = _ASSET_URL.match(source)
            if asset:
                return {"type": "image_ref", "hash": asset.group(1)}
            key: Any = ("image", source)
        else:
            key = ("image", id(source))
        digest = self._hashes.get(key)
        if digest is None:
            try:
                digest = image_hash(load_image(part, policy=self.policy, where=where))
            except Exception as exc:
                exc.add_note(f"while packing {where} (hashing its image for an image_ref)")
                raise
            self._hashes[key] = digest
            self._keep.append(source)
        return {"type": "image_ref", "hash": digest}

    def _video_part(self, part: Mapping[str, Any], where: str) -> Any:
        """``{"type": "video_ref", "hash": mm_hash}`` for a video in memory or on disk;
        http(s) and ``data:`` URLs as they are. The clip is loaded (once per source and
        frame rate in the group) for its ``video_hash``."""
        source = video_part_source(part)
        if isinstance(source, str):
            if _KEPT_URL.match(source):
                return part  # http(s) is never fetched here; a data: URL is already text
            asset = _VIDEO_ASSET_URL.match(source)
            if asset:
                return {"type": "video_ref", "hash": video_mm_hash(asset.group(1), part)}
            key: Any = ("video", source, repr(part.get("frame_rate")))
        else:
            key = ("video", id(source), repr(part.get("frame_rate")))
        digest = self._hashes.get(key)
        if digest is None:
            try:
                video = load_video(
                    dict(part), policy=self.policy, limits=self.video_limits, where=where
                )
            except Exception as exc:
                exc.add_note(f"while packing {where} (hashing its video for a video_ref)")
                raise
            digest = video_hash(video)
            self._hashes[key] = digest
            self._keep.append(source)
        return {"type": "video_ref", "hash": video_mm_hash(digest, part)}


def _check_modality(seen: dict[str, str], h: str, modality: str, where: str) -> None:
    """Refuse a hash used for two modalities in one group: the item table holds one item
    per hash, and an image's inputs are no video's."""
    first = seen.setdefault(h, modality)
    if first != modality:
        raise GroupFrameError(
            f"{where}: hash {h} names {_a(modality)} here but {_a(first)} elsewhere in the "
            "group; one hash names one item"
        )


def _a(modality: str) -> str:
    return f"an {modality}" if modality[:1] in "aeiou" else f"a {modality}"


def _ids(values: Sequence[int]) -> np.ndarray:
    array = np.asarray(values, dtype=np.int64)
    if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
        return array
    return array.astype(np.int32)


def _difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None if the two items hold the same tensors (keys, shapes, dtypes, bytes), else
    what differs."""
    if a.keys() != b.keys():
        return f"keys {sorted(a)} vs {sorted(b)}"
    for key in a:
        problem = _value_difference(a[key], b[key])
        if problem is not None:
            return f"{key!r}: {problem}"
    return None


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _value_difference(a: Any, b: Any) -> str | None:
    if a is b:
        return None
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if a.dtype.hasobject:
            return None if np.array_equal(a, b) else "different values"
        same = np.array_equal(_raw_np(a), _raw_np(b))
        return None if same else f"different bytes ({a.dtype}{list(a.shape)})"
    if _is_torch(a) or _is_torch(b):
        import torch

        ta, tb = torch.as_tensor(a), torch.as_tensor(b)
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            return f"{ta.dtype}{list(ta.shape)} vs {tb.dtype}{list(tb.shape)}"
        same = torch.equal(_raw_torch(ta), _raw_torch(tb))
        return None if same else f"different bytes ({ta.dtype}{list(ta.shape)})"
    if type(a) is not type(b) or a != b:
        return f"{a!r} vs {b!r}"
    return None


def _raw_np(array: np.ndarray) -> np.ndarray:
    """The elements' bytes as a flat uint8 array (NaNs compare by their bits)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _raw_torch(tensor: Any) -> Any:
    import torch

    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


# -- unpacking -----------------------------------------------------------------------


def unpack_group(data: Mapping[str, Any]) -> list[TrainingRollout]:
    """The rollouts of a decoded group frame (``unpackb`` / ``read_stream`` output).

    Each step's ``MultiModalData`` has the hashes and placeholders that were packed, and
    items that are the group's decoded item dicts: one dict per distinct image or video,
    shared by every step and rollout that shows it, its numpy arrays made read-only (as
    the renderer's cached arrays are) so that a write through one step cannot change
    another. Raises ``GroupFrameError`` on a frame that breaks the rules (module
    docstring).
    """
    if not isinstance(data, Mapping) or data.get("format") != GROUP_FORMAT:
        found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise GroupFrameError(f"not a {GROUP_FORMAT} frame (format {found!r})")
    example_id = _get(data, "example_id", "the group")
    images = _get(data, "images", "the group")
    if not isinstance(images, Mapping):
        raise GroupFrameError(
            f"the group's item table ('images') must be a map, not {type(images).__name__}"
        )
    items: dict[str, Any] = {}
    for h, item in images.items():
        if not isinstance(item, Mapping):
            raise GroupFrameError(f"item {h}: an item must be a map, not {type(item).__name__}")
        for value in item.values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        items[h] = item
    modalities: dict[str, str] = {}  # hash -> the modality the group's steps use it as
    out = []
    for r, entry in enumerate(_get(data, "rollouts", "the group")):
        where = f"example {example_id!r}, rollout {r}"
        if not isinstance(entry, Mapping):
            raise GroupFrameError(f"{where}: must be a map, not {type(entry).__name__}")
        index = _get(entry, "rollout_index", where)
        where = f"example {example_id!r}, rollout {index}"
        trajectory = [
            _unpack_step(step, items, modalities, f"{where}, step {s}")
            for s, step in enumerate(_get(entry, "steps", where))
        ]
        out.append(
            TrainingRollout(
                example_id=example_id,
                prompt=_get(entry, "prompt", where),
                completion=_get(entry, "completion", where),
                answer=entry.get("answer"),
                info=entry.get("info") or {},
                trajectory=trajectory,
                reward=entry.get("reward"),
                metrics=entry.get("metrics") or {},
                error=_error_from_frame(entry.get("error"), where),
                rollout_index=index,
                advantage=entry.get("advantage"),
            )
        )
    return out


def _dict_or_none(error: RolloutError | None) -> dict[str, str] | None:
    return error.to_dict() if error is not None else None


def _error_from_frame(value: Any, where: str) -> RolloutError | None:
    """The error of a rollout being packed or unpacked; anything that is no error record
    is refused (``GroupFrameError``), never stringified."""
    try:
        return RolloutError.from_value(value)
    except TypeError as exc:
        raise GroupFrameError(f"{where}, field 'error': {exc}") from None


def _pack_range(r: PlaceholderRange) -> list[Any]:
    if r.is_embed is None:
        return [r.offset, r.length]
    return [r.offset, r.length, np.packbits(np.array(r.is_embed, dtype=bool)).tobytes()]


def _unpack_range(entry: Any, where: str) -> PlaceholderRange:
    """``[offset, length]`` or ``[offset, length, packed is_embed bits]``."""
    if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
        raise GroupFrameError(
            f"{where}: a placeholder must be [offset, length] or [offset, length, mask], "
            f"got {shorten(repr(entry), 80)}"
        )
    mask = None
    if len(entry) == 3:
        _, length, packed = entry
        if not isinstance(packed, (bytes, bytearray, memoryview)) or not isinstance(length, int):
            raise GroupFrameError(f"{where}: a placeholder's mask must be bytes")
        if len(packed) != (length + 7) // 8:
            raise GroupFrameError(
                f"{where}: a placeholder of length {length} needs a {(length + 7) // 8}-byte "
                f"mask, got {len(packed)} bytes"
            )
        bits = np.unpackbits(np.frombuffer(bytes(packed), dtype=np.uint8))[:length]
        mask = tuple(bool(b) for b in bits)
    try:
        return PlaceholderRange(entry[0], entry[1], mask)
    except MultiModalDataError as exc:
        raise GroupFrameError(f"{where}: {exc}") from None


def _get(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    try:
        return mapping[key]
    except KeyError:
        raise GroupFrameError(f"{where}: the frame has no {key!r} field") from None


def _unpack_step(
    step: Any, items: Mapping[str, Any], modalities: dict[str, str], where: str
) -> TrajectoryStep:
    if not isinstance(step, Mapping):
        raise GroupFrameError(f"{where}: must be a map, not {type(step).__name__}")
    if "tokens" in step:
        if step["tokens"] is not None:
            raise GroupFrameError(f"{where}: 'tokens' may only be null (a step without token ids)")
        return TrajectoryStep(prompt=[], completion=[], tokens=None, reward=step.get("reward"))
    prompt_ids = _list(step, "prompt_ids", where)
    wire_mm = _get(step, "mm", where)
    try:
        mm = None if wire_mm is None else _unpack_mm(wire_mm, items, modalities, where)
        tokens = ResponseTokens(
            prompt_ids=prompt_ids,
            completion_ids=_list(step, "completion_ids", where),
            completion_logprobs=_list(step, "completion_logprobs", where),
            completion_mask=_list(step, "completion_mask", where),
            finish_reason=step.get("finish_reason"),
            multi_modal_data=mm,
        )
        tokens.validate()
    except (TrajectoryError, MultiModalDataError, TypeError) as exc:
        raise GroupFrameError(f"{where}: {exc}") from exc
    return TrajectoryStep(prompt=[], completion=[], tokens=tokens, reward=step.get("reward"))


def _unpack_mm(
    wire: Any, items: Mapping[str, Any], modalities: dict[str, str], where: str
) -> MultiModalData:
    if not isinstance(wire, Mapping):
        raise GroupFrameError(f"{where}: 'mm' must be a map or null, not {type(wire).__name__}")
    mm = MultiModalData()
    for modality, entry in wire.items():
        hashes = list(_get(entry, "hashes", f"{where}, mm {modality!r}"))
        pairs = _get(entry, "placeholders", f"{where}, mm {modality!r}")
        if len(pairs) != len(hashes):
            raise GroupFrameError(
                f"{where}: mm {modality!r} has {len(hashes)} hashes and {len(pairs)} placeholders"
            )
        found = []
        for i, h in enumerate(hashes):
            item = items.get(h) if isinstance(h, str) else None
            if item is None:
                raise GroupFrameError(
                    f"{where}: {modality} {i} refers to {modality} {h!r}, which the group "
                    "does not carry (its item table, 'images', has no such hash)"
                )
            _check_modality(modalities, h, modality, f"{where}, {modality} {i}")
            found.append(item)
        ranges = [_unpack_range(entry, where) for entry in pairs]
        mm.mm_hashes[modality] = hashes
        mm.mm_placeholders[modality] = ranges
        mm.mm_items[modality] = found
    return mm


def _list(step: Mapping[str, Any], key: str, where: str) -> list[Any]:
    values = _get(step, key, where)
    if hasattr(values, "tolist"):
        return values.tolist()
    if isinstance(values, (list, tuple)):
        return list(values)
    raise GroupFrameError(f"{where}: {key} must be a list or an array, not {type(values).__name__}")
