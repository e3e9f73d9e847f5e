"""The training wire form of rollouts: one frame per example's group, images and videos
stored once.

``pack_group(outputs)`` turns the rollouts of one example (a GRPO group) into one plain
dict for ``vf_mm.wire.packb`` / ``write_stream``; ``unpack_group(frame)`` turns a decoded
frame back into ``TrainingRollout`` objects whose steps carry a ``MultiModalData`` equal
to what the renderer made. The frame schema (``vf_mm.group/1`` and, with images by bytes
or reference, ``vf_mm.group/2``) is specified in ``docs/formats/groups.md``.

Invariants: each distinct image's or video's tensors travel once per group, keyed by
``mm_hash``, and steps refer to them by hash and position, so the bytes grow with the
distinct media, never with turns x items, whatever the steps do (extension, branching,
compaction, repeats); steps and messages hold hashes, never pixels. Every check fails the
group with a ``GroupFrameError`` naming the rollout and step (one hash for two tensors or
two modalities, a hash the group does not carry, bad placeholders, token lists of
different lengths, a NaN advantage, a frame of another format), on packing and unpacking
alike.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vf_mm._asset_refs import image_asset_hash, video_asset_hash
from vf_mm._text import lone_surrogate, shorten
from vf_mm.errors import GroupFrameError, MultiModalDataError, TrajectoryError
from vf_mm.images import ImagePolicy, decode_data_url, encode_png, image_hash, load_image
from vf_mm.images._internal import (
    SourceKind,
    check_local_path,
    classify_source,
    file_url_to_path,
    read_local_file,
)
from vf_mm.training._images import IMAGE_MODES, ImageProcessing, inputs_hash
from vf_mm.training._store import ImageStore
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
from vf_mm.videos import VideoLimits, load_video, video_hash, video_mm_hash

__all__ = ["GROUP_FORMAT", "MAX_GROUP_ID_BYTES", "TrainingRollout", "pack_group", "unpack_group"]

#: The ``format`` value of a group frame; a reader refuses any other.
GROUP_FORMAT = "vf_mm.group/1"
#: The ``format`` of a frame whose images travel encoded or by reference.
GROUP_FORMAT_BY_SOURCE = "vf_mm.group/2"
_DEFAULT_POLICY = ImagePolicy()
#: The longest group id, in UTF-8 bytes: ids travel in every acknowledgement and ledger line.
MAX_GROUP_ID_BYTES = 1024

_INT32 = np.iinfo(np.int32)
_KEPT_URL = re.compile(r"^(https?:|data:)", re.IGNORECASE)


@dataclass(slots=True)
class TrainingRollout(RolloutOutput):
    """A rollout as ``unpack_group`` rebuilds it: a ``RolloutOutput`` and its group place.

    The ``trajectory`` steps hold the tokens and multi-modal data; their
    ``prompt``/``completion`` messages are not carried and are empty. The fields it shares
    with ``RolloutOutput`` mean what they mean there.

    Attributes:
        example_id: See ``RolloutOutput``.
        prompt: See ``RolloutOutput``.
        completion: See ``RolloutOutput``.
        answer: See ``RolloutOutput``.
        info: See ``RolloutOutput``.
        trajectory: See ``RolloutOutput``.
        reward: See ``RolloutOutput``.
        metrics: See ``RolloutOutput``.
        error: See ``RolloutOutput``.
        timing: See ``RolloutOutput``.
        truncated: See ``RolloutOutput``.
        rollout_index: Its place in the group.
        advantage: None when the frame carries none for it: a failed rollout (reward
            None), or a group packed without advantages (``vf-mm rollout --advantages
            none``: the trainer computes them, ``group_advantages``).
        group_id: The group's id (None for a frame packed without one).
        advantage_method: How the producer computed the advantages (``"grpo"``), None when
            it did not say.
    """

    rollout_index: int = 0
    advantage: float | None = None
    group_id: str | None = None
    advantage_method: str | None = None

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
    advantages: Sequence[float | None] | None = None,
    advantage_method: str | None = None,
    policy: ImagePolicy | None = None,
    video_limits: VideoLimits | None = None,
    group_id: str | None = None,
    images: str = "tensors",
    processing: ImageProcessing | Mapping[str, Any] | None = None,
    store: ImageStore | str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """One frame for one example's rollouts (see the module docstring for the schema).

    The frame holds references to the rollouts' own arrays (nothing is copied here);
    ``packb`` copies each distinct image's and video's tensors once. An empty group never
    reaches a trainer, whoever builds it.

    Args:
        outputs: The group's rollouts.
        rollout_indices: Default to ``0..n-1``.
        example_id: Defaults to the rollouts' (they must all agree, and agree with it when
            given).
        advantages: If given, one per rollout, each a finite number or None (no advantage:
            a failed rollout, as ``group_advantages`` gives it).
        advantage_method: How they were computed (the frame's ``advantage_method``, e.g.
            ``"grpo"``).
        policy: The ``ImagePolicy`` used to read in-memory images and videos and local
            paths in messages in order to hash them (default: any local path, no network).
        video_limits: Bound a video read for its hash (``VideoLimits()`` when None; pass the
            renderer's).
        group_id: Goes in the frame's ``group_id`` field (a non-empty string of at most
            ``MAX_GROUP_ID_BYTES`` UTF-8 bytes): what a trainer deduplicates by.
        images: The image mode (``"tensors"``, ``"encoded"`` or ``"ref"``:
            ``vf_mm/training/_images.py``). An image's bytes are read from its message part
            (the bytes as given, a data URL's payload, a file read under ``policy``; a PNG of
            the decoded pixels for a PIL image or an array) and must decode to the pixels the
            renderer hashed: an image whose bytes cannot be had travels as tensors.
        processing: Needed by ``"encoded"`` and ``"ref"``: the renderer's
            ``ImageProcessing`` (or its ``description``), recorded in the frame for the
            trainer to check against.
        store: Needed by ``"ref"``: the ``ImageStore`` (or its directory) the bytes are
            written to.

    Raises:
        GroupFrameError: No rollouts, or a rollout with no message, no step and no error
            (an agent's session whose every call was refused), naming the example and
            rollout; rollouts of more than one example; ``rollout_indices`` or
            ``advantages`` that do not match the rollouts; an advantage that is NaN or
            infinite.
        ValueError: An unknown image mode, ``"encoded"``/``"ref"`` without ``processing``,
            ``"ref"`` without ``store``, a bad ``group_id`` (``TypeError`` when it is not a
            string).
    """
    if group_id is not None:
        group_id = check_group_id(group_id)
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {list(IMAGE_MODES)}, not {images!r}")
    description: Mapping[str, Any] | None = None
    if images != "tensors":
        if processing is None:
            raise ValueError(
                f'images="{images}" needs processing= (the renderer\'s ImageProcessing: '
                "the trainer rebuilds the images with it and checks it)"
            )
        description = (
            processing.description if isinstance(processing, ImageProcessing) else processing
        )
        if images == "ref":
            if store is None:
                raise ValueError('images="ref" needs store= (an ImageStore or its directory)')
            store = store if isinstance(store, ImageStore) else ImageStore(store)
    outputs = list(outputs)
    n = len(outputs)
    if n == 0:  # refused whoever builds it: a trainer must never receive an empty group
        where = "" if example_id is None else f" (example {example_id!r})"
        raise GroupFrameError(f"pack_group got no rollouts{where}: an empty group is never sent")
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
        advantages = [_advantage(a, f"advantage {r}") for r, a in enumerate(advantages)]
        if len(advantages) != n:
            raise GroupFrameError(f"{len(advantages)} advantages for {n} rollouts")
    if advantage_method is not None:
        if advantages is None:
            raise GroupFrameError(
                "advantage_method= names how advantages= were computed: pass both"
            )
        if not isinstance(advantage_method, str) or not advantage_method:
            raise GroupFrameError(
                f"advantage_method must be a non-empty str, not {advantage_method!r}"
            )

    packer = _Packer(policy, video_limits, by_source=images != "tensors")
    rollouts = []
    for r, output in enumerate(outputs):
        where = f"example {example_id!r}, rollout {indices[r]}"
        if not (output.trajectory or output.prompt or output.completion) and output.error is None:
            raise GroupFrameError(  # what an empty recorded session would be: refused
                f"{where} is empty (no message, no model turn, no error): nothing to train on "
                "or to skip; a rollout that did not run is sent with its error"
            )
        _check_text(output, where)
        entry: dict[str, Any] = {
            "rollout_index": indices[r],
            "reward": output.reward,
            "metrics": output.metrics,
            "error": _dict_or_none(_error_from_frame(output.error, where)),
            "truncated": bool(output.truncated),
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
    if images != "tensors":
        assert description is not None
        frame = packer.by_source_frame(
            example_id, group_id, rollouts, images, dict(description), store
        )
    else:
        frame = {"format": GROUP_FORMAT, "example_id": example_id}
        if group_id is not None:  # absent otherwise: frames without an id are as they were
            frame["group_id"] = group_id
        frame["images"] = packer.images
        frame["rollouts"] = rollouts
    if advantage_method is not None:  # absent otherwise, as group_id
        frame["advantage_method"] = advantage_method
    return frame


def _advantage(value: Any, where: str) -> float | None:
    """``value`` as an advantage a frame may carry: a finite float, or None for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GroupFrameError(f"{where} is a {type(value).__name__}, not a number or None")
    if not math.isfinite(float(value)):
        raise GroupFrameError(
            f"{where} is {float(value)}: an advantage is a finite number, or None for a "
            "rollout without one (vf_mm.training.group_advantages gives None for a failed "
            "rollout)"
        )
    return float(value)


def check_group_id(group_id: Any) -> str:
    """``group_id`` if it is a valid group id (a non-empty ``str`` of at most
    ``MAX_GROUP_ID_BYTES`` UTF-8 bytes); ``TypeError`` / ``ValueError`` otherwise."""
    if not isinstance(group_id, str):
        raise TypeError(f"a group id must be a str, not {type(group_id).__name__}")
    try:
        size = len(group_id.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: no UTF-8 form to send or store
        raise ValueError(f"a group id must be valid Unicode text: {group_id!r:.80}") from None
    if not 0 < size <= MAX_GROUP_ID_BYTES:
        raise ValueError(
            f"a group id must be 1 to {MAX_GROUP_ID_BYTES} UTF-8 bytes, got {size}: "
            f"{shorten(repr(group_id), 80)}"
        )
    return group_id


def _check_text(output: Any, where: str) -> None:
    """Refuse a rollout whose ``answer``, ``info`` or ``metrics`` hold a lone surrogate,
    naming the field: a frame's strings are UTF-8 (msgpack's), which cannot carry one,
    and the codec's own error would name neither the rollout nor the field."""
    for field in ("answer", "info", "metrics"):
        found = lone_surrogate(getattr(output, field, None), field)
        if found is not None:
            path, at = found
            raise GroupFrameError(
                f"{where}, field {path!r}: the text holds a lone surrogate (at character "
                f"{at}), which a group frame's UTF-8 strings cannot carry: decode the "
                'row\'s original bytes with their encoding (raw.decode("utf-8")) where the '
                "dataset is read; bytes decoded with errors='surrogateescape' make these"
            )


class _Packer:
    """Per-group state: the item table (every modality) and what has been checked against it."""

    def __init__(
        self,
        policy: ImagePolicy | None,
        video_limits: VideoLimits | None,
        *,
        by_source: bool = False,
    ) -> None:
        self.policy = policy
        self.video_limits = video_limits
        self.by_source = by_source  # encoded / ref: keep each image's encoded bytes
        self._encoded: dict[str, bytes] = {}  # image hash -> its encoded bytes
        self._data_urls: dict[str, str] = {}  # data: URL -> its image's hash
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
        if self.by_source:
            return self._image_part_by_source(part, source, where)
        if isinstance(source, str):
            if _KEPT_URL.match(source):
                return part  # http(s) is never fetched here; a data: URL is already text
            digest = image_asset_hash(source)
            if digest is not None:
                return {"type": "image_ref", "hash": digest}
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

    def _image_part_by_source(self, part: Mapping[str, Any], source: Any, where: str) -> Any:
        """As ``_image_part``, keeping the image's encoded bytes too: read once, and the
        hash taken from those very bytes (a file that changes between two reads cannot
        pair one image's hash with another's bytes). ``data:`` URLs are hashed here as
        well (they become ``image_ref`` s once their bytes are in the frame)."""
        if isinstance(source, str):
            if re.match(r"^https?:", source, re.IGNORECASE):
                return part  # never fetched here: such an image travels as tensors
            digest = image_asset_hash(source)
            if digest is not None:
                return {"type": "image_ref", "hash": digest}
            key: Any = ("image", source)
        else:
            key = ("image", id(source))
        digest = self._hashes.get(key)
        if digest is None:
            try:
                data, image = self._read_encoded(part)
                digest = image_hash(image)
            except Exception as exc:
                exc.add_note(f"while packing {where} (reading its image's bytes)")
                raise
            self._hashes[key] = digest
            self._keep.append(source)
            self._encoded.setdefault(digest, data)
        if isinstance(source, str) and source[:5].lower() == "data:":
            self._data_urls[source] = digest
            return part  # becomes an image_ref once its bytes are known to be in the frame
        return {"type": "image_ref", "hash": digest}

    def _read_encoded(self, part: Mapping[str, Any]) -> tuple[bytes, Any]:
        """An image part's encoded bytes, and the image they decode to (the renderer's
        decode rules: ``load_image``). Encoded sources give their bytes as they are; a
        PIL image or an array gives a lossless PNG of its decoded RGB pixels."""
        policy = self.policy or _DEFAULT_POLICY
        found = classify_source(dict(part))
        if found.kind is SourceKind.BYTES:
            data = bytes(found.value)
        elif found.kind is SourceKind.DATA_URL:
            data = decode_data_url(found.value, max_bytes=policy.max_bytes)
        elif found.kind in (SourceKind.PATH, SourceKind.FILE_URL):
            path = (
                file_url_to_path(found.value) if found.kind is SourceKind.FILE_URL else found.value
            )
            data = read_local_file(
                check_local_path(path, policy),
                max_bytes=policy.max_bytes,
                confined=policy.local_roots is not None,
            )
        else:  # a PIL image or an array: its decoded pixels, losslessly
            image = load_image(dict(part), policy=policy)
            return encode_png(image, filtered=False), image
        return data, load_image(data, policy=policy)

    def by_source_frame(
        self,
        example_id: Any,
        group_id: str | None,
        rollouts: list[dict[str, Any]],
        mode: str,
        description: dict[str, Any],
        store: Any,
    ) -> dict[str, Any]:
        """The ``vf_mm.group/2`` frame: every image with bytes moves from the item table to
        ``sources`` (with its inputs' hash); the rest stays as tensors."""
        tensors: dict[str, Any] = {}
        sources: dict[str, Any] = {}
        for h, item in self.images.items():
            data = self._encoded.get(h) if self._modality.get(h) == "image" else None
            if data is None:
                tensors[h] = item
                continue
            entry: dict[str, Any] = {
                "format": _sniff(data),
                "size": len(data),
                "inputs": inputs_hash(item),
            }
            if mode == "encoded":
                entry["data"] = data
            else:
                entry["uri"], entry["sha256"] = store.put(data)
            sources[h] = entry
        if self._data_urls:
            for rollout in rollouts:
                for field in ("prompt", "completion"):
                    rollout[field] = self._refer_data_urls(rollout[field], sources)
        frame: dict[str, Any] = {"format": GROUP_FORMAT_BY_SOURCE, "example_id": example_id}
        if group_id is not None:
            frame["group_id"] = group_id
        frame["image_mode"] = mode
        frame["processing"] = description
        frame["images"] = tensors
        frame["sources"] = sources
        frame["rollouts"] = rollouts
        return frame

    def _refer_data_urls(self, messages: list[Any], sources: Mapping[str, Any]) -> list[Any]:
        out = []
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list):
                parts = []
                for part in content:
                    kind = part.get("type") if isinstance(part, Mapping) else None
                    source = image_part_source(part) if kind in IMAGE_PART_TYPES else None
                    digest = self._data_urls.get(source) if isinstance(source, str) else None
                    if digest is not None and digest in sources:
                        part = {"type": "image_ref", "hash": digest}
                    parts.append(part)
                message = {**message, "content": parts}
            out.append(message)
        return out

    def _video_part(self, part: Mapping[str, Any], where: str) -> Any:
        """``{"type": "video_ref", "hash": mm_hash}`` for a video in memory or on disk;
        http(s) and ``data:`` URLs as they are. The clip is loaded (once per source and
        frame rate in the group) for its ``video_hash``."""
        source = video_part_source(part)
        if isinstance(source, str):
            if _KEPT_URL.match(source):
                return part  # http(s) is never fetched here; a data: URL is already text
            found = video_asset_hash(source)
            if found is not None:
                return {"type": "video_ref", "hash": video_mm_hash(found[0], part)}
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


_SNIFF = (
    (b"\x89PNG", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def _sniff(data: bytes) -> str:
    """The encoded format's name, from its first bytes (for reports; decoding sniffs
    again under the policy)."""
    if data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _SNIFF if data.startswith(magic)), "other")


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


def unpack_group(data: Mapping[str, Any], *, images: Any = None) -> list[TrainingRollout]:
    """The rollouts of a decoded group frame (``unpackb`` / ``read_stream`` output).

    Each step's ``MultiModalData`` has the hashes and placeholders that were packed, and
    items that are the group's decoded item dicts: one dict per distinct image or video,
    shared by every step and rollout that shows it, its numpy arrays made read-only (as the
    renderer's cached arrays are) so that a write through one step cannot change another.
    Every rollout carries the frame's ``group_id`` (None when the frame has none).

    Args:
        data: The decoded frame.
        images: A ``vf_mm.group/2`` frame (images ``encoded`` or by ``ref``) needs the
            trainer's ``ImageRebuilder``: it rebuilds each image's model inputs and checks
            them against the sampler's hashes. Under its ``on_missing="skip"`` the rollouts
            that show an unusable image come back with ``error`` set and no steps.

    Raises:
        GroupFrameError: A frame that breaks the rules (module docstring).
        ProcessingMismatchError: The trainer's image processing is not the sampler's.
        ImageRefError: An image reference missing, unreadable, or not matching its hash.
    """
    rebuilder = images  # the name "images" is the frame's item table below
    fmt = data.get("format") if isinstance(data, Mapping) else None
    if fmt not in (GROUP_FORMAT, GROUP_FORMAT_BY_SOURCE):
        found = fmt if isinstance(data, Mapping) else type(data).__name__
        raise GroupFrameError(
            f"not a {GROUP_FORMAT} frame, nor a {GROUP_FORMAT_BY_SOURCE} one (format {found!r})"
        )
    example_id = _get(data, "example_id", "the group")
    group_id = data.get("group_id")  # absent from frames packed without one
    if group_id is not None and not isinstance(group_id, str):
        raise GroupFrameError(
            f"the group's 'group_id' must be a string, not {type(group_id).__name__}"
        )
    method = data.get("advantage_method")  # absent unless the producer computed them
    if method is not None and not isinstance(method, str):
        raise GroupFrameError(
            f"the group's 'advantage_method' must be a string, not {type(method).__name__}"
        )
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
    failed: dict[str, Exception] = {}
    if fmt == GROUP_FORMAT_BY_SOURCE:
        rebuilt, failed = _rebuild(data, rebuilder, f"example {example_id!r}")
        items.update(rebuilt)
    modalities: dict[str, str] = {}  # hash -> the modality the group's steps use it as
    out = []
    for r, entry in enumerate(_get(data, "rollouts", "the group")):
        where = f"example {example_id!r}, rollout {r}"
        if not isinstance(entry, Mapping):
            raise GroupFrameError(f"{where}: must be a map, not {type(entry).__name__}")
        index = _get(entry, "rollout_index", where)
        where = f"example {example_id!r}, rollout {index}"
        lost = _failed_hashes(entry, failed) if failed else []
        if lost:  # on_missing="skip": the rollout comes back without its steps
            for h in lost:
                rebuilder.record_failure(group_id, h, failed[h], 1)
            out.append(
                TrainingRollout(
                    example_id=example_id,
                    prompt=_get(entry, "prompt", where),
                    completion=_get(entry, "completion", where),
                    answer=entry.get("answer"),
                    info=entry.get("info") or {},
                    trajectory=[],
                    reward=entry.get("reward"),
                    metrics=entry.get("metrics") or {},
                    error=RolloutError.from_exception(
                        failed[lost[0]], where=f"rebuilding {where}'s images"
                    ),
                    truncated=bool(entry.get("truncated", False)),
                    rollout_index=index,
                    advantage=entry.get("advantage"),
                    group_id=group_id,
                    advantage_method=method,
                )
            )
            continue
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
                truncated=bool(entry.get("truncated", False)),
                rollout_index=index,
                advantage=entry.get("advantage"),
                group_id=group_id,
                advantage_method=method,
            )
        )
    return out


def _rebuild(
    data: Mapping[str, Any], rebuilder: Any, where: str
) -> tuple[dict[str, Any], dict[str, Exception]]:
    """The model inputs of a ``vf_mm.group/2`` frame's images, rebuilt by ``rebuilder``,
    and the images it could not use (``on_missing="skip"``)."""
    mode = data.get("image_mode")
    if mode not in ("encoded", "ref"):
        raise GroupFrameError(f"{where}: unknown image_mode {mode!r} (encoded or ref)")
    if rebuilder is None:
        raise GroupFrameError(
            f"{where}: the group's images travel {mode} ({GROUP_FORMAT_BY_SOURCE}): pass "
            "unpack_group(frame, images=ImageRebuilder(ImageProcessing.from_checkpoint(...)))"
        )
    sources = _get(data, "sources", where)
    processing = _get(data, "processing", where)
    if not isinstance(sources, Mapping) or not isinstance(processing, Mapping):
        raise GroupFrameError(f"{where}: 'sources' and 'processing' must be maps")
    both = set(sources) & set(data.get("images") or {})
    if both:
        raise GroupFrameError(f"{where}: image {sorted(both)[0]} is both a tensor and a source")
    return rebuilder.rebuild(mode, processing, sources, where)


def _failed_hashes(entry: Mapping[str, Any], failed: Mapping[str, Any]) -> list[str]:
    """The unusable images a rollout's steps show, in order."""
    lost: list[str] = []
    for step in entry.get("steps") or ():
        mm = step.get("mm") if isinstance(step, Mapping) else None
        for wire in (mm or {}).values() if isinstance(mm, Mapping) else ():
            for h in wire.get("hashes", ()) if isinstance(wire, Mapping) else ():
                if h in failed and h not in lost:
                    lost.append(h)
    return lost


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
