"""API keys on the command line: `-k` for the servers a run talks to, `--api-key` for
`vf-mm serve`; keys that do not fit are refused (exit 2) before anything starts."""

from __future__ import annotations

import pytest

from vf_mm.cli import main


def test_eval_refuses_a_key_count_that_fits_neither_rule(tmp_path, capsys):
    argv = ["eval", "shapes", "--backend", "vllm", "-m", str(tmp_path), "-b", "http://127.0.0.1:1",
            "-b", "http://127.0.0.1:2", "-b", "http://127.0.0.1:3", "-k", "a", "-k", "b",
            "-o", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "2 -k for 3 -b: give one key, or one per -b" in capsys.readouterr().err


def test_serve_refuses_an_empty_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VF_MM_API_KEY", raising=False)
    assert main(["serve", "--model", str(tmp_path), "--api-key", ""]) == 2
    assert "must not be empty" in capsys.readouterr().err


def test_serve_refuses_a_limit_that_is_no_limit(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path), "--max-images", "0"]) == 2
    assert "max_images must be an int >= 1" in capsys.readouterr().err


def test_keys_writes_a_pair_and_never_overwrites(tmp_path, capsys):
    assert main(["keys", "trainer", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trainer.key" in out and "trainer.key_secret" in out
    assert (tmp_path / "trainer.key").exists() and (tmp_path / "trainer.key_secret").exists()
    assert main(["keys", "trainer", "--dir", str(tmp_path)]) == 1  # refused: it exists
    err = capsys.readouterr().err
    assert "exists already" in err and "Error" not in err  # the reason, not a type name


def test_rollout_refuses_plain_tcp_off_loopback_and_half_a_key_pair(tmp_path, capsys):
    argv = ["rollout", "shapes", "-n", "1", "-r", "1", "--stream", "tcp://192.0.2.1:5555"]
    assert main(argv) == 1
    assert "--insecure" in capsys.readouterr().err
    assert main([*argv, "--secret-key", str(tmp_path / "w.key_secret")]) == 2
    assert "--secret-key and --trainer-key go together" in capsys.readouterr().out
