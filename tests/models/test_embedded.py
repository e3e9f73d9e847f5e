"""cached_tiny_vlm: each family's tiny checkpoint, built once into the cache."""

from __future__ import annotations

import pytest

from vf_mm.errors import UnsupportedModelError
from vf_mm.models import cached_tiny_vlm, embedded_model, model_type


def test_a_familys_tiny_checkpoint_is_built_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("VF_MM_CACHE", str(tmp_path))
    path = cached_tiny_vlm("gemma3")
    assert path.parent == tmp_path and model_type(path) == "gemma3"
    built = (path / "config.json").stat().st_mtime_ns
    monkeypatch.setattr("vf_mm.models._embedded.build_tiny_vlm", pytest.fail)  # no rebuild
    assert cached_tiny_vlm("gemma3") == path
    assert (path / "config.json").stat().st_mtime_ns == built


def test_the_embedded_model_is_the_cached_qwen2_5_vl(tmp_path, monkeypatch):
    monkeypatch.setenv("VF_MM_CACHE", str(tmp_path))
    assert embedded_model() == cached_tiny_vlm("qwen2_5_vl") == cached_tiny_vlm()


def test_an_unknown_family_is_refused_naming_the_nearest_and_nothing_is_built(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("VF_MM_CACHE", str(tmp_path))
    with pytest.raises(
        UnsupportedModelError, match=r"'gema3' .* \(did you mean 'gemma3'\? supported: "
    ):
        cached_tiny_vlm("gema3")
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_family_for_a_tiny_checkpoint_gets_a_suggestion(tmp_path):
    from vf_mm.testing import build_tiny_vlm

    with pytest.raises(UnsupportedModelError, match="did you mean 'gemma4'"):
        build_tiny_vlm(tmp_path / "m", "gemma_4")  # type: ignore[arg-type]
    assert not (tmp_path / "m").exists()


def test_a_build_another_process_holds_the_lock_for_is_waited_for_and_reused(tmp_path, monkeypatch):
    """Concurrent first uses (two test workers, two runs) build once: while another
    process holds ``<name>.lock`` (it is building), build_once waits, then uses that
    process's build instead of building its own."""
    import threading

    from filelock import FileLock

    from vf_mm.models._cache import build_once

    monkeypatch.setenv("VF_MM_CACHE", str(tmp_path))
    built: list[object] = []
    found: list[object] = []
    other = FileLock(tmp_path / "thing.lock")
    other.acquire()  # the other process, building
    waiter = threading.Thread(
        target=lambda: found.append(build_once("thing", built.append, marker="done"))
    )
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not built, "build_once did not wait for the lock"
    (tmp_path / "thing").mkdir()  # the other process's build lands, then it lets go
    (tmp_path / "thing" / "done").write_text("")
    other.release()
    waiter.join(30)
    assert found == [tmp_path / "thing"] and built == []


def test_the_tiny_vocabulary_is_trained_once_a_process_and_each_build_gets_its_own_copy(
    monkeypatch,
):
    """Dozens of tiny checkpoints in a test run share one BPE training (per size and
    split); a caller that changes its vocabulary changes no other caller's."""
    from vf_mm.models import _vocab

    corpora: list[int] = []
    corpus = _vocab._corpus
    monkeypatch.setattr(_vocab, "_corpus", lambda: corpora.append(1) or corpus())
    first, _ = _vocab._train_bpe(301)  # a size no other test trains
    first["mine"] = -1
    second, merges = _vocab._train_bpe(301)
    assert corpora == [1] and "mine" not in second and merges
    assert _vocab.tiny_tokenizer(301).get_vocab() == _vocab.tiny_tokenizer(301).get_vocab()
