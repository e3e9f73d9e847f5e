"""Video assets: each distinct clip stored once, and the stored part loads back as the
very clip the model saw (frames, frame rate, ``video_hash``)."""

from __future__ import annotations

import base64
import io
import json
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from tests.results._clips import ENCODINGS, encode, frames
from vf_mm.errors import (
    UnsafeVideoSourceError,
    VideoDecodeError,
    VideoError,
    VideoFetchError,
    VideoTooLargeError,
)
from vf_mm.images import ImagePolicy
from vf_mm.results import AssetStore, ResultsWriter, read_results
from vf_mm.types import RolloutOutput
from vf_mm.videos import (
    VIDEO_EXTENSIONS,
    Video,
    VideoLimits,
    encode_lossless,
    load_video,
    video_extension,
    video_hash,
)


def user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


def stored_part(store: AssetStore, part: dict) -> dict:
    (message,) = store.to_jsonable([user(part)])
    (out,) = message["content"]
    return out


def reload(store: AssetStore, part: dict) -> Video:
    """``load_video`` of a stored part, its asset URL resolved in the run directory."""
    inner = part["video_url"]
    absolute = {**part, "video_url": {**inner, "url": str(store.root / inner["url"])}}
    return load_video(absolute)


def assert_same_clip(got: Video, want: Video) -> None:
    assert np.array_equal(got.frames, want.frames)
    assert got.fps == want.fps
    assert video_hash(got) == video_hash(want)


def stated_rate(data: bytes) -> Fraction | None:
    """The frame rate the file itself states (None: it states none)."""
    with av.open(io.BytesIO(data), format="matroska") as container:
        return container.streams.video[0].average_rate


@pytest.fixture
def store(tmp_path):
    return AssetStore(tmp_path)


# -- raw frames: stored losslessly ---------------------------------------------------------


RAW = {
    "array": lambda f: f,
    "list of arrays": lambda f: list(f),
    "list of PIL images": lambda f: [Image.fromarray(x) for x in f],
    "Video": lambda f: Video(f),
    "grey array": lambda f: f[..., 0],
}


@pytest.mark.parametrize("form", list(RAW))
@pytest.mark.parametrize("rate", [None, 4.0, 30000 / 1001, 3.14159, 0.5])
def test_raw_frames_are_stored_losslessly_and_load_back_exactly(store, form, rate):
    part = {"type": "video", "video": RAW[form](frames(1))}
    if rate is not None:
        part["frame_rate"] = rate
    out = stored_part(store, part)
    original = load_video(part)
    digest = video_hash(original)
    assert out["video_url"] == {"url": f"assets/{digest}.mkv"}
    assert out.get("frame_rate") == rate and out["type"] == "video_url"
    assert json.loads(json.dumps(out)) == out  # JSON, and its float survives
    assert_same_clip(reload(store, out), original)


def test_a_rate_the_container_states_exactly_is_stated_there(store):
    """4 fps and NTSC's 30000/1001 are in the file (a player plays them right); a rate the
    file would round is left to the part's frame_rate, and the file states none."""
    for rate, stated in [(4.0, Fraction(4)), (30000 / 1001, Fraction(30000, 1001)),
                         (3.14159, None)]:  # fmt: skip
        out = stored_part(store, {"type": "video", "video": frames(2), "frame_rate": rate})
        data = (store.root / out["video_url"]["url"]).read_bytes()
        assert stated_rate(data) == stated
        assert out["frame_rate"] == rate
    out = stored_part(store, {"type": "video", "video": frames(2)})  # rate unknown
    assert stated_rate((store.root / out["video_url"]["url"]).read_bytes()) is None
    assert "frame_rate" not in out


def test_the_lossless_file_is_ffv1_in_matroska_and_decodes_bit_exact():
    clip = Video(frames(3, t=5, h=18, w=22), fps=12.0)  # odd sizes: no chroma subsampling
    data = encode_lossless(clip)
    assert video_extension(data) == "mkv"
    with av.open(io.BytesIO(data), format="matroska") as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "ffv1"
        assert stream.codec_context.pix_fmt == "bgr0"
    assert_same_clip(load_video({"type": "video", "video": data, "frame_rate": 12.0}), clip)


def test_a_frame_rate_of_a_video_object_goes_into_the_part(store):
    out = stored_part(store, {"type": "video", "video": Video(frames(4), fps=6.0)})
    assert out["frame_rate"] == 6.0
    assert reload(store, out).fps == 6.0


# -- encoded sources: stored as the bytes they are -----------------------------------------


@pytest.mark.parametrize("ext", list(ENCODINGS))
def test_an_encoded_file_is_stored_as_its_own_bytes(store, tmp_path, ext):
    data = encode(frames(5), ext)
    path = tmp_path / f"clip.{ext}"
    path.write_bytes(data)
    out = stored_part(store, {"type": "video", "video": str(path)})
    original = load_video(str(path))
    digest = video_hash(original)
    assert out == {"type": "video_url", "video_url": {"url": f"assets/{digest}.{ext}"},
                   "frame_rate": original.fps}  # fmt: skip
    assert (store.root / out["video_url"]["url"]).read_bytes() == data
    assert_same_clip(reload(store, out), original)


def test_every_form_of_one_file_is_one_asset(store, tmp_path):
    data = encode(frames(6), "webm")
    path = tmp_path / "a clip.webm"
    path.write_bytes(data)
    url = "data:video/webm;base64," + base64.b64encode(data).decode()
    parts = [
        {"type": "video", "video": str(path)},
        {"type": "video", "video": path},
        {"type": "video", "path": str(path)},
        {"type": "video", "url": path.as_uri()},
        {"type": "video_url", "video_url": {"url": path.as_uri()}},
        {"type": "video_url", "video_url": url},
        {"type": "video", "video": data},
        {"type": "video", "video": bytearray(data)},
        {"type": "video", "video": memoryview(data)},
    ]
    out = store.to_jsonable([user(*parts)])
    urls = {part["video_url"]["url"] for part in out[0]["content"]}
    digest = video_hash(load_video(data))
    assert urls == {f"assets/{digest}.webm"}
    assert sorted(os.listdir(store.dir)) == [f"{digest}.webm"]
    assert store.written == 1


def test_a_clip_is_decoded_once_however_often_it_is_shown(store, tmp_path, monkeypatch):
    import vf_mm.results._assets as assets

    calls = []
    real = assets.load_video
    monkeypatch.setattr(assets, "load_video", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = tmp_path / "c.mp4"
    path.write_bytes(encode(frames(7)))
    part = {"type": "video", "video": str(path)}
    first = store.to_jsonable([user(part, part)])
    again = store.to_jsonable([user(dict(part))])
    assert len(calls) == 1
    assert first[0]["content"][0] == first[0]["content"][1] == again[0]["content"][0]


def test_the_same_pixels_from_frames_and_from_a_file_are_one_asset(store):
    data = encode(frames(8), "mp4")
    decoded = load_video(data)
    from_file = stored_part(store, {"type": "video", "video": data})
    raw = {"type": "video", "video": np.array(decoded.frames), "frame_rate": decoded.fps}
    assert stored_part(store, raw)["video_url"] == from_file["video_url"]
    assert store.written == 1


def test_a_container_without_a_rate_takes_the_parts_frame_rate(store):
    bare = encode_lossless(Video(frames(9)))  # states no rate
    out = stored_part(store, {"type": "video", "video": bare, "frame_rate": 5.0})
    assert out["frame_rate"] == 5.0
    assert reload(store, out).fps == 5.0


def test_a_rate_the_file_states_wins_over_the_parts(store):
    data = encode(frames(10), "mp4", rate=10)
    out = stored_part(store, {"type": "video", "video": data, "frame_rate": 3.0})
    assert out["frame_rate"] == 10.0  # what load_video gives, for the original too
    assert load_video({"type": "video", "video": data, "frame_rate": 3.0}).fps == 10.0


# -- what the part keeps, what is kept as it is ---------------------------------------------


def test_options_and_other_json_keys_are_kept(store):
    part = {"type": "video", "video": frames(11), "frame_rate": 4.0, "fps": 2.0,
            "min_pixels": 64, "do_sample_frames": True, "note": {"a": [1]}}  # fmt: skip
    out = stored_part(store, part)
    assert out == {"type": "video_url", "video_url": {"url": out["video_url"]["url"]},
                   "frame_rate": 4.0, "fps": 2.0, "min_pixels": 64, "do_sample_frames": True,
                   "note": {"a": [1]}}  # fmt: skip
    assert part["video"] is not None and "video_url" not in part  # the input is untouched


def test_http_urls_are_kept_and_never_fetched(store):
    parts = [
        {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
        {"type": "video", "video": "http://example.com/b.webm", "num_frames": 4},
    ]
    out = store.to_jsonable([user(*parts)])  # the default policy has no network: not read
    assert out[0]["content"] == [
        {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
        {"type": "video_url", "video_url": {"url": "http://example.com/b.webm"}, "num_frames": 4},
    ]
    assert os.listdir(store.dir) == []


def test_stored_messages_convert_again_to_themselves(store):
    first = store.to_jsonable([user({"type": "video", "video": frames(12), "frame_rate": 2.0},
                                    {"type": "video", "video": encode(frames(13), "mp4")})])  # fmt: skip
    assert store.to_jsonable(first) == first
    assert store.written == 2


def test_a_pre_existing_asset_is_never_rewritten(store):
    clip = {"type": "video", "video": frames(14), "frame_rate": 4.0}
    digest = video_hash(load_video(clip))
    (store.dir / f"{digest}.mkv").write_bytes(b"sentinel")
    assert stored_part(store, clip)["video_url"]["url"] == f"assets/{digest}.mkv"
    assert (store.dir / f"{digest}.mkv").read_bytes() == b"sentinel"
    assert store.written == 0


def test_asset_names_match_the_extensions():
    assert set(VIDEO_EXTENSIONS) == {"mp4", "mov", "webm", "mkv", "avi", "ts"}
    for ext in ENCODINGS:
        assert video_extension(encode(frames(1, t=2), ext)) == ext
    with pytest.raises(VideoDecodeError):
        video_extension(b"\x89PNG\r\n\x1a\n")


# -- what does not load ---------------------------------------------------------------------------


BAD = [
    ({"type": "video", "video": b"\x89PNG\r\n\x1a\nnot a video"}, VideoDecodeError, "PNG image"),
    ({"type": "video", "video": np.zeros((2, 4, 4, 3), np.float32)}, VideoDecodeError, "uint8"),
    ({"type": "video", "video": "/no/such/clip.mp4"}, VideoFetchError, "no such file"),
    (
        {"type": "video_url", "video_url": {"url": "ftp://x.org/a.mp4"}},
        UnsafeVideoSourceError,
        "ftp",
    ),
    ({"type": "video_url", "video_url": "data:image/png;base64,AAAA"}, VideoDecodeError, "image"),
    ({"type": "video", "video": frames(1), "url": "x.mp4"}, VideoDecodeError, "exactly one"),
    ({"type": "video", "video": frames(1), "frame_rate": -1}, VideoDecodeError, "frame_rate"),
]


@pytest.mark.parametrize(("part", "error", "match"), BAD)
def test_a_video_that_does_not_load_raises_naming_its_place(store, part, error, match):
    with pytest.raises(error, match=match) as exc:
        store.to_jsonable([{"role": "system", "content": "hi"}, user({"type": "text", "text": "x"},
                                                                      part)], where="ex 3")  # fmt: skip
    assert exc.value.where == "ex 3, message 1, part 1"
    assert "ex 3, message 1, part 1" in str(exc.value)
    assert os.listdir(store.dir) == []


@pytest.mark.parametrize(("part", "error", "match"), BAD)
def test_a_video_that_does_not_load_is_recorded_never_dropped(store, part, error, match):
    out = store.to_jsonable([user({"type": "text", "text": "x"}, part)], on_error="record")
    text, gap = out[0]["content"]
    assert text == {"type": "text", "text": "x"}
    assert gap["type"] == "unavailable"
    assert gap["error"].startswith(f"{error.__name__}: video ")
    assert isinstance(error("x"), VideoError)
    source = part.get("video_url", part.get("video"))
    source = source.get("url") if isinstance(source, dict) else source
    assert gap["source"] == (source if isinstance(source, str) else None)
    json.dumps(out)


def test_the_policy_and_the_limits_apply(tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(encode(frames(15)))
    confined = AssetStore(
        tmp_path / "run", policy=ImagePolicy(local_roots=[tmp_path / "elsewhere"])
    )
    with pytest.raises(UnsafeVideoSourceError, match="outside"):
        confined.to_jsonable([user({"type": "video", "video": str(path)})])
    small = AssetStore(tmp_path / "run2", video_limits=VideoLimits(max_frames=4))
    with pytest.raises(VideoTooLargeError, match="max_frames"):
        small.to_jsonable([user({"type": "video", "video": str(path)})])
    with pytest.raises(VideoTooLargeError, match="max_frames"):
        small.to_jsonable([user({"type": "video", "video": frames(15)})])
    tiny = AssetStore(tmp_path / "run3", video_limits=VideoLimits(max_bytes=100))
    with pytest.raises(VideoTooLargeError, match="max_bytes"):
        tiny.to_jsonable([user({"type": "video", "video": path.read_bytes()})])


# -- through the writer ---------------------------------------------------------------------------


def test_the_writer_stores_videos_and_a_resumed_run_reloads_them_exactly(tmp_path):
    clip = {"type": "video", "video": frames(17), "frame_rate": 4.0, "num_frames": 4}
    mp4 = tmp_path / "in.mp4"
    mp4.write_bytes(encode(frames(18)))
    prompt = [user(clip, {"type": "video", "video": str(mp4)}, {"type": "text", "text": "?"})]
    outdir = tmp_path / "run"
    with ResultsWriter(outdir, metadata={"config": {}}) as writer:
        for r in range(3):  # every rollout of the example shows the same clips
            writer.write(RolloutOutput(0, prompt, [{"role": "assistant", "content": "ok"}]),
                         rollout_index=r)  # fmt: skip
    assert sorted(p.suffix for p in (outdir / "assets").iterdir()) == [".mkv", ".mp4"]
    rows = read_results(outdir)
    assert len(rows) == 3 and all(row["error"] is None for row in rows)
    stored = rows[2]["prompt"][0]["content"]
    store = AssetStore(outdir)
    assert_same_clip(reload(store, stored[0]), load_video(clip))
    assert_same_clip(reload(store, stored[1]), load_video(str(mp4)))
    assert stored[0]["num_frames"] == 4
    with ResultsWriter(outdir, metadata={"config": {}}, resume=True) as writer:
        assert writer.done == {(0, 0), (0, 1), (0, 2)}
        row = writer.write(RolloutOutput(1, prompt, []), rollout_index=0)
        assert row["prompt"] == rows[0]["prompt"]
        assert writer.assets.written == 0


def test_the_writer_records_a_video_that_does_not_load(tmp_path):
    prompt = [user({"type": "video", "video": str(tmp_path / "gone.mp4")},
                   {"type": "video", "video": frames(19)})]  # fmt: skip
    with ResultsWriter(tmp_path / "run", metadata={"config": {}}) as writer:
        row = writer.write(RolloutOutput(0, prompt, [], reward=1.0), rollout_index=0)
    gone, kept = row["prompt"][0]["content"]
    assert gone["type"] == "unavailable" and "no such file" in gone["error"]
    assert gone["source"] == str(tmp_path / "gone.mp4")
    assert kept["type"] == "video_url"  # the rest of the conversation is stored
    assert row["error"]["type"] == "VideoFetchError" and row["reward"] is None
    assert "message 0, part 0" in row["error"]["message"] + str(row["error"].get("where"))
    assert read_results(tmp_path / "run")[0] == row


def test_a_path_keeps_working_when_the_run_directory_moves(tmp_path):
    clip = {"type": "video", "video": frames(20), "frame_rate": 4.0}
    store = AssetStore(tmp_path / "a")
    out = stored_part(store, clip)
    moved = Path(tmp_path / "b")
    (tmp_path / "a").rename(moved)
    assert_same_clip(reload(AssetStore(moved), out), load_video(clip))


def test_evaluate_to_dir_stores_clips_within_the_limits_it_is_given(tmp_path):
    import asyncio

    from vf_mm.results import evaluate_to_dir

    class Env:  # the three calls evaluate_to_dir makes of an environment
        def iter_eval_dataset(self, n):
            return iter([{"id": 0}])

        def eval_dataset_size(self, n, *, holds=None):
            return 1

        async def evaluate(self, client, *, on_result, skip, **_):
            prompt = [user({"type": "video", "video": frames(21), "frame_rate": 4.0})]
            await on_result(RolloutOutput(0, prompt, [], reward=1.0), 0)

    for name, limits, error in [("ok", None, None), ("small", VideoLimits(max_frames=2),
                                                    "VideoTooLargeError")]:  # fmt: skip
        outdir = tmp_path / name
        asyncio.run(evaluate_to_dir(Env(), None, outdir, metadata={"config": {}},
                                    video_limits=limits))  # fmt: skip
        (row,) = read_results(outdir)
        assert (row["error"] or {}).get("type") == error
        assert row["prompt"][0]["content"][0]["type"] == ("unavailable" if error else "video_url")
