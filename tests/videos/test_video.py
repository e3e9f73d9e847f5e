"""Video: (T, H, W, 3) uint8 frames, C-contiguous and read-only all the way down; fps a
positive float or None; equality by identity."""

from __future__ import annotations

import numpy as np
import pytest

from vf_mm.videos import Video

from ._make import moving_square


def test_a_writeable_array_is_copied_and_the_copy_locked():
    frames = moving_square(3)
    video = Video(frames=frames)
    assert video.frames is not frames and not np.shares_memory(video.frames, frames)
    assert not video.frames.flags.writeable and video.frames.flags.c_contiguous
    frames[0, 0, 0] = 7  # the caller's array stays theirs
    assert not np.array_equal(video.frames, frames)
    with pytest.raises(ValueError):
        video.frames[0, 0, 0] = 1


def test_the_frames_cannot_be_made_writeable_again():
    video = Video(frames=moving_square(2))
    with pytest.raises(ValueError):
        video.frames.flags.writeable = True


def test_a_read_only_view_of_writeable_memory_is_copied():
    base = moving_square(2)
    view = base.view()
    view.flags.writeable = False
    video = Video(frames=view)
    assert not np.shares_memory(video.frames, base)


def test_a_non_contiguous_array_is_copied_contiguous():
    frames = np.asfortranarray(moving_square(2))
    assert Video(frames=frames).frames.flags.c_contiguous


def test_a_locked_array_is_kept_without_a_copy():
    frames = moving_square(2)
    frames.flags.writeable = False
    video = Video(frames=frames)
    assert video.frames is frames


@pytest.mark.parametrize(
    "frames",
    [
        np.zeros((2, 4, 4, 3), dtype=np.float32),
        np.zeros((2, 4, 4), dtype=np.uint8),
        np.zeros((2, 4, 4, 4), dtype=np.uint8),
        np.zeros((0, 4, 4, 3), dtype=np.uint8),
        np.zeros((2, 0, 4, 3), dtype=np.uint8),
    ],
)
def test_frames_other_than_t_h_w_3_uint8_are_refused(frames):
    with pytest.raises(ValueError, match=r"Video\.frames"):
        Video(frames=frames)


def test_frames_must_be_a_numpy_array():
    with pytest.raises(TypeError):
        Video(frames=[[[[0, 0, 0]]]])  # type: ignore[arg-type]


@pytest.mark.parametrize("fps", [0, -1.0, float("nan"), float("inf"), True, "30"])
def test_fps_must_be_positive_and_finite(fps):
    with pytest.raises(ValueError, match="fps"):
        Video(frames=moving_square(1), fps=fps)


def test_fps_is_stored_as_float_and_gives_the_duration():
    video = Video(frames=moving_square(6), fps=np.int64(3))
    assert video.fps == 3.0 and type(video.fps) is float
    assert (video.num_frames, video.height, video.width) == (6, 48, 64)
    assert video.duration_s == 2.0
    assert Video(frames=moving_square(6)).duration_s is None


def test_equality_is_identity_and_repr_is_short():
    a = Video(frames=moving_square(2), fps=2)
    b = Video(frames=a.frames, fps=2)
    assert a == a and a != b  # compare content with video_hash
    assert repr(a) == "Video(frames=<2x48x64x3 uint8>, fps=2.0)"


def test_a_video_is_frozen():
    video = Video(frames=moving_square(1))
    with pytest.raises(AttributeError):
        video.fps = 3.0  # type: ignore[misc]
