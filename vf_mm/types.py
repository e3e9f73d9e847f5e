"""Core types: chat messages, rendered tokens, the multi-modal sidecar, trajectories.

Messages are OpenAI-style ``TypedDict`` s (plain dicts at runtime: they come from
datasets and JSON and go back out unchanged). Everything else is a plain
``dataclass(slots=True)``: these objects are built once per turn on the hot path,
so there is no pydantic validation on construction; call ``validate()`` where data
crosses a trust boundary (a backend's answer, a decoded stream).

Nothing here mutates its inputs: helpers return new lists, and ``MultiModalData``
methods return new objects that *share* the item dicts (the tensors), never copy
them. A step's *sidecar* is its ``MultiModalData``: the images' hashes, placeholders and
model inputs beside its token ids. Its rules (``MultiModalData`` docstring) are enforced
by ``MultiModalData.validate``:

- placeholders are absolute offsets into the step's prompt token ids, sorted and never
  overlapping; per modality, ``len(mm_hashes) == len(mm_placeholders) == len(mm_items)``;
- a bridge never mutates the caller's previous sidecar (copy, then append);
- the same image twice is two placeholder entries (matched by position, not hash) whose
  tensors are stored once;
- on the training wire each distinct image's tensors travel once per group, whatever the
  steps do (extension, branching, compaction, repeats): see ``vf_mm.training``.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from vf_mm.errors import MultiModalDataError, TrajectoryError, VfMmError

__all__ = [
    "IMAGE_PART_TYPES",
    "VIDEO_OPTIONS",
    "VIDEO_PART_KEYS",
    "VIDEO_PART_TYPES",
    "AssistantMessage",
    "ContentPart",
    "ImagePart",
    "ImageURL",
    "ImageURLPart",
    "Message",
    "Messages",
    "MultiModalData",
    "PlaceholderRange",
    "RenderedTokens",
    "ResponseTokens",
    "RolloutError",
    "RolloutOutput",
    "SystemMessage",
    "TextPart",
    "ToolCall",
    "ToolCallFunction",
    "ToolMessage",
    "TrajectoryStep",
    "UserMessage",
    "VideoPart",
    "VideoURL",
    "VideoURLPart",
    "content_parts",
    "image_part_source",
    "image_parts",
    "text_of",
    "unknown_video_key",
    "video_options",
    "video_part_source",
    "video_parts",
]

# -- messages (OpenAI chat format) -------------------------------------------------


class TextPart(TypedDict):
    type: Literal["text"]
    text: str


class ImageURL(TypedDict):
    url: str  # a data: URL, a file:// URL or local path, or http(s) (see vf_mm.images)
    detail: NotRequired[str]


class ImageURLPart(TypedDict):
    type: Literal["image_url"]
    image_url: ImageURL


class ImagePart(TypedDict):
    """An in-memory image: a PIL image, encoded bytes, or a path (see vf_mm.images)."""

    type: Literal["image"]
    image: Any


class VideoURL(TypedDict):
    url: str  # a data: URL, a file:// URL or local path, or http(s) (see vf_mm.videos)


class VideoURLPart(TypedDict):
    type: Literal["video_url"]
    video_url: VideoURL


class VideoPart(TypedDict):
    """A clip: a list of frames, a ``(T, H, W, 3)`` uint8 array, encoded bytes or a path
    (see vf_mm.videos). ``frame_rate`` is the rate of raw frames (a file states its own);
    ``fps`` / ``num_frames`` / ``min_pixels`` / ``max_pixels`` / ``do_sample_frames`` are
    processing options for this clip (the model's video processor takes them)."""

    type: Literal["video"]
    video: Any
    frame_rate: NotRequired[float]
    fps: NotRequired[float]
    num_frames: NotRequired[int]
    min_pixels: NotRequired[int]
    max_pixels: NotRequired[int]
    do_sample_frames: NotRequired[bool]


ContentPart = TextPart | ImageURLPart | ImagePart | VideoURLPart | VideoPart

#: The ``type`` values of content parts that carry an image.
IMAGE_PART_TYPES = frozenset({"image", "image_url"})
#: The ``type`` values of content parts that carry a video.
VIDEO_PART_TYPES = frozenset({"video", "video_url"})
#: A video part's processing options: how the model's video processor samples and sizes
#: this clip (they change its tensors, so they are part of its ``mm_hash``).
VIDEO_OPTIONS = ("fps", "num_frames", "min_pixels", "max_pixels", "do_sample_frames")
#: The keys a video part may hold: its source, the raw frames' rate, processing options.
VIDEO_PART_KEYS = frozenset(
    {"type", "video", "url", "path", "video_url", "frame_rate", *VIDEO_OPTIONS}
)


class ToolCallFunction(TypedDict):
    name: str
    arguments: str  # JSON text, as the model wrote it (it may not parse)


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class SystemMessage(TypedDict):
    role: Literal["system"]
    content: str | list[ContentPart]
    name: NotRequired[str]


class UserMessage(TypedDict):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: NotRequired[str]


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str | list[ContentPart] | None  # None when the turn is only tool calls
    tool_calls: NotRequired[list[ToolCall]]
    reasoning_content: NotRequired[str]
    name: NotRequired[str]


class ToolMessage(TypedDict):
    role: Literal["tool"]
    content: str | list[ContentPart]  # tool results may carry images
    tool_call_id: str
    name: NotRequired[str]


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage
Messages = list[Message]


def content_parts(message: Mapping[str, Any]) -> list[ContentPart]:
    """The message's content as a new list of parts.

    The parts themselves are the message's own dicts.

    Args:
        message: A chat message; ``str`` content gives ``[TextPart]``, ``None`` (or no
            content) gives ``[]``.
    """
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return list(content)
    raise TypeError(f"message content must be str, list or None, not {type(content).__name__}")


def image_parts(messages: Iterable[Mapping[str, Any]]) -> list[tuple[int, int, ContentPart]]:
    """``(message index, part index, part)`` for every image part, in conversation order.

    This order is the order of a rendered prompt's image placeholders, which is how a
    renderer pairs each image with its ``mm_placeholders`` entry (by position).

    Args:
        messages: The conversation.
    """
    found: list[tuple[int, int, ContentPart]] = []
    for m, message in enumerate(messages):
        for p, part in enumerate(content_parts(message)):
            if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                found.append((m, p, part))
    return found


def video_parts(messages: Iterable[Mapping[str, Any]]) -> list[tuple[int, int, ContentPart]]:
    """``(message index, part index, part)`` for every video part, in conversation order.

    The order of a rendered prompt's video placeholders.

    Args:
        messages: The conversation.
    """
    found: list[tuple[int, int, ContentPart]] = []
    for m, message in enumerate(messages):
        for p, part in enumerate(content_parts(message)):
            if isinstance(part, Mapping) and part.get("type") in VIDEO_PART_TYPES:
                found.append((m, p, part))
    return found


def unknown_video_key(part: Mapping[str, Any]) -> str | None:
    """The first key a video part may not hold (``VIDEO_PART_KEYS``), or None.

    A misspelt option would otherwise change nothing.

    Args:
        part: A video content part.

    Returns:
        The key quoted, with the closest known key when there is one (``"'num_frame'
            (did you mean 'num_frames'?)"``).
    """
    import difflib

    for key in part:
        if key not in VIDEO_PART_KEYS:
            close = difflib.get_close_matches(str(key), sorted(VIDEO_PART_KEYS), n=1)
            return f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    return None


def video_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The processing options (``VIDEO_OPTIONS``) a video part or call sets, checked and normalised.

    The one rule every entry point applies (message checks, the renderer, the servers).
    Keys set to None and other keys are left out.

    Args:
        options: ``fps`` a finite positive number; ``num_frames``, ``min_pixels`` and
            ``max_pixels`` finite positive whole numbers (returned as ints);
            ``do_sample_frames`` a bool; not ``fps`` and ``num_frames`` both.

    Raises:
        ValueError: An option breaks its rule (named in the message).
    """
    import math

    out: dict[str, Any] = {}
    for key in VIDEO_OPTIONS:
        value = options.get(key)
        if value is None:
            continue
        if key == "do_sample_frames":
            if not isinstance(value, bool):
                raise ValueError(f"do_sample_frames must be a bool, not {value!r}")
            out[key] = value
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise ValueError(f"video option {key} must be a finite positive number, not {value!r}")
        if key != "fps" and value != int(value):
            raise ValueError(f"video option {key} must be a whole number, not {value!r}")
        out[key] = float(value) if key == "fps" else int(value)
    if "fps" in out and "num_frames" in out:
        raise ValueError(
            "fps and num_frames both given: sample by rate (fps) or by count (num_frames)"
        )
    return out


def image_part_source(part: Mapping[str, Any]) -> Any:
    """The image an image part points at, unchecked; None when there is none.

    ``vf_mm.images.load_image`` is what checks and loads it.

    Args:
        part: A content part: the URL of an OpenAI ``{"type": "image_url", "image_url":
            {"url": ...}}`` (or ``"image_url": "..."``) is taken, else the first of
            ``image`` / ``url`` / ``path`` that is set (vf_mm's and transformers' forms).
    """
    if part.get("type") == "image_url":
        inner = part.get("image_url")
        return inner.get("url") if isinstance(inner, Mapping) else inner
    return next((part[k] for k in ("image", "url", "path") if part.get(k) is not None), None)


def video_part_source(part: Mapping[str, Any]) -> Any:
    """The clip a video part points at, unchecked; None when there is none.

    ``vf_mm.videos.load_video`` is what checks and loads it.

    Args:
        part: A content part: the URL of an OpenAI ``{"type": "video_url", "video_url":
            {"url": ...}}`` (or ``"video_url": "..."``, or vLLM's flat ``"url"``) is
            taken, else the first of ``video`` / ``url`` / ``path`` that is set.
    """
    if part.get("type") == "video_url":
        inner = part.get("video_url", part.get("url"))
        return inner.get("url") if isinstance(inner, Mapping) else inner
    return next((part[k] for k in ("video", "url", "path") if part.get(k) is not None), None)


def text_of(message: Mapping[str, Any]) -> str:
    """The message's text parts joined with no separator (images are skipped).

    Args:
        message: A chat message.
    """
    return "".join(
        str(part.get("text", ""))
        for part in content_parts(message)
        if isinstance(part, Mapping) and part.get("type") == "text"
    )


# -- the multi-modal sidecar -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlaceholderRange:
    """Where one multi-modal item's tokens sit: ``token_ids[offset:offset + length]``.

    Frozen, so ranges can be shared between copies of a ``MultiModalData`` without one
    copy changing another.

    Attributes:
        offset: Absolute in the step's prompt token ids.
        length: The number of tokens.
        is_embed: Which positions inside the range take the item's embeddings, for items
            whose tokens are not one contiguous run (tiles separated by row/column text
            tokens, begin/end markers inside the range; vLLM's
            ``PlaceholderRange.is_embed``): one bool per position, at least one True.
            ``None`` (the Qwen-VL case) means every position is an embedding; an all-True
            mask is stored as ``None``, so equal ranges compare equal.
    """

    offset: int
    length: int
    is_embed: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("offset", "length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise MultiModalDataError(
                    f"PlaceholderRange.{name} must be an int, not {type(value).__name__}"
                )
        if self.offset < 0:
            raise MultiModalDataError(f"PlaceholderRange offset must be >= 0, got {self.offset}")
        if self.length <= 0:
            raise MultiModalDataError(f"PlaceholderRange length must be > 0, got {self.length}")
        if self.is_embed is not None:
            mask = tuple(self.is_embed)
            if not all(isinstance(v, bool) for v in mask):
                raise MultiModalDataError("PlaceholderRange.is_embed must hold bools only")
            if len(mask) != self.length:
                raise MultiModalDataError(
                    f"PlaceholderRange.is_embed has {len(mask)} entries for length {self.length}"
                )
            if not any(mask):
                raise MultiModalDataError(
                    "PlaceholderRange.is_embed marks no position as an embedding"
                )
            object.__setattr__(self, "is_embed", None if all(mask) else mask)

    @property
    def end(self) -> int:
        """One past the last token of the range."""
        return self.offset + self.length

    @property
    def num_embeds(self) -> int:
        """How many positions take the item's embeddings (``length`` when contiguous)."""
        return self.length if self.is_embed is None else sum(self.is_embed)

    def embed_positions(self) -> list[int]:
        """The absolute token positions that take the item's embeddings, in order."""
        if self.is_embed is None:
            return list(range(self.offset, self.end))
        return [self.offset + i for i, embed in enumerate(self.is_embed) if embed]


@dataclass(slots=True)
class MultiModalData:
    """The images (or other modalities) of one prompt, beside its token ids.

    Per modality (``"image"``, ...) three lists, parallel by index. Invariants, checked by
    ``validate``: the three dicts have the same modality keys, equal list lengths per
    modality, placeholders sorted by offset and non-overlapping across *all* modalities.

    The same image twice is two entries with the same hash (items are matched by
    position, not by hash); both entries may share one item dict, so its tensors are
    held once. Methods never mutate ``self`` or their arguments: a bridge copies,
    then appends. ``==`` compares items too; tensors that are not the same object
    make it raise, so compare hashes and placeholders instead.

    Attributes:
        mm_hashes: ``mm_hashes[m][i]`` is item i's content hash.
        mm_placeholders: ``mm_placeholders[m][i]`` is item i's token range.
        mm_items: ``mm_items[m][i]`` is item i's model inputs (e.g. ``{"pixel_values":
            tensor, "image_grid_thw": tensor}``).
    """

    mm_hashes: dict[str, list[str]] = field(default_factory=dict)
    mm_placeholders: dict[str, list[PlaceholderRange]] = field(default_factory=dict)
    mm_items: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> MultiModalData:
        return cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MultiModalData:
        """Rebuild from its wire form. Items are not copied.

        Args:
            data: The wire form: ``unpackb`` gives dataclasses back as dicts, so placeholders
                arrive as ``{"offset", "length"}`` maps.
        """

        def ranges(values: Iterable[Any]) -> list[PlaceholderRange]:
            return [
                v
                if isinstance(v, PlaceholderRange)
                else PlaceholderRange(
                    v["offset"],
                    v["length"],
                    None if v.get("is_embed") is None else tuple(v["is_embed"]),
                )
                for v in values
            ]

        return cls(
            mm_hashes={m: list(v) for m, v in data.get("mm_hashes", {}).items()},
            mm_placeholders={m: ranges(v) for m, v in data.get("mm_placeholders", {}).items()},
            mm_items={m: list(v) for m, v in data.get("mm_items", {}).items()},
        )

    @property
    def modalities(self) -> tuple[str, ...]:
        """The modalities that hold at least one item, in insertion order."""
        return tuple(m for m, ranges in self.mm_placeholders.items() if ranges)

    @property
    def is_empty(self) -> bool:
        return not any(self.mm_placeholders.values())

    def num_items(self, modality: str | None = None) -> int:
        """The number of items of one modality, or of all.

        Args:
            modality: The modality (0 if absent), or None for all modalities.
        """
        if modality is not None:
            return len(self.mm_placeholders.get(modality, ()))
        return sum(len(ranges) for ranges in self.mm_placeholders.values())

    def all_placeholders(self) -> list[tuple[str, int, PlaceholderRange]]:
        """``(modality, index, range)`` for every item, sorted by offset."""
        out = [
            (m, i, r) for m, ranges in self.mm_placeholders.items() for i, r in enumerate(ranges)
        ]
        out.sort(key=lambda entry: entry[2].offset)
        return out

    def validate(self, num_tokens: int | None = None) -> None:
        """Check the sidecar rules (class docstring).

        Args:
            num_tokens: The prompt's length; when given, also checks that every placeholder
                lies inside it.

        Raises:
            MultiModalDataError: A rule is broken.
        """
        keys = (set(self.mm_hashes), set(self.mm_placeholders), set(self.mm_items))
        if not keys[0] == keys[1] == keys[2]:
            raise MultiModalDataError(
                "mm_hashes, mm_placeholders and mm_items must have the same modalities, got "
                f"{sorted(keys[0])}, {sorted(keys[1])} and {sorted(keys[2])}"
            )
        for m, ranges in self.mm_placeholders.items():
            hashes, items = self.mm_hashes[m], self.mm_items[m]
            if not len(hashes) == len(ranges) == len(items):
                raise MultiModalDataError(
                    f"modality {m!r}: {len(hashes)} hashes, {len(ranges)} placeholders and "
                    f"{len(items)} items; the lists must be parallel"
                )
            for i, (h, r) in enumerate(zip(hashes, ranges, strict=True)):
                if not isinstance(h, str):
                    raise MultiModalDataError(
                        f"mm_hashes[{m!r}][{i}] must be a str, not {type(h).__name__}"
                    )
                if not isinstance(r, PlaceholderRange):
                    raise MultiModalDataError(
                        f"mm_placeholders[{m!r}][{i}] must be a PlaceholderRange, "
                        f"not {type(r).__name__}"
                    )
                if i and r.offset < ranges[i - 1].offset:
                    raise MultiModalDataError(
                        f"mm_placeholders[{m!r}] is not sorted: [{i}] at offset {r.offset} "
                        f"comes after [{i - 1}] at offset {ranges[i - 1].offset}"
                    )
        previous: tuple[str, int, PlaceholderRange] | None = None
        if len(self.mm_placeholders) == 1:  # one modality: its ranges are sorted (checked)
            ((only, ranges),) = self.mm_placeholders.items()
            ordered: Iterable[tuple[str, int, PlaceholderRange]] = (
                (only, i, r) for i, r in enumerate(ranges)
            )
        else:
            ordered = self.all_placeholders()
        for m, i, r in ordered:
            if previous is not None and r.offset < previous[2].end:
                pm, pi, pr = previous
                raise MultiModalDataError(
                    f"mm_placeholders[{m!r}][{i}] (offset {r.offset}, length {r.length}) "
                    f"overlaps mm_placeholders[{pm!r}][{pi}] "
                    f"(offset {pr.offset}, length {pr.length}, end {pr.end})"
                )
            previous = (m, i, r)
        if num_tokens is not None and previous is not None:
            # ends increase with offsets once nothing overlaps: the last range ends last
            m, i, r = previous
            if r.end > num_tokens:
                raise MultiModalDataError(
                    f"mm_placeholders[{m!r}][{i}] (offset {r.offset}, length {r.length}) "
                    f"ends at {r.end}, past the prompt's {num_tokens} tokens"
                )

    def copy(self) -> MultiModalData:
        """New dicts and lists; the same hashes, ranges (frozen) and item dicts."""
        return MultiModalData(
            mm_hashes={m: list(v) for m, v in self.mm_hashes.items()},
            mm_placeholders={m: list(v) for m, v in self.mm_placeholders.items()},
            mm_items={m: list(v) for m, v in self.mm_items.items()},
        )

    def extended(self, other: MultiModalData) -> MultiModalData:
        """A new object with ``other``'s entries after ``self``'s, per modality.

        Offsets are taken as they are (both absolute in the same prompt); call ``validate`` on
        the result to check they do not overlap.

        Args:
            other: The entries to append (shared, not copied).
        """
        out = self.copy()
        for m, hashes in other.mm_hashes.items():
            out.mm_hashes.setdefault(m, []).extend(hashes)
        for m, ranges in other.mm_placeholders.items():
            out.mm_placeholders.setdefault(m, []).extend(ranges)
        for m, items in other.mm_items.items():
            out.mm_items.setdefault(m, []).extend(items)
        return out

    def shifted(self, delta: int) -> MultiModalData:
        """A new object with every placeholder moved by ``delta`` tokens (items shared).

        Args:
            delta: Tokens to move by (negative moves left).

        Raises:
            MultiModalDataError: A range would start before token 0.
        """
        out = self.copy()
        out.mm_placeholders = {
            m: [PlaceholderRange(r.offset + delta, r.length) for r in ranges]
            for m, ranges in self.mm_placeholders.items()
        }
        return out


# -- tokens and trajectories -------------------------------------------------------


@dataclass(slots=True)
class RenderedTokens:
    """A rendered prompt: token ids, with the images' placeholders offset into them.

    Attributes:
        token_ids: The prompt's token ids.
        multi_modal_data: Its images (placeholders are offsets into ``token_ids``), or
            None for a text-only prompt.
    """

    token_ids: list[int]
    multi_modal_data: MultiModalData | None = None


@dataclass(slots=True)
class ResponseTokens:
    """One model turn at the token level, exactly as sampled.

    Attributes:
        prompt_ids: The prompt's token ids.
        completion_ids: The sampled token ids.
        completion_logprobs: One logprob per completion token (parallel to
            ``completion_ids``).
        completion_mask: Parallel to ``completion_ids``: 1 = sampled by the model (trained
            on), 0 = not (e.g. tokens the environment inserted).
        finish_reason: Why sampling stopped (``"stop"``, ``"length"``), when known.
        multi_modal_data: The prompt's images; placeholders are offsets into
            ``prompt_ids``.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    completion_mask: list[int]
    finish_reason: str | None
    multi_modal_data: MultiModalData | None = None

    def validate(self) -> None:
        """Raise ``TrajectoryError`` (or ``MultiModalDataError``) if inconsistent."""
        n = len(self.completion_ids)
        if len(self.completion_logprobs) != n or len(self.completion_mask) != n:
            raise TrajectoryError(
                f"completion_ids has {n} tokens but completion_logprobs has "
                f"{len(self.completion_logprobs)} and completion_mask "
                f"{len(self.completion_mask)}; they must be equal"
            )
        for i, bit in enumerate(self.completion_mask):
            if bit not in (0, 1) or isinstance(bit, float):
                raise TrajectoryError(f"completion_mask[{i}] is {bit!r}; must be 0 or 1")
        if self.multi_modal_data is not None:
            self.multi_modal_data.validate(num_tokens=len(self.prompt_ids))


@dataclass(slots=True)
class TrajectoryStep:
    """One model turn of a rollout: the messages it saw and wrote, and its tokens.

    Attributes:
        prompt: The messages the model saw.
        completion: The messages it wrote.
        tokens: None when the backend gives no token ids (an OpenAI-compatible API):
            such steps can be evaluated but not trained on.
        reward: This turn's reward, when the environment gives one.
        extras: Anything else the environment records for the turn.
    """

    prompt: Messages
    completion: Messages
    tokens: ResponseTokens | None
    reward: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RolloutError:
    """Why one rollout failed, as results.jsonl and the training wire carry it.

    ``str()`` gives the one-line form ``"type: message (where)"``.

    Attributes:
        type: The exception's class name (``"ImageFetchError"``), what summaries count
            errors by.
        message: Its message.
        where: The stage of the rollout that failed (``"turn 2: gridnav.env_response"``,
            ``"reward function correct"``), and for an exception raised outside vf_mm
            (environment code) the file, line and function that raised it.
    """

    type: str
    message: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" + (f" ({self.where})" if self.where else "")

    @classmethod
    def from_exception(cls, exc: BaseException, *, where: str = "") -> RolloutError:
        """The record of ``exc``, raised at stage ``where``.

        Args:
            exc: The exception; for one that is not a vf_mm error, the innermost line of the
                author's code it passed through is added to ``where``.
            where: The stage of the rollout that raised it.
        """
        location = _user_code_location(exc)
        if location:
            where = f"{where}, {location}" if where else location
        return cls(type(exc).__name__, str(exc) or type(exc).__name__, where)

    @classmethod
    def coerce(cls, value: Any) -> RolloutError | None:
        """``from_value``, but never refusing.

        Args:
            value: Anything an error field may hold; a value that is no error record
                (something environment code stored as its error) becomes type ``Error`` with
                its repr.
        """
        try:
            return cls.from_value(value)
        except TypeError:
            return cls("Error", repr(value))

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "where": self.where}

    @classmethod
    def from_value(cls, value: Any) -> RolloutError | None:
        """A ``RolloutError`` from anything an error field may hold.

        Args:
            value: ``None``, a ``RolloutError``, an exception, a ``{"type", "message",
                "where"}`` mapping (results lines, group frames), or a ``"Type: message"``
                string (the one-line form; results files of format 1 hold that).

        Raises:
            TypeError: Anything else.
        """
        if value is None or isinstance(value, RolloutError):
            return value
        if isinstance(value, BaseException):
            return cls.from_exception(value)
        if isinstance(value, Mapping):
            fields = {k: value.get(k, "") for k in ("type", "message", "where")}
            if all(isinstance(v, str) for v in fields.values()) and fields["type"]:
                return cls(**fields)
            raise TypeError(
                "an error record needs str 'type', 'message' and 'where' fields, got "
                + repr({k: type(v).__name__ for k, v in value.items()})
            )
        if isinstance(value, str):
            head, sep, rest = value.partition(": ")
            if sep and head.isidentifier():
                return cls(head, rest)
            return cls("Error", value)
        raise TypeError(f"an error record must be a mapping or a str, not {type(value).__name__}")


# frames that are not the environment author's code: vf_mm's own, the standard library's,
# installed libraries' (site-packages), and the import machinery's
_NOT_AUTHORS = tuple(
    {os.path.dirname(os.path.abspath(__file__)) + os.sep, "<frozen"}
    | {
        os.path.abspath(p) + os.sep
        for p in (
            sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")
        )
        if p
    }
)


def _user_code_location(exc: BaseException) -> str:
    """``"at file.py:12 in func"``: the innermost frame of ``exc``'s traceback that is the
    author's code, not vf_mm's, the standard library's, an installed library's or the
    import machinery's (a ``TypeError`` from passing a wrong argument into vf_mm points at
    the call, not into vf_mm). ``""`` when no frame is the author's, for vf_mm errors
    (their message names the cause), for a ``SyntaxError`` (its message names file and
    line) and for an exception never raised."""
    if isinstance(exc, (VfMmError, SyntaxError)) or exc.__traceback__ is None:
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_NOT_AUTHORS)]
    if not own:  # raised at a call into vf_mm or a library: its message says what was wrong
        return ""
    frame = own[-1]
    return f"at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"


@dataclass(slots=True)
class RolloutOutput:
    """One finished rollout of one example.

    A rollout that failed is recorded with ``error`` set, never dropped, so a run's results
    line up with its examples.

    Attributes:
        example_id: The example's id.
        prompt: The prompt messages.
        completion: Every message after the prompt (model turns and environment
            responses).
        answer: The example's answer column.
        info: The example's info column.
        trajectory: One step per model turn.
        reward: The rubric's reward (None when it failed before scoring).
        metrics: Each reward function's score, by name.
        error: Why it failed (a ``RolloutError``: type, message, where; the other fields
            hold whatever it had produced), or None.
        timing: Seconds per stage.
        truncated: The rollout ran out of context (its next prompt, after at least one
            model turn, was longer than the model takes: ``PromptTooLongError``). It ended
            there and was scored on the turns it has, like any finished rollout (no
            ``error``); the flag lets a trainer or a summary tell it apart (verifiers calls
            it ``is_truncated``).
    """

    example_id: int | str
    prompt: Messages
    completion: Messages
    answer: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    trajectory: list[TrajectoryStep] = field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: RolloutError | None = None
    timing: dict[str, float] = field(default_factory=dict)
    truncated: bool = False

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        reward: float | None,
        metrics: dict[str, float],
        error: RolloutError | None,
    ) -> RolloutOutput:
        """The output of a finished rollout's state, scored.

        The one place a state becomes an output, so every environment (vf_mm's own and adapted
        ones) carries the same fields.

        Args:
            state: An environment's ``State``: its ``example_id``, ``prompt``,
                ``completion``, ``answer``, ``info``, ``trajectory``, ``timing`` and
                ``truncated``.
            reward: The rubric's reward.
            metrics: Each reward function's score.
            error: Why it failed, or None.
        """
        return cls(
            example_id=state["example_id"],
            prompt=state["prompt"],
            completion=state["completion"],
            answer=state.get("answer"),
            info=state.get("info") or {},
            trajectory=state["trajectory"],
            reward=reward,
            metrics=metrics,
            error=error,
            timing=dict(state["timing"]),
            truncated=bool(state.get("truncated")),
        )

    @property
    def ok(self) -> bool:
        """True when the rollout finished without an error."""
        return self.error is None
