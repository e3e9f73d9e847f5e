"""Content parts unwrapped (with their frame_rate), and sources named in errors without
secrets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import VideoDecodeError
from vf_mm.videos import Video
from vf_mm.videos._source import describe, unwrap

FRAMES = np.zeros((2, 4, 4, 3), np.uint8)


@pytest.mark.parametrize(
    ("part", "inner"),
    [
        ({"type": "video", "video": "clip.mp4"}, "clip.mp4"),
        ({"type": "video", "url": "https://example.com/a.mp4"}, "https://example.com/a.mp4"),
        ({"type": "video", "path": "/data/a.mp4"}, "/data/a.mp4"),
        ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA"}}, None),
        ({"type": "video_url", "video_url": "file:///a.mp4"}, "file:///a.mp4"),
    ],
)
def test_parts_unwrap_to_their_source(part, inner):
    found, rate = unwrap(part)
    expected = inner if inner is not None else part["video_url"]["url"]
    assert found == expected and rate is None


def test_frame_rate_comes_with_the_part_and_processing_options_are_ignored():
    part = {
        "type": "video",
        "video": FRAMES,
        "frame_rate": 24,
        "fps": 2.0,
        "num_frames": 8,
        "min_pixels": 10,
        "max_pixels": 1000,
    }
    found, rate = unwrap(part)
    assert found is FRAMES and rate == 24.0 and isinstance(rate, float)


@pytest.mark.parametrize("rate", [0, -2, float("nan"), float("inf"), True, "30"])
def test_a_bad_frame_rate_is_refused(rate):
    with pytest.raises(VideoDecodeError, match="frame_rate"):
        unwrap({"type": "video", "video": FRAMES, "frame_rate": rate})


def test_sources_that_are_not_parts_pass_through():
    assert unwrap(FRAMES) == (FRAMES, None)
    assert unwrap("a.mp4") == ("a.mp4", None)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image", "image": "a.png"}, "holds no video"),
        ({"type": "video"}, "exactly one of"),
        ({"type": "video", "video": "a.mp4", "url": "b.mp4"}, "exactly one of"),
        ({"type": "video", "video": {"type": "video", "video": "a"}}, "another content part"),
        ({"type": "video_url", "video_url": {"href": "x"}}, '"video_url"'),
    ],
)
def test_malformed_parts_are_refused(part, message):
    with pytest.raises(VideoDecodeError, match=message):
        unwrap(part)


def test_describe_is_short_and_secret_free():
    assert describe(FRAMES) == "<ndarray (2, 4, 4, 3) uint8>"
    assert describe([FRAMES[0]] * 3) == "<list of 3 frames>"
    assert describe(Video(frames=FRAMES)) == "<Video 2x4x4>"
    assert describe(Image.new("RGB", (3, 2))) == "<PIL image RGB 3x2>"
    assert describe(b"\0" * 10) == "<10 bytes>"
    shown = describe("https://user:pw@example.com/v.mp4?sig=SECRET#t=3")
    assert "SECRET" not in shown and "pw" not in shown and "example.com/v.mp4" in shown
    data_url = "data:video/mp4;base64," + "A" * 5000
    assert "AAAA" not in describe(data_url) and "data:video/mp4;base64" in describe(data_url)
    assert describe({"type": "video", "path": Path("/tmp/a.mp4")}) == "'/tmp/a.mp4'"
    assert describe({"type": "nope"}).startswith("<content part")
    assert describe(3.5) == "<float>"
