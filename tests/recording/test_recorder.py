"""The recording endpoint, in process: the OpenAI SDK's calls become one exact trajectory
per session, bridged turn on turn, isolated from other sessions, under the renderer's
image policy alone; streaming and tool calls as the SDK expects them."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import numpy as np
import pytest
from PIL import Image

import vf_mm as vf
from vf_mm.images import ImagePolicy, png_data_url
from vf_mm.recording import RECORDING_BASE_URL, Recorder, openai_client
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm


def picture(seed: int) -> str:
    rng = np.random.default_rng(seed)
    return png_data_url(Image.fromarray(rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)))


def user(seed: int, text: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture(seed)}},
                                        {"type": "text", "text": text}]}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("recording") / "qwen", "qwen2_5_vl")


@pytest.fixture
def renderer(checkpoint):
    return load_renderer(checkpoint, image_policy=ImagePolicy.dataset(roots=()))


def recorder_for(renderer, replies=("I move left.",), **options):
    return Recorder(
        vf.RendererClient(ScriptedBackend(renderer, list(replies)), renderer), **options
    )


def test_three_sdk_turns_with_a_new_image_each_are_one_exact_trajectory(renderer):
    recorder = recorder_for(renderer)

    async def main():
        oai = openai_client(recorder, model="tiny")
        messages = []
        for turn in range(3):
            messages.append(user(turn, f"turn {turn}: where now?"))
            reply = await oai.chat.completions.create(
                model="tiny", messages=messages, logprobs=True
            )
            assert reply.choices[0].message.content == "I move left."
            assert len(reply.choices[0].logprobs.content) == reply.usage.completion_tokens
            messages.append(reply.choices[0].message)  # as agent code does: the SDK's object
        await oai.close()
        return oai.session_id

    session_id = asyncio.run(main())
    session = recorder.sessions[session_id]
    steps = session.steps
    assert len(steps) == 3
    assert recorder.client.stats.bridges == 2  # turns 2 and 3 bridged onto their predecessor
    for before, after in itertools.pairwise(steps):
        previous = [*before.tokens.prompt_ids, *before.tokens.completion_ids]
        assert after.tokens.prompt_ids[: len(previous)] == previous
    # the last prompt is exactly what a full render of the conversation gives
    full = renderer.render(steps[-1].prompt)
    last = steps[-1].tokens
    assert last.prompt_ids == full.token_ids
    assert last.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    assert last.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
    for a, b in zip(
        last.multi_modal_data.mm_items["image"],
        full.multi_modal_data.mm_items["image"],
        strict=True,
    ):
        assert all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_sessions_are_isolated(renderer):
    recorder = recorder_for(renderer, replies=["one.", "two."])

    async def main():
        a, b = openai_client(recorder, model="m"), openai_client(recorder, model="m")
        conv = {a: [user(1, "a")], b: [user(2, "b")]}
        for _ in range(2):  # interleaved calls
            for oai in (a, b):
                reply = await oai.chat.completions.create(model="m", messages=conv[oai])
                conv[oai] += [reply.choices[0].message, {"role": "user", "content": "more"}]
        return a.session_id, b.session_id

    sa, sb = asyncio.run(main())
    assert set(recorder.sessions) == {sa, sb}
    for sid, seed in ((sa, 1), (sb, 2)):
        steps = recorder.sessions[sid].steps
        assert len(steps) == 2
        assert steps[0].prompt[0]["content"][0]["image_url"]["url"] == picture(seed)
        previous = [*steps[0].tokens.prompt_ids, *steps[0].tokens.completion_ids]
        assert steps[1].tokens.prompt_ids[: len(previous)] == previous


def call(recorder, body, headers=None, *, limits=None):
    """One raw HTTP call to the recording app (no SDK), as (status, JSON body)."""
    from vf_mm.inference import create_app

    client = recorder.client
    app = create_app(client.backend, renderer=client.renderer, model_name="m",
                     recorder=recorder, limits=limits)  # fmt: skip

    async def main():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=RECORDING_BASE_URL
        ) as http:
            response = await http.post("/chat/completions", json=body, headers=headers or {})
            return response.status_code, response.json()

    return asyncio.run(main())


def test_the_session_is_the_header_else_the_user_field_else_a_400(renderer):
    recorder = recorder_for(renderer)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert call(recorder, {**body, "user": "alice"})[0] == 200
    assert call(recorder, body, {"X-Session-ID": "s-1"})[0] == 200
    assert call(recorder, {**body, "user": "bob"}, {"X-Session-ID": "s-2"})[0] == 200
    assert set(recorder.sessions) == {"alice", "s-1", "s-2"}  # the header wins over user
    status, error = call(recorder, body)
    assert status == 400 and "X-Session-ID" in error["error"]["message"]


def image_call(url: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}]}  # fmt: skip


def test_only_the_renderers_image_policy_decides_what_is_read(renderer, checkpoint, tmp_path):
    recorder = recorder_for(renderer)  # data: URLs only
    for url in ("http://127.0.0.1:9/cat.png", "file:///etc/passwd"):
        status, error = call(recorder, image_call(url), {"X-Session-ID": "s"})
        assert status == 400, error
        message = error["error"]["message"]
        assert "policy" in message.lower() and url in message
    assert recorder.client.stats.turns == 2 and "s" not in recorder.sessions
    # a policy that allows a folder: its files are read, and nothing outside it
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(tmp_path / "ok.png")
    allowed = load_renderer(checkpoint, image_policy=ImagePolicy.dataset(roots=[tmp_path]))
    recorder = recorder_for(allowed)
    assert (
        call(recorder, image_call((tmp_path / "ok.png").as_uri()), {"X-Session-ID": "s"})[0] == 200
    )
    assert call(recorder, image_call("file:///etc/hostname"), {"X-Session-ID": "s"})[0] == 400


def test_a_refused_call_records_nothing_and_opens_no_session(renderer):
    """A call refused with 400 (a corrupt image here) is no turn: it opens no session, so
    nothing empty is listed, ended or handed to ``on_end`` (which writes rows and groups);
    in a session already open it adds no step."""
    ended = []
    recorder = recorder_for(renderer, on_end=ended.append)
    corrupt = image_call("data:image/png;base64," + "iVBORw0KGgo" + "A" * 40)
    status, error = call(recorder, corrupt, {"X-Session-ID": "bad"})
    assert status == 400, error
    assert recorder.sessions == {} and recorder._locks == {} and recorder._callers == {}
    assert asyncio.run(recorder.end("bad")) is None and asyncio.run(recorder.aclose()) == []
    assert ended == []
    fine = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert call(recorder, fine, {"X-Session-ID": "s"})[0] == 200
    assert call(recorder, corrupt, {"X-Session-ID": "s"})[0] == 400
    assert [len(s.steps) for s in asyncio.run(recorder.aclose())] == [1]
    assert [s.session_id for s in ended] == ["s"]


def test_ended_sessions_go_to_on_end_and_a_reused_id_starts_anew(renderer):
    ended = []
    recorder = recorder_for(renderer, on_end=ended.append)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    call(recorder, body, {"X-Session-ID": "s"})
    session = asyncio.run(recorder.end("s"))
    assert ended == [session] and session.index == 0 and len(session.steps) == 1
    output = session.as_rollout()
    assert output.example_id == "s" and output.prompt == body["messages"]
    assert output.completion == [session.steps[0].completion[0]] and output.reward is None
    call(recorder, body, {"X-Session-ID": "s"})
    assert recorder.sessions["s"].index == 1
    assert asyncio.run(recorder.end("nobody")) is None


def test_idle_sessions_end_at_the_sweep(renderer):
    ended = []
    recorder = recorder_for(renderer, on_end=ended.append, idle_s=0.0)
    call(
        recorder,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"X-Session-ID": "s"},
    )
    assert [s.session_id for s in asyncio.run(recorder.sweep())] == ["s"]
    assert not recorder.sessions and len(ended) == 1


def test_a_stream_holds_the_same_reply(renderer):
    recorder = recorder_for(renderer, replies=["Left, then up."])

    async def main():
        oai = openai_client(recorder, model="m")
        messages = [user(5, "go")]
        whole = await oai.chat.completions.create(model="m", messages=messages)
        stream = await oai.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return whole, text, finish, usage

    whole, text, finish, usage = asyncio.run(main())
    assert text == whole.choices[0].message.content == "Left, then up."
    assert finish == whole.choices[0].finish_reason == "stop"
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_tool_calls_round_trip_and_bridge(renderer):
    call_text = '<tool_call>\n{"name": "look", "arguments": {"where": "north"}}\n</tool_call>'
    recorder = recorder_for(renderer, replies=[call_text, "I see a wall."])
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object",
              "properties": {"where": {"type": "string"}}}}}]  # fmt: skip

    async def main():
        oai = openai_client(recorder, model="m")
        messages = [user(7, "look around")]
        reply = await oai.chat.completions.create(model="m", messages=messages, tools=tools)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        (tool_call,) = message.tool_calls
        assert tool_call.function.name == "look"
        assert json.loads(tool_call.function.arguments) == {"where": "north"}
        messages += [message, {"role": "tool", "tool_call_id": tool_call.id, "content": "a wall"}]
        second = await oai.chat.completions.create(model="m", messages=messages, tools=tools)
        return oai.session_id, second

    session_id, second = asyncio.run(main())
    assert second.choices[0].message.content == "I see a wall."
    steps = recorder.sessions[session_id].steps
    previous = [*steps[0].tokens.prompt_ids, *steps[0].tokens.completion_ids]
    assert steps[1].tokens.prompt_ids[: len(previous)] == previous
    assert recorder.client.stats.bridges == 1


def test_a_chat_only_client_cannot_record(renderer):
    from vf_mm.testing import ScriptedChatBackend

    with pytest.raises(ValueError, match="token-level"):
        Recorder(vf.RendererClient(ScriptedChatBackend(["hi"])))


def test_one_api_key_cannot_see_or_end_another_keys_sessions(renderer):
    from vf_mm.inference import create_app

    recorder = recorder_for(renderer)
    client = recorder.client
    app = create_app(client.backend, renderer=client.renderer, model_name="m",
                     recorder=recorder, api_keys=["alice-key", "bob-key"])  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=RECORDING_BASE_URL) as http:
            alice = {"Authorization": "Bearer alice-key", "X-Session-ID": "s"}
            bob = {"Authorization": "Bearer bob-key", "X-Session-ID": "s"}
            assert (
                await http.post("/chat/completions", json=body, headers=alice)
            ).status_code == 200
            listed = (await http.get("/sessions", headers=bob)).json()["data"]
            ended = await http.post("/sessions/s/end", headers=bob)  # bob has no session "s"
            assert (await http.post("/chat/completions", json=body, headers=bob)).status_code == 200
            mine = (await http.get("/sessions", headers=alice)).json()["data"]
            nobody = await http.get("/sessions")
            return listed, ended.status_code, mine, nobody.status_code

    listed, ended, mine, nobody = asyncio.run(main())
    assert listed == [] and ended == 404 and nobody == 401
    assert mine == [{"id": "s", "turns": 1, "index": 0}]  # alice's, untouched by bob's call
    names = sorted(s.name for s in recorder._sessions.values())
    assert len(names) == 2 and all(name.endswith("/s") for name in names)
    assert "alice-key" not in " ".join(names)  # a tag, never the key


def test_an_empty_reply_echoed_as_none_and_null_part_keys_still_bridge(renderer):
    """Clients normalise what they echo: an empty reply's content comes back as None, and
    Arrow-backed prompts carry ``image_url: null`` on text parts. Neither is a new
    conversation: the turn still bridges, and the null key is no image."""
    recorder = recorder_for(renderer, replies=["", "fine."])
    text = {"type": "text", "text": "hello", "image_url": None}
    first = [{"role": "user", "content": [text]}]
    status, reply = call(recorder, {"model": "m", "messages": first}, {"X-Session-ID": "s"})
    assert status == 200 and reply["choices"][0]["message"]["content"] == ""
    echoed = {"role": "assistant", "content": None, "refusal": None}
    second = [*first, echoed, {"role": "user", "content": "and?"}]
    status, reply = call(recorder, {"model": "m", "messages": second}, {"X-Session-ID": "s"})
    assert status == 200 and reply["choices"][0]["message"]["content"] == "fine."
    assert recorder.client.stats.bridges == 1


def test_a_recording_server_caps_prompt_tokens_like_any_other(renderer):
    """``--max-request-tokens`` holds for a recorded session too: a prompt over it is the
    same 400 an unrecorded request gets, refused before generation, and not recorded."""
    from vf_mm.inference import ServerLimits

    recorder = recorder_for(renderer)
    limits = ServerLimits(max_request_tokens=40)
    long = {"model": "m", "messages": [{"role": "user", "content": "word " * 200}]}
    status, reply = call(recorder, long, {"X-Session-ID": "s"}, limits=limits)
    assert status == 400 and reply["error"]["type"] == "RequestTooLargeError"
    assert "at most 40 (--max-request-tokens)" in reply["error"]["message"]
    assert recorder.client.stats.turns == 1 and recorder.client.stats.backend_s == 0.0
    assert all(not s.steps for s in recorder._sessions.values())
    short = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert call(recorder, short, {"X-Session-ID": "s"}, limits=limits)[0] == 200


def test_a_chat_backend_cannot_take_a_prompt_token_cap():
    from vf_mm.testing import ScriptedChatBackend

    client = vf.RendererClient(ScriptedChatBackend(["hi"]))
    with pytest.raises(ValueError, match="token-level backend"):
        asyncio.run(client.generate([{"role": "user", "content": "hi"}], max_prompt_tokens=5))


def test_a_session_that_branched_shows_its_last_branch_and_says_so(renderer):
    """An agent that compacts its history sends a prompt that does not continue the last
    call's conversation: the row shows the last branch after what it shares with the
    first prompt, names the call that branched, and the trajectory keeps every call."""
    recorder = recorder_for(renderer, replies=["one", "two", "three"])
    system = {"role": "system", "content": "be brief"}
    first = [system, {"role": "user", "content": "hi"}]
    _, reply = call(recorder, {"model": "m", "messages": first}, {"X-Session-ID": "s"})
    said = reply["choices"][0]["message"]
    second = [*first, said, {"role": "user", "content": "more"}]
    _, reply = call(recorder, {"model": "m", "messages": second}, {"X-Session-ID": "s"})
    compacted = [system, {"role": "user", "content": "summary: hi, more"}]
    call(recorder, {"model": "m", "messages": compacted}, {"X-Session-ID": "s"})
    output = asyncio.run(recorder.end("s")).as_rollout()
    assert output.prompt == first and len(output.trajectory) == 3
    assert output.info == {"branched_at_calls": [2]}
    assert [m["content"] for m in output.completion] == ["summary: hi, more", "three"]

    straight = recorder_for(renderer, replies=["one", "two"])
    _, reply = call(straight, {"model": "m", "messages": first}, {"X-Session-ID": "t"})
    call(straight, {"model": "m", "messages": [*first, reply["choices"][0]["message"],
                                              {"role": "user", "content": "more"}]},
         {"X-Session-ID": "t"})  # fmt: skip
    output = asyncio.run(straight.end("t")).as_rollout()
    assert output.info == {} and [m["content"] for m in output.completion] == [
        "one", "more", "two",
    ]  # fmt: skip
