"""``load_video``: any video source to a ``Video``, as the policy and limits allow."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from PIL import Image

from vf_mm.errors import (
    ImageError,
    ImageFetchError,
    ImageTooLargeError,
    UnsafeImageSourceError,
    UnsafeVideoSourceError,
    VideoDecodeError,
    VideoError,
    VideoFetchError,
    VideoTooLargeError,
)
from vf_mm.images import Fetcher, ImagePolicy
from vf_mm.images._internal import classify_source, read_encoded
from vf_mm.videos._decode import decode_video
from vf_mm.videos._frames import frames_from_array, frames_from_list
from vf_mm.videos._limits import VideoLimits, check_duration, check_frame_count, check_frame_size
from vf_mm.videos._source import describe, is_array, unwrap
from vf_mm.videos._video import Video, locked

__all__ = ["load_video"]

_DEFAULT_POLICY = ImagePolicy()
_DEFAULT_LIMITS = VideoLimits()
_DEFAULT_FETCHER = Fetcher()


def load_video(
    source: Any,
    *,
    policy: ImagePolicy | None = None,
    limits: VideoLimits | None = None,
    where: str | None = None,
    fetcher: Fetcher | None = None,
) -> Video:
    """Load ``source`` as a ``Video``: every frame decoded, RGB, read-only.

    Never a partial video. ``fps`` of the result: the container's average frame rate for encoded
    sources; a part's ``"frame_rate"`` where the source states none (raw frames always, a
    container without a rate, a ``Video`` whose ``fps`` is None); else ``None``.

    Args:
        source: A list or tuple of frames (PIL images of any mode, ``(H, W, 3)`` or
            ``(H, W)`` uint8 arrays; all the same size); a ``(T, H, W, 3)`` or
            ``(T, H, W)`` uint8 array; encoded video bytes; a ``data:video/...;base64,``
            URL; a local path (``str`` or ``os.PathLike``) or ``file://`` URL; an
            ``http(s)://`` URL; a ``Video`` (returned as it is, once checked against
            ``limits``); or a content part holding one of these (``{"type": "video",
            "video": ...}``, ``{"type": "video_url", "video_url": {"url": ...}}``).
        policy: Where a video may be read from, exactly as for images (``ImagePolicy()``
            when None: any local path, no network); its ``max_bytes`` is replaced by
            ``limits.max_bytes``, its ``timeout_s`` bounds a whole fetch (raise it for large
            videos).
        limits: ``VideoLimits()`` when None.
        where: The video's place in a conversation (``"message 2, part 1"``), put in
            errors.
        fetcher: How http(s) is fetched (tests pass a mock transport).

    Raises:
        UnsafeVideoSourceError: The policy's guard refuses where it comes from (its
            refusal chained as ``__cause__``).
        VideoFetchError: Reading it failed.
        VideoDecodeError: Not a whole video we decode, or frames we refuse.
        VideoTooLargeError: Over a ``VideoLimits`` limit.
    """
    policy, limits = _checked_args(policy, limits)
    with _named(source, where):
        return _load(source, policy, limits, fetcher or _DEFAULT_FETCHER)


def read_video_bytes(
    source: Any,
    *,
    policy: ImagePolicy | None = None,
    limits: VideoLimits | None = None,
    where: str | None = None,
    fetcher: Fetcher | None = None,
) -> bytes:
    """The encoded bytes a source holds or names, not decoded.

    Read exactly as ``load_video`` reads them. For whoever must keep a clip's own file (the
    results store keeps what was sent, so a browser can play it). Read through ``policy``'s
    guard, at most ``limits.max_bytes``.

    Args:
        source: Bytes, a ``data:`` URL, a local path or ``file://`` URL, an http(s) URL,
            or a content part holding one; raw frames are refused (they have no file:
            ``encode_lossless`` makes one).
        policy: As for ``load_video``.
        limits: As for ``load_video``.
        where: The video's place in a conversation, put in errors.
        fetcher: How http(s) is fetched.

    Raises:
        UnsafeVideoSourceError: The guard refuses where it comes from.
        VideoFetchError: Reading it failed.
        VideoDecodeError: Raw frames, or not a video source.
        VideoTooLargeError: Over ``limits.max_bytes``.
    """
    policy, limits = _checked_args(policy, limits)
    inner, _ = unwrap(source)
    with _named(source, where):
        if is_raw_video(inner):
            raise VideoDecodeError("raw frames have no encoded bytes to read")
        return bytes(_read(inner, policy, limits, fetcher or _DEFAULT_FETCHER))


def _checked_args(
    policy: ImagePolicy | None, limits: VideoLimits | None
) -> tuple[ImagePolicy, VideoLimits]:
    policy = _DEFAULT_POLICY if policy is None else policy
    limits = _DEFAULT_LIMITS if limits is None else limits
    if not isinstance(policy, ImagePolicy):
        raise TypeError(f"policy must be an ImagePolicy, not {type(policy).__name__}")
    if not isinstance(limits, VideoLimits):
        raise TypeError(f"limits must be a VideoLimits, not {type(limits).__name__}")
    return policy, limits


@contextlib.contextmanager
def _named(source: Any, where: str | None) -> Iterator[None]:
    """Errors inside, in the video tree (the image guard's refusals mapped) and naming
    ``source`` and ``where``."""
    try:
        try:
            yield
        except ImageError as exc:  # the image guard's refusal, in the video tree
            raise _as_video_error(exc) from exc
    except VideoError as exc:
        if exc.source is None:
            exc.source = describe(source)
        if exc.where is None:
            exc.where = where
        raise


def is_raw_video(source: Any) -> bool:
    """Whether a video source is frames rather than encoded bytes or a place.

    Frames are a list or tuple of frames, an array, or a ``Video``.

    Args:
        source: A video source (any form ``load_video`` takes).
    """
    return isinstance(source, (Video, list, tuple)) or is_array(source)


def _as_video_error(exc: ImageError) -> VideoError:
    if isinstance(exc, UnsafeImageSourceError):
        return UnsafeVideoSourceError(exc.reason)
    if isinstance(exc, ImageFetchError):
        return VideoFetchError(exc.reason, status=exc.status)
    if isinstance(exc, ImageTooLargeError):
        return VideoTooLargeError(exc.reason)
    return VideoDecodeError(exc.reason)


def _load(source: Any, policy: ImagePolicy, limits: VideoLimits, fetcher: Fetcher) -> Video:
    inner, frame_rate = unwrap(source)
    if isinstance(inner, Video):
        return _checked(inner, frame_rate, limits)
    if isinstance(inner, (list, tuple)):
        frames = frames_from_list(inner, fps=frame_rate, limits=limits, policy=policy)
        return Video(frames=locked(frames), fps=frame_rate)
    if is_array(inner):
        frames = frames_from_array(inner, fps=frame_rate, limits=limits, policy=policy)
        return Video(frames=locked(frames), fps=frame_rate)
    if isinstance(inner, Image.Image):
        raise VideoDecodeError(
            "a single image is not a video; pass [image] for a one-frame video, or pass it "
            "as an image part"
        )
    frames, fps = decode_video(_read(inner, policy, limits, fetcher), limits)
    if fps is None and frame_rate is not None:
        fps = frame_rate
        check_duration(len(frames) / fps, limits, how=f"{len(frames)} frames at {fps:g} fps")
    return Video(frames=locked(frames), fps=fps)


def _checked(video: Video, frame_rate: float | None, limits: VideoLimits) -> Video:
    """A ``Video`` passed in, held to ``limits`` like any other source (it may have been
    loaded under looser ones)."""
    check_frame_size(video.width, video.height, limits)
    check_frame_count(
        video.num_frames, video.width * video.height * 3, limits, stated="the source holds"
    )
    if video.fps is None and frame_rate is not None:
        video = Video(frames=video.frames, fps=frame_rate)  # shares the read-only frames
    if video.duration_s is not None:
        check_duration(
            video.duration_s, limits, how=f"{video.num_frames} frames at {video.fps:g} fps"
        )
    return video


@functools.lru_cache(maxsize=64)
def _guard_policy(policy: ImagePolicy, max_bytes: int) -> ImagePolicy:
    """``policy`` with the video byte cap (cached: ``replace`` validates again, resolving
    the local roots on the filesystem)."""
    return policy if policy.max_bytes == max_bytes else policy.replace(max_bytes=max_bytes)


def _read(source: Any, policy: ImagePolicy, limits: VideoLimits, fetcher: Fetcher) -> Any:
    """The encoded bytes of a source that names them (bytes, a URL, a path), read through
    the image guard with ``limits.max_bytes`` as the cap."""
    if not isinstance(source, (str, bytes, bytearray, memoryview)) and not hasattr(
        source, "__fspath__"
    ):
        raise VideoDecodeError(
            "a video source must be a list of frames, a (T, H, W, 3) uint8 array, encoded "
            "bytes, a data:/file:/http(s): URL, a path, a Video or a content-part dict, "
            f"not {type(source).__name__}"
        )
    guarded = _guard_policy(policy, limits.max_bytes)
    return read_encoded(classify_source(source), guarded, fetcher, medium="video")
