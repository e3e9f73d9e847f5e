"""video_hash: the same content (pixels, shape, frame rate) hashes the same wherever it
came from; any change hashes differently; the scheme is pinned."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from vf_mm.images import image_hash, load_image
from vf_mm.videos import Video, load_video, video_hash

from ._make import RATE, moving_square, mp4

ROOT = Path(__file__).resolve().parents[2]


def test_the_scheme_is_the_documented_one():
    frames = moving_square(2)
    video = Video(frames=frames, fps=2.5)
    digest = hashlib.sha256(b"vf_mm.video.v1\0RGB\0")
    digest.update((2).to_bytes(4, "big") + (48).to_bytes(4, "big") + (64).to_bytes(4, "big"))
    digest.update(b"\1" + struct.pack(">d", 2.5))
    digest.update(frames.tobytes())
    assert video_hash(video) == digest.hexdigest()[:32]
    assert len(video_hash(video)) == 32 and int(video_hash(video), 16) >= 0


def test_equal_content_from_different_sources_hashes_equal():
    """The decoded lossless MP4 and the raw frames with its frame rate are one video."""
    from_file = load_video(mp4())
    from_frames = load_video({"type": "video", "video": moving_square(), "frame_rate": RATE})
    from_list = load_video({"type": "video", "video": list(moving_square()), "frame_rate": 10.0})
    assert video_hash(from_file) == video_hash(from_frames) == video_hash(from_list)


def test_a_changed_pixel_fps_or_shape_hashes_differently():
    frames = moving_square(4)
    base = video_hash(Video(frames=frames, fps=10))
    changed = frames.copy()
    changed[3, 47, 63, 2] ^= 1
    assert video_hash(Video(frames=changed, fps=10)) != base
    assert video_hash(Video(frames=frames, fps=10.5)) != base
    assert video_hash(Video(frames=frames)) != base  # no rate is not any rate
    same_bytes = frames.reshape(4, 64, 48, 3)
    assert video_hash(Video(frames=same_bytes, fps=10)) != base
    swapped = frames[[1, 0, 2, 3]]
    assert video_hash(Video(frames=swapped, fps=10)) != base


def test_an_int_and_a_float_frame_rate_agree():
    frames = moving_square(2)
    assert video_hash(Video(frames=frames, fps=30)) == video_hash(Video(frames=frames, fps=30.0))


def test_a_one_frame_video_never_collides_with_its_image():
    frame = moving_square(1)
    assert video_hash(Video(frames=frame)) != image_hash(load_image(frame[0]))


def test_stable_across_processes():
    video = Video(frames=moving_square(3), fps=RATE)
    code = (
        "import numpy as np; from tests.videos._make import moving_square; "
        "from vf_mm.videos import Video, video_hash; "
        f"print(video_hash(Video(frames=moving_square(3), fps={RATE})))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert other.stdout.strip() == video_hash(video)


def test_hashing_reads_the_frames_in_place():
    """The buffer is handed to sha256 as it lies: hashing allocates nothing like a copy."""
    video = Video(frames=np.zeros((8, 256, 256, 3), np.uint8))
    tracemalloc.start()
    try:
        video_hash(video)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < video.frames.nbytes // 20


def test_only_videos_are_hashed():
    with pytest.raises(TypeError, match="takes a Video"):
        video_hash(moving_square(1))  # type: ignore[arg-type]
