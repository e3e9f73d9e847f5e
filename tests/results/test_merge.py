"""merge_runs: the run directories of a sharded eval become one run directory that reads
like the same run done in one process, or the merge is refused and nothing is written."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from tests.results._clips import frames
from vf_mm.errors import MergeError, ResultsError
from vf_mm.report import make_report
from vf_mm.results import (
    ASSETS_DIR,
    METADATA_FILE,
    RESULTS_FILE,
    MergeResult,
    ResultsWriter,
    merge_runs,
    read_metadata,
    read_results,
    scan_results,
    summarize,
)
from vf_mm.types import RolloutError, RolloutOutput
from vf_mm.videos import encode_lossless, load_video

CONFIG = {
    "env_id": "vqa",
    "env_args": {"split": "test"},
    "model": "tiny",
    "sampling_args": {"temperature": 0.7, "max_tokens": 64},
    "num_examples": 8,
    "rollouts_per_example": 2,
}
EXAMPLES = range(8)
ROLLOUTS = range(2)
SHARDS = 4
FAILED = (3, 0)  # a rollout that fails in every run
RETRIED = (5, 1)  # fails once in its shard, then succeeds on --resume
CLIP_EXAMPLES = (2, 7)  # one clip, shown by examples of two shards


def picture(shade: int) -> Image.Image:
    return Image.new("RGB", (6, 4), (shade * 40, 100, 200))


def rollout(example: int, index: int, *, fail: bool = False) -> RolloutOutput:
    """Example ``e`` shows picture ``e % 3`` (so shards share pictures), two of them a clip."""
    parts: list[dict] = [{"type": "image", "image": picture(example % 3)}]
    if example in CLIP_EXAMPLES:
        parts.append({"type": "video", "video": frames(seed=1, t=4), "frame_rate": 8})
    parts.append({"type": "text", "text": f"question {example}"})
    failed = fail or (example, index) == FAILED
    return RolloutOutput(
        example_id=example,
        prompt=[{"role": "user", "content": parts}],
        completion=[{"role": "assistant", "content": f"answer {example}.{index}"}],
        answer=str(example),
        reward=None if failed else float((example + index) % 2),
        metrics={"correct": float((example + index) % 2)},
        error=RolloutError("BackendError", "server gone", "turn 1: generate") if failed else None,
        timing={"generate_s": 0.25},
    )


def shard_of(example: int, count: int = SHARDS) -> int:
    return example % count


def keys_of(shard: int | None, count: int = SHARDS) -> list[tuple[int, int]]:
    return [
        (e, r) for e in EXAMPLES for r in ROLLOUTS if shard is None or shard_of(e, count) == shard
    ]


def make_run(
    path: Path,
    keys: list[tuple[int, int]],
    *,
    shard: str | None = None,
    config: dict | None = None,
    client: dict | None = None,
    server: str = "http://h0:8000",
    finish: bool = True,
) -> Path:
    """A run directory written by the real writer; ``shard`` goes into its config, as
    ``vf-mm eval --shard i/N`` records it. RETRIED fails first and is resumed."""
    run_config = {**(config or CONFIG), **({"shard": shard} if shard is not None else {})}
    metadata = {"config": run_config, "server": {"base_url": server}, "vf_mm_version": "t"}
    retried = RETRIED in keys and shard is not None
    with ResultsWriter(path, metadata=metadata) as writer:
        for e, r in keys:
            writer.write(rollout(e, r, fail=retried and (e, r) == RETRIED), rollout_index=r)
    with ResultsWriter(path, metadata=metadata, resume=True) as writer:
        if retried:
            writer.write(rollout(*RETRIED), rollout_index=RETRIED[1])
        if finish:
            aggregates = summarize(read_results(path))
            if client is not None:
                aggregates["client"] = client
            writer.finalize(aggregates)
    return path


def make_shards(root: Path, shards=range(SHARDS), count: int = SHARDS) -> list[Path]:
    return [
        make_run(
            root / f"s{i}",
            keys_of(i, count),
            shard=f"{i}/{count}",
            client={"turns": 10 + i, "bridges": i, "renders": 10, "fallbacks": {"prefix": i}},
            server=f"http://h{i}:8000",
        )
        for i in shards
    ]


def by_key(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["example_id"], r["rollout_index"]): r for r in rows}


def fingerprint(*folders: Path) -> dict[str, tuple[str, int]]:
    """Every file under the folders: its sha256 and mtime."""
    return {
        str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


@pytest.fixture
def shards(tmp_path):
    return make_shards(tmp_path)


# -- a full merge -------------------------------------------------------------------


def test_a_full_merge_is_the_unsharded_run(tmp_path, shards):
    whole = make_run(tmp_path / "whole", keys_of(None))
    before = fingerprint(*shards)
    merged = merge_runs(tmp_path / "all", shards)

    out = tmp_path / "all"
    assert isinstance(merged, MergeResult) and merged.outdir == out
    assert merged.complete and merged.missing == () and merged.warnings == ()
    assert merged.shards == ("0/4", "1/4", "2/4", "3/4") and merged.rows == 16
    # the same (example, rollout) rows, rewards and all, as one process wrote them
    rows = read_results(out, bad_lines="raise")
    assert by_key(rows) == by_key(read_results(whole)) and len(rows) == 16
    assert by_key(rows)[RETRIED]["error"] is None  # the retried record, not the failed one
    assert by_key(rows)[FAILED]["error"]["type"] == "BackendError"
    # byte for byte: each merged line is the line its shard's reader gave
    lines = (out / RESULTS_FILE).read_bytes().splitlines(keepends=True)
    assert len(lines) == 16 and set(lines) <= {
        line for s in shards for line in (s / RESULTS_FILE).read_bytes().splitlines(True)
    }
    # each picture and the clip once, although several shards show them; same names
    stored = sorted(p.name for p in (out / ASSETS_DIR).iterdir())
    assert stored == sorted(p.name for p in (whole / ASSETS_DIR).iterdir())
    assert len([n for n in stored if n.endswith(".png")]) == 3 and merged.assets == 4
    assert {n for n in stored if not n.endswith(".png")} == {
        Path(p["video_url"]["url"]).name
        for i in CLIP_EXAMPLES
        for p in by_key(rows)[(i, 0)]["prompt"][0]["content"]
        if p["type"] == "video_url"
    }
    for name in stored:
        assert (out / ASSETS_DIR / name).read_bytes() in {
            (s / ASSETS_DIR / name).read_bytes() for s in shards if (s / ASSETS_DIR / name).exists()
        }
    assert fingerprint(*shards) == before


def test_the_merged_metadata_is_the_common_config_and_the_sums(tmp_path, shards):
    merged = merge_runs(tmp_path / "all", shards)
    meta = read_metadata(tmp_path / "all")
    assert meta == merged.metadata
    assert meta["config"] == {**CONFIG, "merged_shards": ["0/4", "1/4", "2/4", "3/4"]}
    assert meta["results_format"] == 2 and meta["finished_at"] and meta["started_at"]
    assert meta["vf_mm_version"] == "t"  # the same in every source: kept
    assert "server" not in meta  # differs by shard: kept per source
    record = meta["merge"]
    assert record["shards"] == list(merged.shards) == ["0/4", "1/4", "2/4", "3/4"]
    assert record["of"] == 4 and record["missing"] == []
    assert [s["shards"] for s in record["sources"]] == [["0/4"], ["1/4"], ["2/4"], ["3/4"]]
    assert [s["rows"] for s in record["sources"]] == [4, 4, 4, 4]
    assert [s["metadata"]["server"]["base_url"] for s in record["sources"]] == [
        f"http://h{i}:8000" for i in range(4)
    ]
    assert record["sources"][0]["path"] == str(shards[0].resolve())
    # aggregates: summarize over all the rows, the client's counts summed
    aggregates = meta["results"]
    assert {k: aggregates[k] for k in summarize([])} == summarize(read_results(tmp_path / "all"))
    assert aggregates["count"] == 16 and aggregates["errors"] == 1
    assert aggregates["client"] == {
        "turns": 46,
        "bridges": 6,
        "renders": 40,
        "fallbacks": {"prefix": 6},
    }
    assert aggregates["stopped"] is None


def test_the_merged_run_reads_like_any_other(tmp_path, shards):
    merge_runs(tmp_path / "all", shards)
    scan = scan_results(tmp_path / "all", bad_lines="raise")
    assert scan.bad_lines == [] and scan.retries == 0 and len(scan.keys) == 16
    report = make_report(tmp_path / "all")  # what vf-mm view builds
    assert report.warnings == [] and report.rollouts_total == 16
    whole = make_report(make_run(tmp_path / "whole", keys_of(None)))
    assert (
        (report.images_embedded, report.videos_embedded)
        == (
            whole.images_embedded,  # the pictures and the clip's strip frames, once each
            whole.videos_embedded,
        )
        == (3 + 4, 1)
    )


def test_sources_come_in_any_order_and_an_empty_outdir_is_fine(tmp_path, shards):
    (tmp_path / "all").mkdir()
    merged = merge_runs(tmp_path / "all", list(reversed(shards)))
    assert merged.shards == ("0/4", "1/4", "2/4", "3/4")
    first = [r["example_id"] for r in read_results(tmp_path / "all")][:4]
    assert {shard_of(e) for e in first} == {0}  # shard by shard, in shard order


# -- partial merges -----------------------------------------------------------------


def test_a_missing_shard_is_named_and_needs_allow_partial(tmp_path, shards):
    some = [shards[0], shards[1], shards[3]]
    with pytest.raises(MergeError, match=r"shard 2/4 of 4 is missing .*allow_partial") as info:
        merge_runs(tmp_path / "part", some)
    assert info.value.sources == tuple(str(s) for s in some)
    assert_nothing_written(tmp_path / "part")

    merged = merge_runs(tmp_path / "part", some, allow_partial=True)
    assert merged.missing == ("2/4",) and not merged.complete and merged.rows == 12
    meta = read_metadata(tmp_path / "part")
    assert meta["config"]["merged_shards"] == ["0/4", "1/4", "3/4"]
    assert meta["merge"]["missing"] == ["2/4"]
    assert {shard_of(r["example_id"]) for r in read_results(tmp_path / "part")} == {0, 1, 3}


def test_a_partial_merge_merges_again_with_the_rest(tmp_path, shards):
    merge_runs(tmp_path / "part", shards[:2], allow_partial=True)
    merged = merge_runs(tmp_path / "all", [tmp_path / "part", *shards[2:]])
    assert merged.complete and merged.rows == 16
    assert read_metadata(tmp_path / "all")["config"]["merged_shards"] == [
        "0/4", "1/4", "2/4", "3/4"
    ]  # fmt: skip
    whole = make_run(tmp_path / "whole", keys_of(None))
    assert by_key(read_results(tmp_path / "all")) == by_key(read_results(whole))
    with pytest.raises(MergeError, match="both hold shard 0/4"):
        merge_runs(tmp_path / "again", [tmp_path / "part", shards[0]], allow_partial=True)


# -- what the reader does with a source's bad lines ---------------------------------


def test_a_torn_last_line_is_left_out_as_the_reader_does(tmp_path, shards, caplog):
    torn = b'{"example_id": 11, "rollout_index": 0, "prompt": [{"ro'
    with open(shards[3] / RESULTS_FILE, "ab") as f:  # a writer killed mid-line
        f.write(torn)
    before = fingerprint(*shards)
    merged = merge_runs(tmp_path / "all", shards)
    assert merged.rows == 16 and 11 not in {r["example_id"] for r in read_results(tmp_path / "all")}
    [warning] = merged.warnings
    assert str(shards[3]) in warning and "torn last line" in warning and "line 5" in warning
    assert "torn last line" in caplog.text
    assert scan_results(tmp_path / "all", bad_lines="raise").torn_tail is None
    assert fingerprint(*shards) == before  # the source keeps its torn tail: only read
    assert (shards[3] / RESULTS_FILE).read_bytes().endswith(torn)


def test_a_corrupt_middle_line_is_refused_by_the_reader(tmp_path, shards):
    path = shards[1] / RESULTS_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]))
    with pytest.raises(ResultsError, match=r"line 2 is corrupt") as info:
        merge_runs(tmp_path / "all", shards)
    assert str(shards[1]) in str(info.value)
    assert_nothing_written(tmp_path / "all")


def test_an_unfinished_source_is_merged_with_a_warning(tmp_path):
    sources = make_shards(tmp_path, range(3))
    sources.append(make_run(tmp_path / "s3", keys_of(3), shard="3/4", finish=False))
    merged = merge_runs(tmp_path / "all", sources)
    assert merged.rows == 16
    assert any("was not finished" in w and str(sources[3]) in w for w in merged.warnings)
    assert read_metadata(tmp_path / "all")["results"]["client"]["turns"] == 33  # 3 stored


# -- refusals -----------------------------------------------------------------------


def test_configs_that_differ_beyond_the_shard_are_refused(tmp_path, shards):
    other = make_run(tmp_path / "other", keys_of(1), shard="1/4", config={**CONFIG, "model": "big"})
    with pytest.raises(MergeError, match=r"configs differ in model \(model: \"tiny\"") as info:
        merge_runs(tmp_path / "all", [shards[0], other, *shards[2:]])
    assert str(shards[0]) in str(info.value) and str(other) in str(info.value)
    assert info.value.sources == (str(shards[0]), str(other))
    assert_nothing_written(tmp_path / "all")


def test_two_sources_of_one_shard_are_refused(tmp_path, shards):
    again = make_run(tmp_path / "again", keys_of(1), shard="1/4")
    with pytest.raises(MergeError, match=r"both hold shard 1/4") as info:
        merge_runs(tmp_path / "all", [*shards, again])
    assert set(info.value.sources) == {str(shards[1]), str(again)}
    assert_nothing_written(tmp_path / "all")


def test_different_shard_counts_are_refused(tmp_path, shards):
    half = make_run(tmp_path / "half", keys_of(1, 2), shard="1/2")
    with pytest.raises(MergeError, match=r"shard of 4 \(0/4\) but .*half of 2 \(1/2\)"):
        merge_runs(tmp_path / "all", [shards[0], half])
    assert_nothing_written(tmp_path / "all")


def test_a_rollout_in_two_sources_is_refused(tmp_path, shards):
    # shard 1's run that also ran example 0 (another sharding, or a bug)
    overlapping = make_run(tmp_path / "s1b", [(0, 1), *keys_of(1)], shard="1/4")
    with pytest.raises(
        MergeError, match=rf"example 0 rollout 1 is in both {shards[0]} and {overlapping}"
    ) as info:
        merge_runs(tmp_path / "all", [shards[0], overlapping, *shards[2:]])
    assert info.value.sources == (str(shards[0]), str(overlapping))
    assert_nothing_written(tmp_path / "all")


def test_a_missing_source_or_one_that_is_not_a_run_is_refused(tmp_path, shards):
    out = tmp_path / "all"
    with pytest.raises(MergeError, match=r"source .*nowhere does not exist"):
        merge_runs(out, [*shards, tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError, match=r"empty is not a run directory: it has no metadata"):
        merge_runs(out, [*shards, tmp_path / "empty"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(MergeError, match=r"file is not a run directory"):
        merge_runs(out, [*shards, tmp_path / "file"])
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / RESULTS_FILE).write_bytes(b"")
    with pytest.raises(MergeError, match=r"rows is not a run directory: it has no metadata"):
        merge_runs(out, [*shards, tmp_path / "rows"])
    (tmp_path / "rows" / METADATA_FILE).write_text("[1]")
    with pytest.raises(MergeError, match=r"rows is not a run directory: .*not an object"):
        merge_runs(out, [*shards, tmp_path / "rows"])
    with pytest.raises(MergeError, match=r"the same source directory, given twice"):
        merge_runs(out, [*shards, shards[0]])
    assert_nothing_written(out)


def test_a_source_that_is_not_a_shard_is_refused(tmp_path, shards):
    whole = make_run(tmp_path / "whole", keys_of(None))
    with pytest.raises(MergeError, match=r"whole is not a shard: its config has no 'shard'"):
        merge_runs(tmp_path / "all", [whole])
    bad = make_run(tmp_path / "bad", keys_of(1), shard="4/4")
    with pytest.raises(MergeError, match=r"shard '4/4' is not 'i/N' with 0 <= i < N"):
        merge_runs(tmp_path / "all", [*shards[:1], bad])
    assert_nothing_written(tmp_path / "all")


def test_an_outdir_that_is_not_empty_or_inside_a_source_is_refused(tmp_path, shards):
    out = tmp_path / "all"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(MergeError, match=r"outdir .*all exists and is not empty") as info:
        merge_runs(out, shards)
    assert info.value.path == str(out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    with pytest.raises(MergeError, match=r"exists and is not empty"):
        merge_runs(shards[0], shards)  # a source as the outdir
    with pytest.raises(MergeError, match=r"is inside source"):
        merge_runs(shards[0] / "merged", shards)
    assert not (shards[0] / "merged").exists()


def test_a_source_still_being_written_is_refused(tmp_path, shards):
    metadata = read_metadata(shards[3])
    with (
        ResultsWriter(shards[3], metadata=metadata, resume=True),  # a run going on
        pytest.raises(MergeError, match=r"s3 is being written"),
    ):
        merge_runs(tmp_path / "all", shards)
    assert_nothing_written(tmp_path / "all")
    assert merge_runs(tmp_path / "all", shards).rows == 16  # once it has ended


def test_an_asset_that_does_not_match_its_hash_is_refused(tmp_path, shards):
    # example 5's picture (2) is in shard 1 and in no earlier shard: shard 1's file is copied
    [name] = {
        Path(p["image_url"]["url"]).name
        for r in read_results(shards[1])
        for p in r["prompt"][0]["content"]
        if p["type"] == "image_url" and r["example_id"] == 5
    }
    buffer = io.BytesIO()
    picture(0).save(buffer, format="PNG")
    (shards[1] / ASSETS_DIR / name).write_bytes(buffer.getvalue())  # another picture
    with pytest.raises(MergeError, match=rf"s1: assets/{name} .*does not match its hash"):
        merge_runs(tmp_path / "all", shards)
    assert_nothing_written(tmp_path / "all")
    (shards[1] / ASSETS_DIR / name).unlink()
    with pytest.raises(
        MergeError,
        match=rf"{name} \(referred to by example 5 rollout 0, prompt, message \d+, part \d+\) cannot",
    ):
        merge_runs(tmp_path / "all", shards)
    assert_nothing_written(tmp_path / "all")


def test_a_clip_is_checked_at_its_frame_rate_like_the_store_does(tmp_path, shards):
    # the clip first appears in shard 2 (example 2): its file there is the one copied
    [clip] = [p for p in (shards[2] / ASSETS_DIR).iterdir() if p.suffix != ".png"]
    other = load_video({"type": "video", "video": frames(seed=2, t=4), "frame_rate": 8})
    clip.write_bytes(encode_lossless(other))  # another clip under the first one's name
    with pytest.raises(MergeError, match=rf"s2: assets/{clip.name} .*does not match its hash"):
        merge_runs(tmp_path / "all", shards)
    clip.write_bytes(b"not a video")
    with pytest.raises(MergeError, match=rf"assets/{clip.name} .*does not load"):
        merge_runs(tmp_path / "all", shards)
    assert_nothing_written(tmp_path / "all")


def test_wrong_arguments_raise_at_once(tmp_path, shards):
    with pytest.raises(TypeError, match="a list of run directories"):
        merge_runs(tmp_path / "all", str(shards[0]))
    with pytest.raises(ValueError, match="at least one source"):
        merge_runs(tmp_path / "all", [])
    with pytest.raises(ValueError, match="bad_lines"):
        merge_runs(tmp_path / "all", shards, bad_lines="ignore")
    assert_nothing_written(tmp_path / "all")


def test_sources_are_never_changed(tmp_path, shards):
    before = fingerprint(*shards)
    names = {s: sorted(p.name for p in s.rglob("*")) for s in shards}
    merge_runs(tmp_path / "all", shards)
    with pytest.raises(MergeError):
        merge_runs(tmp_path / "again", shards[:2])
    with pytest.raises(MergeError):
        merge_runs(tmp_path / "all", shards)
    assert fingerprint(*shards) == before
    assert {s: sorted(p.name for p in s.rglob("*")) for s in shards} == names
    assert json.loads((shards[0] / METADATA_FILE).read_text())["config"]["shard"] == "0/4"
