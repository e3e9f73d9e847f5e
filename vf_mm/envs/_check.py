"""``check_environment``: what an environment author runs in their own tests.

It runs the environment the way ``vf-mm eval`` does, against a scripted policy on an
offline tiny VLM of the family the environment is meant for (``family=``: templates and
processors differ in what they refuse, so a check on one family says little about
another), and reports every problem at once (``EnvironmentCheckError``):

- **the dataset**: each eval row has a ``question`` or a ``prompt``, formats into valid
  messages whose images load through the image policy, and has every column a reward
  function asks for (``answer``, ``info``) unless the environment declares it optional;
  its ``answer`` and ``info`` are JSON (what results.jsonl stores: an image there would
  fail every rollout when ``vf-mm eval`` writes it);
- **the rollouts**: two per example, one at a time. The default policy calls each of the
  environment's tools once, in order, with arguments made from the tool's schema (or
  ``tool_args``), then answers; every ``env_response`` and tool result is checked where
  it enters the rollout, as in a real run. Every rollout must finish without an error,
  with a finite reward and finite metrics;
- **determinism**: a second run with the same seed gives each rollout the same reward.
  This is checked only when the replies are deterministic (the default policy or a list
  of strings; a callable may sample).

- **the rubric** (``_rubric_check``): an ``answer`` that is a number where a reward
  function compares parsed text (a problem where a probe proves it, else a warning),
  a reward-function parameter whose name is a near miss of one the rubric supplies, a
  reward that gives rollouts with different final replies the same score (warnings).

The report counts what it saw: rows, the dataset's images and videos, the new images
and videos each model turn was shown (the prompt's on turn 1, environment and tool ones
after), the tool
calls made and the tools that answered with an error (``"Error: ..."``), and the rewards.
Its ``warnings`` say what a tool's schema leaves the model to guess (no description, a
parameter without a type hint or an ``Args:`` line, an ``Args:`` line naming no
parameter): the model sees only the schema; and what the rubric checks above could not
prove wrong but look it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vf_mm._json import to_json_value
from vf_mm.envs._env import (
    IMAGE_COLUMNS,
    KNOWN_COLUMNS,
    VIDEO_COLUMNS,
    Environment,
    holds_image,
)
from vf_mm.envs._messages import check_messages, did_you_mean
from vf_mm.envs._rubric import Rubric, asked_columns
from vf_mm.envs._rubric_check import answer_findings, constant_reward, unsupplied_defaults
from vf_mm.envs._tools import schema_gaps
from vf_mm.errors import EnvironmentCheckError, ResultsError, VfMmError
from vf_mm.types import image_parts, video_parts

DEFAULT_ANSWER = "I think the answer is 1."


def check_environment(
    env: Environment,
    *,
    num_examples: int = 2,
    replies: Sequence[str] | Callable[[Any], str] | None = None,
    tool_args: Mapping[str, Mapping[str, Any]] | None = None,
    family: str | None = None,
    model_dir: str | Path | None = None,
    image_policy: Any = None,
) -> dict[str, Any]:
    """Run the checks; return the report, or raise listing every problem found.

    The report::

        {"family": the model_type rendered with, "rows": rows checked,
         "images": dataset images loaded,
         "videos": dataset videos loaded,
         "images_per_turn": [[new images at model turn 1, 2, ...] per rollout],
         "videos_per_turn": [[new videos at model turn 1, 2, ...] per rollout],
         "tool_calls": {tool: calls made}, "tool_errors": {tool: its first error answer},
         "warnings": [what a tool schema leaves the model to guess],
         "rewards": [reward per rollout], "seconds": wall time}

    Args:
        env: The environment to check.
        num_examples: How many rows to roll out.
        replies: What the model "says": strings used in turn, or a function of the
            ``GenerateRequest`` (``request.messages`` is the conversation so far). Default:
            the scripted tool policy described in the module docstring, then
            ``DEFAULT_ANSWER``.
        tool_args: Arguments per tool name for that policy, where the schema's own
            examples (the first enum value, 1, 1.0, "a", ...) would be refused by the tool.
        family: The model family the environment is meant for (a ``model_type``, one of
            ``vf_mm.models.VISION_FAMILIES``): the rollouts render with that family's tiny
            checkpoint, built offline once and cached (``vf_mm.models.cached_tiny_vlm``), so
            what its template or processor refuses (a literal ``<image>`` on
            LLaVA-OneVision, a ``tool`` message on Gemma 3) is found here. Default:
            ``qwen2_5_vl``.
        model_dir: A checkpoint directory to render with instead (not with ``family``).
        image_policy: The ``ImagePolicy`` dataset images are loaded under (default:
            ``ImagePolicy()``).

    Raises:
        EnvironmentCheckError: Problems were found (all of them listed).
    """
    from vf_mm.images import ImagePolicy

    start = time.perf_counter()
    model = _checkpoint(family, model_dir)
    problems: list[str] = []
    report: dict[str, Any] = {"family": _family_of(model), "rows": 0, "images": 0, "videos": 0}
    try:
        rows = env.get_eval_dataset(num_examples)
    except Exception as exc:
        raise EnvironmentCheckError(
            f"{env.env_id}: the eval dataset cannot be read: {exc}", problems=[str(exc)]
        ) from exc
    if not rows:
        problems.append("the eval dataset is empty")
    policy = image_policy if image_policy is not None else ImagePolicy()
    row_warnings: list[str] = []
    for i, row in enumerate(rows):
        problems += _check_row(env, i, row, policy, report)
        row_warnings += _row_warnings(i, row)

    report["warnings"] = row_warnings + [
        gap for func in getattr(env, "tool_funcs", {}).values() for gap in schema_gaps(func)
    ]
    if not any(rf.weight for rf in getattr(env.rubric, "funcs", [])) and (
        type(env.rubric).score_group is Rubric.score_group
    ):
        report["warnings"].append(
            "no reward functions: every reward is 0.0, so every advantage is 0 and training "
            "learns nothing; pass rubric=vf.Rubric([your_reward_func])"
        )
    answer_problems, answer_warnings = answer_findings(env.rubric, rows, task=env.env_id)
    problems += answer_problems
    report["warnings"] += answer_warnings + unsupplied_defaults(env.rubric)
    if tool_args is not None and replies is not None:
        raise ValueError(
            "tool_args sets the default tool policy's arguments; with replies= it is unused"
        )
    deterministic = replies is None or not callable(replies)
    if replies is None:
        replies = tool_policy(env.tools or [], tool_args=tool_args, tool_format=_tool_format(model))
    runs = _scripted_runs(env, rows, replies, model, 2 if deterministic else 1)
    if isinstance(runs, Exception):
        problems.append(
            f"evaluate() raised instead of recording errors: {type(runs).__name__}: {runs}"
        )
        runs = [{}]
    first = runs[0]
    report["images_per_turn"] = [_new_per_turn(out, image_parts) for out in first.values()]
    report["videos_per_turn"] = [_new_per_turn(out, video_parts) for out in first.values()]
    report["tool_calls"], report["tool_errors"] = _tool_use(first.values())
    report["rewards"] = []
    for (example_id, index), out in sorted(first.items(), key=lambda kv: str(kv[0])):
        where = f"example {example_id!r} rollout {index}"
        if out.error:
            problems.append(f"{where}: the rollout failed: {out.error}")
            continue
        for field in ("answer", "info"):  # what results.jsonl stores as JSON
            problem = _not_json(getattr(out, field))
            if problem:
                problems.append(f"{where}: its {field} {problem}")
        for name, value in {"reward": out.reward, **out.metrics}.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"{where}: {name} is {value!r}, not a finite number")
        report["rewards"].append(out.reward)
    report["warnings"] += constant_reward(first.values())
    if len(runs) == 2:
        differ = [
            k for k in first if runs[1].get(k) is None or runs[1][k].reward != first[k].reward
        ]
        if differ:
            problems.append(
                f"two runs with the same seed and the same scripted replies gave different "
                f"rewards for {len(differ)} rollout(s) (first: example {differ[0][0]!r} rollout "
                f"{differ[0][1]}): the environment or its rubric is not deterministic"
            )
    report["seconds"] = time.perf_counter() - start
    if problems:
        counted = Counter(problems)
        lines = [p if n == 1 else f"{p} (× {n})" for p, n in counted.items()]  # noqa: RUF001
        raise EnvironmentCheckError(
            f"{env.env_id}: {len(problems)} problem(s):\n- " + "\n- ".join(lines),
            problems=problems,
        )
    return report


def tool_policy(
    tools: Sequence[Mapping[str, Any]],
    *,
    tool_args: Mapping[str, Mapping[str, Any]] | None = None,
    answer: str = DEFAULT_ANSWER,
    tool_format: str = "json",
) -> Callable[[Any], str]:
    """A scripted policy (a ``ScriptedBackend`` reply function): on each turn it calls the
    next tool of ``tools`` (OpenAI-style schemas) this conversation has not called yet,
    with ``tool_args[name]`` or arguments made from its schema; once every tool has been
    called, it answers ``answer``. It needs a ``GenerateRequest`` that carries its
    conversation (``RendererClient`` sets ``request.messages``). ``tool_format`` is the
    model's call format (``"json"``, or ``"xml"`` for Qwen3.5)."""
    tool_args = dict(tool_args or {})
    names = [t["function"]["name"] for t in tools]
    unknown = set(tool_args) - set(names)
    if unknown:
        raise ValueError(f"tool_args names {sorted(unknown)}; the tools are {names}")
    calls = {
        t["function"]["name"]: dict(
            tool_args.get(t["function"]["name"])
            or example_value(t["function"].get("parameters") or {"type": "object"})
        )
        for t in tools
    }

    def reply(request: Any) -> str:
        called = {
            call.get("function", {}).get("name")
            for m in request.messages or ()
            if m.get("role") == "assistant"
            for call in m.get("tool_calls") or ()
        }
        todo = [name for name in names if name not in called]
        if not todo:
            return answer
        from vf_mm.renderers import format_tool_calls

        return format_tool_calls([(todo[0], calls[todo[0]])], tool_format=tool_format)

    return reply


def _checkpoint(family: str | None, model_dir: str | Path | None) -> Path:
    """The checkpoint the check renders with: ``model_dir``, or ``family``'s cached tiny one."""
    from vf_mm.models import cached_tiny_vlm

    if model_dir is not None:
        if family is not None:
            raise ValueError(
                f"check_environment takes family= or model_dir=, not both: family={family!r} "
                "builds that family's tiny checkpoint, model_dir= is a checkpoint of your own"
            )
        return Path(model_dir)
    return cached_tiny_vlm("qwen2_5_vl" if family is None else family)


def _family_of(model: Path) -> str | None:
    """The checkpoint's ``model_type`` (None for a directory without a config)."""
    from vf_mm.models import model_type

    return model_type(model) if (model / "config.json").exists() else None


def _tool_format(model: Path) -> str:
    """The tool-call format of the checkpoint the check renders with."""
    from vf_mm.models import VISION_FAMILIES, family_info

    family = _family_of(model)
    return family_info(family).tool_format if family in VISION_FAMILIES else "json"


def example_value(schema: Mapping[str, Any]) -> Any:
    """A small value valid under a JSON schema (the subset ``tool_schema`` writes): the
    first enum value, a number within its bounds, "a", True, an object with its required
    properties, an array of ``minItems`` examples."""
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return example_value(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind in ("integer", "number"):
        value = 1 if kind == "integer" else 1.0
        if "minimum" in schema:
            value = max(value, schema["minimum"])
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return value
    if kind == "boolean":
        return True
    if kind == "array":
        return [example_value(schema.get("items") or {})] * int(schema.get("minItems", 0))
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: example_value(props.get(name) or {}) for name in schema.get("required", [])}
    return "a"


# -- the pieces ----------------------------------------------------------------------


def _check_row(
    env: Environment, i: int, row: Mapping[str, Any], policy: Any, report: dict[str, Any]
) -> list[str]:
    from vf_mm.images import load_image
    from vf_mm.videos import load_video

    if row.get("question") is None and row.get("prompt") is None:
        return [f"row {i} has neither a 'question' nor a 'prompt' column"]
    try:
        prompt = check_messages(env.format_prompt(row), where=f"row {i}: the prompt")
    except Exception as exc:
        return [f"row {i} does not format into a prompt: {type(exc).__name__}: {exc}"]
    report["rows"] += 1
    problems = []
    for field in ("answer", "info"):
        problem = _not_json(row.get(field))
        if problem:
            problems.append(f"row {i}: its {field!r} column {problem}")
    for column in env.missing_columns(row):
        for rf in env.rubric.funcs:
            if column in asked_columns(rf.func):
                problems.append(
                    f"row {i} has no {column!r} (or it is null) but reward function "
                    f"{rf.name} asks for it: give every row one, or declare "
                    f"optional_columns=[{column!r}]"
                )
    for count, parts, load in (("images", image_parts, load_image),
                               ("videos", video_parts, load_video)):  # fmt: skip
        for m, p, part in parts(prompt):
            try:
                load(part, policy=policy, where=f"row {i}, message {m}, part {p}")
                report[count] += 1
            except VfMmError as exc:
                problems.append(str(exc))
    return problems


def _row_warnings(i: int, row: Mapping[str, Any]) -> list[str]:
    """What a row holds that formats without error but likely not as meant: a null image
    or video column (a text-only prompt: fine in a dataset mixing text rows, a lost image
    otherwise), an image under a column vf_mm does not put in the prompt, a column whose
    name is close to one vf_mm reads (a typo)."""
    warnings = []
    for column in (*IMAGE_COLUMNS, *VIDEO_COLUMNS):
        if column in row and row[column] is None:
            warnings.append(
                f"row {i}: its {column!r} column is null, so its prompt is text only: drop "
                "the column from rows meant to be text only, or give the media"
            )
    for column, value in row.items():
        if column in KNOWN_COLUMNS or not isinstance(column, str):
            continue
        if holds_image(value):  # a name close to an image column is refused by format_prompt
            warnings.append(
                f"row {i}: column {column!r} holds an image that is not in the prompt "
                f"(only {', '.join(map(repr, IMAGE_COLUMNS))} are): a reward function can "
                "read it through row; rename it if the model should see it"
            )
        elif (close := did_you_mean(column, KNOWN_COLUMNS, cutoff=0.8)) is not None:
            warnings.append(f"row {i}: column {column!r} is not one vf_mm reads ({close})")
    return warnings


def _scripted_runs(
    env: Environment,
    rows: list[dict[str, Any]],
    replies: Sequence[str] | Callable[[Any], str],
    model: Path,
    times: int,
) -> list[dict[tuple[Any, int], Any]] | Exception:
    """``times`` seeded runs of two rollouts per row, one rollout at a time (so replies
    from a list reach the same turns every run): ``{(example_id, index): output}`` each."""
    from vf_mm.client import RendererClient
    from vf_mm.inference._internal import ScriptedBackend
    from vf_mm.renderers import load_renderer

    renderer = load_renderer(model)

    async def run() -> dict[tuple[Any, int], Any]:
        client = RendererClient(ScriptedBackend(renderer, replies), renderer)
        outs: dict[tuple[Any, int], Any] = {}

        def keep(output: Any, index: int) -> None:
            outs[(output.example_id, index)] = output

        await env.evaluate(
            client, rows=rows, rollouts_per_example=2, concurrency=1, seed=0, on_result=keep
        )
        return outs

    try:
        return [asyncio.run(run()) for _ in range(times)]
    except Exception as exc:
        return exc


def _not_json(value: Any) -> str | None:
    """Why results.jsonl cannot store ``value`` (an answer or info), or None: the writer's
    own rule (``to_json_value``). Images are stored (as assets) only from message content
    parts, so one in ``info`` is refused."""
    try:
        to_json_value(value, "value")
    except ResultsError as exc:
        return (
            f"cannot be stored in results.jsonl ({str(exc).removeprefix('value').lstrip(', :')}): "
            "keep JSON values there (numbers, strings, lists, str-keyed dicts); for an image, "
            "keep a path or the parameters to redraw it"
        )
    return None


def _new_per_turn(output: Any, parts: Any) -> list[int]:
    """How many images (or videos: ``parts`` finds them) each model turn saw for the
    first time."""
    counts, seen = [], 0
    for step in output.trajectory:
        shown = len(parts(step.prompt))
        counts.append(shown - seen)
        seen = shown + len(parts(step.completion))
    return counts


def _tool_use(outputs: Any) -> tuple[dict[str, int], dict[str, str]]:
    calls: Counter[str] = Counter()
    errors: dict[str, str] = {}
    for out in outputs:
        names = {}
        for m in out.completion:
            for call in m.get("tool_calls") or ():
                names[call.get("id")] = call.get("function", {}).get("name", "?")
                calls[names[call.get("id")]] += 1
            content = m.get("content")
            if m.get("role") == "tool" and isinstance(content, str) and content.startswith("Error"):
                errors.setdefault(names.get(m.get("tool_call_id"), m.get("name", "?")), content)
    return dict(calls), errors
