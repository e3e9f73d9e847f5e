"""``--device`` and ``--dtype`` of `vf-mm eval`, `vf-mm rollout` and `vf-mm serve`: where the
local backend runs its model and in what dtype; a value this machine cannot honour is a
clear argument error (exit 2), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vf_mm.inference
from vf_mm.cli import main
from vf_mm.inference import LocalBackend

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [["eval", "shapes"], ["rollout", "shapes", "--stream", "unused.vfmm"]]
ALL = [*COMMANDS, ["serve", "--model", "m"]]


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.fixture
def recorded(monkeypatch):
    """The keyword arguments each LocalBackend the CLI builds is given."""
    calls: list[dict] = []

    class Recording(LocalBackend):
        def __init__(self, model, **kwargs):
            calls.append(kwargs)
            super().__init__(model, **kwargs)

    monkeypatch.setattr(vf_mm.inference, "LocalBackend", Recording)
    return calls


@pytest.mark.parametrize("command", ALL)
@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cpu:0", "cuda0"])
def test_a_value_that_is_no_device_is_refused(command, device, capsys):
    err = refused([*command, "--device", device], capsys)
    assert f"argument --device: '{device}' is not a device: use cpu, cuda or cuda:N" in err


@pytest.mark.parametrize("command", ALL)
def test_an_unknown_dtype_is_refused_with_the_choices(command, capsys):
    err = refused([*command, "--dtype", "float64"], capsys)
    assert "argument --dtype: invalid choice: 'float64'" in err
    assert "float32" in err and "bfloat16" in err and "float16" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ALL)
def test_cuda_where_there_is_none_is_refused(command, capsys):
    err = refused([*command, "--device", "cuda"], capsys)
    assert "argument --device: cuda: no CUDA device is available here" in err
    assert "use cpu" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_device_this_machine_lacks_is_refused(capsys):
    count = torch.cuda.device_count()
    err = refused(["eval", "shapes", "--device", f"cuda:{count}"], capsys)
    assert f"this machine has {count} CUDA device" in err


def test_device_or_dtype_with_another_backend_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    err = refused(
        ["eval", "shapes", "--backend", "vllm", "-b", "http://127.0.0.1:1", "-m", "m",
         "--dtype", "bfloat16", "-o", str(tmp_path / "run")],
        capsys,
    )  # fmt: skip
    assert "vf-mm eval: --dtype is for the local backend; --backend vllm runs the model" in err
    assert not (tmp_path / "run").exists()


def test_eval_runs_the_local_backend_on_the_device_and_dtype_given(tmp_path, recorded, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["eval", "shapes", "-n", "1", "-r", "1", "-S", '{"max_tokens": 4}',
            "--device", "cpu", "--dtype", "bfloat16", "-o", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    # on CPU the KV cache is in RAM: bounded like the image cache (--kv-cache-mb)
    assert recorded == [{"device": "cpu", "dtype": torch.bfloat16, "prefix_cache_bytes": 128 << 20}]


def test_the_caches_that_live_for_the_whole_run_take_their_bounds_from_the_flags(
    tmp_path, recorded, monkeypatch
):
    monkeypatch.chdir(ROOT)
    argv = ["eval", "shapes", "-n", "1", "-r", "1", "-S", '{"max_tokens": 4}',
            "--kv-cache-mb", "64", "-o", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    assert recorded[0]["prefix_cache_bytes"] == 64 << 20


def test_rollout_defaults_to_cpu_and_float32(tmp_path, recorded, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["rollout", "shapes", "-n", "1", "-r", "1", "-S", '{"max_tokens": 4}',
            "--stream", str(tmp_path / "s.vfmm")]  # fmt: skip
    assert main(argv) == 0
    assert recorded == [{"device": "cpu", "dtype": None, "prefix_cache_bytes": 128 << 20}]


def test_serve_loads_the_model_on_the_device_and_dtype_given(
    tiny_checkpoint, recorded, monkeypatch
):
    import uvicorn

    served: list = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    assert main(["serve", "--model", str(tiny_checkpoint), "--dtype", "float16"]) == 0
    assert recorded[0]["device"] == "cpu" and recorded[0]["dtype"] is torch.float16
    backend = served[0].state.server.backend
    assert next(backend.model.parameters()).dtype is torch.float16


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from vf_mm.testing import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("engine") / "m", "qwen2_5_vl")


def test_on_a_gpu_the_kv_flag_sizes_the_local_backends_kv_pool(tmp_path, monkeypatch, capsys):
    """On a GPU the pool engine's arena holds running requests and the prefix cache:
    --kv-cache-mb bounds it (on CPU, the prefix cache alone)."""
    from vf_mm.errors import BackendError

    calls: list[dict] = []

    class Stopped(BackendError):
        pass

    class Recording:
        def __init__(self, model, **kwargs):
            calls.append(kwargs)
            raise Stopped("recorded", backend="test")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(vf_mm.inference, "LocalBackend", Recording)
    monkeypatch.chdir(ROOT)
    argv = ["eval", "shapes", "-n", "1", "-r", "1", "--device", "cuda", "--dtype", "bfloat16",
            "--kv-cache-mb", "512", "-o", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) != 0
    assert "Stopped: recorded" in capsys.readouterr().err
    assert calls == [
        {"device": "cuda", "dtype": torch.bfloat16,
         "prefix_cache_bytes": 512 << 20, "kv_pool_bytes": 512 << 20},
    ]  # fmt: skip
