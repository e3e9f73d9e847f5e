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
