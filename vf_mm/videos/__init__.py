"""Every video that enters vf_mm passes here: ``load_video``, ``Video``, ``VideoLimits``,
``video_hash``.

``load_video(source, *, policy=None, limits=None, where=None)`` turns a list of frames,
a frames array, encoded bytes, a ``data:`` URL, a local path or ``file://`` URL, an
``http(s)://`` URL, or a content part into a ``Video``: every frame decoded, ``(T, H,
W, 3)`` uint8 RGB, read-only, with the source's frame rate. ``video_hash(video)`` is its
content hash (pixels, shape, frame rate); ``video_mm_hash(hash, part)`` the hash of the
clip as a part's processing options make it (what the renderer, group frames and vLLM
key its tensors by). ``read_video_bytes`` reads a source's own file without decoding it
(``video_extension`` names its container); ``encode_lossless`` turns raw frames into a
file that decodes back to them exactly (results assets, vLLM content_parts).

Sources (``_source.py``, ``_load.py``)
    Strings are sorted by ``vf_mm.images``' rules (``data:``, ``http:``/``https:``,
    ``file:``, else a local path; other schemes refused). Content parts: ``{"type":
    "video", "video": ...}`` (or ``"url"`` / ``"path"``) and ``{"type": "video_url",
    "video_url": {"url": ...}}``. A part's ``"frame_rate"`` gives raw frames their rate;
    its processing options (``fps``, ``num_frames``, ``min_pixels``, ``max_pixels``) are
    the processor's and are ignored here.

Safety (``vf_mm.images``' guard, ``_container.py``, ``_limits.py``)
    Paths, ``file://`` and ``http(s)://`` URLs go through the ``ImagePolicy`` exactly as
    images do: network off by default, the SSRF guard, ``local_roots`` confinement,
    bounded reads, one deadline per fetch; the byte cap is ``VideoLimits.max_bytes``.
    FFmpeg never probes: the container is recognised from its first bytes (MP4/MOV,
    Matroska/WebM, AVI, MPEG-TS) and that demuxer forced, so no playlist or file list
    can make it open anything else. ``VideoLimits`` bounds bytes, frames, pixels per
    frame, decoded bytes and duration, from the header where it says and while
    decoding, before memory is spent.

What happens to each kind of input (``_frames.py`` for raw frames, ``_decode.py`` for
encoded video; errors are ``vf_mm.errors.VideoError`` subclasses)

    =================================== ========================================================
    input                               result
    =================================== ========================================================
    MP4/MOV, Matroska/WebM, AVI,        the first video stream (not a cover picture), every
    MPEG-TS bytes                       frame, ``frame.to_ndarray(format="rgb24")`` as
                                        transformers' "pyav" backend; ``fps`` = the stream's
                                        ``average_rate`` (``None`` if it has none)
    rotation metadata (phones)          not applied: frames as stored, as transformers
    audio and subtitle streams          ignored, never decoded
    a resolution change mid-stream      ``VideoDecodeError``
    corrupt or truncated data           ``VideoDecodeError`` when FFmpeg reports it, flags a
                                        packet or frame corrupt, or the frames stop short of
                                        the duration the header states (never a partial video)
    zero frames, audio only, a cover    ``VideoDecodeError``
    picture only
    an image (PNG, JPEG, GIF, WebP,     ``VideoDecodeError`` saying what the bytes are (and
    AVIF, ...), HTML, text, Ogg, junk   that an image goes in an image part)
    ``(T, H, W, 3)`` uint8 array        copied (never the caller's buffer)
    ``(T, H, W)`` / ``(T, H, W, 1)``    grey replicated to R=G=B
    ``(T, H, W, 4)`` uint8 array        alpha composited onto white, as images
    a float or other non-uint8 array,   ``VideoDecodeError`` naming shape and dtype (with a
    channels first ``(T, 3, H, W)``,    hint: scale to uint8, transpose, ``array[None]``)
    one ``(H, W, 3)`` image, empty
    a list of frames                    each frame through ``vf_mm.images.load_image`` (PIL
                                        of any mode: alpha onto white, palettes applied;
                                        ``(H, W[, 3])`` uint8 arrays); sizes must all match,
                                        else ``VideoDecodeError`` naming the first that
                                        differs; an empty list is refused
    a single PIL image                  ``VideoDecodeError`` (``[image]`` is a one-frame video)
    a ``Video``                         returned as it is, after the limits are checked
    over a limit                        ``VideoTooLargeError`` naming the limit
    =================================== ========================================================
"""

from __future__ import annotations

from vf_mm.videos._container import VIDEO_EXTENSIONS, VIDEO_MEDIA_TYPES, video_extension
from vf_mm.videos._encode import encode_lossless
from vf_mm.videos._hash import video_hash, video_mm_hash
from vf_mm.videos._limits import VideoLimits
from vf_mm.videos._load import is_raw_video, load_video, read_video_bytes
from vf_mm.videos._video import Video

__all__ = [
    "VIDEO_EXTENSIONS",
    "VIDEO_MEDIA_TYPES",
    "Video",
    "VideoLimits",
    "encode_lossless",
    "is_raw_video",
    "load_video",
    "read_video_bytes",
    "video_extension",
    "video_hash",
    "video_mm_hash",
]
