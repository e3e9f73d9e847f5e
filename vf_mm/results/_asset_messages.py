"""Messages made JSON-ready for ``results.jsonl``: every image and video part rewritten as
a reference to its asset in an ``AssetStore``, every other value checked as JSON.

This is the conversation side of the store (``AssetStore.to_jsonable`` calls
``messages_to_jsonable``); the store itself only names, writes and finds files. A
part's options (``detail``, a video's ``fps``, ...) are kept beside its new URL, a video
part gets the loaded ``frame_rate`` (so ``load_video`` of the stored part is the
original), and an http(s) URL or a reference to an asset already in the store is kept as
it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from vf_mm._asset_refs import image_asset_hash, video_asset_hash
from vf_mm._json import to_json_value
from vf_mm.errors import ImageError, ResultsError, VideoError
from vf_mm.images import ImagePolicy
from vf_mm.types import IMAGE_PART_TYPES, VIDEO_PART_TYPES, image_part_source, video_part_source

if TYPE_CHECKING:
    from vf_mm.results._assets import AssetStore

__all__ = ["messages_to_jsonable", "unavailable", "well_formed_video_part"]

_HTTP_URL = re.compile(r"^https?://", re.IGNORECASE)
# keys of an image part that hold the image itself (vf_mm, OpenAI and transformers forms)
_IMAGE_SOURCE_KEYS = frozenset({"type", "image", "image_url", "url", "path"})
# keys of a video part that hold the video itself (vf_mm, OpenAI and transformers forms)
_VIDEO_SOURCE_KEYS = frozenset({"type", "video", "video_url", "url", "path"})


def unavailable(value: Any, exc: BaseException) -> dict[str, Any]:
    """What is stored in place of a value that could not be: its type and why."""
    return {"unavailable": type(value).__name__, "error": f"{type(exc).__name__}: {exc}"}


def well_formed_video_part(part: Mapping[str, Any]) -> bool:
    """Whether a video part names exactly one source as ``load_video`` wants it (a
    malformed one is handed to ``load_video`` for its error)."""
    if part.get("type") == "video_url":
        return isinstance(video_part_source(part), str)
    present = [k for k in ("video", "url", "path") if part.get(k) is not None]
    return len(present) == 1 and not isinstance(part[present[0]], Mapping)


def messages_to_jsonable(
    store: AssetStore,
    messages: Iterable[Mapping[str, Any]],
    *,
    policy: ImagePolicy | None,
    where: str | None,
    on_error: str,
) -> list[dict[str, Any]]:
    """``store.to_jsonable(messages, ...)``: see ``AssetStore.to_jsonable``.

    Args:
        store: Where the images and videos are stored.
        messages: The conversation.
        policy: Images and videos load with it (the store's when None).
        where: Put before the place in errors.
        on_error: ``"raise"`` or ``"record"``.

    Raises:
        ImageError: An image that does not load (``on_error="raise"``).
        VideoError: A video that does not load (``on_error="raise"``).
        ResultsError: A value JSON cannot hold (``on_error="raise"``).
    """
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', not {on_error!r}")
    record = on_error == "record"
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        error = ResultsError(
            f"{where or 'messages'}: must be a list of message dicts, not {type(messages).__name__}"
        )
        if not record:
            raise error
        return [unavailable(messages, error)]
    policy = policy or store.policy
    out: list[dict[str, Any]] = []
    for m, message in enumerate(messages):
        at = f"message {m}" if where is None else f"{where}, message {m}"
        if not isinstance(message, Mapping):
            error = ResultsError(f"{at}: a message must be a dict, not {type(message).__name__}")
            if not record:
                raise error
            out.append(unavailable(message, error))
            continue
        copy: dict[str, Any] = {}
        for key, value in message.items():
            if not isinstance(key, str):
                if not record:
                    raise ResultsError(f"{at}: key {key!r} is not a str")
                continue  # JSON cannot name it; the rollout's error says it failed
            try:
                if key == "content":
                    copy[key] = _content(store, value, at, policy, record=record)
                else:
                    copy[key] = to_json_value(value, at, key)
            except (ResultsError, ImageError, VideoError) as exc:
                if not record:
                    raise
                copy[key] = unavailable(value, exc)
        out.append(copy)
    return out


def _content(
    store: AssetStore, value: Any, where: str, policy: ImagePolicy | None, *, record: bool
) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        parts = []
        for p, part in enumerate(value):
            try:
                parts.append(_part(store, part, f"{where}, part {p}", policy))
            except (ResultsError, ImageError, VideoError) as exc:
                if not record:
                    raise
                source = _part_source(part) if isinstance(part, Mapping) else None
                parts.append(
                    {
                        "type": "unavailable",
                        "error": f"{type(exc).__name__}: {exc}",
                        "source": source if isinstance(source, str) else None,
                    }
                )
        return parts
    raise ResultsError(
        f"{where}, field 'content': must be a str, a list of parts or None, not "
        f"{type(value).__name__}"
    )


def _part(store: AssetStore, part: Any, where: str, policy: ImagePolicy | None) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise ResultsError(f"{where}: a content part must be a dict, not {type(part).__name__}")
    kind = part.get("type")
    if kind in VIDEO_PART_TYPES:
        return _video_part(store, part, where, policy)
    if kind not in IMAGE_PART_TYPES:
        return to_json_value(part, where)
    url = _kept_url(store, part)
    if url is None:
        url = store.add(dict(part), policy=policy, where=where)
    # keep what else the part says (``detail``, per-image options), converted as JSON
    inner = part.get("image_url")
    inner_rest = (
        {k: v for k, v in inner.items() if k != "url"} if isinstance(inner, Mapping) else {}
    )
    rest = {k: v for k, v in part.items() if k not in _IMAGE_SOURCE_KEYS}
    return {
        "type": "image_url",
        "image_url": {"url": url, **to_json_value(inner_rest, where, "image_url")},
        **to_json_value(rest, where),
    }


def _video_part(
    store: AssetStore, part: Mapping[str, Any], where: str, policy: ImagePolicy | None
) -> dict[str, Any]:
    inner = part.get("video_url")
    inner_rest = (
        {k: v for k, v in inner.items() if k != "url"} if isinstance(inner, Mapping) else {}
    )
    rest = {k: v for k, v in part.items() if k not in _VIDEO_SOURCE_KEYS}
    url = _kept_video_url(store, part)
    if url is None:
        url, fps = store.add_video(part, policy=policy, where=where)
        # the loaded rate, so that load_video of the stored part is the original
        # whether or not the asset's container states it (vf_mm.videos.encode_lossless)
        if fps is None:
            rest.pop("frame_rate", None)
        else:
            rest["frame_rate"] = fps
    return {
        "type": "video_url",
        "video_url": {"url": url, **to_json_value(inner_rest, where, "video_url")},
        **to_json_value(rest, where),
    }


def _kept_url(store: AssetStore, part: Mapping[str, Any]) -> str | None:
    """The part's URL when it is kept as it is: http(s), or an asset of this store."""
    url = image_part_source(part)
    if not isinstance(url, str):
        return None
    if _HTTP_URL.match(url):
        return url
    digest = image_asset_hash(url)
    if digest is not None and digest in store:
        return url
    return None


def _kept_video_url(store: AssetStore, part: Mapping[str, Any]) -> str | None:
    """A video part's URL when it is kept as it is: http(s), or a video asset of this
    store (its file there)."""
    url = video_part_source(part) if well_formed_video_part(part) else None
    if not isinstance(url, str):
        return None
    if _HTTP_URL.match(url):
        return url
    if video_asset_hash(url) is not None and (store.root / url).is_file():
        return url
    return None


def _part_source(part: Mapping[str, Any]) -> Any:
    """An image or video part's source, for an ``unavailable`` record."""
    if part.get("type") in VIDEO_PART_TYPES:
        return video_part_source(part)
    return image_part_source(part)
