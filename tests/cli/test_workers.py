"""`vf-mm eval --workers W` and `--shard i/N`: the same rollouts as one process, split
by example id across runs, and clear refusals of what does not go together."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vf_mm.cli import main
from vf_mm.results import read_metadata, read_results

ROOT = Path(__file__).resolve().parents[2]
RUN = ["eval", "shapes", "-n", "6", "-r", "2", "-S", '{"max_tokens": 12}']


def rows(outdir):
    return {(r["example_id"], r["rollout_index"]): r for r in read_results(outdir)}


def test_two_worker_processes_write_what_one_process_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main([*RUN, "-o", str(tmp_path / "one")]) == 0
    assert main([*RUN, "--workers", "2", "-o", str(tmp_path / "two")]) == 0
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert sorted(one) == sorted(two) and len(two) == 12
    for key, row in one.items():
        assert two[key]["completion"] == row["completion"]
        assert two[key]["reward"] == row["reward"] and two[key]["error"] is None
    client = read_metadata(tmp_path / "two")["results"]["client"]
    assert client["turns"] == 12  # the workers' counts, summed


def test_shards_split_the_examples_by_id(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for i in range(2):
        assert main([*RUN, "--shard", f"{i}/2", "-o", str(tmp_path / f"s{i}")]) == 0
    s0, s1 = rows(tmp_path / "s0"), rows(tmp_path / "s1")
    assert sorted(s0) == [(e, i) for e in (0, 2, 4) for i in range(2)]
    assert sorted(s1) == [(e, i) for e in (1, 3, 5) for i in range(2)]
    assert read_metadata(tmp_path / "s1")["config"]["shard"] == "1/2"
    # a resume must stay in its shard
    assert main([*RUN, "--shard", "0/2", "--resume", "-o", str(tmp_path / "s1")]) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workers", "0"], "--workers must be >= 1"),
        (["--shard", "2/2"], "0 <= i < N"),
        (["--shard", "half"], "write i/N"),
    ],
)
def test_bad_scale_arguments_exit_2_naming_the_mistake(extra, message, tmp_path, capsys, monkeypatch):  # fmt: skip
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main([*RUN, *extra, "-o", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here")
def test_ray_without_ray_installed_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main([*RUN, "--ray", "-o", str(tmp_path / "run")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "needs Ray: pip install 'vf-mm[ray]'" in out


@pytest.mark.slow  # --workers with --stream is also run by the next test (one worker)
def test_rollout_with_workers_streams_the_groups_one_process_streams(tmp_path, monkeypatch):
    from vf_mm.training import read_groups, unpack_group

    monkeypatch.chdir(ROOT)
    run = ["rollout", "shapes", "-n", "4", "-r", "2", "-S", '{"max_tokens": 8}']
    assert main([*run, "--stream", str(tmp_path / "one.vfmm")]) == 0
    assert main([*run, "--workers", "2", "--stream", str(tmp_path / "two.vfmm")]) == 0

    def rollouts(path):
        return {
            (r.group_id, r.rollout_index): r for g in read_groups(path) for r in unpack_group(g)
        }

    one, two = rollouts(tmp_path / "one.vfmm"), rollouts(tmp_path / "two.vfmm")
    assert sorted(one) == sorted(two) and len(two) == 8  # the same group ids: the same run
    for key, rollout in one.items():
        mine = [s.tokens.prompt_ids + s.tokens.completion_ids for s in rollout.trajectory]
        theirs = [s.tokens.prompt_ids + s.tokens.completion_ids for s in two[key].trajectory]
        assert mine == theirs
    # a shard of the same run keeps the run's id, so its groups are the same groups
    assert main([*run, "--shard", "1/2", "--stream", str(tmp_path / "half.vfmm")]) == 0
    half = rollouts(tmp_path / "half.vfmm")
    assert set(half) == {k for k in one if one[k].example_id in (1, 3)}


def test_rollout_with_workers_records_the_workers_image_processing(tmp_path, monkeypatch):
    """An encoded group records the processing of the renderer that made its tensors: with
    workers, the one each worker reports, and the trainer rebuilds against it."""
    from vf_mm.models import embedded_model
    from vf_mm.training import ImageProcessing, ImageRebuilder, read_groups, unpack_group

    monkeypatch.chdir(ROOT)
    path = tmp_path / "groups.vfmm"
    run = ["rollout", "shapes", "-n", "2", "-r", "2", "-S", '{"max_tokens": 8}']
    assert main([*run, "--workers", "1", "--images", "encoded", "--stream", str(path)]) == 0
    trainer = ImageProcessing.from_checkpoint(embedded_model(), image_backend="auto")
    groups = list(read_groups(path))
    assert len(groups) == 2
    with ImageRebuilder(trainer) as rebuilder:
        for group in groups:
            assert trainer.differences(group["processing"]) == {}
            assert all(r.error is None for r in unpack_group(group, images=rebuilder))
        assert rebuilder.rebuilt == 2


def test_the_parent_reads_the_tokenizer_once_and_sends_it_to_every_worker(tmp_path, monkeypatch):
    """The workers are handed the tokenizer the parent loaded for its own check (no worker
    reads tokenizer.json: test_client.py shows a client built from it does not), instead
    of each worker loading it once per renderer. The pool is a stand-in that records its
    spec and fails to start: no process is spawned."""
    import pickle

    from transformers import AutoTokenizer

    import vf_mm.workers
    from vf_mm.errors import WorkerStartError
    from vf_mm.models import TokenizerSnapshot, embedded_model

    loads, load, specs = [], AutoTokenizer.from_pretrained, []

    def spy(*args, **kwargs):
        loads.append(args)
        return load(*args, **kwargs)

    class Pool:
        def __init__(self, spec, size, **options):
            specs.append(spec)

        async def __aenter__(self):
            raise WorkerStartError("stand-in pool")

        async def __aexit__(self, *exc):
            return None

    monkeypatch.chdir(ROOT)
    embedded_model()  # built before counting (it loads a tokenizer to build one)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    monkeypatch.setattr(vf_mm.workers, "WorkerPool", Pool)
    assert main([*RUN, "--workers", "4", "-o", str(tmp_path / "run")]) == 1
    assert len(loads) == 1  # the parent's check and the four workers share one load
    sent = specs[0].make_client.keywords["tokenizer"]
    assert isinstance(sent, TokenizerSnapshot) and sent.belongs_to(embedded_model())
    assert (
        pickle.loads(pickle.dumps(specs[0])).make_client.keywords["tokenizer"].nbytes == sent.nbytes
    )
