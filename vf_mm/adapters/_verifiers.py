"""``VerifiersEnv``: an environment written for verifiers' classic API, run as a vf_mm one.

verifiers 0.3.x environments (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``
and their subclasses) own their rollout loop, which talks to a model through an OpenAI
client, and their rubric. The adapter keeps both and changes only what the client
reaches. For each vf_mm rollout it

1. opens a recording session over the rollout's ``RendererClient``
   (``vf_mm.recording.Recorder``) and hands the environment, wrapped in verifiers' own
   ``OpenAIChatCompletionsClient``, the in-process OpenAI client bound to it
   (``openai_client``: no network, no server);
2. runs ``env.rollout(input, client, model, sampling_args)``: every chat call the
   environment makes is one model turn, bridged onto the session's previous one, so
   the session's steps are the exact prompt and completion ids, logprobs and images a
   native vf_mm environment would have produced;
3. returns those steps as the rollout's trajectory, and the environment's prompt and
   completion (what its rubric scores) as OpenAI-style messages.

A group is scored by the environment's own rubric (``rubric.score_group``), so group
reward functions see the group as under verifiers, and its metrics (``num_turns``,
``total_tool_calls``, ...) come along.

What differs from running it under verifiers, each on purpose:

- A reward function that raises fails its rollout (reward None, the error naming the
  function and the line), where verifiers logs it and counts 0.0: in training a bug
  must not pass for a wrong answer. A rollout verifiers ended with an error
  (``state["error"]``) or that raised is failed too, and never scored (vf_mm's rule).
- Rows, concurrency (``-c``), seeds and results are vf_mm's: verifiers' ``generate`` /
  ``evaluate`` (``max_concurrent``, retries, saving) are not used.
- Sampling: the environment's ``sampling_args`` are the defaults that ``vf-mm eval -S``
  overrides; every call of one rollout carries the rollout's seed.
- Only chat completions are recorded (their messages are what a renderer turns into
  exact tokens): an environment with ``message_type="completion"`` is refused when it
  is wrapped, and a call to another route fails its rollout, naming the route.
- Dataset prompts lose the null keys Arrow adds to content parts (a text part holding
  ``"image_url": None``), which a chat template would read as an image.
- verifiers sends a reply whose content was ``""`` (a tool call parsed out of the text)
  back with None; the client it is handed sends it back as it came, so the recorder
  knows its own reply and the next turn bridges (``_chat_client_class``).

Recording needs token ids: the run's client must be token-level (the local or vLLM
backend); over a chat API every rollout fails, saying so.

Importing this module never imports verifiers; wrapping an environment does (it is
installed, or the environment could not exist).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from vf_mm._text import shorten
from vf_mm.envs import Environment, State
from vf_mm.errors import UnsupportedEnvironmentError
from vf_mm.recording import Recorder, openai_client
from vf_mm.types import Message, Messages, RolloutError, RolloutOutput

#: the model name the environment's calls carry (the in-process endpoint serves this one)
MODEL = "vf-mm"
#: the verifiers sampling args vf_mm's ``SamplingParams`` models; the others pass through
_MODELLED = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids",
             "logprobs")  # fmt: skip
CHAT_ROUTE = "/chat/completions"


def is_verifiers_environment(obj: Any) -> bool:
    """Whether ``obj``'s class (or a base) is defined in the verifiers package.

    Read from module names, so asking never imports verifiers.

    Args:
        obj: Any object.
    """
    return any(
        (getattr(cls, "__module__", "") or "").split(".")[0] == "verifiers"
        for cls in type(obj).__mro__
    )


def adapt_verifiers(obj: Any, env_id: str) -> VerifiersEnv | None:
    """The ``vf_mm.envs._internal.Adapter`` for verifiers: ``obj`` wrapped, or None.

    None when ``obj`` is not verifiers'.

    Args:
        obj: What an environment's ``load_environment`` returned.
        env_id: The id it was loaded as.

    Raises:
        UnsupportedEnvironmentError: A verifiers environment it cannot run.
    """
    if not is_verifiers_environment(obj):
        return None
    return VerifiersEnv(obj, env_id=env_id)


class VerifiersEnv(Environment):
    """A verifiers classic environment as a vf_mm ``Environment``.

    Args:
        env: The verifiers environment.
        env_id: The id runs and results use (default: the environment's own, else its
            class name).
        model: The model name its calls send (its rubric sees it in ``state["model"]``).
        timeout_s: A hard limit on one rollout, on top of the environment's own
            ``timeout_seconds`` (which ends a rollout as verifiers does).
    """

    def __init__(
        self,
        env: Any,
        *,
        env_id: str | None = None,
        model: str = MODEL,
        timeout_s: float | None = None,
    ) -> None:
        _check_classic(env)
        train = env.build_dataset()
        evaluation = env.build_eval_dataset()
        modelled, self.passthrough_args = _split_sampling(dict(env.sampling_args or {}))
        super().__init__(
            dataset=train,
            eval_dataset=evaluation,
            sampling_args=modelled,
            env_id=env_id or getattr(env, "env_id", None) or type(env).__name__,
            timeout_s=timeout_s,
            optional_columns=("answer", "info"),  # verifiers' rubric decides what it needs
        )
        self.verifiers_env = env
        self.model = model
        self.chat_client_class = _chat_client_class()

    def format_prompt(self, row: Mapping[str, Any]) -> Messages:
        """The row's prompt as the environment sends it.

        Args:
            row: A dataset row; its ``prompt`` messages (a str is one user message) are taken,
                without Arrow's null keys in content parts.
        """
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if not isinstance(prompt, Sequence):
            raise ValueError("a verifiers dataset row needs a 'prompt' column (messages)")
        return [cast(Message, _clean_message(m)) for m in prompt]

    async def rollout(
        self,
        client: Any,
        row: Mapping[str, Any],
        *,
        example_id: int | str = 0,
        rollout_index: int = 0,
        sampling: Any = None,
    ) -> State:
        """One verifiers rollout through a recording session over ``client``.

        See the module docstring. Never raises but for cancellation: a failure is the state's
        ``error``.

        Args:
            client: A ``RendererClient``.
            row: The dataset row.
            example_id: The example's id.
            rollout_index: Which of the example's rollouts this is.
            sampling: Sampling for its model calls.
        """
        start = time.perf_counter()
        state = self._new_state(row, example_id, rollout_index)
        if state["error"] is not None:
            _fill_timing(state, time.perf_counter() - start)
            return state
        recorder: Recorder | None = None
        oai: Any = None
        chat: Any = None

        def where() -> str:  # the stage a failure now is at: the model turns it got through
            session = recorder.sessions.get(state["session_id"]) if recorder else None
            turns = len(session.steps) if session is not None else 0
            after = f"after model turn {turns}" if turns else "before the first model turn"
            return f"{self.env_id}: the verifiers rollout, {after}"

        limit = asyncio.timeout(self.timeout_s)
        try:
            recorder = Recorder(client)
            oai = openai_client(recorder, session_id=state["session_id"], model=self.model)
            chat = self.chat_client_class(oai)
            async with limit:
                vstate = await self.verifiers_env.rollout(
                    _verifiers_input(row, example_id, state["prompt"]),
                    chat,
                    self.model,
                    self._request_args(sampling or self.sampling()),
                )
            state["verifiers_state"] = vstate
            if vstate.get("error") is not None:
                state["error"] = _rollout_error(vstate["error"], where())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the environment's code, or the recording: this rollout
            if isinstance(exc, TimeoutError) and limit.expired():
                message = f"the rollout took longer than {self.timeout_s} s"
                state["error"] = RolloutError("TimeoutError", message, where())
            else:
                state["error"] = _rollout_error(exc, where())
        finally:
            steps = []
            if recorder is not None:
                session = await recorder.end(state["session_id"])
                steps = list(session.steps) if session is not None else []
            if oai is not None:
                await oai.close()
        state["trajectory"] = steps
        state["turn"] = len(steps)
        await self._fill_messages(state, chat, steps)
        _fill_timing(state, time.perf_counter() - start)
        return state

    async def score(self, states: Sequence[State]) -> list[RolloutOutput]:
        """Score one example's group with the environment's rubric (its ``score_group``).

        Failed rollouts are not scored, and a reward function that raises fails the rollout it
        raised for (all of them, for a group function).

        Args:
            states: The group's finished states.
        """
        start = time.perf_counter()
        ok = [s for s in states if s["error"] is None and "verifiers_state" in s]
        if ok:
            # its own task: the scoring context (which rollout a reward function is
            # scoring) lives and dies with it, never in the caller's context
            errors = await asyncio.ensure_future(self._score_group(ok))
            for state in ok:
                state["error"] = errors.get(id(state["verifiers_state"]))
        elapsed = time.perf_counter() - start
        return [self._output(state, elapsed) for state in states]

    # -- the parts ---------------------------------------------------------------------

    def _new_state(self, row: Mapping[str, Any], example_id: Any, rollout_index: int) -> State:
        info = row.get("info")
        if isinstance(info, str):  # verifiers stores info as JSON text in some datasets
            try:
                info = json.loads(info)
            except ValueError:
                info = {"info": info}
        state = State(
            prompt=[], completion=[], answer=row.get("answer"),
            info=dict(info) if isinstance(info, Mapping) else {}, task=self.env_id,
            example_id=example_id, rollout_index=rollout_index, turn=0, trajectory=[],
            error=None, timing={"generation_s": 0.0, "env_s": 0.0, "total_s": 0.0},
            row=dict(row), session_id=uuid.uuid4().hex,
        )  # fmt: skip
        try:
            state["prompt"] = self.format_prompt(row)
        except Exception as exc:
            state["error"] = RolloutError.from_exception(exc, where="making the prompt")
        return state

    def _request_args(self, sampling: Any) -> dict[str, Any]:
        """The sampling args every call of the rollout sends: the environment's own that
        vf_mm does not model (``n``, ``extra_body``, ...), then vf_mm's, so ``-S`` wins and
        each call asks for logprobs (a trajectory without them cannot train)."""
        args = copy.deepcopy(self.passthrough_args)
        args.update(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            logprobs=sampling.logprobs,
        )
        if sampling.top_k > 0:
            args["top_k"] = sampling.top_k
        if sampling.min_p > 0:
            args["min_p"] = sampling.min_p
        if sampling.seed is not None:
            args["seed"] = sampling.seed
        if sampling.stop_token_ids:
            args["stop_token_ids"] = list(sampling.stop_token_ids)
        return args

    async def _fill_messages(self, state: State, chat: Any, steps: list[Any]) -> None:
        """``prompt`` and ``completion`` as the rubric saw them (the environment's own
        messages, in OpenAI form); for a rollout that raised, what was recorded."""
        vstate = state.get("verifiers_state")
        if vstate is not None and chat is not None:
            try:
                prompt, _ = await chat.to_native_prompt(vstate["prompt"] or [])
                completion, _ = await chat.to_native_prompt(vstate.get("completion") or [])
                state["prompt"] = [_clean_message(m) for m in prompt]
                state["completion"] = [_clean_message(m) for m in completion]
                return
            except Exception:  # an environment that left odd messages: keep the recording
                pass
        if steps:
            last = steps[-1]
            conversation = [*last.prompt, *last.completion]
            state["completion"] = conversation[len(steps[0].prompt) :]
            if not state["prompt"]:
                state["prompt"] = list(steps[0].prompt)

    async def _score_group(self, ok: Sequence[State]) -> dict[int, RolloutError]:
        env = self.verifiers_env
        vstates = [s["verifiers_state"] for s in ok]
        failures = _RewardFailures()
        rubric = failures.watch(env.rubric)
        try:
            if getattr(env, "score_rollouts", True):
                await rubric.score_group(vstates)
            else:
                await rubric.dummy_score_group(vstates)
        except Exception as exc:  # the rubric itself failed: the whole group
            error = RolloutError.from_exception(exc, where=f"{self.env_id}: scoring the group")
            return {id(v): error for v in vstates}
        for vstate in vstates:
            try:
                await env.rubric.cleanup(vstate)
            except Exception as exc:
                failures.errors.setdefault(
                    id(vstate), RolloutError.from_exception(exc, where="the rubric's cleanup")
                )
        return failures.errors

    def _output(self, state: State, scoring_s: float) -> RolloutOutput:
        vstate = state.get("verifiers_state")
        reward: float | None = None
        metrics: dict[str, float] = {}
        if state["error"] is None and vstate is not None:
            reward = float(vstate.get("reward") or 0.0)
            metrics = {str(k): float(v) for k, v in (vstate.get("metrics") or {}).items()}
        state["timing"]["scoring_s"] = scoring_s
        if vstate is not None:  # verifiers' name for a rollout that ran out of context
            state["truncated"] = bool(vstate.get("is_truncated"))
        return RolloutOutput.from_state(state, reward=reward, metrics=metrics, error=state["error"])


class _RewardFailures:
    """Which rollout each reward function raised for, while one group is scored.

    verifiers' rubric catches a reward function's exception itself (logs it, scores 0.0).
    ``watch`` gives a copy of the rubric (and of its sub-rubrics) whose functions note
    what they raise before verifiers sees it, and whose ``score_objects`` /
    ``group_score_objects`` say, through a context variable, which rollouts the function
    being called scores: verifiers runs each rollout's call in its own task (a copy of
    the context), so the note lands on the right rollout. The user's rubric is never
    changed; the copy lives for one group.
    """

    def __init__(self) -> None:
        self.errors: dict[int, RolloutError] = {}  # id(verifiers state) -> its first error
        self.scoring: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            "vf_mm_verifiers_scoring", default=()
        )

    def watch(self, rubric: Any) -> Any:
        funcs = getattr(rubric, "funcs", None)
        if not isinstance(funcs, list):  # not a verifiers Rubric: scored as it is
            return rubric
        clone = copy.copy(rubric)
        clone.funcs = [self._watched(f) for f in funcs]
        subs = getattr(rubric, "rubrics", None)
        if isinstance(subs, list):  # a RubricGroup
            clone.rubrics = [self.watch(r) for r in subs]
        for name, many in (("score_objects", False), ("group_score_objects", True)):
            method = getattr(clone, name, None)
            if callable(method):
                setattr(clone, name, self._scoped(method, many))
        return clone

    def _scoped(self, method: Callable[[Any], Any], many: bool) -> Callable[[Any], Any]:
        def scoped(arg: Any) -> Any:
            objects = method(arg)
            self.scoring.set(tuple(arg) if many else (arg,))
            return objects

        return scoped

    def _watched(self, func: Callable[..., Any]) -> Callable[..., Any]:
        name = getattr(func, "__name__", repr(func))

        @functools.wraps(func)  # signature, name and return annotation: what verifiers reads
        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                result = func(*args, **kwargs)
            except Exception as exc:
                self._note(exc, name)
                raise
            if inspect.isawaitable(result):
                return self._awaited(result, name)
            return result

        return watched

    async def _awaited(self, result: Awaitable[Any], name: str) -> Any:
        try:
            return await result
        except Exception as exc:
            self._note(exc, name)
            raise

    def _note(self, exc: Exception, name: str) -> None:
        error = RolloutError.from_exception(exc, where=f"reward function {name!r}")
        for vstate in self.scoring.get():
            self.errors.setdefault(id(vstate), error)


def _check_classic(env: Any) -> None:
    """Refuse, saying why and what to do, a verifiers object that is not a classic
    environment vf_mm can run."""
    import verifiers

    version = getattr(verifiers, "__version__", "?")
    classic = _classic_base()
    if classic is None or not isinstance(env, classic):
        raise UnsupportedEnvironmentError(
            f"a {type(env).__module__}.{type(env).__name__} (verifiers {version}) is not a "
            "classic verifiers environment (vf.SingleTurnEnv, vf.MultiTurnEnv, vf.ToolEnv, "
            "verifiers 0.3.x): vf_mm runs those. A verifiers v1 environment runs its own "
            "harness against an endpoint: point it at vf-mm serve --record DIR instead "
            "(docs/recording.md, 'verifiers environments')"
        )
    message_type = getattr(env, "message_type", "chat")
    if message_type != "chat":
        raise UnsupportedEnvironmentError(
            f"{type(env).__name__} asks for message_type={message_type!r}: vf_mm records "
            "chat calls only (POST /v1/chat/completions, whose messages it renders into "
            "exact tokens). Give the dataset chat prompts (a 'prompt' column of messages, "
            "or 'question') and drop message_type"
        )


def _classic_base() -> type | None:
    """verifiers' classic ``Environment`` class: ``verifiers.Environment`` in 0.3.0, the
    alias of ``verifiers.legacy`` in 0.3.1; None in a verifiers without it (0.4: v1 only)."""
    import verifiers

    try:
        base = verifiers.Environment
    except (AttributeError, ImportError):
        return None
    return base if isinstance(base, type) else None


def _chat_client_class() -> type:
    """verifiers' chat-completions client, echoing replies as they came.

    verifiers turns a reply's empty content into None (``content_to_text("")`` is
    falsy) and sends it back so; a renderer that parses tool calls out of the text (Qwen3's)
    replies with ``""``. The recorder recognises its own reply only when the echo equals
    it (None-valued keys set aside), so the next call would be rendered whole instead of
    bridged: exact still, but the steps would no longer extend each other. This client
    remembers which tool-call replies had ``""`` and sends those back with ``""``."""
    import verifiers

    class RecordingChatClient(verifiers.OpenAIChatCompletionsClient):
        def __init__(self, client: Any) -> None:
            super().__init__(client)
            self.empty_replies: set[tuple[str, ...]] = set()  # their tool-call ids

        async def from_native_response(self, response: Any) -> Any:
            parsed = await super().from_native_response(response)
            calls = tuple(c.id for c in parsed.message.tool_calls or ())
            if calls and response.choices[0].message.content == "":
                self.empty_replies.add(calls)
            return parsed

        async def to_native_prompt(self, messages: Any) -> Any:
            native, extra = await super().to_native_prompt(messages)
            for message in native:
                calls = tuple(c["id"] for c in message.get("tool_calls") or ())
                if message.get("content") is None and calls in self.empty_replies:
                    message["content"] = ""
            return native, extra

    return RecordingChatClient


def _verifiers_input(row: Mapping[str, Any], example_id: Any, prompt: Messages) -> dict[str, Any]:
    """The row as verifiers' ``rollout`` takes it: its columns, the cleaned prompt, the id."""
    data = dict(row)
    data["prompt"] = prompt
    data.setdefault("example_id", example_id)
    return data


def _split_sampling(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The environment's sampling args as (what vf_mm's ``SamplingParams`` models, the
    rest): ``max_completion_tokens`` is ``max_tokens``; modelled keys are taken from
    ``extra_body`` too (where vLLM users put ``top_k``), so no key is sent twice."""
    modelled: dict[str, Any] = {}
    rest = copy.deepcopy(args)
    extra = rest.get("extra_body")
    for source in (extra if isinstance(extra, dict) else {}, rest):
        if "max_completion_tokens" in source:
            source.setdefault("max_tokens", source.pop("max_completion_tokens"))
        for key in _MODELLED:
            if key in source:
                value = source.pop(key)
                if value is not None:
                    modelled[key] = value
    if isinstance(extra, dict) and not extra:
        rest.pop("extra_body")
    return modelled, rest


def _clean_message(message: Any) -> dict[str, Any]:
    """A message as a plain dict: None-valued keys dropped (``content`` kept), and content
    parts without their None-valued keys (Arrow gives every part every part's keys)."""
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    out = {k: v for k, v in dict(message).items() if v is not None or k == "content"}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [_drop_nulls(p) for p in content]
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _rollout_error(exc: BaseException, where: str) -> RolloutError:
    """``exc`` as the rollout's error: a call to a route other than chat completions says
    so; otherwise its type, and its message with the causes verifiers wrapped it around
    (its ``ModelError`` carries none of its own)."""
    route = _refused_route(exc)
    if route is not None:
        return RolloutError(
            "UnsupportedEnvironmentError",
            f"the environment called {route}: vf_mm records chat completions only "
            "(POST /v1/chat/completions)",
            where,
        )
    base = RolloutError.from_exception(exc, where=where)
    causes: list[str] = []
    seen = {id(exc)}
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen and len(causes) < 4:
        seen.add(id(cause))
        causes.append(f"{type(cause).__name__}: {shorten(str(cause), 500)}")
        cause = cause.__cause__ or cause.__context__
    message = str(exc) if str(exc) else ""
    if causes:
        message = (f"{message} " if message else "") + "(from " + " <- ".join(causes) + ")"
    return RolloutError(base.type, message or base.message, base.where)


def _refused_route(exc: BaseException) -> str | None:
    """``"POST /v1/completions"`` when ``exc`` (or a cause) is the in-process endpoint's
    404 for a route that is not chat completions."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        request = getattr(getattr(current, "response", None), "request", None)
        if getattr(current, "status_code", None) == 404 and request is not None:
            path = request.url.path
            if not path.endswith(CHAT_ROUTE):
                return f"{request.method} {path}"
        current = current.__cause__ or current.__context__
    return None


def _fill_timing(state: State, total_s: float) -> None:
    """vf_mm's timing keys from verifiers' ``RolloutTiming`` (model and environment time),
    when the rollout got that far."""
    timing = state["timing"]
    timing["total_s"] = total_s
    vtiming = (state.get("verifiers_state") or {}).get("timing")
    for key, phase in (("generation_s", "model"), ("env_s", "env")):
        duration = getattr(getattr(vtiming, phase, None), "duration", None)
        if isinstance(duration, (int, float)):
            timing[key] = float(duration)
