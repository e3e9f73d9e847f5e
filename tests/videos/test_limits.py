"""VideoLimits: plain frozen data, validated on construction."""

from __future__ import annotations

import pickle

import pytest

from vf_mm.videos import VideoLimits
from vf_mm.videos._internal import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_MAX_DURATION_S,
    DEFAULT_MAX_FRAMES,
    DEFAULT_MAX_PIXELS_PER_FRAME,
)


def test_defaults():
    limits = VideoLimits()
    assert limits.max_bytes == DEFAULT_MAX_BYTES == 256 * 1024 * 1024
    assert limits.max_frames == DEFAULT_MAX_FRAMES == 2048
    assert limits.max_duration_s == DEFAULT_MAX_DURATION_S == 600.0
    assert limits.max_pixels_per_frame == DEFAULT_MAX_PIXELS_PER_FRAME == 4096 * 4096
    assert limits.max_decoded_bytes == DEFAULT_MAX_DECODED_BYTES == 4 * 1024**3
    assert limits.max_pixels_per_frame >= 3840 * 2160  # 4K UHD frames fit


@pytest.mark.parametrize(
    "field", ["max_bytes", "max_frames", "max_pixels_per_frame", "max_decoded_bytes"]
)
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10", None])
def test_integer_limits_must_be_positive_ints(field, value):
    with pytest.raises(ValueError, match=rf"VideoLimits\.{field} must be a positive int"):
        VideoLimits(**{field: value})


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "60"])
def test_max_duration_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match=r"VideoLimits\.max_duration_s"):
        VideoLimits(max_duration_s=value)


def test_an_int_duration_is_stored_as_float():
    assert VideoLimits(max_duration_s=5).max_duration_s == 5.0
    assert isinstance(VideoLimits(max_duration_s=5).max_duration_s, float)


def test_frozen_hashable_picklable_and_replace_validates():
    limits = VideoLimits(max_frames=10)
    with pytest.raises(AttributeError):
        limits.max_frames = 3  # type: ignore[misc]
    assert hash(limits) == hash(VideoLimits(max_frames=10))
    assert pickle.loads(pickle.dumps(limits)) == limits
    assert limits.replace(max_bytes=5) == VideoLimits(max_frames=10, max_bytes=5)
    with pytest.raises(ValueError):
        limits.replace(max_frames=0)
