"""Encoded bytes to frames: every frame as transformers' pyav backend converts it, the
frame rate from the stream, the limits enforced from the header and while decoding, and
never a partial video."""

from __future__ import annotations

import fractions

import numpy as np
import pytest

from vf_mm.errors import VideoDecodeError, VideoTooLargeError
from vf_mm.videos import VideoLimits
from vf_mm.videos._decode import decode_video

from ._make import (
    COUNT,
    HEIGHT,
    RATE,
    WIDTH,
    audio_only_mp4,
    encode,
    faststart_mp4,
    live_mkv,
    moving_square,
    mp4,
    no_frames_mkv,
    resolution_change_ts,
    webm,
)

LIMITS = VideoLimits()
FRAME_BYTES = WIDTH * HEIGHT * 3


def test_lossless_mp4_decodes_to_exactly_the_frames_written():
    frames, fps = decode_video(mp4(), LIMITS)
    assert frames.shape == (COUNT, HEIGHT, WIDTH, 3) and frames.dtype == np.uint8
    assert frames.flags.c_contiguous
    assert np.array_equal(frames, moving_square())
    assert fps == float(RATE)


def test_the_pixels_are_pyavs_rgb24_conversion():
    """What transformers' pyav backend stacks: frame.to_ndarray(format="rgb24")."""
    import io

    import av

    data = webm()
    with av.open(io.BytesIO(data)) as container:
        expected = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    frames, _ = decode_video(data, LIMITS)
    assert np.array_equal(frames, expected)
    assert np.abs(frames.astype(int) - moving_square()).mean() < 8  # lossy, but the clip


@pytest.mark.parametrize(
    ("kwargs", "lossless"),
    [
        ({"fmt": "matroska", "codec": "ffv1", "pix_fmt": "bgr0"}, True),
        ({"fmt": "mov", "codec": "png", "pix_fmt": "rgb24"}, True),
        ({"fmt": "avi", "codec": "mpeg4", "pix_fmt": None, "options": {"qscale": "2"}}, False),
        ({"fmt": "mpegts", "codec": "libx264", "pix_fmt": None}, False),
    ],
)
def test_every_container_read_decodes_every_frame(kwargs, lossless):
    frames, fps = decode_video(encode(moving_square(), **kwargs), LIMITS)
    assert frames.shape == (COUNT, HEIGHT, WIDTH, 3)
    error = np.abs(frames.astype(int) - moving_square())
    assert error.max() == 0 if lossless else error.mean() < 8  # 4:2:0 chroma blurs edges
    assert fps == RATE


def test_a_fractional_frame_rate_is_kept():
    data = encode(moving_square(4), rate=fractions.Fraction(30000, 1001))
    _, fps = decode_video(data, LIMITS)
    assert fps == pytest.approx(29.97002997)


def test_rotation_metadata_is_not_applied():
    """A phone's display matrix is left alone, as transformers' backend leaves it."""
    data = encode(moving_square(3), rotation=90)
    frames, _ = decode_video(data, LIMITS)
    assert frames.shape == (3, HEIGHT, WIDTH, 3)
    assert np.array_equal(frames, moving_square(3))


def test_no_frames_and_no_video_stream_are_refused():
    with pytest.raises(VideoDecodeError, match="holds audio only"):
        decode_video(audio_only_mp4(), LIMITS)
    with pytest.raises(VideoDecodeError, match="holds no frames"):
        decode_video(no_frames_mkv(), LIMITS)


def test_a_resolution_change_mid_stream_is_refused():
    with pytest.raises(VideoDecodeError, match="frame 4 is 32x32 but earlier frames are 64x48"):
        decode_video(resolution_change_ts(), LIMITS)


# --- limits ------------------------------------------------------------------------------


def test_max_bytes_is_checked_before_anything_is_parsed():
    with pytest.raises(VideoTooLargeError, match="over max_bytes=100"):
        decode_video(b"not even a video" * 10, VideoLimits(max_bytes=100))


def test_max_pixels_per_frame_from_the_header():
    with pytest.raises(VideoTooLargeError, match="64x48 = 3072 pixels are over"):
        decode_video(mp4(), VideoLimits(max_pixels_per_frame=3071))
    decode_video(mp4(), VideoLimits(max_pixels_per_frame=3072))


def test_max_frames_from_the_stated_count():
    with pytest.raises(VideoTooLargeError, match="the header states 12 frames, over max_frames=11"):
        decode_video(mp4(), VideoLimits(max_frames=11))
    assert decode_video(mp4(), VideoLimits(max_frames=12))[0].shape[0] == 12


def test_max_frames_found_only_while_decoding_stops_at_the_first_frame_over():
    """A live recording states no count: decoding stops at frame max_frames + 1."""
    with pytest.raises(
        VideoTooLargeError, match=r"more than max_frames=5 frames \(stopped at frame 6\)"
    ):
        decode_video(live_mkv(), VideoLimits(max_frames=5))
    assert decode_video(live_mkv(), VideoLimits(max_frames=COUNT))[0].shape[0] == COUNT


def test_max_decoded_bytes_from_the_header_and_while_decoding():
    with pytest.raises(
        VideoTooLargeError, match=r"the header states 12 frames .* max_decoded_bytes"
    ):
        decode_video(mp4(), VideoLimits(max_decoded_bytes=FRAME_BYTES * 11))
    with pytest.raises(VideoTooLargeError, match=r"^8 frames of 9216 bytes"):
        decode_video(live_mkv(), VideoLimits(max_decoded_bytes=FRAME_BYTES * 7))
    assert decode_video(live_mkv(), VideoLimits(max_decoded_bytes=FRAME_BYTES * COUNT))


def test_max_duration_from_the_header():
    with pytest.raises(VideoTooLargeError, match=r"1\.200 s \(the header states\)"):
        decode_video(webm(), VideoLimits(max_duration_s=1.0))
    decode_video(webm(), VideoLimits(max_duration_s=1.2))


def test_max_duration_found_only_while_decoding():
    with pytest.raises(VideoTooLargeError, match=r"0\.600 s \(6 frames at 10 fps\)"):
        decode_video(live_mkv(), VideoLimits(max_duration_s=0.5))


# --- whole or not at all -----------------------------------------------------------------


def test_an_mp4_cut_before_its_index_is_refused():
    data = mp4()  # the moov box is written last
    with pytest.raises(VideoDecodeError, match="not a readable MP4/MOV file"):
        decode_video(data[: len(data) // 2], LIMITS)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_an_mp4_cut_inside_its_samples_is_refused(tmp_path_factory, keep):
    data = faststart_mp4(str(tmp_path_factory.mktemp("clip")))
    assert decode_video(data, LIMITS)[0].shape[0] == 30
    with pytest.raises(VideoDecodeError, match="truncated or corrupt MP4/MOV"):
        decode_video(data[: int(len(data) * keep)], LIMITS)


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_webm_is_refused_though_ffmpeg_says_nothing(keep):
    data = encode(
        np.random.default_rng(1).integers(0, 256, (30, HEIGHT, WIDTH, 3), dtype=np.uint8),
        fmt="webm",
        codec="libvpx-vp9",
        pix_fmt=None,
    )
    assert decode_video(data, LIMITS)[0].shape[0] == 30
    with pytest.raises(VideoDecodeError, match=r"truncated: the header states 3\.000 s"):
        decode_video(data[: int(len(data) * keep)], LIMITS)


def _ffmpeg_notices(data: bytes) -> bool:
    """Whether FFmpeg itself reports damage in ``data``: an error, or a frame it flags."""
    import io

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            return any(frame.is_corrupt for frame in container.decode(video=0))
    except av.FFmpegError:
        return True


def test_corruption_ffmpeg_notices_is_refused(tmp_path_factory):
    """Flipped bytes inside H.264 data: whatever FFmpeg notices (an error, or a frame it
    flags corrupt and conceals) is refused. (Damage that still parses as valid data
    decodes to what it says: no decoder can tell.)"""
    clean = faststart_mp4(str(tmp_path_factory.mktemp("clip")))
    noticed = 0
    # damage at 17 places through the sample data (about half of them land where FFmpeg
    # notices: which ones can vary with its threads, so one place alone would be a coin
    # toss); every place FFmpeg notices must be refused
    for where in [0.10 + 0.05 * k for k in range(17)]:
        data = bytearray(clean)
        at = int(len(data) * where)
        data[at : at + 300] = bytes(b ^ 0x5A for b in data[at : at + 300])
        if _ffmpeg_notices(bytes(data)):
            noticed += 1
            with pytest.raises(VideoDecodeError, match="corrupt"):
                decode_video(bytes(data), LIMITS)
    assert noticed >= 2  # the test tests something


def test_the_bytes_of_an_image_are_not_a_video():
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    with pytest.raises(VideoDecodeError, match="a PNG image, not a video"):
        decode_video(buffer.getvalue(), LIMITS)


def test_junk_with_a_container_signature_is_refused():
    with pytest.raises(VideoDecodeError, match="Matroska/WebM"):
        decode_video(b"\x1a\x45\xdf\xa3" + b"\xff" * 200, LIMITS)
