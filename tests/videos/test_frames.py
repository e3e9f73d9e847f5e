"""Raw frames (an array, or a list of images or arrays) to (T, H, W, 3) RGB: copied,
converted as images are, refused where a guess would give a wrong picture."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import VideoDecodeError, VideoTooLargeError
from vf_mm.images import ImagePolicy, load_image
from vf_mm.videos import VideoLimits
from vf_mm.videos._frames import frames_from_array, frames_from_list

from ._make import moving_square

LIMITS = VideoLimits()
POLICY = ImagePolicy()


def from_array(array, *, fps=None, limits=LIMITS):
    return frames_from_array(array, fps=fps, limits=limits, policy=POLICY)


def from_list(frames, *, fps=None, limits=LIMITS):
    return frames_from_list(frames, fps=fps, limits=limits, policy=POLICY)


# --- arrays ------------------------------------------------------------------------------


def test_an_rgb_array_is_copied_exactly():
    source = moving_square(4)
    frames = from_array(source)
    assert np.array_equal(frames, source) and not np.shares_memory(frames, source)
    assert frames.flags.c_contiguous


def test_a_non_contiguous_array_becomes_contiguous():
    source = moving_square(4)[::2]
    frames = from_array(source)
    assert frames.flags.c_contiguous and np.array_equal(frames, source)


@pytest.mark.parametrize("shape", [(3, 5, 7), (3, 5, 7, 1)])
def test_grey_is_replicated_to_rgb(shape):
    grey = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
    frames = from_array(grey)
    assert frames.shape == (3, 5, 7, 3)
    assert all(np.array_equal(frames[..., c], grey.reshape(3, 5, 7)) for c in range(3))


def test_rgba_is_composited_onto_white_as_images_are():
    rgba = np.zeros((2, 4, 4, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 128  # half transparent red over white
    frames = from_array(rgba)
    expected = np.asarray(load_image(rgba[0]))
    assert frames.shape == (2, 4, 4, 3) and np.array_equal(frames[0], expected)
    assert tuple(frames[0, 0, 0]) != (200, 0, 0)  # not just the alpha dropped


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (
            np.zeros((2, 4, 4, 3), np.float32),
            r"uint8 \(0-255\), not float32 \(shape \(2, 4, 4, 3\)\)",
        ),
        (np.zeros((2, 4, 4, 3), np.uint16), "not uint16"),
        (np.zeros((2, 3, 16, 16), np.uint8), r"shape \(2, 3, 16, 16\) \(channels first\?"),
        (np.zeros((2, 4, 4, 2), np.uint8), r"not shape \(2, 4, 4, 2\)"),
        (np.zeros((48, 64, 3), np.uint8), r"reads as one \(H, W, C\) image"),
        (np.zeros((4, 4), np.uint8), r"not shape \(4, 4\)"),
        (np.zeros((0, 4, 4, 3), np.uint8), r"at least one frame, got shape \(0, 4, 4, 3\)"),
        (np.zeros((2, 0, 4, 3), np.uint8), r"at least one frame, got shape \(2, 0, 4, 3\)"),
    ],
)
def test_arrays_a_guess_would_get_wrong_are_refused_naming_shape_and_dtype(array, message):
    with pytest.raises(VideoDecodeError, match=message):
        from_array(array)


def test_a_torch_tensor_is_read_through_array():
    import torch

    frames = from_array(torch.from_numpy(moving_square(2)))
    assert np.array_equal(frames, moving_square(2))


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (VideoLimits(max_frames=3), "the source holds 4 frames, over max_frames=3"),
        (VideoLimits(max_pixels_per_frame=64 * 48 - 1), "64x48 = 3072 pixels are over"),
        (VideoLimits(max_decoded_bytes=3 * 64 * 48 * 3), "decoded bytes, over max_decoded_bytes"),
    ],
)
def test_array_limits_are_checked_before_the_copy(limits, message):
    with pytest.raises(VideoTooLargeError, match=message):
        from_array(moving_square(4), limits=limits)


def test_array_duration_needs_a_frame_rate():
    limits = VideoLimits(max_duration_s=1.0)
    from_array(moving_square(4), limits=limits)  # no rate: no duration to check
    with pytest.raises(VideoTooLargeError, match=r"2\.000 s \(4 frames at 2 fps\)"):
        from_array(moving_square(4), fps=2.0, limits=limits)


# --- lists -------------------------------------------------------------------------------


def test_a_list_of_arrays_and_images_stacks_exactly():
    source = moving_square(3)
    mixed = [source[0], Image.fromarray(source[1]), source[2]]
    assert np.array_equal(from_list(mixed), source)
    assert np.array_equal(from_list(tuple(mixed)), source)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "1", "CMYK", "I;16"])
def test_pil_frames_of_any_mode_convert_as_load_image_converts(mode):
    rgba = Image.fromarray(moving_square(1)[0]).convert("RGBA")
    rgba.putalpha(100)
    image = rgba.convert(mode)
    frames = from_list([image, image])
    expected = np.asarray(load_image(image))
    assert np.array_equal(frames[0], expected) and np.array_equal(frames[1], expected)


def test_grey_array_frames_are_replicated():
    grey = np.arange(20, dtype=np.uint8).reshape(4, 5)
    frames = from_list([grey, grey])
    assert frames.shape == (2, 4, 5, 3) and np.array_equal(frames[1, ..., 2], grey)


def test_frames_of_different_sizes_are_refused_naming_the_first_that_differs():
    a = Image.new("RGB", (64, 48))
    b = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(VideoDecodeError, match="frame 2 is 32x32 but frame 0 is 64x48"):
        from_list([a, a, b, Image.new("RGB", (10, 10))])


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([], "at least one frame"),
        (["frame.png"], "frame 0 is a str; a frame must be a PIL image"),
        ([np.zeros((4, 4, 3), np.uint8), b"\x89PNG"], "frame 1 is a bytes"),
        ([np.zeros((2, 4, 4, 3), np.uint8)], r"frame 0 is an array of shape \(2, 4, 4, 3\)"),
        ([np.zeros((4, 4, 3), np.float32)], "frame 0: an image array must be uint8"),
    ],
)
def test_bad_frames_are_refused_naming_the_frame(frames, message):
    with pytest.raises(VideoDecodeError, match=message):
        from_list(frames)


def test_list_limits_are_checked_before_any_frame_is_converted():
    class Exploding:  # would fail if its size or pixels were read
        shape = property(lambda self: pytest.fail("read"))

    with pytest.raises(VideoTooLargeError, match="the source holds 3 frames, over max_frames=2"):
        from_list([Exploding()] * 3, limits=VideoLimits(max_frames=2))
    big = [Image.new("RGB", (64, 48))] * 2
    with pytest.raises(VideoTooLargeError, match="pixels are over"):
        from_list(big, limits=VideoLimits(max_pixels_per_frame=100))
    with pytest.raises(VideoTooLargeError, match=r"\(2 frames at 1 fps\)"):
        from_list(big, fps=1.0, limits=VideoLimits(max_duration_s=1.5))


def test_the_image_policy_pixel_limit_applies_to_each_frame():
    policy = ImagePolicy(max_pixels=100)
    with pytest.raises(VideoTooLargeError, match="frame 0:"):
        frames_from_list([Image.new("RGB", (64, 48))], fps=None, limits=LIMITS, policy=policy)
