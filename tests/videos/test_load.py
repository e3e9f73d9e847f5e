"""load_video over every source form, through the image guard, with errors in the video
tree that name the source (secret-free) and where it was."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import (
    ImageError,
    UnsafeImageSourceError,
    UnsafeVideoSourceError,
    VideoDecodeError,
    VideoError,
    VideoFetchError,
    VideoTooLargeError,
)
from vf_mm.images import ImagePolicy
from vf_mm.videos import Video, VideoLimits, load_video, video_hash

from ._make import RATE, encode, live_mkv, moving_square, mp4, serving

EXPECTED = moving_square()
DATA_URL = "data:video/mp4;base64," + base64.b64encode(mp4()).decode()
NET = ImagePolicy(allow_network=True)


def same(video: Video, fps: float | None = float(RATE)) -> bool:
    return (
        isinstance(video, Video)
        and np.array_equal(video.frames, EXPECTED)
        and not video.frames.flags.writeable
        and video.fps == fps
    )


@pytest.fixture
def clip(tmp_path: Path) -> Path:
    path = tmp_path / "a clip.mp4"
    path.write_bytes(mp4())
    return path


# --- every source form -------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_encoded_bytes(wrap):
    assert same(load_video(wrap(mp4())))


def test_data_url():
    assert same(load_video(DATA_URL))


def test_path_as_str_and_as_path(clip: Path):
    assert same(load_video(str(clip)))
    assert same(load_video(clip))


def test_file_url(clip: Path):
    assert same(load_video(clip.as_uri()))  # the space percent-encoded


def test_http_url_with_the_network_on():
    fetcher = serving(mp4(), **{"content-type": "video/mp4"})
    assert same(load_video("https://example.com/clip.mp4", policy=NET, fetcher=fetcher))


def test_raw_frames_array_and_list():
    assert same(load_video(EXPECTED), fps=None)
    assert same(load_video(list(EXPECTED)), fps=None)
    assert same(load_video(tuple(Image.fromarray(f) for f in EXPECTED)), fps=None)


def test_the_callers_array_is_never_kept():
    source = EXPECTED.copy()
    video = load_video(source)
    source[:] = 0
    assert np.array_equal(video.frames, EXPECTED)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "video", "video": "PATH"},
        {"type": "video", "path": "PATH"},
        {"type": "video", "url": "URL"},
        {"type": "video_url", "video_url": {"url": "URL"}},
        {"type": "video_url", "video_url": "URL"},
        {"type": "video", "video": "DATA"},
        {"type": "video", "video": "BYTES"},
    ],
)
def test_content_parts(part, clip: Path):
    values = {"PATH": str(clip), "URL": clip.as_uri(), "DATA": DATA_URL, "BYTES": mp4()}

    def fill(value):
        return (
            {k: fill(v) for k, v in value.items()}
            if isinstance(value, dict)
            else values.get(value, value)
        )

    assert same(load_video(fill(part)))


def test_processing_options_in_a_part_are_ignored(clip: Path):
    part = {"type": "video", "video": str(clip), "fps": 2, "num_frames": 4, "max_pixels": 64}
    assert same(load_video(part))


# --- the frame rate ----------------------------------------------------------------------


def test_raw_frames_take_the_parts_frame_rate():
    video = load_video({"type": "video", "video": EXPECTED, "frame_rate": 24})
    assert video.fps == 24.0 and video.duration_s == pytest.approx(12 / 24)
    assert load_video({"type": "video", "video": list(EXPECTED)}).fps is None


def test_the_containers_rate_wins_over_the_parts(clip: Path):
    assert load_video({"type": "video", "video": str(clip), "frame_rate": 25}).fps == RATE


def test_a_container_that_states_no_rate_takes_the_parts():
    """MPEG-TS stores no frame rate; FFmpeg cannot tell one for MPEG-4 Part 2 in it."""
    data = encode(EXPECTED, fmt="mpegts", codec="mpeg4", pix_fmt=None)
    assert load_video(data).fps is None
    assert load_video({"type": "video", "video": data, "frame_rate": 10}).fps == 10.0
    # the duration limit holds for the rate given (the header's 1.2 s is under it)
    with pytest.raises(VideoTooLargeError, match=r"2\.400 s \(12 frames at 5 fps\)"):
        load_video(
            {"type": "video", "video": data, "frame_rate": 5},
            limits=VideoLimits(max_duration_s=2.0),
        )


def test_a_video_passed_in_is_returned_as_it_is_or_given_the_parts_rate():
    video = load_video(EXPECTED)
    assert load_video(video) is video
    assert load_video({"type": "video", "video": video}) is video
    rated = load_video({"type": "video", "video": video, "frame_rate": 5})
    assert rated.fps == 5.0 and rated.frames is video.frames
    timed = load_video(mp4())
    assert load_video({"type": "video", "video": timed, "frame_rate": 5}).fps == RATE


def test_a_video_passed_in_is_held_to_the_limits():
    video = load_video(EXPECTED)
    with pytest.raises(VideoTooLargeError, match="over max_frames=3"):
        load_video(video, limits=VideoLimits(max_frames=3))


# --- the guard ---------------------------------------------------------------------------


def test_http_is_refused_with_the_network_off():
    with pytest.raises(UnsafeVideoSourceError, match="network access is off") as caught:
        load_video("https://example.com/clip.mp4?token=SECRET", where="message 1, part 0")
    error = caught.value
    assert isinstance(error.__cause__, UnsafeImageSourceError)
    assert error.source == "https://example.com/clip.mp4?…" and "SECRET" not in str(error)
    assert error.where == "message 1, part 0"
    assert str(error).startswith("video https://example.com/clip.mp4?… (message 1, part 0): ")


def test_the_ssrf_guard_applies_to_videos():
    with pytest.raises(UnsafeVideoSourceError, match="not a public address"):
        load_video("http://169.254.169.254/latest/clip.mp4", policy=NET)
    with pytest.raises(UnsafeVideoSourceError, match="not read"):
        load_video("ftp://example.com/clip.mp4", policy=NET)


def test_a_path_outside_local_roots_is_refused(clip: Path, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("roots")
    policy = ImagePolicy.dataset(roots=[elsewhere])
    with pytest.raises(UnsafeVideoSourceError, match="outside local_roots"):
        load_video(clip, policy=policy)
    with pytest.raises(UnsafeVideoSourceError, match="outside local_roots"):
        load_video(clip.as_uri(), policy=policy)
    link = elsewhere / "link.mp4"
    os.symlink(clip, link)  # a symlink inside the roots pointing out of them
    with pytest.raises(UnsafeVideoSourceError, match="outside local_roots"):
        load_video(link, policy=policy)
    assert same(load_video(clip, policy=ImagePolicy.dataset(roots=[clip.parent])))


def test_no_local_file_under_a_policy_without_roots(clip: Path):
    with pytest.raises(UnsafeVideoSourceError, match=r"local_roots=\(\)"):
        load_video(clip, policy=ImagePolicy.dataset())


def test_a_missing_file_is_a_fetch_error(tmp_path: Path):
    with pytest.raises(VideoFetchError, match="no such file"):
        load_video(tmp_path / "missing.mp4")


def test_an_http_error_status_is_a_fetch_error_with_the_status():
    with pytest.raises(VideoFetchError, match="HTTP 404") as caught:
        load_video("https://example.com/gone.mp4", policy=NET, fetcher=serving(b"", status=404))
    assert caught.value.status == 404


def test_the_byte_cap_is_the_video_limit_not_the_image_policys(clip: Path):
    small_policy = ImagePolicy(allow_network=True, max_bytes=1000)  # smaller than the clip
    assert len(mp4()) > 1000
    assert same(load_video(clip, policy=small_policy))
    tight = VideoLimits(max_bytes=1000)
    for source in (clip, DATA_URL, mp4()):
        with pytest.raises(VideoTooLargeError, match="max_bytes=1000"):
            load_video(source, limits=tight)
    # an HTTP body over the cap is a fetch error, as it is for images (ImageFetchError)
    with pytest.raises(VideoFetchError, match="over max_bytes=1000"):
        load_video("https://example.com/a.mp4", policy=NET, limits=tight, fetcher=serving(mp4()))


# --- what is not a video -----------------------------------------------------------------


def test_a_single_image_is_not_a_video():
    with pytest.raises(VideoDecodeError, match=r"pass \[image\] for a one-frame video"):
        load_video(Image.new("RGB", (8, 8)))


def test_an_image_file_is_not_a_video(tmp_path: Path):
    path = tmp_path / "photo.mp4"  # the name says video; the bytes say PNG
    Image.new("RGB", (8, 8)).save(path, "PNG")
    with pytest.raises(VideoDecodeError, match="a PNG image, not a video"):
        load_video(path)


def test_an_image_data_url_is_not_a_video():
    with pytest.raises(VideoDecodeError, match="is an image, not a video"):
        load_video("data:image/png;base64,iVBORw0KGgo=")


@pytest.mark.parametrize("source", [3, 2.5, None, object(), {"type": "text", "text": "hi"}])
def test_other_values_are_refused(source):
    with pytest.raises(VideoDecodeError):
        load_video(source)


def test_arguments_of_the_wrong_type_are_type_errors():
    with pytest.raises(TypeError, match="ImagePolicy"):
        load_video(EXPECTED, policy=VideoLimits())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="VideoLimits"):
        load_video(EXPECTED, limits=ImagePolicy())  # type: ignore[arg-type]


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        (np.zeros((2, 3, 16, 16), np.uint8), "<ndarray (2, 3, 16, 16) uint8>"),
        ({"type": "video", "video": [np.zeros((4, 4, 3), np.uint8), "x"]}, "<list of 2 frames>"),
        (b"<html></html>", "<13 bytes>"),
        ("data:video/mp4;base64," + "A" * 400, "data:video/mp4;base64,… (422 chars)"),
    ],
)
def test_errors_name_the_source_and_where(source, shown):
    with pytest.raises(VideoDecodeError) as caught:
        load_video(source, where="message 3, part 1")
    assert caught.value.source == shown and caught.value.where == "message 3, part 1"
    assert str(caught.value).startswith(f"video {shown} (message 3, part 1): ")


def test_video_errors_are_value_errors_and_never_image_errors():
    with pytest.raises(VideoError) as caught:
        load_video("https://example.com/a.mp4")
    assert isinstance(caught.value, ValueError) and not isinstance(caught.value, ImageError)


def test_limits_found_while_decoding_name_the_source():
    with pytest.raises(VideoTooLargeError, match="stopped at frame 4") as caught:
        load_video(live_mkv(), limits=VideoLimits(max_frames=3), where="tool result 2")
    assert caught.value.where == "tool result 2"


def test_the_same_clip_loads_to_the_same_hash_every_time(clip: Path):
    assert video_hash(load_video(clip)) == video_hash(load_video(DATA_URL))
