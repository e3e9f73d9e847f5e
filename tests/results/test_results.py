"""ResultsWriter / read_results: the line schema, refusals, resume and torn lines."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import ResultsError, ResumeMismatchError
from vf_mm.images import image_hash
from vf_mm.results import (
    METADATA_FILE,
    RESULTS_FILE,
    ROW_KEYS,
    ResultsWriter,
    read_metadata,
    read_results,
)
from vf_mm.types import ResponseTokens, RolloutError, RolloutOutput, TrajectoryStep

CONFIG = {
    "env_id": "vqa",
    "env_args": {"split": "test"},
    "model": "tiny",
    "sampling_args": {"temperature": 0.7, "max_tokens": 64},
    "num_examples": 3,
    "rollouts_per_example": 2,
}
METADATA = {"env_id": "vqa", "model": "tiny", "config": CONFIG}


def image(shade: int = 0) -> Image.Image:
    return Image.new("RGB", (6, 4), (shade, 100, 200))


def tokens(prompt: int, completion: int) -> ResponseTokens:
    return ResponseTokens(
        [1] * prompt, [2] * completion, [-0.5] * completion, [1] * completion, "stop"
    )


def output(example_id=0, *, reward=1.0, steps=None, **kwargs) -> RolloutOutput:
    shade = example_id if isinstance(example_id, int) else 99
    fields = {
        "prompt": [{"role": "user", "content": [{"type": "image", "image": image(shade)}]}],
        "completion": [{"role": "assistant", "content": f"answer {example_id}"}],
        "answer": "a",
        "reward": reward,
        **kwargs,
    }
    if steps is not None:
        fields["trajectory"] = steps
    return RolloutOutput(example_id=example_id, **fields)


def raw_lines(outdir) -> list[bytes]:
    return (outdir / RESULTS_FILE).read_bytes().splitlines(keepends=True)


def new_writer(outdir, **kwargs) -> ResultsWriter:
    return ResultsWriter(outdir, metadata=kwargs.pop("metadata", METADATA), **kwargs)


# -- the line schema ----------------------------------------------------------------


def test_results_line_schema(tmp_path):
    steps = [
        TrajectoryStep(prompt=[], completion=[], tokens=tokens(10, 3)),
        TrajectoryStep(prompt=[], completion=[], tokens=tokens(15, 4)),
    ]
    rollout = output(
        7,
        reward=0.25,
        steps=steps,
        info={"source": "x", "ids": (1, 2)},
        metrics={"correct": 0.0, "format": np.float32(1.0)},
        timing={"generate_s": 0.5},
        error=None,
    )
    with new_writer(tmp_path) as writer:
        returned = writer.write(rollout, rollout_index=1, extra={"model": "tiny"})
    [line] = raw_lines(tmp_path)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    row = json.loads(line)
    assert list(row) == [*ROW_KEYS, "model"]
    assert row == returned
    assert row == {
        "example_id": 7,
        "rollout_index": 1,
        "prompt": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": f"assets/{image_hash(image(7))}.png"},
                    }
                ],
            }
        ],
        "completion": [{"role": "assistant", "content": "answer 7"}],
        "answer": "a",
        "info": {"source": "x", "ids": [1, 2]},
        "reward": 0.25,
        "metrics": {"correct": 0.0, "format": 1.0},
        "error": None,
        "truncated": False,
        "num_turns": 2,
        "prompt_tokens": 25,
        "completion_tokens": 7,
        "timing": {"generate_s": 0.5},
        "model": "tiny",
    }
    assert (tmp_path / row["prompt"][0]["content"][0]["image_url"]["url"]).is_file()
    assert b"base64" not in line and b"data:" not in line


def test_token_counts_are_null_without_token_level_steps(tmp_path):
    no_tokens = [TrajectoryStep(prompt=[], completion=[], tokens=None)] * 3
    mixed = [
        TrajectoryStep(prompt=[], completion=[], tokens=tokens(4, 2)),
        TrajectoryStep(prompt=[], completion=[], tokens=None),
    ]
    two_turns = [
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "b"},
    ]
    with new_writer(tmp_path) as writer:
        a = writer.write(output(0, steps=no_tokens), rollout_index=0)
        b = writer.write(output(1, steps=mixed), rollout_index=0)
        c = writer.write(output(2, completion=two_turns), rollout_index=0)  # no trajectory
    assert (a["num_turns"], a["prompt_tokens"], a["completion_tokens"]) == (3, None, None)
    assert (b["num_turns"], b["prompt_tokens"], b["completion_tokens"]) == (2, None, None)
    assert (c["num_turns"], c["prompt_tokens"], c["completion_tokens"]) == (2, None, None)


def test_a_truncated_rollout_says_so_in_its_row(tmp_path):
    with new_writer(tmp_path) as writer:
        cut = writer.write(output(0, truncated=True), rollout_index=0)
        whole = writer.write(output(1), rollout_index=0)
    assert cut["truncated"] is True and cut["reward"] == 1.0 and cut["error"] is None
    assert whole["truncated"] is False
    assert [json.loads(line)["truncated"] for line in raw_lines(tmp_path)] == [True, False]


def test_unicode_is_written_as_utf8_and_line_separators_stay_inside_the_line(tmp_path):
    text = "héllo\u2028next\u2029para\x85nel 日本 \ud800"  # U+2028 etc. are not line ends
    with new_writer(tmp_path) as writer:
        writer.write(
            output(
                0,
                completion=[{"role": "assistant", "content": text}],
                answer="caf\udce9",
                info={"note\udce9": ["\ud800"]},
            ),
            rollout_index=0,
        )
        writer.write(output(1), rollout_index=0)
    assert len(raw_lines(tmp_path)) == 2
    rows = read_results(tmp_path)
    assert rows[0]["completion"][0]["content"] == text
    # a lone surrogate is stored losslessly (a JSON escape) and read back the same
    assert rows[0]["answer"] == "caf\udce9" and rows[0]["info"] == {"note\udce9": ["\ud800"]}
    with new_writer(tmp_path / "b") as writer:
        writer.write(
            output(0, completion=[{"role": "assistant", "content": "日本"}]), rollout_index=0
        )
    assert "日本".encode() in (tmp_path / "b" / RESULTS_FILE).read_bytes()  # not \u escapes


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"reward": math.nan}, r"example 0 rollout 0, field 'reward'.*nan.*JSON has no NaN"),
        ({"metrics": {"acc": math.inf}}, r"field 'metrics.acc'.*inf"),
        ({"timing": {"t": -math.inf}}, r"field 'timing.t'"),
    ],
)
def test_non_json_values_are_refused_and_nothing_is_written(tmp_path, change, match):
    with new_writer(tmp_path) as writer:
        with pytest.raises(ResultsError, match=match):
            writer.write(output(0, **change), rollout_index=0)
        assert raw_lines(tmp_path) == []
        assert writer.done == frozenset()
        writer.write(output(0), rollout_index=0)  # the key is still free
    assert len(read_results(tmp_path)) == 1


def test_extra_keys_may_not_replace_row_fields(tmp_path):
    with new_writer(tmp_path) as writer, pytest.raises(ResultsError, match="'reward' clashes"):
        writer.write(output(0), rollout_index=0, extra={"reward": 5})
    assert raw_lines(tmp_path) == []


@pytest.mark.parametrize(
    ("change", "field", "match"),
    [
        ({"info": {"blob": b"123"}}, "info", r"field 'info.blob': bytes is not JSON"),
        ({"answer": np.zeros(2)}, "answer", r"field 'answer'.*tensor or array"),
    ],
)
def test_content_json_cannot_hold_is_recorded_and_the_run_goes_on(tmp_path, change, field, match):
    with new_writer(tmp_path) as writer:
        row = writer.write(output(0, **change), rollout_index=0)
        writer.write(output(1), rollout_index=0)
    (first, second) = read_results(tmp_path)
    assert first == row and first["reward"] is None
    assert first[field]["unavailable"] in ("dict", "ndarray")
    assert re.search(match, first["error"]["message"]) and first["error"]["type"] == "ResultsError"
    assert first["error"]["where"] == "storing the rollout"
    assert second["error"] is None and second["reward"] == 1.0


def test_an_image_that_does_not_load_is_recorded_where_it_was(tmp_path):
    bad = [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image", "image": "/no/such/file.png"}]},
        {"role": "tool", "tool_call_id": "t", "content": [{"type": "image", "image": b"x"}]},
    ]  # fmt: skip
    with new_writer(tmp_path) as writer:
        writer.write(
            output(
                3, completion=bad, error=RolloutError("RuntimeError", "its own", "turn 2: model")
            ),
            rollout_index=1,
        )
        writer.write(output(4, completion=bad), rollout_index=0)
    own, stored = read_results(tmp_path)
    assert own["error"] == {"type": "RuntimeError", "message": "its own", "where": "turn 2: model"}
    assert own["reward"] is None
    text, missing = own["completion"][0]["content"]
    assert text == {"type": "text", "text": "look"}
    assert missing["type"] == "unavailable" and missing["source"] == "/no/such/file.png"
    assert "ImageFetchError" in missing["error"]
    garbage = own["completion"][1]["content"][0]
    assert garbage["type"] == "unavailable" and garbage["source"] is None
    assert "ImageDecodeError" in garbage["error"]
    assert stored["error"]["type"] == "ImageFetchError"
    assert "example 4 rollout 0" in stored["error"]["message"]
    assert "completion, message 0, part 1" in stored["error"]["message"]


def test_a_key_is_written_once(tmp_path):
    with new_writer(tmp_path) as writer:
        writer.write(output(0), rollout_index=0)
        with pytest.raises(ResultsError, match="example 0 rollout 0 is already in"):
            writer.write(output(0, reward=0.0), rollout_index=0)
        writer.write(output("0"), rollout_index=0)  # "0" is another example id than 0
        assert writer.done == {(0, 0), ("0", 0)}
    assert len(raw_lines(tmp_path)) == 2


def test_bad_keys_are_refused(tmp_path):
    with new_writer(tmp_path) as writer:
        with pytest.raises(ResultsError, match="rollout_index"):
            writer.write(output(0), rollout_index=-1)
        with pytest.raises(ResultsError, match="example_id"):
            writer.write(RolloutOutput(example_id=1.5, prompt=[], completion=[]), rollout_index=0)


def test_concurrent_writes_from_threads(tmp_path):
    with new_writer(tmp_path, fsync_every=7) as writer:

        def work(t: int) -> None:
            for r in range(20):
                writer.write(
                    output(t, completion=[{"role": "assistant", "content": "x" * 5000}]),
                    rollout_index=r,
                )

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    rows = read_results(tmp_path, bad_lines="raise")
    assert sorted((r["example_id"], r["rollout_index"]) for r in rows) == [
        (t, r) for t in range(8) for r in range(20)
    ]


def test_awrite_from_asyncio(tmp_path):
    import asyncio

    async def main(writer: ResultsWriter) -> None:
        await asyncio.gather(*(writer.awrite(output(i), rollout_index=0) for i in range(5)))

    with new_writer(tmp_path) as writer:
        asyncio.run(main(writer))
    assert {r["example_id"] for r in read_results(tmp_path)} == set(range(5))


def test_fsync_every_n_lines_and_on_close(tmp_path, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync
    writer = new_writer(tmp_path, fsync_every=3)
    results_fd = writer._fd

    def spy(fd):
        if fd == results_fd:
            synced.append(len(raw_lines(tmp_path)))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    for i in range(7):
        writer.write(output(i), rollout_index=0)
    assert synced == [3, 6]
    writer.close()
    assert synced == [3, 6, 7]
    with pytest.raises(ResultsError, match="closed"):
        writer.write(output(9), rollout_index=0)


# -- metadata, finalize ---------------------------------------------------------------


def test_metadata_is_written_at_start_and_by_finalize(tmp_path):
    writer = new_writer(tmp_path)
    start = read_metadata(tmp_path)
    assert start["config"] == CONFIG and start["model"] == "tiny"
    assert start["finished_at"] is None and start["results"] is None
    assert start["results_format"] == 2 and start["started_at"]
    writer.write(output(0, reward=1.0), rollout_index=0)
    writer.write(output(0, reward=0.0, error="boom"), rollout_index=1)
    aggregates = writer.finalize()
    writer.close()
    final = read_metadata(tmp_path)
    assert final["results"] == aggregates
    assert aggregates["count"] == 2 and aggregates["errors"] == 1
    assert final["finished_at"] is not None and final["started_at"] == start["started_at"]
    assert {k: v for k, v in final.items() if k not in ("results", "finished_at")} == {
        k: v for k, v in start.items() if k not in ("results", "finished_at")
    }
    assert sorted(os.listdir(tmp_path)) == ["assets", METADATA_FILE, RESULTS_FILE]


def test_finalize_with_given_aggregates(tmp_path):
    with new_writer(tmp_path) as writer:
        writer.finalize({"reward": {"mean": 0.5}})
    assert read_metadata(tmp_path)["results"] == {"reward": {"mean": 0.5}}


def test_non_json_metadata_is_refused_before_anything_is_created(tmp_path):
    outdir = tmp_path / "out"
    with pytest.raises(ResultsError, match=r"metadata, field 'config.seed'.*nan"):
        new_writer(outdir, metadata={"config": {"seed": math.nan}})
    assert not outdir.exists()


# -- refusing to overwrite, locking ------------------------------------------------


def test_refuses_an_outdir_that_holds_results(tmp_path):
    with new_writer(tmp_path) as writer:
        writer.write(output(0), rollout_index=0)
    before = (tmp_path / RESULTS_FILE).read_bytes(), (tmp_path / METADATA_FILE).read_bytes()
    with pytest.raises(ResultsError, match=r"already holds results\.jsonl.*resume=True"):
        new_writer(tmp_path)
    assert ((tmp_path / RESULTS_FILE).read_bytes(), (tmp_path / METADATA_FILE).read_bytes()) == (
        before
    )


def test_refuses_an_outdir_with_only_metadata(tmp_path):
    (tmp_path / METADATA_FILE).write_text("{}")
    with pytest.raises(ResultsError, match=r"already holds metadata\.json"):
        new_writer(tmp_path)
    assert not (tmp_path / RESULTS_FILE).exists()


def test_an_empty_existing_outdir_is_fine(tmp_path):
    (tmp_path / "out").mkdir()
    with new_writer(tmp_path / "out") as writer:
        writer.write(output(0), rollout_index=0)


def test_a_run_that_stopped_before_its_first_rollout_is_reused_with_or_without_resume(tmp_path):
    """Bad settings or an interrupt before the first rollout leave metadata.json and an
    empty results.jsonl: nothing to lose, so the next try (with other settings, with or
    without resume) takes the directory; once a rollout is in, it is a run to keep."""
    new_writer(tmp_path).close()  # stopped before its first rollout
    other = {"config": {**CONFIG, "sampling_args": {"max_tokens": 8}}}
    new_writer(tmp_path, metadata=other).close()
    assert read_metadata(tmp_path)["config"] == other["config"]
    third = {"config": {**CONFIG, "seed": 3}}
    with new_writer(tmp_path, resume=True, metadata=third) as writer:
        assert writer.done == frozenset() and not writer.resumed
        writer.write(output(0), rollout_index=0)
    assert read_metadata(tmp_path)["config"] == third["config"]
    with pytest.raises(ResultsError, match=r"already holds results\.jsonl and metadata\.json"):
        new_writer(tmp_path, metadata=third)
    with pytest.raises(ResumeMismatchError, match="seed"):
        new_writer(tmp_path, resume=True, metadata=other)


def test_a_second_writer_on_the_same_outdir_is_refused(tmp_path):
    with new_writer(tmp_path), pytest.raises(ResultsError, match="another ResultsWriter"):
        new_writer(tmp_path, resume=True)
    new_writer(tmp_path, resume=True).close()  # released on close


# -- resume ----------------------------------------------------------------------------


def test_resume_reads_done_and_continues(tmp_path):
    with new_writer(tmp_path) as writer:
        for i in range(3):
            writer.write(output(i), rollout_index=0)
    started = read_metadata(tmp_path)["started_at"]
    with new_writer(tmp_path, resume=True) as writer:
        assert writer.done == {(0, 0), (1, 0), (2, 0)}
        assert writer.resumed and writer.truncated_bytes == 0
        assert writer.pending(range(3), 2) == [(0, 1), (1, 1), (2, 1)]
        assert read_metadata(tmp_path)["finished_at"] is None
        assert read_metadata(tmp_path)["started_at"] == started
        with pytest.raises(ResultsError, match="already in"):
            writer.write(output(1), rollout_index=0)
        writer.write(output(1), rollout_index=1)
    keys = [(r["example_id"], r["rollout_index"]) for r in read_results(tmp_path)]
    assert keys == [(0, 0), (1, 0), (2, 0), (1, 1)]


def test_resume_on_a_new_outdir_starts_a_run(tmp_path):
    with new_writer(tmp_path / "new", resume=True) as writer:
        assert writer.done == frozenset() and not writer.resumed
        writer.write(output(0), rollout_index=0)
    assert len(read_results(tmp_path / "new")) == 1


def test_resume_with_a_different_config_lists_the_differing_keys(tmp_path):
    with new_writer(tmp_path) as writer:
        writer.write(output(0), rollout_index=0)
    (tmp_path / RESULTS_FILE).open("ab").write(b'{"example_id": 1, "rol')  # a torn tail
    before = (tmp_path / RESULTS_FILE).read_bytes(), (tmp_path / METADATA_FILE).read_bytes()
    changed = {
        **CONFIG,
        "model": "other",
        "sampling_args": {"temperature": 1.0, "max_tokens": 64},
        "seed": 3,
    }
    del changed["num_examples"]
    with pytest.raises(ResumeMismatchError) as caught:
        new_writer(tmp_path, resume=True, metadata={**METADATA, "config": changed})
    error = caught.value
    assert set(error.differences) == {"model", "sampling_args", "seed", "num_examples"}
    assert error.differences["model"] == ("tiny", "other")
    assert error.differences["seed"] == (ResumeMismatchError.MISSING, 3)
    assert error.differences["num_examples"] == (3, ResumeMismatchError.MISSING)
    for key in ("model", "sampling_args", "seed", "num_examples"):
        assert key in str(error)
    assert isinstance(error, ResultsError)
    # nothing on disk changed: the torn tail is still there, the metadata too
    after = (tmp_path / RESULTS_FILE).read_bytes(), (tmp_path / METADATA_FILE).read_bytes()
    assert after == before


def test_resume_compares_configs_as_json(tmp_path):
    config = {**CONFIG, "stop": ("a", "b")}
    new_writer(tmp_path, metadata={"config": config}).close()
    new_writer(tmp_path, resume=True, metadata={"config": {**config, "stop": ["a", "b"]}}).close()


def test_resume_refuses_results_without_metadata(tmp_path):
    with new_writer(tmp_path) as writer:
        writer.write(output(0), rollout_index=0)
    (tmp_path / METADATA_FILE).unlink()
    with pytest.raises(ResultsError, match=r"no metadata\.json"):
        new_writer(tmp_path, resume=True)


def test_resume_removes_temp_files_of_a_killed_writer(tmp_path):
    new_writer(tmp_path).close()
    (tmp_path / "assets" / ".0123.png.tmp-abc").write_bytes(b"half a png")
    (tmp_path / ".metadata.json.tmp-xyz").write_bytes(b"{")
    with new_writer(tmp_path, resume=True) as writer:
        assert writer.removed_temp_files == 2
    assert sorted(os.listdir(tmp_path)) == ["assets", METADATA_FILE, RESULTS_FILE]
    assert os.listdir(tmp_path / "assets") == []


def _three_rows(outdir) -> tuple[bytes, int]:
    """A results file of three lines; returns its bytes and where the last line starts."""
    with new_writer(outdir) as writer:
        for i in range(3):
            writer.write(output(i, info={"text": "é ✓ " * 10}), rollout_index=0)
    data = (outdir / RESULTS_FILE).read_bytes()
    return data, data.rstrip(b"\n").rfind(b"\n") + 1


def test_resume_after_a_torn_last_line_at_every_byte_offset(tmp_path):
    data, last = _three_rows(tmp_path)
    whole = data[:last]
    assert last > 0 and len(data) - last > 100
    for cut in range(last + 1, len(data)):  # every offset strictly inside the last line
        (tmp_path / RESULTS_FILE).write_bytes(data[:cut])
        with new_writer(tmp_path, resume=True, fsync_every=0) as writer:
            assert writer.done == {(0, 0), (1, 0)}, cut
            assert writer.truncated_bytes == cut - last, cut
        assert (tmp_path / RESULTS_FILE).read_bytes() == whole, cut
    # and the run goes on from there: the lost rollout is written again, once
    with new_writer(tmp_path, resume=True) as writer:
        writer.write(output(2), rollout_index=0)
    assert [r["example_id"] for r in read_results(tmp_path, bad_lines="raise")] == [0, 1, 2]


@pytest.mark.parametrize("tail", [b"\x00" * 64 + b"\n", b"{not json}\n", b"[1, 2]\n", b"{}\n"])
def test_resume_cuts_a_newline_terminated_garbage_last_line(tmp_path, tail):
    data, _ = _three_rows(tmp_path)
    (tmp_path / RESULTS_FILE).write_bytes(data + tail)
    with new_writer(tmp_path, resume=True) as writer:
        assert writer.truncated_bytes == len(tail)
        assert len(writer.done) == 3
    assert (tmp_path / RESULTS_FILE).read_bytes() == data


def test_resume_refuses_a_corrupt_line_in_the_middle(tmp_path):
    data, _ = _three_rows(tmp_path)
    lines = data.splitlines(keepends=True)
    corrupt = lines[0] + b'{"example_id": 1, "rollout_ind\n' + lines[2]
    (tmp_path / RESULTS_FILE).write_bytes(corrupt)
    with pytest.raises(ResultsError) as caught:
        new_writer(tmp_path, resume=True)
    assert caught.value.line == 2 and "line 2" in str(caught.value)
    assert (tmp_path / RESULTS_FILE).read_bytes() == corrupt  # not "repaired"


# -- read_results ---------------------------------------------------------------------


def test_read_results_raises_on_a_corrupt_middle_line_with_its_number(tmp_path):
    data, _ = _three_rows(tmp_path)
    lines = data.splitlines(keepends=True)
    (tmp_path / RESULTS_FILE).write_bytes(lines[0] + lines[1] + b"\xff\xfe garbage\n" + lines[2])
    with pytest.raises(ResultsError, match="line 3 is corrupt") as caught:
        read_results(tmp_path)
    assert caught.value.line == 3


def test_read_results_raises_on_a_repeated_key(tmp_path):
    data, _ = _three_rows(tmp_path)
    lines = data.splitlines(keepends=True)
    (tmp_path / RESULTS_FILE).write_bytes(data + lines[1])
    with pytest.raises(ResultsError, match="line 4 repeats example 1 rollout 0 of line 2"):
        read_results(tmp_path)


def test_read_results_leaves_out_a_torn_last_line_loudly(tmp_path, caplog):
    data, last = _three_rows(tmp_path)
    (tmp_path / RESULTS_FILE).write_bytes(data[: last + 10])
    with caplog.at_level(logging.WARNING, logger="vf_mm.results"):
        rows = read_results(tmp_path)
    assert [r["example_id"] for r in rows] == [0, 1]
    assert "line (3) is torn" in caplog.text
    with pytest.raises(ResultsError, match="torn") as caught:
        read_results(tmp_path / RESULTS_FILE, bad_lines="raise")
    assert caught.value.line == 3


def test_read_results_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_results(tmp_path)


def test_files_get_the_permissions_a_plain_open_gives_not_private_ones(tmp_path):
    old = os.umask(0o022)
    try:
        with new_writer(tmp_path / "run") as writer:
            writer.write(output(0), rollout_index=0)
            writer.finalize()
    finally:
        os.umask(old)
    files = [tmp_path / "run" / "metadata.json", *(tmp_path / "run" / "assets").iterdir()]
    assert len(files) == 2  # the metadata and the row's one image
    for path in files:  # shared run directories stay readable (mkstemp alone gives 0600)
        assert path.stat().st_mode & 0o777 == 0o644, path
