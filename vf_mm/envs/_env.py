"""Environments: the dataset, the rollout loop, the rubric.

``Environment`` owns a dataset of examples and turns each row into a prompt (system
prompt, question, the row's images as content parts). ``MultiTurnEnv.rollout`` runs
one rollout: model turn, then ``env_response``, until a stop condition holds; every
model turn goes through a ``RendererClient`` (so later turns bridge onto earlier
tokens, images carried forward) and lands in ``state["trajectory"]``.
``SingleTurnEnv`` is one model turn. ``evaluate`` runs many rollouts concurrently,
scores each example's group with the rubric, and hands every finished rollout to a
callback as it completes; it pulls rows as rollout slots free up and keeps no output it
has handed over, so a run's memory does not grow with its length.

A rollout that fails (an image that does not load, a backend error, a timeout, an
exception in environment code) is returned with ``error`` set and reward None: the run
goes on. A rollout that runs out of context after at least one model turn (its next
prompt is longer than the model takes: ``PromptTooLongError``) is not a failure: it ends
there, ``state["truncated"]`` is True, and it is scored on the turns it has (a long
rollout's work is kept, as verifiers does). Its last model turn already had its
``env_response``, so ``finish_state`` is not called (it would apply that turn twice). A
prompt too long for even the first turn is an error: there is nothing to score. Nothing here keeps module-level state; a ``State`` lives for one rollout.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from vf_mm.client import RendererClient
from vf_mm.envs._messages import check_messages, check_text, did_you_mean, is_image_value
from vf_mm.envs._parser import Parser
from vf_mm.envs._rows import count_rows, iter_rows
from vf_mm.envs._rubric import Rubric
from vf_mm.errors import MessageError, PromptTooLongError
from vf_mm.inference import SamplingParams
from vf_mm.types import (
    IMAGE_PART_TYPES,
    VIDEO_PART_TYPES,
    Message,
    Messages,
    RolloutError,
    RolloutOutput,
)

IMAGE_COLUMNS = ("image", "images")
VIDEO_COLUMNS = ("video", "videos")
#: dataset columns reward functions receive by name; a row without one (or with null) is
#: refused to a reward function that asks for it, unless declared in ``optional_columns``
SCORED_COLUMNS = ("answer", "info")
#: the columns vf_mm reads from a row; any other column is the author's own (a reward
#: function reads it through ``row``), so it is never refused for being unknown, only
#: for holding an image under a name close to an image column (which would be dropped)
KNOWN_COLUMNS = ("question", "prompt", *SCORED_COLUMNS, "task", "example_id",
                 *IMAGE_COLUMNS, *VIDEO_COLUMNS)  # fmt: skip
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
_STOP_ATTR = "__vf_mm_stop__"


def stop(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``MultiTurnEnv`` method ``(self, state) -> bool`` (sync or async) as a stop condition.

    The rollout ends after a model turn for which any of them is true.

    Args:
        func: The method.
    """
    setattr(func, _STOP_ATTR, True)
    return func


class State(dict):
    """Everything about one rollout, as a dict (reward functions receive it as ``state``).

    Keys vf_mm sets: ``prompt``, ``completion``, ``answer``, ``info``, ``example_id``,
    ``rollout_index``, ``task``, ``row`` (the whole dataset row), ``turn`` (model turns
    so far), ``trajectory`` (the ``TrajectoryStep`` list), ``error``, ``timing``,
    ``session_id`` (unique to the rollout: its model turns go to one inference server),
    ``truncated`` (True once the rollout ran out of context: module docstring).
    Environments add their own keys.
    """

    @property
    def turn(self) -> int:
        return self["turn"]

    @property
    def trajectory(self) -> list[Any]:
        return self["trajectory"]


class Environment:
    """The base: a dataset, how a row becomes a prompt, a rubric, sampling defaults.

    One concept: the environment contract users subclass (its dataset, prompt, rubric,
    state and the ``rollout``/``evaluate``/``score`` entry points that tie them), long
    because each entry point checks its input and names the row in errors; the rollout
    loop itself is ``MultiTurnEnv``'s and rows' reading is ``vf_mm.envs._rows``'.

    Args:
        dataset: The train rows: a Hugging Face ``datasets.Dataset`` (or a list of dicts;
            or, for a dataset of any size, a ``vf.LazyRows``, a streaming
            ``datasets.IterableDataset``, a generator function: rows are read one at a time
            as a run needs them, see ``vf_mm.envs._rows``) with a ``question`` column (or
            ``prompt``: a message list), optional ``answer``, ``info`` (a dict), ``task``,
            image columns (``image``: one image, ``images``: a list; PIL images, bytes or
            paths) and video columns (``video``: one clip, a frames list or ``(T, H, W, 3)``
            array or path or a video part; ``videos``: a list of them), which become video
            and image parts of the first user message, before its text.
        eval_dataset: The eval rows, in the same forms (at least one of the two).
        system_prompt: A system message put first in each prompt that has none.
        parser: Reads answers from completions (default: the rubric's, else ``Parser()``).
        rubric: The reward functions (default: an empty ``Rubric``).
        sampling_args: Sampling defaults for every rollout.
        env_id: The id runs and results use (default: the class name).
        timeout_s: A hard limit on one rollout, in seconds (None: no limit).
        optional_columns: The scored columns (``answer``, ``info``) a row may lack: a
            reward function that asks for a column its row lacks fails that rollout
            (``MissingColumnError``) unless the column is declared optional here.

    Raises:
        ValueError: No dataset at all, a ``timeout_s`` not above 0, an optional column
            that is not a scored column.
        MessageError: A ``system_prompt`` that is not text.
    """

    def __init__(
        self,
        *,
        dataset: Any = None,
        eval_dataset: Any = None,
        system_prompt: str | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        env_id: str | None = None,
        timeout_s: float | None = None,
        optional_columns: Sequence[str] = (),
    ) -> None:
        if dataset is None and eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        for name, value in (("dataset", dataset), ("eval_dataset", eval_dataset)):
            _check_dataset(name, value)
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(
                f"timeout_s must be > 0 seconds (or None for no limit), got {timeout_s}"
            )
        if system_prompt is not None:
            check_text(system_prompt, where=f"{env_id or type(self).__name__}: system_prompt")
        self.dataset = dataset
        self.eval_dataset = eval_dataset
        self.system_prompt = system_prompt
        self.parser = parser or (rubric.parser if rubric is not None else Parser())
        self.rubric = rubric or Rubric(parser=self.parser)
        self.sampling_args = dict(sampling_args or {})
        self.env_id = env_id or type(self).__name__
        self.timeout_s = timeout_s
        unknown = set(optional_columns) - set(SCORED_COLUMNS)
        if unknown:
            raise ValueError(
                f"optional_columns may name {list(SCORED_COLUMNS)}, not {sorted(unknown)}"
            )
        self.optional_columns = tuple(optional_columns)
        self.tools: list[dict[str, Any]] | None = None

    # -- data ---------------------------------------------------------------------------

    def get_dataset(self, n: int = -1, *, seed: int | None = None) -> list[dict[str, Any]]:
        """The first ``n`` train rows as a list.

        All of them are held: ``iter_dataset`` is for a run of any length.

        Args:
            n: How many rows (-1: all).
            seed: Shuffles a sized dataset.
        """
        return list(self.iter_dataset(n, seed=seed))

    def get_eval_dataset(self, n: int = -1, *, seed: int | None = None) -> list[dict[str, Any]]:
        """The first ``n`` eval rows as a list.

        All of them are held: ``iter_eval_dataset`` is for a run of any length.

        Args:
            n: How many rows (-1: all).
            seed: Shuffles a sized dataset.
        """
        return list(self.iter_eval_dataset(n, seed=seed))

    def iter_dataset(self, n: int = -1, *, seed: int | None = None) -> Iterator[dict[str, Any]]:
        """The first ``n`` train rows (the eval rows when there is no train split), one at a time.

        Read as the iterator advances (``vf_mm.envs`` rows: any size, streamed sources
        included).

        Args:
            n: How many rows (-1: all).
            seed: Shuffles a sized dataset.
        """
        source = self.dataset if self.dataset is not None else self.eval_dataset
        return iter_rows(source, n, seed=seed, name=f"{self.env_id}: dataset")

    def iter_eval_dataset(
        self, n: int = -1, *, seed: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The first ``n`` eval rows (the train rows when there is no eval split), one at a time.

        Read as the iterator advances; what ``evaluate`` runs when given no rows.

        Args:
            n: How many rows (-1: all).
            seed: Shuffles a sized dataset.
        """
        source = self.eval_dataset if self.eval_dataset is not None else self.dataset
        return iter_rows(source, n, seed=seed, name=f"{self.env_id}: eval_dataset")

    def dataset_size(
        self, n: int = -1, *, holds: Callable[[Any], bool] | None = None
    ) -> int | None:
        """How many rows ``iter_dataset(n)`` gives, or None when the dataset is streamed.

        A streamed dataset has no length: the count is known only at its end.

        Args:
            n: As for ``iter_dataset``.
            holds: Count only the rows whose example id it holds (a shard).
        """
        source = self.dataset if self.dataset is not None else self.eval_dataset
        return count_rows(source, n, holds=holds)

    def eval_dataset_size(
        self, n: int = -1, *, holds: Callable[[Any], bool] | None = None
    ) -> int | None:
        """How many rows ``iter_eval_dataset(n)`` gives, or None when that needs reading them.

        A streamed dataset has no length.

        Args:
            n: As for ``iter_eval_dataset``.
            holds: Count only the rows whose example id it holds (a shard).
        """
        source = self.eval_dataset if self.eval_dataset is not None else self.dataset
        return count_rows(source, n, holds=holds)

    def format_prompt(self, row: Mapping[str, Any]) -> Messages:
        """The prompt messages of one dataset row (never mutates the row).

        Args:
            row: A dataset row (see the class for its columns).

        Raises:
            MessageError: A row whose prompt is not a message list.
        """
        messages: list[dict[str, Any]]
        _refuse_misnamed_media(row, self.env_id)
        if row.get("prompt") is not None and row.get("question") is not None:
            _refuse_two_prompts(row, self.env_id)
        if isinstance(row.get("prompt"), str):  # a bare string is the user's text
            messages = [{"role": "user", "content": row["prompt"]}]
        elif row.get("prompt") is not None:  # one message dict, or a list of them
            messages = cast(
                list[dict[str, Any]],
                check_messages(row["prompt"], where=f"{self.env_id}: the 'prompt' column"),
            )
        elif row.get("question") is not None:  # text, never str()-ed (bytes: decode them)
            question = check_text(row["question"], where=f"{self.env_id}: the 'question' column")
            messages = [{"role": "user", "content": question}]
        else:
            raise ValueError("a dataset row needs a 'question' or a 'prompt' column")
        images: list[Any] = []
        for column in IMAGE_COLUMNS:
            value = row.get(column)
            if value is None:
                continue
            images.extend(value if isinstance(value, (list, tuple)) else [value])
        videos = [] if row.get("video") is None else [row["video"]]  # one clip: frames list ok
        if row.get("videos") is not None:
            value = row["videos"]
            videos.extend(value if isinstance(value, (list, tuple)) else [value])
        if images or videos:
            first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
            if first is None:
                raise ValueError("a row with images or videos needs a user message to put them in")
            content = messages[first]["content"]
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            media = [*(_video_part(v) for v in videos), *(_image_part(i) for i in images)]
            messages[first] = {**messages[first], "content": [*media, *parts]}
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            system = check_text(self.system_prompt, where=f"{self.env_id}: system_prompt")
            messages = [{"role": "system", "content": system}, *messages]
        return cast(Messages, messages)

    def sampling(self, overrides: Mapping[str, Any] | None = None) -> SamplingParams:
        """The environment's sampling defaults with ``overrides`` over them.

        Args:
            overrides: Sampling arguments that win over ``sampling_args``.
        """
        return SamplingParams.from_dict({**self.sampling_args, **dict(overrides or {})})

    # -- rollouts -----------------------------------------------------------------------

    async def rollout(
        self,
        client: RendererClient,
        row: Mapping[str, Any],
        *,
        example_id: int | str = 0,
        rollout_index: int = 0,
        sampling: SamplingParams | None = None,
    ) -> State:
        """Run one rollout of ``row`` and return its final state (subclasses implement it).

        A failure (a backend, image or environment error, a timeout) is recorded as the state's
        ``error``, never raised: it fails this rollout only.

        Args:
            client: The client model turns go through.
            row: The dataset row.
            example_id: The example's id.
            rollout_index: Which of the example's rollouts this is.
            sampling: This rollout's sampling (default: the environment's).
        """
        raise NotImplementedError

    async def evaluate(
        self,
        client: RendererClient,
        *,
        num_examples: int = -1,
        rollouts_per_example: int = 1,
        concurrency: int = 32,
        sampling_args: Mapping[str, Any] | None = None,
        seed: int | None = None,
        skip: set[tuple[Any, int]] | frozenset[tuple[Any, int]] | None = None,
        on_result: Callable[[RolloutOutput, int], Awaitable[None] | None] | None = None,
        rows: Iterable[Mapping[str, Any]] | None = None,
        example_ids: Iterable[Any] | None = None,
        keep_outputs: bool | None = None,
    ) -> list[RolloutOutput]:
        """Run ``rollouts_per_example`` rollouts of the first ``num_examples`` eval rows.

        Rollouts of one example are scored together (group rewards see the group).

        Memory is flat in the number of rows: at most ``concurrency`` rollouts run at once, and
        a row is pulled from ``rows`` (or the eval dataset) only when a rollout slot frees up,
        never scheduled up front; a group's finished rollouts wait for its last one, then are
        scored and handed over. The slot a group's last rollout held is released only after
        ``on_result`` returns, so a slow consumer (a writer, a trainer stream) slows the run
        instead of piling up scored groups.

        Args:
            client: The client the rollouts' model turns go through.
            num_examples: How many rows (-1: all).
            rollouts_per_example: Rollouts per row (a group).
            concurrency: The most rollouts running at once.
            sampling_args: Sampling over the environment's defaults.
            seed: Seeds sampling per rollout (example, index).
            skip: ``(example_id, rollout_index)`` pairs already done (a resumed run).
            on_result: ``on_result(output, rollout_index)``, called with each scored rollout
                as soon as its group finishes (sync or async).
            rows: Replaces the eval dataset (a trainer passes a batch of training rows): any
                iterable of rows, a generator included.
            example_ids: Names the ``rows``, in step with them (default: a row's
                ``example_id`` column, else its position), so a slice of a dataset run
                elsewhere keeps the ids it has in the whole.
            keep_outputs: Whether the outputs are also kept and returned, in the order they
                were handed over. They hold every step's tokens and images' model inputs, so a
                run of any length must not keep them: by default (None) they are kept only
                when there is no ``on_result`` (the returned list is then the only way to see
                them); with ``on_result`` the list returned is empty unless
                ``keep_outputs=True``.
        """
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if rows is None:
            rows = self.iter_eval_dataset(num_examples)
        sized = hasattr(rows, "__len__") and hasattr(example_ids, "__len__")
        if example_ids is not None and sized and len(example_ids) != len(rows):  # type: ignore[arg-type]
            raise ValueError(f"{len(example_ids)} example_ids for {len(rows)} rows")  # type: ignore[arg-type]
        keep = on_result is None if keep_outputs is None else keep_outputs
        sampling = self.sampling(sampling_args)
        skip = skip or frozenset()
        outputs: list[RolloutOutput] = []
        jobs = _jobs(rows, example_ids, rollouts_per_example, skip)

        async def one(group: _Group, index: int) -> State:
            params = sampling
            if seed is not None:
                key = f"{seed}:{group.example_id}:{index}".encode()
                params = _with_seed(sampling, zlib.crc32(key))  # stable across processes
            return await self.rollout(
                client, group.row, example_id=group.example_id, rollout_index=index,
                sampling=params,
            )  # fmt: skip

        async def lane() -> None:
            # one rollout slot: pulls the next (group, index), runs it, and when it was the
            # group's last, scores the group and hands it over before pulling again
            for group, index in jobs:
                group.states[index] = await one(group, index)
                if len(group.states) < len(group.todo):
                    continue
                states = [group.states.pop(i) for i in group.todo]
                for i, output in zip(group.todo, await self.score(states), strict=True):
                    if keep:
                        outputs.append(output)
                    if on_result is not None:
                        result = on_result(output, i)
                        if inspect.isawaitable(result):
                            await result

        lanes = [asyncio.ensure_future(lane()) for _ in range(concurrency)]
        try:
            await asyncio.gather(*lanes)
        except BaseException:  # one lane failed, or the run was cancelled: stop them all
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            raise
        return outputs

    async def score(self, states: Sequence[State]) -> list[RolloutOutput]:
        """Score one example's group of rollouts.

        A reward function that fails on one rollout fails that rollout
        (``Rubric.score_group``); a failure that concerns the whole group (a group reward
        function) becomes each rollout's error.

        Args:
            states: The group's finished states.
        """
        start = time.perf_counter()
        try:
            scores = await self.rubric.score_group(states)
        except Exception as exc:  # env code: record it, keep the run going
            error = RolloutError.from_exception(exc, where="scoring the example's group")
            scores = [(None, {})] * len(states)
            for state in states:
                state["error"] = state.get("error") or error
        elapsed = time.perf_counter() - start
        outputs = []
        for state, (reward, metrics) in zip(states, scores, strict=True):
            state["timing"]["scoring_s"] = elapsed
            # environment code may store an exception or a message in state["error"] itself
            failure = RolloutError.coerce(state.get("error"))
            outputs.append(
                RolloutOutput.from_state(state, reward=reward, metrics=metrics, error=failure)
            )
        return outputs

    def new_state(self, row: Mapping[str, Any], *, example_id: Any, rollout_index: int) -> State:
        """A fresh rollout ``State`` for one row: its checked prompt, its columns, a new session id.

        Args:
            row: The dataset row.
            example_id: The example's id (named in errors).
            rollout_index: Which of the example's rollouts this is.

        Raises:
            MessageError: The row's prompt is not a message list (naming the example).
        """
        try:
            formatted = self.format_prompt(row)
        except MessageError as exc:  # name the row: format_prompt sees only its columns
            error = MessageError(f"example {example_id!r}: {exc}", where=exc.where)
            error.hint = exc.hint
            raise error from None
        prompt = check_messages(
            formatted, where=f"{self.env_id}: the prompt of example {example_id!r}"
        )
        info = row.get("info")
        if info is not None and not isinstance(info, Mapping):
            raise MessageError(
                f"example {example_id!r}: {self.env_id}: the 'info' column is a "
                f"{type(info).__name__}, not a dict",
                where=f"example {example_id!r}, the 'info' column",
                hint='info is a dict of JSON values (a note goes in as {"note": "..."}); '
                "other per-row values are columns of their own",
            )
        return State(
            prompt=prompt,
            completion=[],
            answer=row.get("answer"),
            info=dict(info or {}),
            task=row.get("task", self.env_id),
            example_id=example_id,
            rollout_index=rollout_index,
            turn=0,
            trajectory=[],
            error=None,
            truncated=False,
            timing={"generation_s": 0.0, "env_s": 0.0, "total_s": 0.0},
            row=dict(row),
            missing_columns=self.missing_columns(row),
            session_id=uuid.uuid4().hex,
        )

    def missing_columns(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        """The scored columns ``row`` lacks (or holds null) that are not declared optional.

        Args:
            row: A dataset row.
        """
        return tuple(
            c for c in SCORED_COLUMNS if row.get(c) is None and c not in self.optional_columns
        )


class MultiTurnEnv(Environment):
    """Model turn, ``env_response``, repeat.

    Until ``max_turns`` model turns or a stop condition (a method marked
    ``@vf_mm.stop``) holds, or ``env_response`` sets ``state["done"] = True``.
    ``timeout_s`` bounds one rollout.

    Args:
        max_turns: The most model turns in a rollout (an int >= 1).
        **kwargs: ``Environment``'s arguments.

    Raises:
        ValueError: ``max_turns`` is not an int >= 1.
    """

    def __init__(self, *, max_turns: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self._stops = [
            getattr(self, name)
            for name in dir(type(self))
            if getattr(getattr(type(self), name, None), _STOP_ATTR, False)
        ]

    async def setup_state(self, state: State) -> None:
        """Hook: prepare per-rollout state before the first turn (sync or async).

        Args:
            state: The rollout's state.
        """

    async def env_response(self, messages: Messages, state: State) -> Messages:
        """The environment's answer to the model's last message (new messages to append).

        Args:
            messages: The conversation so far, the model's message last.
            state: The rollout's state.
        """
        return []

    async def finish_state(self, state: State) -> None:
        """Hook: called once the rollout's last model turn is in (sync or async), before scoring.

        The last turn gets no ``env_response`` (nobody would read it), so an environment whose
        state changes with the model's final action applies it here.

        Args:
            state: The rollout's state.
        """

    async def rollout(
        self,
        client: RendererClient,
        row: Mapping[str, Any],
        *,
        example_id: int | str = 0,
        rollout_index: int = 0,
        sampling: SamplingParams | None = None,
    ) -> State:
        start = time.perf_counter()
        try:
            state = self.new_state(row, example_id=example_id, rollout_index=rollout_index)
        except Exception as exc:
            state = State(
                prompt=[], completion=[], answer=row.get("answer"), info=_info_or_empty(row),
                task=self.env_id, example_id=example_id, rollout_index=rollout_index, turn=0,
                trajectory=[], error=RolloutError.from_exception(exc, where="making the prompt"),
                timing={"generation_s": 0.0, "env_s": 0.0, "total_s": 0.0},
            )  # fmt: skip
            return state
        stage = _Stage()
        try:
            await asyncio.wait_for(
                self._run(client, state, sampling, stage), timeout=self.timeout_s
            )
        except TimeoutError:
            state["error"] = RolloutError(
                "TimeoutError", f"the rollout took longer than {self.timeout_s} s", stage.where
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a backend, image or env failure fails this rollout only
            state["error"] = RolloutError.from_exception(exc, where=stage.where)
        finally:
            if state.get("session_id") is not None:
                client.end_session(state["session_id"])
        state["timing"]["total_s"] = time.perf_counter() - start
        return state

    async def _run(
        self, client: RendererClient, state: State, sampling: SamplingParams | None, stage: _Stage
    ) -> None:
        stage.where = f"{self.env_id}.setup_state"
        await _maybe_await(self.setup_state(state))
        await self._loop(client, state, sampling, stage)
        if state.get("truncated"):  # its last model turn had its env_response already
            return
        stage.where = f"{self.env_id}.finish_state"
        await _maybe_await(self.finish_state(state))

    async def _loop(
        self, client: RendererClient, state: State, sampling: SamplingParams | None, stage: _Stage
    ) -> None:
        messages: Messages = list(state["prompt"])
        sampling = sampling or self.sampling()
        while True:
            turn_no = state["turn"] + 1
            stage.where = f"turn {turn_no}: model"
            t0 = time.perf_counter()
            params = sampling
            if sampling.seed is not None and state["turn"]:  # each turn its own random stream
                params = _with_seed(
                    sampling, zlib.crc32(f"{sampling.seed}:{state['turn']}".encode())
                )
            try:
                turn = await client.generate(
                    messages,
                    trajectory=state["trajectory"],
                    tools=self.tools,
                    sampling=params,
                    session_id=state.get("session_id"),
                )
            except PromptTooLongError:
                if not state["turn"]:  # not even the prompt fits: nothing to score
                    raise
                state["truncated"] = True  # out of context: scored on what it has
                return
            state["timing"]["generation_s"] += time.perf_counter() - t0
            state["trajectory"].append(turn.step(messages))
            messages = [*messages, cast(Message, turn.message)]
            state["turn"] += 1
            state["completion"] = messages[len(state["prompt"]) :]
            stage.where = f"turn {turn_no}: a stop condition"
            if await self._should_stop(state):
                return
            stage.where = f"turn {turn_no}: {self.env_id}.env_response"
            t0 = time.perf_counter()
            reply = check_messages(
                await _maybe_await(self.env_response(messages, state)),
                where=f"{self.env_id}.env_response returned (turn {turn_no})",
            )
            state["timing"]["env_s"] += time.perf_counter() - t0
            _refuse_made_up_turns(reply, self.env_id, turn_no)
            messages = [*messages, *reply]
            state["completion"] = messages[len(state["prompt"]) :]
            if state.get("done"):
                return

    async def _should_stop(self, state: State) -> bool:
        if state["turn"] >= self.max_turns:
            return True
        for check in self._stops:
            if await _maybe_await(check(state)):
                return True
        return False


class SingleTurnEnv(MultiTurnEnv):
    """One model turn per rollout."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["max_turns"] = 1
        super().__init__(**kwargs)


class _Stage:
    """Where a running rollout is (``where`` of its error record if it fails now)."""

    __slots__ = ("where",)

    def __init__(self) -> None:
        self.where = "starting"


def _info_or_empty(row: Mapping[str, Any]) -> dict[str, Any]:
    """A failed rollout's ``info``: the row's, where it is a dict (``new_state`` refuses
    any other by name), else empty."""
    info = row.get("info")
    return dict(info) if isinstance(info, Mapping) else {}


def _check_dataset(name: str, value: Any) -> None:
    """A dataset is a ``datasets.Dataset`` (map-style or streaming), a list of row dicts,
    any other sequence or iterable of rows, or a function returning one (``vf_mm.envs``
    rows); refuse the forms a user might pass by mistake with what to do instead. Only a
    list or tuple, already in memory, is checked row by row here: a lazy or streamed
    source is checked as its rows are read, since reading it all would defeat it."""
    if value is None or hasattr(value, "column_names"):  # a datasets.Dataset
        return
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{name} must be a list of row dicts or a datasets.Dataset, not a str; to use a "
            f"Hugging Face dataset by name: datasets.load_dataset({value!r}, split=...)"
        )
    if isinstance(value, Mapping):
        raise TypeError(
            f"{name} is a dict (of columns?): pass a list of row dicts, or "
            "datasets.Dataset.from_dict(columns)"
        )
    if isinstance(value, (list, tuple)):
        if not all(isinstance(row, Mapping) for row in value):
            raise TypeError(
                f"{name} must be a list of row dicts or a datasets.Dataset, not a "
                f"{type(value).__name__} holding other values"
            )
        return
    if isinstance(value, Iterable) or callable(value):
        return
    raise TypeError(
        f"{name} must be a list of row dicts, a datasets.Dataset, an iterable of rows or a "
        f"function returning one, not a {type(value).__name__}"
    )


class _Group:
    """One example's rollouts while they run: its row, the indices to run, and the states
    of those that finished (released once the group is scored)."""

    __slots__ = ("example_id", "row", "states", "todo")

    def __init__(self, row: Mapping[str, Any], example_id: Any, todo: list[int]) -> None:
        self.row = row
        self.example_id = example_id
        self.todo = todo
        self.states: dict[int, State] = {}


def _jobs(
    rows: Iterable[Mapping[str, Any]],
    example_ids: Iterable[Any] | None,
    rollouts_per_example: int,
    skip: set[tuple[Any, int]] | frozenset[tuple[Any, int]],
) -> Iterator[tuple[_Group, int]]:
    """Every ``(group, rollout_index)`` to run, pulling a row only when the previous
    row's rollouts have all been taken (lanes advance it one job at a time)."""
    ids: Iterator[Any] = iter(example_ids) if example_ids is not None else itertools.count()
    for position, row in enumerate(rows):
        try:
            example_id = next(ids)
        except StopIteration:
            raise ValueError(f"fewer example_ids than rows (row {position} has none)") from None
        if example_ids is None:
            example_id = row.get("example_id", example_id)
        todo = [i for i in range(rollouts_per_example) if (example_id, i) not in skip]
        if not todo:
            continue
        group = _Group(row, example_id, todo)
        for index in todo:
            yield group, index
    if example_ids is not None and next(ids, _END) is not _END:
        raise ValueError("more example_ids than rows")


_END = object()


def _refuse_made_up_turns(reply: Messages, env_id: str, turn_no: int) -> None:
    """An ``env_response`` answers the model: an ``assistant`` message in it would be a turn
    the model never sampled, rendered as its own (and trained on as context it did not
    write), so it fails the rollout naming the turn and the message."""
    for i, message in enumerate(reply):
        if message.get("role") == "assistant":
            where = f"{env_id}.env_response returned (turn {turn_no}), message {i}"
            raise MessageError(
                f"{where}: role 'assistant' would be a turn the model never sampled",
                where=where,
                hint="env_response returns the environment's side: 'user' or 'tool' messages "
                "(a note for the model goes in a user message)",
            )


def _refuse_misnamed_media(row: Mapping[str, Any], env_id: str) -> None:
    """A column whose name is close to ``image``/``images``/``video``/``videos`` and that
    holds an image is a misspelt image column: refused, since only the known image columns
    go into the prompt and the model would silently be asked about an image it never sees.
    An image under a name that is not close (``reference``) is the author's own, for a
    reward function to read through ``row``: ``check_environment`` warns about it."""
    for column, value in row.items():
        if column in KNOWN_COLUMNS or not holds_image(value):
            continue
        close = did_you_mean(str(column), (*IMAGE_COLUMNS, *VIDEO_COLUMNS), cutoff=0.75)
        if close is not None:
            raise MessageError(
                f"{env_id}: the row's column {column!r} holds an image but is not an image "
                f"column, so the image would not be in the prompt ({close})",
                where=f"the {column!r} column",
                hint=f"rename the column: images go in {IMAGE_COLUMNS[0]!r} (one) or "
                f"{IMAGE_COLUMNS[1]!r} (a list)",
            )


def holds_image(value: Any) -> bool:
    """Whether a column's value is an image (a PIL image, an array, encoded bytes, a path
    to an image file, a ``datasets`` Image feature) or a list of them."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(holds_image(v) for v in value)
    if isinstance(value, Mapping):
        return value.get("type") in IMAGE_PART_TYPES or (
            "bytes" in value and "path" in value and len(value) == 2
        )
    if isinstance(value, str):
        return value.lower().endswith(_IMAGE_SUFFIXES)
    return is_image_value(value)


def _refuse_two_prompts(row: Mapping[str, Any], env_id: str) -> None:
    """A row with a ``prompt`` and a ``question`` renders the prompt only; that is
    accepted where the question is the prompt's user text (verifiers' formatted datasets
    keep both columns), refused where it is not (the question would be silently lost)."""
    question = row["question"]
    prompt = row["prompt"]
    messages = [prompt] if isinstance(prompt, (str, Mapping)) else prompt
    texts: list[str] = []
    if isinstance(messages, (list, tuple)):
        for message in messages:
            if isinstance(message, str):
                texts.append(message)
                continue
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, (list, tuple)):
                texts += [p.get("text") or "" for p in content if isinstance(p, Mapping)]
    if isinstance(question, str) and any(question in text for text in texts):
        return
    raise MessageError(
        f"{env_id}: the row has both a 'prompt' and a 'question' column, and the question "
        "is not in the prompt: which one is asked is ambiguous",
        where="the 'prompt' and 'question' columns",
        hint="keep one: 'question' is the user's text (the row's images go with it); "
        "'prompt' is the whole message list, with the question in its user message",
    )


def _image_part(image: Any) -> dict[str, Any]:
    if isinstance(image, Mapping) and image.get("type") in IMAGE_PART_TYPES:
        return dict(image)
    if isinstance(image, Mapping) and "bytes" in image:  # datasets' Image feature, undecoded
        return {"type": "image", "image": image["bytes"] if image["bytes"] else image.get("path")}
    return {"type": "image", "image": image}


def _video_part(video: Any) -> dict[str, Any]:
    if isinstance(video, Mapping) and video.get("type") in VIDEO_PART_TYPES:
        return dict(video)
    if isinstance(video, Mapping) and ("bytes" in video or "path" in video):
        # datasets' Video feature, undecoded: the file's bytes, else its path
        return {"type": "video", "video": video.get("bytes") or video.get("path")}
    return {"type": "video", "video": video}


def _with_seed(sampling: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(sampling, seed=seed)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
