"""`vf-mm export OUTDIR --to parquet|hf DIR`: a run directory as a Hugging Face dataset that
reads back exactly; exit 0 done, 1 refused (in red, saying why, nothing written), 2 bad
arguments."""

from __future__ import annotations

import re
from pathlib import Path

import datasets
import pytest

from tests.results.test_dataset import assert_round_trips, make_run
from vf_mm.cli import main
from vf_mm.results import RESULTS_FILE, ResultsWriter, read_results

ROOT = Path(__file__).resolve().parents[2]


def plain(text: str) -> str:
    """Printed text without colour codes or the terminal's line wrapping."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())


@pytest.fixture
def colour(monkeypatch):
    """A colour terminal for what the command prints (rich reads FORCE_COLOR)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)


def load(folder: Path, form: str, cache: Path) -> datasets.Dataset:
    if form == "parquet":
        assert sorted(p.name for p in folder.iterdir()) == ["results.parquet"]
        return datasets.Dataset.from_parquet(str(folder / "results.parquet"), cache_dir=str(cache))
    return datasets.load_from_disk(str(folder))


def siblings(folder: Path) -> list[str]:
    """Hidden leftovers of an export beside ``folder`` (there must be none)."""
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


def test_a_real_eval_exports_to_both_formats_and_reads_back_exactly(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    assert (
        main(["eval", "shapes", "-n", "2", "-r", "2", "-o", str(run), "-S", '{"max_tokens": 8}'])
        == 0
    )
    capsys.readouterr()
    rows = read_results(run)
    assert len(rows) == 4
    for form in ("parquet", "hf"):
        out = tmp_path / form
        assert main(["export", str(run), "--to", form, str(out)]) == 0
        printed = plain(capsys.readouterr().out)
        assert f"exported 4 rollouts (4 images, 0 videos) from {run} to {out}" in printed
        dataset = load(out, form, tmp_path / "cache")
        assert_round_trips(dataset, run)
        assert all(len(r["images"]) == 1 for r in dataset)
        assert siblings(out) == []
    # the embedded model's token counts are there; token ids are not stored in a run
    assert all(r["prompt_tokens"] for r in load(tmp_path / "hf", "hf", tmp_path / "cache"))
    assert main(["export", str(run), "--to", "hf", str(tmp_path / "tokens"), "--tokens"]) == 1
    printed = plain(capsys.readouterr().out)
    assert "holds no token ids, logprobs or masks" in printed and "prompt_tokens" in printed
    assert not (tmp_path / "tokens").exists()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run with images, clips, tool calls, extra keys, a failed and a retried rollout."""
    return make_run(tmp_path_factory.mktemp("export") / "run")


@pytest.mark.parametrize("form", ["parquet", "hf"])
def test_failed_rollouts_and_clips_are_exported(run, tmp_path, capsys, form):
    out = tmp_path / "out"
    assert main(["export", str(run), "--to", form, str(out)]) == 0
    assert "exported 6 rollouts (" in plain(capsys.readouterr().out)
    dataset = load(out, form, tmp_path / "cache")
    assert_round_trips(dataset, run)
    assert sum(r["error"] is not None for r in dataset) == 1


def test_a_directory_that_is_not_a_run_is_refused_in_red(tmp_path, capsys, colour):
    (tmp_path / "notarun").mkdir()
    (tmp_path / "notarun" / "notes.txt").write_text("hello")
    for outdir, why in [
        (tmp_path / "missing", "it does not exist"),
        (tmp_path / "notarun", "it has no results.jsonl"),
    ]:
        assert main(["export", str(outdir), "--to", "parquet", str(tmp_path / "out")]) == 1
        printed = capsys.readouterr().out
        assert printed.startswith("\x1b[31m")  # red
        assert plain(printed) == f"vf-mm export: {outdir} is not a run directory: {why}" + (
            " (vf-mm eval -o OUTDIR writes one)" if "results" in why else ""
        )
        assert not (tmp_path / "out").exists() and siblings(tmp_path / "out") == []


def test_a_run_with_no_rollouts_yet_is_refused(tmp_path, capsys):
    ResultsWriter(tmp_path / "run", metadata={"config": {}}).close()
    assert main(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "out")]) == 1
    assert "holds no rollouts yet" in plain(capsys.readouterr().out)
    assert not (tmp_path / "out").exists()


def test_a_dir_that_is_not_empty_needs_overwrite_and_must_be_an_export(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is fine
    assert main(["export", str(run), "--to", "parquet", str(out)]) == 0
    first = (out / "results.parquet").read_bytes()
    capsys.readouterr()
    # again: refused without --overwrite, nothing touched
    assert main(["export", str(run), "--to", "parquet", str(out)]) == 1
    printed = plain(capsys.readouterr().out)
    assert "exists and is not empty" in printed and "pass --overwrite" in printed
    assert (out / "results.parquet").read_bytes() == first
    # --overwrite replaces a previous export of the same form
    assert main(["export", str(run), "--to", "parquet", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.parquet"] and siblings(out) == []
    capsys.readouterr()
    # ... but never a folder holding anything else, nor an export of the other form
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    for folder, form in [(mine, "hf"), (out, "hf")]:
        assert main(["export", str(run), "--to", form, str(folder), "--overwrite"]) == 1
        assert "replaces a previous export only" in plain(capsys.readouterr().out)
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in out.iterdir()) == ["results.parquet"]
    # OUTDIR itself is not empty either
    assert main(["export", str(run), "--to", "hf", str(run), "--overwrite"]) == 1
    assert read_results(run)


def test_hf_overwrite_replaces_a_previous_save(run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run), "--to", "hf", str(out)]) == 0
    assert main(["export", str(run), "--to", "hf", str(out), "--overwrite"]) == 0
    assert_round_trips(datasets.load_from_disk(str(out)), run)
    assert siblings(out) == []


def test_a_missing_asset_is_refused_unless_skipped(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    url = read_results(run)[0]["prompt"][1]["content"][0]["image_url"]["url"]
    (run / url).unlink()
    out = tmp_path / "out"
    assert main(["export", str(run), "--to", "hf", str(out)]) == 1
    printed = plain(capsys.readouterr().out)
    assert f"{url}, referred to by example 0 rollout 0" in printed and "is missing" in printed
    assert "--skip-bad-assets" in printed and not out.exists()
    assert main(["export", str(run), "--to", "hf", str(out), "--skip-bad-assets"]) == 0
    exported = datasets.load_from_disk(str(out))
    record = exported[0]
    assert record["image_urls"][0] == url and record["images"][0] is None
    shown = sum(len(urls) for urls in exported["image_urls"])
    lost = sum(image is None for images in exported["images"] for image in images)
    assert lost >= 1
    # the count printed is of the images exported, not of the references
    assert f"({shown - lost} images, " in plain(capsys.readouterr().out)


def test_bad_lines_follow_the_reader(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    lines = (run / RESULTS_FILE).read_bytes().splitlines(keepends=True)
    (run / RESULTS_FILE).write_bytes(b"".join([lines[0], b"garbage\n", *lines[1:]]))
    assert main(["export", str(run), "--to", "hf", str(tmp_path / "a")]) == 1
    assert "line 2 is corrupt" in plain(capsys.readouterr().out)
    assert main(["export", str(run), "--to", "hf", str(tmp_path / "b"), "--bad-lines", "skip"]) == 0
    assert datasets.load_from_disk(str(tmp_path / "b")).num_rows == 6


@pytest.mark.parametrize(
    "argv",
    [
        ["export"],
        ["export", "run"],
        ["export", "run", "--to", "parquet"],
        ["export", "run", "--to", "csv", "out"],
        ["export", "run", "--to", "hf", "out", "--bad-lines", "ignore"],
        ["export", "run", "--to", "hf", "out", "--nope"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_is_listed_in_the_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "export" in capsys.readouterr().out


@pytest.mark.parametrize("fails", [False, True])
def test_the_arrow_cache_is_beside_dir_and_removed_after(run, tmp_path, monkeypatch, fails):
    """The rows go to Arrow files in a hidden folder beside DIR (DIR's disk, not /tmp),
    which is gone once the command ends, whether it exported or refused."""
    import vf_mm.results

    real, seen = vf_mm.results.to_dataset, []

    def spying(outdir, **options):
        seen.append(Path(options["cache_dir"]))
        dataset = real(outdir, **options)
        assert any(seen[-1].iterdir())  # the export's files are there while it runs
        if fails:
            raise OSError(28, "No space left on device")
        return dataset

    monkeypatch.setattr(vf_mm.results, "to_dataset", spying)
    out = tmp_path / "deeper" / "out"  # its folder does not exist yet
    assert main(["export", str(run), "--to", "parquet", str(out)]) == (1 if fails else 0)
    (cache,) = seen
    assert cache.parent == tmp_path and cache.name.startswith(".out.tmp-cache-")
    assert not cache.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert out.exists() != fails
