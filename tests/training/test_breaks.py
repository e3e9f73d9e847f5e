"""``history_break``: where a rollout's turns stop extending each other, and whose doing it
is: the template re-rendering the model's own turn (the common case) or the environment
rewriting the history. Token ids and a toy vocabulary; no model."""

from __future__ import annotations

from vf_mm.training import build_samples, history_break
from vf_mm.types import ResponseTokens, RolloutOutput, TrajectoryStep

VOCAB = {
    1: "<s>", 2: "<|im_end|>", 3: "<|endoftext|>", 4: "\n", 5: "user", 6: "assistant",
    7: "<|im_start|>", 10: "go", 11: "left", 12: " Hello", 13: "Hello", 14: " there",
    15: "<think>", 16: "wall", 17: "right",
}  # fmt: skip


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def turn(prompt_ids, completion_ids, prompt, text) -> TrajectoryStep:
    tokens = ResponseTokens(
        prompt_ids, completion_ids, [-1.0] * len(completion_ids), [1] * len(completion_ids), "stop"
    )
    return TrajectoryStep(prompt=prompt, completion=[{"role": "assistant", "content": text}],
                          tokens=tokens)  # fmt: skip


def rollout(first_prompt, first_completion, second_prompt, *, env_text="wall") -> RolloutOutput:
    """Two model turns: 'go' answered, then the environment's message and a second turn."""
    first = [user("go")]
    second = [*first, {"role": "assistant", "content": "left"}, user(env_text)]
    steps = [
        turn(first_prompt, first_completion, first, "left"),
        turn(second_prompt, [17, 2], second, "right"),
    ]
    return RolloutOutput(example_id=0, prompt=first, completion=[], trajectory=steps)


OPEN = [7, 5, 4, 10, 2, 7, 6, 4]  # <|im_start|>user\ngo<|im_end|><|im_start|>assistant\n
ENV = [7, 5, 4, 16, 2, 7, 6, 4]  # the environment's message and the next turn's opening


def test_turns_that_extend_each_other_have_no_break():
    out = rollout(OPEN, [11, 2], [*OPEN, 11, 2, *ENV])
    assert history_break(out, decode=decode) is None
    assert len(build_samples(out, advantage=0.0, image_token_id=99)) == 1


def test_a_model_that_stopped_on_another_end_token_is_the_templates_re_render_not_the_env():
    # Qwen2.5-VL stopping on <|endoftext|> where the template closes turns with <|im_end|>
    out = rollout(OPEN, [11, 3], [*OPEN, 11, 2, *ENV])
    why = history_break(out, decode=decode)
    assert len(build_samples(out, advantage=0.0, image_token_id=99)) == 2
    assert "position 9" in why
    assert "inside model turn 1's sampled tokens" in why
    assert "'<|endoftext|>' (id 3)" in why and "'<|im_end|>' (id 2)" in why
    assert "re-renders the model's own turn" in why and "stop tokens" in why
    assert "environment rewrote" not in why


def test_a_template_that_trims_the_models_leading_space_is_named():
    # Gemma 4's template strips the space the model sampled at its turn's start
    out = rollout(OPEN, [12, 14, 2], [*OPEN, 13, 14, 2, *ENV])
    why = history_break(out, decode=decode)
    assert "position 8" in why and "' Hello'" in why and "'Hello'" in why
    assert "trims the leading whitespace" in why
    assert "environment rewrote" not in why


def test_text_the_template_writes_otherwise_inside_the_turn_is_the_template():
    out = rollout(OPEN, [12, 14, 2], [*OPEN, 12, 10, 2, *ENV])
    why = history_break(out, decode=decode)
    assert "inside model turn 1's sampled tokens" in why
    assert "writes the model's text otherwise" in why


def test_an_environment_that_rewrote_a_message_is_blamed():
    rewritten = [7, 5, 4, 17, 2, 7, 6, 4]  # the first user message is no longer 'go'
    out = rollout(OPEN, [11, 2], [*rewritten, 11, 2, *ENV])
    out.trajectory[1].prompt[0] = user("right")
    why = history_break(out, decode=decode)
    assert "position 3" in why and "'go'" in why and "'right'" in why
    assert "message 0 (the user's) changed" in why
    assert "the environment rewrote the history" in why
    assert "own turn" not in why


def test_a_frame_rendered_otherwise_with_the_messages_kept_is_the_template():
    # Qwen3.5's generation prompt opens an empty <think> block its history render drops
    out = rollout([*OPEN, 15], [11, 2], [*OPEN, 11, 2, *ENV])
    why = history_break(out, decode=decode)
    assert "'<think>'" in why and "'left'" in why
    assert "the messages were kept" in why and "the template renders the text around a turn" in why


def test_without_messages_or_a_decoder_the_ids_still_say_where():
    """The wire's rollouts (dicts of token fields) carry no messages."""
    steps = [
        {"prompt_ids": OPEN, "completion_ids": [11, 3], "completion_logprobs": [-1.0, -1.0],
         "completion_mask": [1, 1]},
        {"prompt_ids": [*OPEN, 11, 2, *ENV], "completion_ids": [17], "completion_logprobs": [-1.0],
         "completion_mask": [1]},
    ]  # fmt: skip
    why = history_break({"steps": steps})
    assert "turn 1 has (id 3), turn 2's prompt (id 2)" in why
    assert "re-renders the model's own turn" in why
