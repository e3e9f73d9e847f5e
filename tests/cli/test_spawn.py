"""``vf-mm eval|rollout --backend vllm --spawn N [--gpus-per-server K] [-- VLLM_ARGS]``.

The servers are ``tests/inference/_fake_vllm.py`` (``$VF_MM_VLLM_COMMAND``): a stand-in
for ``vllm serve`` that answers the generate route with the prompt's last tokens, so a
whole run goes through the spawned servers without vLLM.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.inference.test_spawn import alive
from vf_mm.cli import main
from vf_mm.results import read_results

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "inference" / "_fake_vllm.py"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_eval_spawns_servers_runs_through_them_and_stops_them(tmp_path, capsys, monkeypatch):
    from vf_mm.models import embedded_model

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("VF_MM_VLLM_COMMAND", shlex.join([sys.executable, str(FAKE)]))
    model = str(embedded_model())
    out = tmp_path / "run"
    code = main(
        ["eval", "shapes", "--backend", "vllm", "-m", model, "--spawn", "2",
         "--gpus-per-server", "0", "-n", "2", "-r", "2", "-c", "4", "-o", str(out),
         "-S", '{"max_tokens": 4}', "--", "--max-num-seqs", "4"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    rows = read_results(out)
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    assert re.search(r"waiting for 2 vLLM servers: 2/2 healthy", err)
    logs = Path(re.search(r"\(logs: (\S+)\)", err).group(1))
    served, pids = [], []
    for i in range(2):
        lines = (logs / f"server-{i}.log").read_text().splitlines()
        fields = [line.partition(" ")[::2] for line in lines if not line.startswith("#")]
        argv = json.loads(dict(fields)["argv"])
        assert argv[:2] == ["--model", model] and argv[-2:] == ["--max-num-seqs", "4"]
        assert "--enable-scale-out" in argv
        served.append(sum(1 for f in fields if f[0] == "generate"))
        pids += [int(v.split()[-1]) for k, v in fields if k in ("pid", "child")]
    # 4 single-turn rollouts, each a new session on the server with fewer: 2 and 2
    assert served == [2, 2]
    assert len(pids) == 4 and not any(alive(p) for p in pids)


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "shapes", "--spawn", "2"],  # the local backend
        ["eval", "shapes", "--backend", "vllm", "--spawn", "2"],  # no -m
        ["eval", "shapes", "--backend", "vllm", "-m", "x", "-b", "http://h:1", "--spawn", "1"],
        ["eval", "shapes", "--backend", "vllm", "-b", "http://h:1", "--", "--max-num-seqs", "4"],
        ["view", "outputs/x", "--", "--max-num-seqs", "4"],
    ],
)
def test_spawn_arguments_that_do_not_go_together_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "--" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--spawn", "2", "--dtype", "bfloat16"], "--dtype is for the local backend"),
        (["--spawn", "2", "--device", "cpu"], "--device is for the local backend"),
        (["--spawn", "2", "--", "--port", "9000"], "--port is set for each spawned server"),
        (["--spawn", "2", "--", "--host=0.0.0.0", "--model", "y"], "--host, --model are set"),
        (["--spawn", "0"], "N >= 1"),
        (["-b", "http://h:1", "--gpus-per-server", "2"], "--gpus-per-server is for --spawn"),
    ],
)
def test_a_spawn_flag_that_would_change_nothing_is_refused_before_anything_starts(
    extra, message, capsys, monkeypatch
):
    """A user's flag is never dropped without a word: the local backend's --dtype beside
    --spawn, a reserved server flag after --, --gpus-per-server without --spawn."""
    monkeypatch.setenv("VF_MM_VLLM_COMMAND", "false")  # anything started would fail loudly
    with pytest.raises(SystemExit) as info:
        main(["eval", "shapes", "--backend", "vllm", "-m", "x", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
