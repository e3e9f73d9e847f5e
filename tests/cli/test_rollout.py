"""`vf-mm rollout`: the train split's scored groups, streamed to a file or a trainer over tcp://."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from vf_mm.cli import main
from vf_mm.errors import StreamEndedEarlyError
from vf_mm.training import GroupReceiver, group_advantages, read_groups, unpack_group

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = '{"max_tokens": 8}'


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(ROOT)  # environments/<id> resolves from here


def count_key(obj, key):
    if isinstance(obj, dict):
        return sum((k == key) + count_key(v, key) for k, v in obj.items())
    if isinstance(obj, list):
        return sum(count_key(v, key) for v in obj)
    return 0


def check_groups(groups):
    assert sorted(g["example_id"] for g in groups) == [0, 1, 2]
    for g in groups:
        assert g["format"] == "vf_mm.group/1"
        assert g["advantage_method"] == "grpo"  # filled by default: the trainer can use them
        assert [r["advantage"] for r in g["rollouts"]] == group_advantages(
            [r["reward"] for r in g["rollouts"]]
        )
        assert [r["rollout_index"] for r in g["rollouts"]] == [0, 1]
        (h,) = g["images"]  # one picture per example: its tensors once per group
        assert count_key(g, "pixel_values") == 1
        assert g["images"][h]["pixel_values"].ndim == 2
        for r in g["rollouts"]:
            assert r["error"] is None and r["reward"] is not None
            (step,) = r["steps"]
            assert isinstance(step["prompt_ids"], np.ndarray) and len(step["prompt_ids"]) > 0
            assert len(step["completion_ids"]) == len(step["completion_logprobs"]) > 0
            assert step["mm"]["image"]["hashes"] == [h]
            refs = [p for m in r["prompt"] if isinstance(m["content"], list)
                    for p in m["content"] if p.get("type") == "image_ref"]  # fmt: skip
            assert refs == [{"type": "image_ref", "hash": h}]
        a, b = unpack_group(g)
        items = [x.trajectory[0].tokens.multi_modal_data.mm_items["image"][0] for x in (a, b)]
        assert items[0] is items[1]  # the two rollouts share the group's one image


def test_rollout_to_a_stream_file(tmp_path, capsys):
    path = tmp_path / "groups.vfs"
    assert main(["rollout", "shapes", "-n", "3", "-r", "2", "--stream", str(path), "-S", SAMPLING]) == 0  # fmt: skip
    groups = list(read_groups(path))
    assert len(groups) == 3
    check_groups(groups)
    out = capsys.readouterr().out
    assert "groups sent" in out and "3 / 3" in out


def test_rollout_to_a_trainer_over_tcp(capsys):
    with GroupReceiver("tcp://127.0.0.1:*", timeout_s=120) as receiver:
        groups = []
        reader = threading.Thread(target=lambda: groups.extend(receiver), daemon=True)
        reader.start()
        args = ["rollout", "shapes", "-n", "3", "-r", "2", "--stream", receiver.endpoint]
        assert main([*args, "-S", SAMPLING, "--hwm", "1"]) == 0
        reader.join(30)
        assert not reader.is_alive()
    check_groups(groups)
    assert receiver.ends == [{"sent": 3, "error": None}]
    assert "trainer took all" in capsys.readouterr().out


def test_a_trainer_that_is_not_there_is_a_failed_run_not_a_success(capsys):
    """Groups sent to an endpoint no trainer listens on are queued, never delivered: the
    run says so and exits 1, so a script never takes it for a success."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["rollout", "shapes", "-n", "2", "-r", "1", "--stream", f"tcp://127.0.0.1:{port}"]
    assert main([*args, "-S", SAMPLING, "--send-timeout", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "did not take every group" in out


def test_failed_rollouts_are_sent_with_their_error(tmp_path):
    path = tmp_path / "groups.vfs"
    too_long = '{"max_tokens": 1000000}'  # over the tiny model's context: every rollout fails
    assert main(["rollout", "shapes", "-n", "2", "-r", "2", "--stream", str(path), "-S", too_long]) == 0  # fmt: skip
    groups = list(read_groups(path))
    assert len(groups) == 2
    for g in groups:
        assert len(g["rollouts"]) == 2
        assert all(r["error"]["type"] == "PromptTooLongError" for r in g["rollouts"])
        assert all(r["error"]["where"] == "turn 1: model" for r in g["rollouts"])
        assert [r["advantage"] for r in g["rollouts"]] == [None, None]  # never NaN


def test_advantages_none_leaves_them_to_the_trainer(tmp_path, capsys):
    path = tmp_path / "groups.vfs"
    args = ["rollout", "shapes", "-n", "1", "-r", "2", "--stream", str(path), "-S", SAMPLING]
    assert main([*args, "--advantages", "none"]) == 0
    (group,) = read_groups(path)
    assert "advantage_method" not in group
    assert all("advantage" not in r for r in group["rollouts"])
    assert "advantages" in capsys.readouterr().out


def test_an_unsupported_stream_target_is_a_clear_error(capsys):
    assert main(["rollout", "shapes", "-n", "1", "--stream", "udp://127.0.0.1:9"]) == 1
    assert "TransportError" in capsys.readouterr().err


@pytest.fixture
def picky_packer(monkeypatch):
    """Fault injection: packing any group whose rollouts have steps fails."""
    from vf_mm.training import pack_group as real

    def picky(outputs, **kwargs):
        if any(o.trajectory for o in outputs):
            raise ValueError("cannot pack this")
        return real(outputs, **kwargs)

    monkeypatch.setattr("vf_mm.training._streaming.pack_group", picky)


def test_a_group_that_cannot_be_packed_is_sent_stripped_with_the_reason(tmp_path, picky_packer):
    path = tmp_path / "groups.vfs"
    assert main(["rollout", "shapes", "-n", "1", "-r", "2", "--stream", str(path), "-S", SAMPLING]) == 0  # fmt: skip
    (g,) = read_groups(path)
    assert [r["rollout_index"] for r in g["rollouts"]] == [0, 1]
    for r in g["rollouts"]:
        assert r["steps"] == [] and r["error"]["type"] == "ValueError"
        assert r["error"]["message"] == "cannot pack this"
        assert r["error"]["where"].startswith("packing the group, at test_rollout.py:")
        assert r["reward"] is not None  # the scores are kept


def test_a_stripped_group_keeps_an_error_the_environment_set_as_text(tmp_path, picky_packer):
    env_dir = tmp_path / "selfreport"
    env_dir.mkdir()
    (env_dir / "selfreport.py").write_text(
        "import vf_mm as vf\n"
        "class E(vf.SingleTurnEnv):\n"
        "    def finish_state(self, state):\n"
        "        state['error'] = 'the board broke'\n"
        "def load_environment(**kw):\n"
        "    return E(dataset=[{'question': 'q'}], **kw)\n"
    )
    path = tmp_path / "groups.vfs"
    assert main(["rollout", str(env_dir), "-n", "1", "-r", "2", "--stream", str(path), "-S", SAMPLING]) == 0  # fmt: skip
    (g,) = read_groups(path)
    for r in g["rollouts"]:
        assert (r["error"]["type"], r["error"]["message"]) == ("Error", "the board broke")
        assert "packing the group" in r["error"]["where"]


def test_rollout_with_encoded_images_rebuilds_on_the_trainer(tmp_path, capsys):
    from vf_mm.models import embedded_model
    from vf_mm.training import ImageProcessing, ImageRebuilder

    path = tmp_path / "groups.vfs"
    args = ["rollout", "shapes", "-n", "2", "-r", "2", "--stream", str(path), "-S", SAMPLING]
    assert main([*args, "--images", "encoded"]) == 0
    groups = list(read_groups(path))
    assert [g["image_mode"] for g in groups] == ["encoded", "encoded"]
    assert count_key(groups, "pixel_values") == 0  # bytes, not tensors
    trainer = ImageProcessing.from_checkpoint(embedded_model(), image_backend="auto")
    with ImageRebuilder(trainer) as rebuilder:
        for g in groups:
            a, _ = unpack_group(g, images=rebuilder)
            item = a.trajectory[0].tokens.multi_modal_data.mm_items["image"][0]
            assert item["pixel_values"].ndim == 2
        assert rebuilder.rebuilt == 2
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "encoded x1" in out


def test_rollout_with_image_references_into_a_shared_store(tmp_path, capsys):
    path, store = tmp_path / "groups.vfs", tmp_path / "store"
    args = ["rollout", "shapes", "-n", "1", "-r", "2", "--stream", str(path), "-S", SAMPLING]
    assert main([*args, "--images", "ref", "--image-store", str(store)]) == 0
    (group,) = read_groups(path)
    (entry,) = group["sources"].values()
    assert entry["uri"].startswith("file://" + str(store.resolve()))
    assert main(["inspect", str(path)]) == 0
    assert "ref x1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags",
    [["--images", "ref"], ["--image-store", "x"], ["--images", "encoded", "--image-store", "x"]],
)
def test_image_mode_flags_that_do_not_go_together_exit_2(tmp_path, flags, capsys):
    path = tmp_path / "groups.vfs"
    assert main(["rollout", "shapes", "-n", "1", "--stream", str(path), *flags]) == 2
    assert "--image-store" in capsys.readouterr().out


def test_rollout_with_image_references_into_a_network_store(tmp_path, monkeypatch):
    """``--image-store URL``: an fsspec store (``s3://`` in production), read back by a
    trainer that allow-lists it. Here fsspec's ``memory`` filesystem stands in for an
    object store under another protocol name (the CLI refuses ``memory://`` itself: it
    lives in one process)."""
    import uuid

    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from vf_mm.models import embedded_model
    from vf_mm.training import ImageProcessing, ImageRebuilder

    class Bucket(MemoryFileSystem):
        protocol = "bucket"

        @classmethod
        def _strip_protocol(cls, path):
            return MemoryFileSystem._strip_protocol(path.replace("bucket://", "memory://", 1))

    fsspec.register_implementation("bucket", Bucket, clobber=True)
    url = f"bucket://vfmm-cli-{uuid.uuid4().hex[:8]}/images"
    path = tmp_path / "groups.vfs"
    args = ["rollout", "shapes", "-n", "1", "-r", "2", "--stream", str(path), "-S", SAMPLING]
    assert main([*args, "--images", "ref", "--image-store", url]) == 0
    (group,) = read_groups(path)
    (entry,) = group["sources"].values()
    assert entry["uri"] == f"{url}/{entry['sha256'][:2]}/{entry['sha256']}"
    trainer = ImageProcessing.from_checkpoint(embedded_model(), image_backend="auto")
    with ImageRebuilder(trainer, stores=[url]) as rebuilder:
        assert all(r.error is None for r in unpack_group(group, images=rebuilder))


@pytest.mark.parametrize(
    "store",
    [
        "https://example.com/images",
        "nosuchprotocol://b/images",
        "memory://x/images",
        "s3:/bucket/images",  # a typo: not a directory named "s3:"
        "s3://",  # a bucket's root is no store of its own
        "/proc/no/such/images",  # a directory that cannot be made
        "",  # an unset shell variable: not the current directory
    ],
)
def test_an_image_store_that_cannot_be_one_exits_2(tmp_path, store, capsys):
    path = tmp_path / "groups.vfs"
    code = main(["rollout", "shapes", "-n", "1", "--stream", str(path), "--images", "ref",
                 "--image-store", store])  # fmt: skip
    assert code == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "--image-store" in out
    reasons = ("cannot be https", "fsspec cannot open", "this process only", "without '//'",
               "names a path under its root", "No such file", "not an empty string")  # fmt: skip
    assert any(why in out for why in reasons), out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-S", '{"max_tokns": 8}'], "-S/--sampling-args: unknown sampling arg 'max_tokns' "
         "(did you mean 'max_tokens'?)"),
        (["-S", '{"temperature": -1}'], "temperature: temperature must be >= 0, got -1"),
        (["-n", "0"], "-n/--num-examples must be a number of rows >= 1, or -1 for all of them"),
        (["-r", "0"], "-r/--rollouts-per-example must be >= 1, not 0"),
        (["-c", "-2"], "-c/--max-concurrent must be >= 1, not -2"),
        (["--hwm", "0"], "--hwm must be >= 1, not 0"),
        (["--send-timeout", "0"], "--send-timeout must be a number of seconds > 0, not 0.0"),
        (["--workers", "0"], "--workers must be >= 1, not 0"),
        (["-a", '{"difficuly": "easy"}'], "-a/--env-args: shapes: load_environment takes no "
         "argument 'difficuly' (did you mean 'difficulty'?)"),
    ],
)  # fmt: skip
def test_a_bad_argument_exits_2_in_one_line_before_anything_is_written(
    tmp_path, capsys, args, said
):
    path = tmp_path / "groups.vfs"
    with pytest.raises(SystemExit) as exit_info:
        main(["rollout", "shapes", "--stream", str(path), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("vf-mm rollout: ") and err.count("\n") == 1 and said in err, err
    assert not path.exists()


def test_ctrl_c_keeps_the_stream_whole_says_so_in_one_line_and_a_rerun_sends_the_same(tmp_path):
    """A real SIGINT once the first group is written (the others wait on a gate): one
    line, exit 130, and a stream that holds the whole first group. The same command
    sends the same groups again, under the same ids (a trainer with a ledger takes each
    once)."""
    import json

    from tests._interrupt import gated_environment, interrupt_at

    module, gate = gated_environment(tmp_path)
    path = tmp_path / "groups.vfs"
    args = ["rollout", str(module), "-n", "3", "-r", "2", "-c", "1", "-a",
            json.dumps({"gate": str(gate)}), "-S", SAMPLING]  # fmt: skip
    done = interrupt_at([*args, "--stream", str(path)], gate.with_suffix(".reached"))
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    line = (f"vf-mm rollout: interrupted: 1/3 groups written to {path}, each whole; the same "
            "command writes the file anew, every group under the same group id")  # fmt: skip
    assert line in done.stderr.splitlines()
    read = []
    with pytest.raises(StreamEndedEarlyError, match=r"after 1 groups \(interrupted\)"):
        read.extend(read_groups(path))  # no torn frame: the end marker says why it ended
    (first,) = read
    gate.touch()
    again = tmp_path / "again.vfs"
    assert main([*args, "--stream", str(again)]) == 0
    groups = {g["group_id"]: g for g in read_groups(again)}
    assert len(groups) == 3
    same = groups[first["group_id"]]
    for a, b in zip(first["rollouts"], same["rollouts"], strict=True):
        assert [list(s["completion_ids"]) for s in a["steps"]] == [
            list(s["completion_ids"]) for s in b["steps"]
        ]


def test_an_interrupted_rollout_to_a_trainer_says_what_the_same_command_does(monkeypatch, capsys):
    """To an endpoint, the line says the groups sent and that the same command sends them
    again under the same ids (Ctrl-C stood in for by the interrupt it becomes)."""
    import vf_mm.training
    from vf_mm.training import RolloutProgress

    async def interrupted(env, client, sender, *, on_progress, **options):
        on_progress(RolloutProgress(total_groups=3, groups=2))
        raise KeyboardInterrupt

    monkeypatch.setattr(vf_mm.training, "stream_rollouts", interrupted)
    args = ["rollout", "shapes", "-n", "3", "--stream", "tcp://127.0.0.1:9"]
    try:
        code = main([*args, "--send-timeout", "0.5"])
    except KeyboardInterrupt:  # a failure of this test, not the end of the test run
        pytest.fail("the interrupt escaped vf-mm's main")
    assert code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "vf-mm rollout: interrupted: 2/3 groups sent to tcp://127.0.0.1:9; the same command "
        "sends every group again, under the same group ids (a trainer with a ledger takes "
        "each once)"
    )


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_help_describes_the_command_and_says_each_default_once(command, capsys, monkeypatch):
    """The run options are shared: rollout's help named the openai backend, results that
    land here and vf-mm merge, none of which it has; and a default in the text was said
    twice, or said as None."""
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    options = [line for line in out.splitlines() if line.startswith("  -")]
    assert len(options) > 20
    for line in options:
        assert line.count("default") <= 1 and "(default: None)" not in line, line
        assert "(default: False)" not in line and "(default: [])" not in line, line
    if command == "rollout":
        assert not [line for line in options if "openai" in line or "merge" in line]
        assert not [line for line in options if "results" in line]
        text = " ".join(out.split())
        assert "every group is still packed and sent from here, once" in text
        assert "their group ids (RUN_ID/EXAMPLE_ID) never collide" in text
        assert "130 interrupted" in text and "There is no resume" in text


FAULTY = """
import vf_mm as vf


class Faulty(vf.MultiTurnEnv):
    async def env_response(self, messages, state):
        if state["row"]["fault"]:
            raise RuntimeError("env code blew up")
        return [{"role": "user", "content": "go on"}]


def load_environment(**kwargs):
    rows = [{"question": "q", "answer": "a", "fault": i == 1} for i in range(4)]
    return Faulty(dataset=rows, eval_dataset=rows, max_turns=2, rubric=vf.Rubric([lambda: 1.0]))
"""


def test_max_errors_is_one_option_of_eval_and_rollout():
    from vf_mm.cli._main import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    helps = {
        name: next(a.help for a in commands[name]._actions if "--max-errors" in a.option_strings)
        for name in ("eval", "rollout")
    }
    assert helps["eval"] == helps["rollout"] and "exit status 3" in helps["rollout"]


def test_rollout_max_errors_stops_with_exit_3_and_the_stream_file_says_why(
    tmp_path, monkeypatch, capsys
):
    """The stream file ends with an end marker naming the stop; its reader raises it after
    the last group sent, so a trainer cannot take a stopped run's file for a whole one."""
    env_dir = tmp_path / "environments" / "faulty"
    env_dir.mkdir(parents=True)
    (env_dir / "faulty.py").write_text(FAULTY)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "groups.vfs"
    code = main(["rollout", "faulty", "-n", "-1", "-r", "1", "-c", "1", "--max-errors", "1",
                 "--stream", str(path), "-S", SAMPLING])  # fmt: skip
    assert code == 3
    assert "stopped after 1 failed rollouts (--max-errors 1)" in capsys.readouterr().out
    got = []
    with pytest.raises(StreamEndedEarlyError) as info:
        for group in read_groups(path):
            got.append(group["example_id"])
    assert got == [0, 1] and info.value.sent == 2
    assert "--max-errors 1" in info.value.reason
