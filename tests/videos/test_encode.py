"""``encode_lossless``: raw frames become a file that decodes back to exactly them, frame
rate included, or the encoding is refused."""

from __future__ import annotations

import numpy as np
import pytest

import vf_mm.videos._encode as encoding
from tests.videos._make import encode, moving_square
from vf_mm.errors import VideoDecodeError
from vf_mm.videos import Video, encode_lossless, load_video, video_extension, video_hash


@pytest.mark.parametrize("fps", [None, 4.0, 30000 / 1001, 2.5, 3.14159])
def test_frames_and_rate_come_back_exactly(fps):
    video = Video(moving_square(count=5, width=33, height=17), fps=fps)
    data = encode_lossless(video)
    assert video_extension(data) == "mkv"
    part = {"type": "video", "video": data}
    if fps is not None:
        part["frame_rate"] = fps  # kept beside a file that cannot state the rate exactly
    back = load_video(part)
    assert np.array_equal(back.frames, video.frames) and back.fps == fps
    assert video_hash(back) == video_hash(video)


def test_an_encoding_that_does_not_round_trip_is_refused(monkeypatch):
    lossy = encode(moving_square(), codec="libx264", pix_fmt="yuv420p")
    monkeypatch.setattr(encoding, "_encode", lambda video, rate: lossy)
    with pytest.raises(VideoDecodeError, match="losslessly"):
        encode_lossless(Video(moving_square(), fps=10.0))
