"""``TurnBridge``: the next turn's prompt, built on the previous turn's tokens.

The next turn's prompt is the previous prompt, the sampled completion tokens verbatim,
the template's turn closing, and the new messages rendered as the template would render
them after that assistant turn. A bridge returns a ``Refusal`` (the renderer then counts
it and the caller re-renders) whenever it cannot guarantee the result equals a full
render: an assistant message in the new messages, a template that renders earlier turns
differently once later turns exist (Qwen3's dropping of earlier reasoning is caught this
way), image pads in the previous tokens without the multi-modal data that explains
them, and so on.

Where the text after the completion comes from is one ``BridgePlan``, chosen once per
bridge from what the caller gave and the template's ``TemplateFacts``:

- with the real history (``previous_messages``) ending in the sampled turn, and a
  completion closed by a stop token, one render of that history gives the text
  (built as ChatML without running the template, for the known ChatML templates): the
  bridged text then equals the full render's by construction;
- otherwise the template renders a probe conversation (sentinel strings for the user
  and assistant text) with and without the new messages, and the difference is the
  text; with the real history the render of that history must then agree with the
  probe's text, without it the tokens are checked for what they can show.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from vf_mm.renderers._chatml import chatml_tail
from vf_mm.renderers._counts import CountedLists, Counts
from vf_mm.renderers._drops import refuse_dropped
from vf_mm.renderers._facts import PROBE_CONTENT, PROBE_REASONING, PROBE_USER, TemplateFacts
from vf_mm.types import MultiModalData, RenderedTokens

if TYPE_CHECKING:
    from vf_mm.renderers._template import ChatTemplateRenderer

#: prefix probes kept, one per (template, tools): a few, unless tools vary by rollout
_MAX_PROBES = 64


class Refusal:
    """Why a bridge was not built (the caller re-renders)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Replay(Enum):
    """How the real history is rendered, to give or to check the text after the turn."""

    #: the template rewrites earlier turns (``history_sensitive``): the whole history
    HISTORY = "history"
    #: only the sampled turn can differ: that turn alone, after a probe user turn (the
    #: same cost at turn 2 and turn 200)
    TURN = "turn"


@dataclass(frozen=True, slots=True)
class BridgePlan:
    """How one bridge finds the text the template writes after the sampled completion.

    ``template``: the template rendering the conversation (None: the tokenizer's), and
    ``facts`` what it does. ``history``: the real history (``previous_messages``), None
    where the caller gave only tokens; ``replay`` how it is rendered (None without it).
    ``ends_with_turn``: the history ends with the sampled assistant message, which
    ``after_call`` says made tool calls (None: no history to tell). ``replay_gives_tail``:
    that turn ends with a stop token too, so one render of the history gives the text
    (the probe remains for a render that does not continue with what was sampled);
    ``chatml``: that render is built without running the template. ``check_lead``: only
    the tokens are known, and the completion must start with the template's lead.
    ``has_reasoning``: the probe's assistant turn carries reasoning (the template
    writes it, and the completion holds some that must survive the next turn).
    """

    template: str | None
    facts: TemplateFacts
    history: Sequence[Mapping[str, Any]] | None
    replay: Replay | None
    ends_with_turn: bool
    after_call: bool | None
    replay_gives_tail: bool
    chatml: bool
    check_lead: bool
    has_reasoning: bool


class TurnBridge:
    """The bridge of one ``ChatTemplateRenderer``: it renders, prepares messages and
    tokenizes through that renderer (one template call, one message check, one
    tokenizing for a render and a bridge alike), and reads its ``TemplateFacts``.
    Thread-safe: it keeps only the prefix probes and the counted lists, under locks."""

    def __init__(self, renderer: ChatTemplateRenderer) -> None:
        self._r = renderer
        self._lock = threading.Lock()
        self._probe_cache: dict[str, str] = {}
        self._counted = CountedLists() if renderer._embed_groups else None

    def remember(self, ids: list[int], counts: Counts) -> None:
        """``ids`` was returned with ``counts`` embedding tokens per group: a bridge onto
        it does not scan it again."""
        if self._counted is not None:
            self._counted.remember(ids, counts)

    def build(
        self,
        previous_prompt_ids: Sequence[int],
        previous_completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        previous_multi_modal_data: MultiModalData | None,
        previous_messages: Sequence[Mapping[str, Any]] | None,
    ) -> RenderedTokens | Refusal:
        """The bridged prompt (see the module docstring). Raises ``RenderError`` where
        the new messages themselves are refused, whether or not a bridge could be built."""
        r = self._r
        reason, counts = self._token_refusal(
            previous_prompt_ids, previous_completion_ids, new_messages, previous_multi_modal_data
        )
        first = len(previous_messages) if previous_messages is not None else 0
        template_messages, parts = r._prepare(new_messages, first=first)
        had_video = previous_multi_modal_data is not None and bool(
            previous_multi_modal_data.mm_placeholders.get("video")
        )
        template = r._template_for(had_video or any(m == "video" for _, _, m in parts))
        if reason is None and template != r._template_for(had_video):
            reason = "the first clip switches the chat template (SmolVLM's processor does)"
        completion = list(previous_completion_ids)
        plan = self._plan(template, previous_messages, completion, tools)
        refuse_dropped(plan.facts.drops, template_messages, name=r.name or "this model",
                       first=first, after_call=plan.after_call)  # fmt: skip
        reason = reason or self._unseen_refusal(plan, new_messages, previous_prompt_ids, completion)
        if reason is not None:
            return Refusal(reason)
        tail = self._replayed_tail(plan, template_messages, tools, completion)
        if tail is None:
            probed = self._probe_tail(plan, template_messages, tools, completion)
            if isinstance(probed, Refusal):
                return probed
            tail = probed
        base = [*previous_prompt_ids, *completion]
        rendered = r._tokenize(tail, parts, base=len(base))
        merged = rendered.multi_modal_data
        if previous_multi_modal_data is not None and not previous_multi_modal_data.is_empty:
            merged = previous_multi_modal_data.extended(merged or MultiModalData())
        token_ids = base
        token_ids += rendered.token_ids
        if merged is not None:
            merged.validate(len(token_ids))
        if counts is not None:  # the completion holds no embedding tokens (checked)
            new = r._count(rendered.token_ids)
            self.remember(token_ids, {group: n + new[group] for group, n in counts.items()})
        return RenderedTokens(token_ids=token_ids, multi_modal_data=merged)

    # -- the plan -------------------------------------------------------------------------

    def _plan(
        self,
        template: str | None,
        history: Sequence[Mapping[str, Any]] | None,
        completion: list[int],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> BridgePlan:
        """The plan of this bridge, chosen before anything is rendered from what the
        caller gave (the history or only tokens, the completion, the tools) and what
        ``template`` does."""
        r = self._r
        facts = r._facts[template]
        last = history[-1] if history else None
        ends_with_turn = last is not None and last.get("role") == "assistant"
        replay = None
        if history is not None:
            replay = Replay.HISTORY if facts.history_sensitive else Replay.TURN
        return BridgePlan(
            template=template,
            facts=facts,
            history=history,
            replay=replay,
            ends_with_turn=ends_with_turn,
            after_call=None if last is None else ends_with_turn and bool(last.get("tool_calls")),
            replay_gives_tail=(
                ends_with_turn and bool(completion) and completion[-1] in r.stop_token_ids
            ),
            chatml=replay is Replay.TURN and facts.chatml and not tools,
            check_lead=history is None and bool(facts.lead),
            # reasoning the template renders from ``reasoning_content`` (Qwen3) must
            # survive the next turn; a template that does not render it (Qwen2-VL,
            # Qwen2.5-VL) keeps the ``<think>`` text inside the content, which it renders
            # verbatim: nothing to check
            has_reasoning=facts.reasoning and r._think_end in completion,
        )

    def _token_refusal(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        previous: MultiModalData | None,
    ) -> tuple[str | None, Counts | None]:
        """Why the bridge cannot be built from these tokens (None: it can), and the
        previous prompt's embedding tokens per token group (None for a text model)."""
        r = self._r
        if not new_messages:
            return "no new messages", None
        stops = [i for i, t in enumerate(completion_ids) if t in r.stop_token_ids]
        if stops and stops[0] != len(completion_ids) - 1:
            return "the completion has a stop token before its end", None
        if any(m.get("role") == "assistant" for m in new_messages):
            return "an assistant message in the new messages", None
        if r.template_kwargs.get("add_vision_id"):
            return "add_vision_id numbers images across the whole conversation", None
        if r.vision is None:
            return None, None
        if not r.vision.marker_token_ids.isdisjoint(completion_ids):
            return "the completion contains image tokens", None
        counts = self._counted_in(prompt_ids)
        for tokens, modalities in r._embed_groups.items():
            covered = sum(
                p.num_embeds
                for m in modalities
                for p in (previous.mm_placeholders.get(m, ()) if previous else ())
            )
            if counts[tokens] != covered:
                return (
                    f"the previous prompt has {counts[tokens]} {' and '.join(modalities)} "
                    f"tokens but its multi-modal data covers {covered}"
                ), None
        return None, counts

    def _counted_in(self, ids: Sequence[int]) -> Counts:
        """The embedding tokens in ``ids`` per token group: remembered for a list this
        renderer returned (so the count costs nothing at turn 200), else scanned."""
        known = self._counted.get(ids) if self._counted is not None else None
        if known is not None:
            return known
        return self._r._count(ids if isinstance(ids, list) else list(ids))

    def _unseen_refusal(
        self,
        plan: BridgePlan,
        new_messages: Sequence[Mapping[str, Any]],
        prompt_ids: Sequence[int],
        completion: list[int],
    ) -> str | None:
        """Why the bridge cannot be checked without the history the caller did not give
        (None: it can)."""
        drops = plan.facts.drops
        if (
            plan.after_call is None
            and drops.tool_without_call
            and any(m.get("role") == "tool" for m in new_messages)
        ):
            return (
                "the template writes a tool message only after the call it answers, which "
                "the bridge cannot see without previous_messages"
            )
        if plan.history is not None or not plan.facts.history_sensitive:
            return None
        # without the messages only the tokens can tell: the rewrite we know of (dropping
        # earlier reasoning on a new user query) needs reasoning to drop
        think_end = self._r._think_end
        if (think_end in prompt_ids or think_end in completion) and any(
            m.get("role") == "user" for m in new_messages
        ):
            return "the template drops the reasoning of earlier turns"
        if not _ends_with(prompt_ids, plan.facts.generation_prompt):
            # the model went on inside a turn (Gemma 4 after tool results): how the
            # template closes that turn depends on what follows, which only the messages
            # show
            return (
                "the previous prompt ends inside a model turn, which this template "
                "closes according to what follows: pass previous_messages"
            )
        return None

    # -- the text after the completion --------------------------------------------------

    def _replayed_tail(
        self,
        plan: BridgePlan,
        new_messages: list[dict[str, Any]],
        tools: Any,
        completion: list[int],
    ) -> str | None:
        """The text after the sampled completion, where the plan lets one render of the
        real history give it: that render is the previous prompt's render, then the
        completion verbatim, then this text, so the bridged text equals the full render's
        by construction. Only for a completion closed by a stop token: the text then
        starts after an added token, where the tokenizer splits anyway (after a cut-off
        completion the render could continue its last word). None where it does not fit
        (the probe then says why)."""
        if not plan.replay_gives_tail:
            return None
        sampled = self._r._decode(completion)
        if plan.chatml:
            tail = chatml_tail(self._sampled_turn(plan), new_messages, sampled)
            if tail is not None:
                return tail
        prompt, full = self._replay(plan, new_messages, tools)
        if not full.startswith(prompt) or not full.startswith(sampled, len(prompt)):
            return None
        return full[len(prompt) + len(sampled) :]

    def _probe_tail(
        self,
        plan: BridgePlan,
        new_messages: list[dict[str, Any]],
        tools: Any,
        completion: list[int],
    ) -> str | Refusal:
        """The text after the sampled completion from the probe render, checked against
        what the plan has: the real history's render, or the completion's tokens."""
        r = self._r
        tail = self._tail_text(new_messages, tools, plan.has_reasoning, plan.template)
        if isinstance(tail, Refusal):
            return tail
        lead = plan.facts.lead
        if plan.check_lead and not r._decode(completion).startswith(lead):
            # the template writes text between the generation prompt and the content
            # (SmolVLM: "Assistant:" then ": " + content); the model wrote it itself when
            # its completion starts with it, and then the tokens are the same
            return Refusal(f"the template rewrites the assistant turn (adds {lead[:40]!r})")
        # The completion ends with the stop token the template writes to close the turn
        # (or was cut off by max_tokens and needs the whole closing).
        if completion and completion[-1] in r.stop_token_ids:
            stop_text = r.tokenizer.convert_ids_to_tokens(completion[-1])
            if not tail.startswith(stop_text):
                return Refusal("the completion ends with a stop token the template does not write")
            tail = tail[len(stop_text) :]
        if plan.replay is not None:
            reason = self._replay_refusal(plan, new_messages, tools, completion, tail)
            if reason is not None:
                return Refusal(reason)
        return tail

    def _replay_refusal(
        self,
        plan: BridgePlan,
        new_messages: list[dict[str, Any]],
        tools: Any,
        completion: list[int],
        tail: str,
    ) -> str | None:
        """With the real history: the template's render of the conversation must be the
        previous prompt's render, then exactly the sampled completion and the tail. This
        catches every rewrite of the history (Qwen3 dropping earlier reasoning) and of
        the sampled turn (Gemma 3 and Qwen3.5 trimming its whitespace, Qwen3.5
        re-serialising tool arguments, a SmolVLM completion without the space its
        template writes)."""
        if not plan.ends_with_turn:
            return "the previous messages do not end with the sampled assistant message"
        prompt, full = self._replay(plan, new_messages, tools)
        if not full.startswith(prompt):
            return "the template renders earlier turns differently once this turn is added"
        sampled = self._r._decode(completion) + tail
        if full[len(prompt) :] != sampled:
            return "the template renders the sampled turn differently from what was sampled"
        return None

    def _replay(
        self, plan: BridgePlan, new_messages: list[dict[str, Any]], tools: Any
    ) -> tuple[str, str]:
        """The render of the real history up to the sampled turn, and with that turn and
        the new messages, as ``plan.replay`` says: the whole history, or the sampled turn
        alone after a probe user turn."""
        r, history = self._r, plan.history
        assert history is not None and plan.replay is not None
        if plan.replay is Replay.HISTORY:
            messages, _ = r._prepare(history)
            prompt = r._template(messages[:-1], tools, True, plan.template)
            return prompt, r._template([*messages, *new_messages], tools, True, plan.template)
        user = {"role": "user", "content": PROBE_USER}
        prompt = self._probe_prompt(user, tools, plan.template)
        turn = self._sampled_turn(plan)
        return prompt, r._template([user, turn, *new_messages], tools, True, plan.template)

    def _sampled_turn(self, plan: BridgePlan) -> dict[str, Any]:
        """The history's last message (the sampled turn), as the template gets it."""
        assert plan.history is not None
        (turn,), _ = self._r._prepare(plan.history[-1:], first=len(plan.history) - 1)
        return turn

    def _tail_text(
        self,
        new_messages: list[dict[str, Any]],
        tools: Any,
        has_reasoning: bool,
        template: str | None,
    ) -> str | Refusal:
        """What the template writes after the sampled assistant content: turn closing,
        the new messages, the generation prompt (whitespace before the content is the
        template's lead, ``TemplateFacts.lead``)."""
        user = {"role": "user", "content": PROBE_USER}
        assistant: dict[str, Any] = {"role": "assistant", "content": PROBE_CONTENT}
        if has_reasoning:
            assistant["reasoning_content"] = PROBE_REASONING
        prompt = self._probe_prompt(user, tools, template)
        full = self._r._template([user, assistant, *new_messages], tools, True, template)
        if not full.startswith(prompt):
            return Refusal("the template renders earlier turns differently once later turns exist")
        rest = full[len(prompt) :]
        at = rest.find(PROBE_CONTENT)
        if at < 0:
            return Refusal("the template drops the assistant's content")
        before = rest[:at]
        if has_reasoning and PROBE_REASONING not in before:
            return Refusal("the template drops the reasoning of earlier turns")
        if not has_reasoning and before.strip():
            return Refusal(f"the template rewrites the assistant turn (adds {before[:40]!r})")
        return rest[at + len(PROBE_CONTENT) :]

    def _probe_prompt(self, user: dict[str, Any], tools: Any, template: str | None) -> str:
        """The render of the probe user turn with the generation prompt, kept per
        (template, tools)."""
        used = template if template is not None else self._r.tokenizer.chat_template
        key = f"{hash(used)}:{json.dumps(tools, sort_keys=True, default=str)}"
        with self._lock:
            cached = self._probe_cache.get(key)
        if cached is None:
            cached = self._r._template([user], tools, True, template)
            with self._lock:
                if len(self._probe_cache) >= _MAX_PROBES:  # tools that vary by rollout
                    self._probe_cache.pop(next(iter(self._probe_cache)))
                self._probe_cache[key] = cached
        return cached


def _ends_with(ids: Sequence[int], suffix: tuple[int, ...] | None) -> bool:
    """Whether ``ids`` end with ``suffix`` (None, an unknown suffix: assume they do)."""
    if suffix is None:
        return True
    return len(ids) >= len(suffix) and tuple(ids[len(ids) - len(suffix) :]) == suffix
