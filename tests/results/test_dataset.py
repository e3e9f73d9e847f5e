"""to_dataset: a run directory as a datasets.Dataset, one row per stored rollout, that
round-trips exactly through Parquet and save_to_disk: every column as the reader gives
it, messages as JSON text, images pixel for pixel against the assets, clips byte for
byte; and the refusals (not a run, a bad asset, tokens a run does not store)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import datasets
import numpy as np
import pytest
from datasets.arrow_writer import ArrowWriter
from datasets.exceptions import DatasetGenerationError
from PIL import Image

from tests.results._clips import frames
from vf_mm.errors import AssetError, ResultsError
from vf_mm.images import image_hash, load_image
from vf_mm.results import (
    RESULTS_FILE,
    ROW_KEYS,
    ResultsWriter,
    _dataset,
    read_results,
    to_dataset,
)
from vf_mm.types import (
    ResponseTokens,
    RolloutError,
    RolloutOutput,
    TrajectoryStep,
    image_part_source,
    video_part_source,
)
from vf_mm.videos import load_video, video_hash

METADATA = {"config": {"env_id": "vqa", "model": "tiny", "rollouts_per_example": 2}}
JSON_COLUMNS = ("prompt", "completion", "answer", "info", "metrics", "error", "timing")
COLUMNS = [*ROW_KEYS, "extra", "images", "image_urls", "videos"]


def picture(shade: int, size: tuple[int, int] = (6, 4)) -> Image.Image:
    return Image.new("RGB", size, (shade * 40 % 256, 100, 200))


def steps(prompt: int, completion: int) -> list[TrajectoryStep]:
    tokens = ResponseTokens(
        [1] * prompt, [2] * completion, [-0.5] * completion, [1] * completion, "stop"
    )
    return [TrajectoryStep(prompt=[], completion=[], tokens=tokens)]


def tool_rollout(example: int, index: int) -> RolloutOutput:
    """A multi-turn rollout with everything a message can hold: an image and a clip in the
    prompt, an http image (kept, never fetched), a tool call whose result holds a crop and
    the prompt's picture again, reasoning, a string content and a null one."""
    return RolloutOutput(
        example_id=example,
        prompt=[
            {"role": "system", "content": "Look closely."},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture(example)},
                    {"type": "video", "video": frames(seed=example, t=3), "frame_rate": 6},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    {"type": "text", "text": f"How many? ({example}) ✓ 日本 \ud800"},
                ],
            },
        ],
        completion=[
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "zoom first",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "zoom", "arguments": '{"x": 1, "y": [2, 3]}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "zoom",
                "content": [
                    {"type": "image", "image": picture(example + 7, (3, 5)), "detail": "high"},
                    {"type": "image", "image": picture(example)},  # the prompt's, again
                    {"type": "text", "text": "crop"},
                ],
            },
            {"role": "assistant", "content": f"<answer>{example + index}</answer>"},
        ],
        answer={"count": example, "alts": [str(example), None]} if example else example,
        info={"difficulty": "easy", "ids": [1, 2]},
        trajectory=steps(10 + index, 3),
        reward=float(index),
        metrics={"correct": float(index), "format": None},
        timing={"generate_s": 0.25, "score_s": 0.5},
    )


def failed_rollout(example: int) -> RolloutOutput:
    """A rollout that failed: a backend error, and an image that did not load (stored as
    an ``unavailable`` part)."""
    return RolloutOutput(
        example_id=example,
        prompt=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture(1)},
                    {"type": "image", "image": "/nonexistent/vf_mm/picture.png"},
                ],
            }
        ],
        completion=[],
        answer="2",
        error=RolloutError("BackendError", "server gone", "turn 1: generate"),
    )


def make_run(path: Path) -> Path:
    """Two examples x two rollouts of ``tool_rollout`` (one with extra keys), a failed
    rollout, and one retried on resume: the reader's last record counts."""
    with ResultsWriter(path, metadata=METADATA) as writer:
        for example in (0, 1):
            for index in (0, 1):
                extra = {"judge": {"score": 3, "why": "ok"}} if (example, index) == (1, 0) else None
                writer.write(tool_rollout(example, index), rollout_index=index, extra=extra)
        writer.write(failed_rollout(2), rollout_index=0)
        writer.write(failed_rollout(3), rollout_index=0)
    with ResultsWriter(path, metadata=METADATA, resume=True) as writer:
        writer.write(tool_rollout(3, 0), rollout_index=0)  # the retry of (3, 0)
        writer.finalize()
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("dataset") / "run")


# -- what a dataset row is, read back -----------------------------------------------


def stored_row(record: dict, *, id_kind: str = "int") -> dict:
    """The results.jsonl row a dataset record stands for, by the documented rules: JSON
    text columns parsed (null is JSON null), ``extra`` spread after the row keys."""
    example_id = json.loads(record["example_id"]) if id_kind == "json" else record["example_id"]
    row: dict = {"example_id": example_id}
    for key in ROW_KEYS[1:]:
        value = record[key]
        row[key] = json.loads(value) if key in JSON_COLUMNS and value is not None else value
    if record["extra"] is not None:
        row.update(json.loads(record["extra"]))
    return row


def asset_refs(row: dict) -> tuple[list[str], list[tuple[str, float | None]]]:
    """The image and video asset URLs a row's messages refer to, in reading order."""
    images, videos = [], []
    for name in ("prompt", "completion"):
        for message in row[name]:
            content = message.get("content")
            for part in content if isinstance(content, list) else ():
                if part.get("type") == "image_url":
                    url = image_part_source(part)
                    if url.startswith("assets/"):
                        images.append(url)
                elif part.get("type") == "video_url":
                    videos.append((video_part_source(part), part.get("frame_rate")))
    return images, videos


def assert_round_trips(dataset: datasets.Dataset, outdir: Path, *, id_kind: str = "int") -> None:
    """Every column of ``dataset`` is what the reader gives for ``outdir``: rows exactly
    (values and key order), images pixel for pixel against the assets and lined up with
    the references in the messages, clips byte for byte."""
    rows = read_results(outdir, bad_lines="raise")
    assert dataset.column_names == COLUMNS
    assert dataset.num_rows == len(rows)
    for record, row in zip(dataset, rows, strict=True):
        back = stored_row(record, id_kind=id_kind)
        assert back == row
        assert json.dumps(back) == json.dumps(row)  # key order and float spelling too
        image_urls, video_refs = asset_refs(row)
        assert record["image_urls"] == image_urls
        assert len(record["images"]) == len(image_urls)
        for url, image in zip(image_urls, record["images"], strict=True):
            assert isinstance(image, Image.Image) and image.mode == "RGB"
            asset = load_image(outdir / url)
            assert np.array_equal(np.asarray(image), np.asarray(asset)), url
            assert image_hash(image.convert("RGB")) == Path(url).stem
        assert [(v["url"], v["frame_rate"]) for v in record["videos"]] == video_refs
        for clip in record["videos"]:
            assert clip["bytes"] == (outdir / clip["url"]).read_bytes()
            part = {"type": "video", "video": clip["bytes"], "frame_rate": clip["frame_rate"]}
            assert video_hash(load_video(part)) == Path(clip["url"]).stem


def reload(dataset: datasets.Dataset, tmp_path: Path, form: str) -> datasets.Dataset:
    if form == "parquet":
        dataset.to_parquet(str(tmp_path / "results.parquet"))
        return datasets.Dataset.from_parquet(
            str(tmp_path / "results.parquet"), cache_dir=str(tmp_path / "cache")
        )
    dataset.save_to_disk(str(tmp_path / "hf"))
    return datasets.load_from_disk(str(tmp_path / "hf"))


# -- the round trip -----------------------------------------------------------------


def test_one_row_per_stored_rollout_with_every_column(run):
    dataset = to_dataset(run)
    rows = read_results(run)
    assert [(r["example_id"], r["rollout_index"]) for r in dataset] == [
        (r["example_id"], r["rollout_index"]) for r in rows
    ]
    assert dataset.num_rows == 6  # 4 + the failed (2, 0) + the retried (3, 0)
    features = dataset.features
    assert features["example_id"] == datasets.Value("int64")
    assert features["reward"] == datasets.Value("float64")
    assert features["prompt"] == datasets.Value("string")
    assert isinstance(features["images"].feature, datasets.Image)
    assert_round_trips(dataset, run)


@pytest.mark.parametrize("form", ["parquet", "hf"])
def test_saving_and_reloading_round_trips_exactly(run, tmp_path, form):
    dataset = to_dataset(run)
    back = reload(dataset, tmp_path, form)
    assert back.features == dataset.features
    assert_round_trips(back, run)


def test_images_line_up_with_the_references_in_the_messages(run):
    record = to_dataset(run)[0]
    prompt, completion = json.loads(record["prompt"]), json.loads(record["completion"])
    shown = prompt[1]["content"][0]["image_url"]["url"]
    crop = completion[1]["content"][0]["image_url"]["url"]
    again = completion[1]["content"][1]["image_url"]["url"]
    # prompt first, then completion; a picture shown twice is listed twice
    assert record["image_urls"] == [shown, crop, again] and again == shown
    assert record["images"][1].size == (3, 5)
    # the http image stays in the message, and is not fetched into `images`
    assert prompt[1]["content"][2]["image_url"]["url"] == "https://example.com/a.png"
    assert completion[1]["content"][0]["detail"] == "high"  # a part's other keys are kept
    (clip,) = record["videos"]
    assert clip["url"] == prompt[1]["content"][1]["video_url"]["url"] and clip["frame_rate"] == 6


def test_failed_rollouts_are_rows_with_their_errors(run):
    dataset = to_dataset(run)
    failed = [r for r in dataset if r["error"] is not None]
    assert [(r["example_id"], r["rollout_index"]) for r in failed] == [(2, 0)]
    (row,) = failed
    assert row["reward"] is None
    assert json.loads(row["error"])["type"] == "BackendError"
    parts = json.loads(row["prompt"])[0]["content"]
    assert parts[1]["type"] == "unavailable" and "picture.png" in parts[1]["source"]
    assert row["image_urls"] == [parts[0]["image_url"]["url"]]  # the stored picture only
    ok = [r for r in dataset if r["error"] is None]
    assert all(r["reward"] is not None for r in ok)
    assert {r["prompt_tokens"] for r in ok} == {10, 11} and row["prompt_tokens"] is None


def test_keys_beyond_the_row_keys_are_the_extra_column(run):
    dataset = to_dataset(run)
    extras = {(r["example_id"], r["rollout_index"]): r["extra"] for r in dataset}
    assert json.loads(extras[(1, 0)]) == {"judge": {"score": 3, "why": "ok"}}
    assert sum(v is not None for v in extras.values()) == 1


def test_a_run_with_no_images(tmp_path):
    out = tmp_path / "text"
    with ResultsWriter(out, metadata=METADATA) as writer:
        for example in range(3):
            writer.write(
                RolloutOutput(
                    example_id=f"q{example}",
                    prompt=[{"role": "user", "content": "2 + 2?"}],
                    completion=[{"role": "assistant", "content": "4"}],
                    answer="4",
                    reward=1.0,
                ),
                rollout_index=0,
            )
    dataset = to_dataset(out)
    assert dataset.features["example_id"] == datasets.Value("string")
    assert [r["images"] for r in dataset] == [[], [], []]
    assert [r["videos"] for r in dataset] == [[], [], []]
    for form in ("parquet", "hf"):
        back = reload(dataset, tmp_path / form, form)
        assert isinstance(back.features["images"].feature, datasets.Image)
        assert_round_trips(back, out, id_kind="str")


def test_an_empty_run_is_an_empty_dataset_with_the_columns(tmp_path):
    out = tmp_path / "empty"
    ResultsWriter(out, metadata=METADATA).close()
    dataset = to_dataset(out)
    assert dataset.num_rows == 0 and dataset.column_names == COLUMNS
    # (datasets 5.2 cannot load an empty save back: vf-mm export refuses an empty run)


def test_mixed_example_ids_are_json_text(tmp_path):
    out = tmp_path / "mixed"
    with ResultsWriter(out, metadata=METADATA) as writer:
        for example in (3, "3", "a"):
            writer.write(
                RolloutOutput(example_id=example, prompt=[], completion=[], reward=0.0),
                rollout_index=0,
            )
    dataset = to_dataset(out)
    assert dataset["example_id"] == ["3", '"3"', '"a"']  # 3 and "3" stay apart
    assert_round_trips(reload(dataset, tmp_path, "hf"), out, id_kind="json")


# -- what the reader decides --------------------------------------------------------


def test_bad_lines_are_the_readers_choice(tmp_path, caplog):
    out = make_run(tmp_path / "run")
    with open(out / RESULTS_FILE, "ab") as f:
        f.write(b'{"example_id": 9, "rollout')  # a torn last line: left out
    with caplog.at_level(logging.WARNING, logger="vf_mm.results"):
        dataset = to_dataset(out)
    assert dataset.num_rows == 6 and "torn last line" in caplog.text
    lines = (out / RESULTS_FILE).read_bytes().splitlines(keepends=True)
    lines.insert(1, b"not json\n")
    (out / RESULTS_FILE).write_bytes(b"".join(lines[:-1]))  # a corrupt line in the middle
    with pytest.raises(ResultsError, match="line 2 is corrupt"):
        to_dataset(out)
    assert to_dataset(out, bad_lines="skip").num_rows == 6


# -- refusals -----------------------------------------------------------------------


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for path, why in [
        (tmp_path / "missing", "it does not exist"),
        (tmp_path / "file", "it is a file"),
        (tmp_path / "empty", "it has no results.jsonl"),
    ]:
        with pytest.raises(ResultsError, match=f"is not a run directory: {why}"):
            to_dataset(path)


def test_tokens_are_refused_because_a_run_stores_only_their_counts(run):
    with pytest.raises(ResultsError) as info:
        to_dataset(run, tokens=True)
    message = str(info.value)
    assert "holds no token ids, logprobs or masks" in message
    assert "prompt_tokens, completion_tokens" in message and "vf-mm rollout --stream" in message


def test_bad_arguments_raise_at_once(run):
    with pytest.raises(ValueError, match="bad_assets must be one of"):
        to_dataset(run, bad_assets="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad_lines must be one of"):
        to_dataset(run, bad_lines="tolerant")  # type: ignore[arg-type]


def first_image(out: Path) -> tuple[str, Path]:
    url = read_results(out)[0]["prompt"][1]["content"][0]["image_url"]["url"]
    return url, out / url


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.unlink(), "is missing from the run directory"),
        (lambda p: p.write_bytes(b"not a png"), "does not load (ImageDecodeError"),
        (lambda p: picture(5).save(p), "does not match its content hash"),
    ],
)
def test_a_missing_or_corrupt_asset_names_the_asset_and_the_row(tmp_path, damage, why):
    out = make_run(tmp_path / "run")
    url, path = first_image(out)
    damage(path)
    with pytest.raises(AssetError) as info:
        to_dataset(out)
    error = info.value
    assert isinstance(error, ResultsError)
    assert (error.asset, error.example_id, error.rollout_index) == (url, 0, 0)
    assert error.where == "prompt, message 1, part 0"
    assert url in str(error) and why in str(error) and "example 0 rollout 0" in str(error)
    assert "bad_assets='skip'" in str(error)


def test_bad_assets_skip_leaves_a_null_in_place_with_a_warning(tmp_path, caplog):
    out = make_run(tmp_path / "run")
    url, path = first_image(out)
    path.unlink()
    with caplog.at_level(logging.WARNING, logger="vf_mm.results"):
        dataset = to_dataset(out, bad_assets="skip")
    assert caplog.text.count(url) == 1  # one warning per file, however many rows show it
    for record in dataset:
        assert len(record["images"]) == len(record["image_urls"])  # positions kept
        for shown, image in zip(record["image_urls"], record["images"], strict=True):
            assert (image is None) == (shown == url)
    assert any(shown == url for r in dataset for shown in r["image_urls"])


def test_a_damaged_clip_is_an_asset_error(tmp_path):
    out = make_run(tmp_path / "run")
    url = read_results(out)[0]["prompt"][1]["content"][1]["video_url"]["url"]
    (out / url).write_bytes((out / url).read_bytes()[:100])
    with pytest.raises(AssetError, match="does not load") as info:
        to_dataset(out)
    assert info.value.asset == url


def test_check_assets_false_reads_the_files_without_decoding_them(tmp_path):
    out = make_run(tmp_path / "run")
    url, path = first_image(out)
    picture(5).save(path)  # changed, but still a picture
    dataset = to_dataset(out, check_assets=False)
    assert np.array_equal(np.asarray(dataset[0]["images"][0]), np.asarray(picture(5)))
    assert dataset[0]["image_urls"][0] == url


# -- memory: rows streamed to Arrow files on disk -----------------------------------


def noise_run(path: Path, rollouts: int, *, side: int = 256, seed: int = 0) -> int:
    """A run of ``rollouts`` rollouts, each showing its own picture of random noise (PNG
    cannot shrink it: ~side * side * 3 bytes a file); the total bytes of the assets."""
    rng = np.random.default_rng(seed)
    with ResultsWriter(path, metadata=METADATA) as writer:
        for example in range(rollouts):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            writer.write(
                RolloutOutput(
                    example_id=example,
                    prompt=[
                        {
                            "role": "user",
                            "content": [{"type": "image", "image": Image.fromarray(pixels)}],
                        }
                    ],
                    completion=[{"role": "assistant", "content": "noise"}],
                    reward=1.0,
                ),
                rollout_index=0,
            )
    return sum(p.stat().st_size for p in (path / "assets").iterdir())


def test_rows_reach_the_arrow_writer_in_batches_as_they_are_read(run, monkeypatch):
    """At most one batch of rows exists before it is written: the writer flushes every
    ``_WRITER_BATCH_SIZE`` rows, and no more than that were built since the last flush."""
    monkeypatch.setattr(_dataset, "_WRITER_BATCH_SIZE", 2)
    built, flushes = [0], []
    record, flush = _dataset._record, ArrowWriter.write_examples_on_file

    def counting_record(*args, **kwargs):
        built[0] += 1
        return record(*args, **kwargs)

    def noting_flush(self):
        if self.current_examples:
            flushes.append((built[0], len(self.current_examples)))
        return flush(self)

    monkeypatch.setattr(_dataset, "_record", counting_record)
    monkeypatch.setattr(ArrowWriter, "write_examples_on_file", noting_flush)
    dataset = to_dataset(run)
    assert dataset.num_rows == 6 and built[0] == 6
    assert flushes == [(2, 2), (4, 2), (6, 2)]  # built, waiting: never more than a batch
    assert_round_trips(dataset, run)


def test_exporting_holds_a_batch_of_images_not_the_run(tmp_path, monkeypatch):
    """The peak of Python memory while exporting a run of many MB of images stays far
    below their total: image bytes are read per row and leave with their batch (building
    every record first, as one list, peaks above the total)."""
    out = tmp_path / "noise"
    total = noise_run(out, 48, side=192)
    assert total > 5_000_000
    monkeypatch.setattr(_dataset, "_WRITER_BATCH_SIZE", 2)
    to_dataset(out, cache_dir=tmp_path / "warm-up")  # what is imported on first use
    tracemalloc.start()
    try:
        dataset = to_dataset(out, cache_dir=tmp_path / "cache")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert dataset.num_rows == 48
    assert peak < total / 4, (peak, total)
    last = dataset[47]
    asset = load_image(out / last["image_urls"][0])
    assert np.array_equal(np.asarray(last["images"][0]), np.asarray(asset))


def test_cache_dir_holds_the_arrow_files(run, tmp_path):
    cache = tmp_path / "cache" / "deeper"  # created when missing
    dataset = to_dataset(run, cache_dir=cache)
    files = [Path(f["filename"]) for f in dataset.cache_files]
    assert files and all(f.is_relative_to(cache) for f in files)
    assert_round_trips(dataset, run)


def test_by_default_each_export_has_its_own_temporary_folder(run, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    first, second = to_dataset(run), to_dataset(run)
    folders = set()
    for dataset in (first, second):
        (file,) = {Path(f["filename"]) for f in dataset.cache_files}
        folder = file.relative_to(tmp_path / "tmp").parts[0]
        assert folder.startswith("vf-mm-dataset-")
        folders.add(folder)
    assert len(folders) == 2
    assert_round_trips(first, run)


def test_the_temporary_folder_goes_when_the_process_exits(run, tmp_path):
    code = (
        "import sys; from pathlib import Path; from vf_mm.results import to_dataset; "
        "d = to_dataset(sys.argv[1]); print(Path(d.cache_files[0]['filename']).parent)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(run)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.is_relative_to(tmp_path)
    assert not folder.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("vf-mm-dataset-")] == []


def test_an_export_of_a_changed_run_never_reuses_the_earlier_cache(tmp_path):
    """Same run directory, same keys, same cache_dir: the second export reads the run as
    it is now, and the first dataset still reads as it was."""
    out, cache = tmp_path / "run", tmp_path / "cache"

    def write(reward: float, rollouts: int) -> None:
        with ResultsWriter(out, metadata=METADATA) as writer:
            for example in range(rollouts):
                writer.write(
                    RolloutOutput(
                        example_id=example,
                        prompt=[{"role": "user", "content": "hi"}],
                        completion=[{"role": "assistant", "content": str(reward)}],
                        reward=reward,
                    ),
                    rollout_index=0,
                )

    write(0.0, 3)
    before = to_dataset(out, cache_dir=cache)
    shutil.rmtree(out)
    write(1.0, 3)  # the same path and keys, other values
    after = to_dataset(out, cache_dir=cache)
    assert after["reward"] == [1.0, 1.0, 1.0]
    assert before["reward"] == [0.0, 0.0, 0.0]
    assert {f["filename"] for f in before.cache_files}.isdisjoint(
        f["filename"] for f in after.cache_files
    )
    with ResultsWriter(out, metadata=METADATA, resume=True) as writer:  # one more row
        writer.write(RolloutOutput(example_id=9, prompt=[], completion=[]), rollout_index=0)
    assert to_dataset(out, cache_dir=cache).num_rows == 4


def test_a_bad_asset_raises_itself_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    out = make_run(tmp_path / "run")
    url, path = first_image(out)
    path.unlink()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(AssetError) as info:
        to_dataset(out)
    assert not isinstance(info.value, DatasetGenerationError)
    assert info.value.__suppress_context__  # datasets' wrapper is not shown with it
    assert info.value.asset == url and "example 0 rollout 0" in str(info.value)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_asset_changed_after_its_check_is_checked_again(tmp_path, monkeypatch):
    """Each file is checked once, its bytes not kept: a later reference reads it again,
    and bytes other than those that passed are checked again (here: refused)."""
    out = make_run(tmp_path / "run")
    url, path = first_image(out)  # (0, 0)'s picture, shown again by (0, 1)
    record = _dataset._record
    seen = []

    def damaging(row, *args):
        seen.append(row["example_id"])
        if len(seen) == 2:  # after the first row's check
            picture(5).save(path)
        return record(row, *args)

    monkeypatch.setattr(_dataset, "_record", damaging)
    with pytest.raises(AssetError, match="does not match its content hash") as info:
        to_dataset(out)
    assert (info.value.asset, info.value.example_id, info.value.rollout_index) == (url, 0, 1)


def test_a_results_file_rewritten_between_the_passes_is_refused(run, monkeypatch):
    """The keys come from the first pass, the rows from the second: when they disagree
    the file was rewritten under the export, and no partial dataset comes back."""
    final = _dataset._final_records

    def rewritten_first(scan):  # another process rewrites the file between the passes
        lines = scan.path.read_bytes().splitlines(keepends=True)
        scan.path.write_bytes(b"".join(lines[:-1]))
        return final(scan)

    monkeypatch.setattr(_dataset, "_final_records", rewritten_first)
    with pytest.raises(ResultsError, match="changed while it was read: 6 rollouts on the"):
        to_dataset(run)
