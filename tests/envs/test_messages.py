"""Messages are checked where they enter a rollout: reasonable forms normalised, the rest
refused with the method, the field and a hint; inputs never mutated."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vf_mm.envs._messages import check_messages
from vf_mm.errors import EnvError, MessageError

WHERE = "env.env_response returned (turn 2)"


def check(value):
    return check_messages(value, where=WHERE)


def test_a_list_of_messages_passes_through_as_new_dicts():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    out = check(messages)
    assert out == messages and out[0] is not messages[0]


def test_a_single_message_becomes_a_list():
    assert check({"role": "user", "content": "hi"}) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "image", [Image.new("RGB", (4, 4)), np.zeros((4, 4, 3), np.uint8), b"\x89PNG..."]
)
def test_bare_image_content_becomes_one_image_part(image):
    original = {"role": "user", "content": image}
    (out,) = check(original)
    assert out["content"] == [{"type": "image", "image": image}]
    assert original["content"] is image  # not mutated


def test_bare_strings_and_images_inside_a_content_list_become_parts():
    image = Image.new("RGB", (4, 4))
    (out,) = check([{"role": "tool", "tool_call_id": "c", "content": ["look", image]}])
    assert out["content"] == [{"type": "text", "text": "look"}, {"type": "image", "image": image}]


def test_a_single_part_as_content_becomes_a_list():
    (out,) = check({"role": "user", "content": {"type": "text", "text": "x"}})
    assert out["content"] == [{"type": "text", "text": "x"}]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (None, r"None, not a list of messages \(return \[\] for no new messages\)"),
        ("hello", "a str, not a list of messages"),
        (["hello"], "message 0: a str, not a message dict"),
        ([{"content": "x"}], r"message 0: no 'role' \(give it one of"),
        ([{"role": "usr", "content": "x"}], r"'usr' is not a role \(did you mean 'user'\?\)"),
        ([{"role": "user"}], "field 'content': missing or None in a user message"),
        ([{"role": "user", "content": 5}], "field 'content': a int, not text or content parts"),
        (
            [{"role": "user", "content": [{"type": "img", "image": 1}]}],
            r"content part 0, field 'type': 'img' is not a content part type \(did you mean 'image'\?\)",
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            "a text part needs a str, not NoneType",
        ),
        ([{"role": "user", "content": [{"type": "image"}]}], "an image part without an image"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "field 'image_url': needs a URL",
        ),
        ([{"role": "user", "content": [5]}], "content part 0: a int, not a content part"),
        (
            [{"role": "assistant", "content": "", "tool_calls": "f()"}],
            "'tool_calls': must be a list",
        ),
    ],
)
def test_what_is_refused_and_how_it_is_named(value, match):
    with pytest.raises(MessageError, match=match) as info:
        check(value)
    assert str(info.value).startswith(WHERE)
    assert isinstance(info.value, EnvError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "prompt",
    [
        "What is 2+2?",
        {"role": "user", "content": "What is 2+2?"},
        [{"role": "user", "content": "What is 2+2?"}],
    ],
)
def test_a_prompt_column_as_text_one_message_or_a_list_all_format(prompt):
    import vf_mm as vf

    env = vf.SingleTurnEnv(dataset=[{"prompt": prompt, "answer": "4"}])
    assert env.format_prompt(env.get_eval_dataset()[0]) == [
        {"role": "user", "content": "What is 2+2?"}
    ]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("imgae", "picture"),
        ("Image", "picture"),
        ("imgs", ["picture", "picture"]),
        ("img", "array"),
        ("imge", "path"),
        ("vidoe", "bytes"),
    ],
)
def test_an_image_under_a_misspelt_image_column_is_refused_naming_it(column, value, tmp_path):
    """It was silently dropped: the model was asked about an image it never saw."""
    import vf_mm as vf

    image = Image.new("RGB", (8, 8), "red")
    made = {"picture": image, "array": np.zeros((8, 8, 3), np.uint8),
            "path": str(tmp_path / "a.png"), "bytes": b"\x89PNG\r\n\x1a\n"}  # fmt: skip
    value = [made[v] for v in value] if isinstance(value, list) else made[value]
    env = vf.SingleTurnEnv(dataset=[{"question": "q", column: value}], env_id="quiz")
    with pytest.raises(
        MessageError, match=rf"quiz: the row's column '{column}' holds an image"
    ) as info:
        env.format_prompt(env.get_eval_dataset()[0])
    assert "did you mean" in str(info.value) and info.value.where == f"the {column!r} column"


def test_columns_of_the_authors_own_are_kept_out_of_the_prompt_without_error():
    import vf_mm as vf

    row = {"question": "q", "page": Image.new("RGB", (8, 8)), "id": 3, "source": "a.png",
           "task": "t", "info": {"k": 1}, "answer": "x"}  # fmt: skip
    env = vf.SingleTurnEnv(dataset=[row])
    assert env.format_prompt(row) == [{"role": "user", "content": "q"}]


def test_a_row_with_a_prompt_and_a_different_question_is_refused_as_ambiguous():
    import vf_mm as vf

    env = vf.SingleTurnEnv(dataset=[{"prompt": "What is 2+2?", "question": "What is 3+3?"}])
    with pytest.raises(MessageError, match="both a 'prompt' and a 'question'") as info:
        env.new_state(env.get_eval_dataset()[0], example_id=4, rollout_index=0)
    assert "example 4" in str(info.value) and "'prompt' and 'question'" in info.value.where
    # verifiers' formatted datasets keep the question the prompt was made from: accepted
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}
    row = {"prompt": [system, user], "question": "What is 2+2?"}
    assert env.format_prompt(row)[1] == user


def test_a_prompt_column_that_is_not_messages_names_the_column():
    import vf_mm as vf

    env = vf.SingleTurnEnv(dataset=[{"prompt": [{"content": "no role"}]}], env_id="quiz")
    with pytest.raises(MessageError, match=r"quiz: the 'prompt' column, message 0: no 'role'"):
        env.format_prompt(env.get_eval_dataset()[0])


def test_video_parts_a_user_would_get_wrong_are_refused():
    clip = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(MessageError, match="without a video"):
        check([{"role": "user", "content": [{"type": "video"}]}])
    with pytest.raises(MessageError, match="needs a URL"):
        check([{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}])
    with pytest.raises(MessageError, match="positive"):
        check([{"role": "user", "content": [{"type": "video", "video": clip, "fps": 0}]}])
    with pytest.raises(MessageError, match="both given"):
        check([{"role": "user", "content": [{"type": "video", "video": clip, "fps": 1,
                                             "num_frames": 2}]}])  # fmt: skip
    with pytest.raises(MessageError, match=r"'num_frame'.*num_frames"):
        check([{"role": "user", "content": [{"type": "video", "video": clip, "num_frame": 2}]}])
    ok = check([{"role": "user", "content": [{"type": "video", "video": clip, "frame_rate": 4}]}])
    assert ok[0]["content"][0]["video"] is clip


def test_video_numbers_must_be_finite():
    clip = np.zeros((2, 8, 8, 3), np.uint8)
    for key, value in (("fps", float("inf")), ("num_frames", float("nan")),
                       ("frame_rate", float("inf")), ("max_pixels", 1e999)):  # fmt: skip
        with pytest.raises(MessageError, match="finite positive"):
            check([{"role": "user", "content": [{"type": "video", "video": clip, key: value}]}])


# -- text that is not text ------------------------------------------------------------------

SURROGATE = "caf\udce9 dots?"  # what errors="surrogateescape" makes of b"caf\xe9 dots?"


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "user", "content": SURROGATE}, "message 0, field 'content'"),
        ({"role": "tool", "tool_call_id": "c", "content": ["look", SURROGATE]},
         "message 0, content part 1"),
        ({"role": "user", "content": [{"type": "text", "text": SURROGATE}]},
         "message 0, content part 0, field 'text'"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_refused_naming_the_field_and_the_fix(message, field):
    """No tokenizer takes it: it used to fail deep inside one with 'TextInputSequence must
    be str', naming neither the row nor the field."""
    with pytest.raises(MessageError) as info:
        check([message])
    text = str(info.value)
    assert text.startswith(f"{WHERE}, {field}: the text holds a lone surrogate ('\\udce9' at ")
    assert 'raw.decode("utf-8")' in text


@pytest.mark.parametrize(
    ("text", "kind"), [(b"caf\xe9 dots?", "bytes"), (3, "int"), ({"a": 1}, "dict")]
)
def test_a_text_part_that_is_not_a_str_is_refused_not_stringified(text, kind):
    with pytest.raises(MessageError, match=f"a text part needs a str, not {kind}") as info:
        check([{"role": "user", "content": [{"type": "text", "text": text}]}])
    if kind == "bytes":
        assert 'value.decode("utf-8")' in str(info.value)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"question": b"caf\xe9 dots?"}, 'the text needs a str, not bytes (decode it where it is '
                                         'read: value.decode("utf-8")'),
        ({"question": SURROGATE}, "the text holds a lone surrogate"),
        ({"question": 42}, "the text needs a str, not int (42)"),
        ({"question": {"text": "hi"}}, "the text needs a str, not dict"),
        ({"prompt": SURROGATE}, "the prompt of example 1, message 0, field 'content': the text "
                                "holds a lone surrogate"),
    ],
)  # fmt: skip
def test_a_question_that_is_not_text_fails_its_rollout_naming_the_row_and_the_fix(row, problem):
    """A bytes question was rendered as its repr ("b'caf\\xe9 dots?'"), an int as its
    digits; both now fail that rollout alone, naming the example and the column."""
    import asyncio

    import vf_mm as vf
    from vf_mm.testing import ScriptedChatBackend

    env = vf.SingleTurnEnv(dataset=[{"question": "fine"}, row], env_id="quiz")
    outs = asyncio.run(env.evaluate(vf.RendererClient(ScriptedChatBackend(["ok"]))))
    assert outs[0].error is None
    error = outs[1].error
    assert error.type == "MessageError" and problem in error.message
    if "question" in row:
        assert error.message.startswith("example 1: quiz: the 'question' column: ")


def test_a_system_prompt_that_is_not_text_is_refused_when_the_env_is_made():
    import vf_mm as vf

    with pytest.raises(MessageError, match=r"quiz: system_prompt: the text needs a str, not bytes"):
        vf.SingleTurnEnv(dataset=[{"question": "q"}], system_prompt=b"Be brief.", env_id="quiz")
    with pytest.raises(MessageError, match="lone surrogate"):
        vf.SingleTurnEnv(dataset=[{"question": "q"}], system_prompt=SURROGATE)


@pytest.mark.parametrize("info", ["a note", ["a", "list"], 5, [("k", "v")]])
def test_an_info_that_is_not_a_dict_fails_its_rollout_naming_the_row(info):
    """A str or list info crashed the whole run with dict()'s ValueError (and a list of
    pairs was silently turned into a dict); now that row's rollout fails, by name."""
    import asyncio

    import vf_mm as vf
    from vf_mm.testing import ScriptedChatBackend

    rows = [{"question": "fine", "info": {"k": 1}}, {"question": "q", "info": info}]
    env = vf.SingleTurnEnv(dataset=rows, env_id="quiz")
    outs = asyncio.run(env.evaluate(vf.RendererClient(ScriptedChatBackend(["ok"]))))
    assert outs[0].error is None and outs[0].info == {"k": 1}
    error = outs[1].error
    assert error.type == "MessageError" and outs[1].info == {}
    assert error.message.startswith(
        f"example 1: quiz: the 'info' column is a {type(info).__name__}, not a dict"
    )
    assert '{"note": "..."}' in error.message
