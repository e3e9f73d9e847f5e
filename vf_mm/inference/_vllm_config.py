"""``Retry``, ``Routing``, ``Auth`` and ``Expansion``: ``VLLMBackend``'s settings, each
valid once made.

Settings that belong to one concern are one frozen object (as httpx keeps its timeouts
in ``httpx.Timeout`` and its pool sizes in ``httpx.Limits``), checked in its constructor:
a wrong value fails where it is written, with a ``ValueError`` (``TypeError`` for a value
of the wrong kind) that names the object, the field and what to give instead, never
later at the first request. An object can be built once and shared by every backend of
a run (each worker builds its own ``VLLMBackend``).

``VLLMBackend``'s older keywords (``max_retries``, ``backoff_s``, ``max_backoff_s``;
``shed_margin``, ``session_idle_s``; ``api_key``; ``embed_token_ids``, ``embed_swaps``,
``refusals``) still work: they build these objects (``with_keywords``), and giving one of
them with its object is refused as ambiguous.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Protocol, TypeVar, cast

RoutingPolicy = Literal["sticky", "least_outstanding", "round_robin"]
#: the routing policies ``Routing`` takes
ROUTINGS: tuple[str, ...] = ("sticky", "least_outstanding", "round_robin")


@dataclass(frozen=True, slots=True)
class Retry:
    """How a failed attempt is tried again.

    A server's ``Retry-After`` is honoured up to ``max_backoff_s``. A failing server is
    avoided for the same growing, capped time.

    Attributes:
        max_retries: Attempts after the first (0: try once).
        backoff_s: The first wait before a retry on a server already tried; each further
            retry doubles it, up to ``max_backoff_s``, and the wait is jittered (half of it,
            then up to as much again at random).
        max_backoff_s: The cap on a wait.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise TypeError(
                f"Retry(max_retries={self.max_retries!r}): max_retries must be an int >= 0 "
                "(the attempts after the first; 0 tries once)"
            )
        if self.max_retries < 0:
            raise ValueError(
                f"Retry(max_retries={self.max_retries!r}): max_retries must be an int >= 0 "
                "(the attempts after the first; 0 tries once)"
            )
        for name in ("backoff_s", "max_backoff_s"):
            value = _seconds("Retry", name, getattr(self, name), "a number of seconds >= 0")
            if value < 0:
                raise ValueError(
                    f"Retry({name}={value!r}): {name} must be a number of seconds >= 0 "
                    "(0: retry at once)"
                )
            object.__setattr__(self, name, value)

    def backoff(self, retry: int) -> float:
        """The jittered wait before retry number ``retry``.

        Args:
            retry: 1, 2, ...
        """
        delay = self.cooldown(retry)
        return delay / 2 + random.uniform(0, delay / 2)

    def cooldown(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row, without jitter.

        Args:
            failures: 1, 2, ...
        """
        return min(self.max_backoff_s, self.backoff_s * (2 ** (failures - 1)))


@dataclass(frozen=True, slots=True)
class Routing:
    """Which server each attempt goes to.

    Attributes:
        policy: ``"sticky"`` (the default: a rollout's turns stay on the server that holds
            its history in its prefix cache, new sessions go to the least-loaded server;
            see ``vf_mm.inference._vllm``), ``"least_outstanding"`` or ``"round_robin"``
            (both ignore sessions).
        shed_margin: A session leaves its server when that server has this many more
            requests in flight than the least-loaded other one (None: only when it fails).
        session_idle_s: A session with no turn for this long is forgotten.
    """

    policy: RoutingPolicy = "sticky"
    shed_margin: int | None = 4
    session_idle_s: float = 600.0

    def __post_init__(self) -> None:
        if self.policy not in ROUTINGS:
            raise ValueError(
                f"Routing(policy={self.policy!r}): the routing policy must be one of "
                f"{', '.join(ROUTINGS)}"
            )
        margin = self.shed_margin
        if margin is not None and (
            isinstance(margin, bool) or not isinstance(margin, int) or margin < 1
        ):
            raise ValueError(
                f"Routing(shed_margin={margin!r}): shed_margin must be an int >= 1 (requests "
                "in flight above the least-loaded other server), or None to move a session "
                "only off a failing server"
            )
        idle = _seconds("Routing", "session_idle_s", self.session_idle_s, "a number of seconds > 0")
        if not idle > 0:
            raise ValueError(
                f"Routing(session_idle_s={idle!r}): session_idle_s must be a number of "
                "seconds > 0 (math.inf: sessions end only with end_session)"
            )
        object.__setattr__(self, "session_idle_s", idle)


@dataclass(frozen=True, slots=True, repr=False)
class Auth:
    """The API keys sent as ``Authorization: Bearer KEY`` (vLLM's ``--api-key``).

    Keys are secrets: the repr and every error message leave them out.

    Attributes:
        api_key: One key for every server, or a sequence of one key per base URL, in the
            backend's order (None or ``""``: that server gets no header).
    """

    api_key: str | tuple[str | None, ...] | None = None

    def __post_init__(self) -> None:
        key = self.api_key
        if key is None or isinstance(key, str):
            _check_key(key, "api_key")
            return
        if not isinstance(key, Sequence):
            raise TypeError(
                f"Auth(api_key=<{type(key).__name__}>): api_key must be a str, a sequence "
                "of one str (or None) per base URL, or None"
            )
        keys = tuple(key)
        for i, each in enumerate(keys):
            _check_key(each, f"api_key[{i}]")
        object.__setattr__(self, "api_key", keys)

    def headers(self, servers: int) -> list[dict[str, str]]:
        """The ``Authorization`` header of each base URL, in order.

        Empty for a server without a key.

        Args:
            servers: How many base URLs.

        Raises:
            ValueError: One key per URL was given, and not ``servers`` of them.
        """
        key = self.api_key
        keys = [key] * servers if key is None or isinstance(key, str) else list(key)
        if len(keys) != servers:
            raise ValueError(
                f"{len(keys)} API keys for {servers} base URLs: give one per URL "
                "(None for a server without one), or one str for every server"
            )
        return [{"Authorization": f"Bearer {k}"} if k else {} for k in keys]

    def __repr__(self) -> str:
        key = self.api_key
        if key is None or isinstance(key, str):
            shown = "None" if key is None else "'***'"
        else:
            shown = f"({', '.join('None' if k is None else repr('***') for k in key)})"
        return f"Auth(api_key={shown})"


def _check_key(key: object, where: str) -> None:
    """A key is a str (or None) a header can carry as it is: one with whitespace at its
    ends or a control character is refused (the usual cause: a key file's newline, which
    httpx would refuse only at the first request, or a server would never match)."""
    if key is None:
        return
    if not isinstance(key, str):
        raise TypeError(f"Auth: {where} must be a str or None, not {type(key).__name__}")
    if key != key.strip() or not key.isprintable():
        raise ValueError(
            f"Auth: {where} starts or ends with whitespace, or holds a control character "
            "(a newline kept from a key file?): give the key alone, stripped"
        )


class VisionFacts(Protocol):
    """What ``Expansion.of`` reads of a renderer's vision spec (``renderer.vision``)."""

    video: object

    def embed_ids(self, modality: str) -> tuple[int, ...]: ...

    def vllm_embed_swaps(self, modality: str) -> dict[int, int]: ...

    def vllm_refusal(self, modality: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Expansion:
    """How content_parts mode reads a server's expansion of raw parts against the
    renderer's: the renderer's facts, handed to the backend as one object
    (``Expansion.of(renderer.vision)``; ``make_client`` does it).

    Attributes:
        embed_token_ids: Per modality, the ids that take embeddings
            (``renderer.vision.embed_ids``), so the returned placeholders say which of their
            positions are embeddings (``is_embed``) where a range also holds text: Qwen3-VL's
            clips (timestamps), Gemma 3's images (markers). Without them every returned
            position counts as an embedding, which a later bridge or training batch refuses
            for those families (never silently wrong), and a clip is refused before sending.
        embed_swaps: Per modality, ``{the server's id: the renderer's id}`` at embedding
            positions, for a family whose vLLM processing writes another id there
            (``renderer.vision.vllm_embed_swaps``: InternVL3's clips come back with
            ``<video>`` where the renderer writes ``<IMG_CONTEXT>``). Inside a returned range
            of that modality only, those ids are mapped back; each mapped-to id must be one
            of ``embed_token_ids`` and no mapped-from id one of them.
        refusals: Per modality, why the server cannot take this model's raw parts of it
            (``renderer.vision.vllm_refusal``: vLLM 0.32 answers Kimi-K2.5's clips with
            400). Such a part is refused before sending, with the reason.

    Raises:
        ValueError: A swap that maps to an id outside ``embed_token_ids``, or away from one.
    """

    embed_token_ids: Mapping[str, frozenset[int]] = field(default_factory=dict)
    embed_swaps: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    refusals: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("embed_token_ids", "embed_swaps", "refusals"):
            given = getattr(self, name)
            if given is not None and not isinstance(given, Mapping):
                raise TypeError(
                    f"Expansion({name}={given!r}): {name} must be a mapping by modality "
                    "('image', 'video'); take it from the renderer: Expansion.of(renderer.vision)"
                )
        try:
            ids = {m: frozenset(_token_id(t) for t in v)
                   for m, v in (self.embed_token_ids or {}).items()}  # fmt: skip
        except TypeError:
            raise TypeError(
                f"Expansion(embed_token_ids={self.embed_token_ids!r}): each modality's ids must "
                "be token ids (ints)"
            ) from None
        swaps = {m: {int(k): int(v) for k, v in pairs.items()}
                 for m, pairs in (self.embed_swaps or {}).items() if pairs}  # fmt: skip
        for modality, pairs in swaps.items():
            own = ids.get(modality, frozenset())
            for theirs, ours in pairs.items():
                if ours not in own or theirs in own:
                    raise ValueError(
                        f"Expansion: embed_swaps[{modality!r}] maps {theirs} to {ours}: it "
                        "must map an id the server writes to one of embed_token_ids"
                        f"[{modality!r}] ({sorted(own)}), never one of them away; take both "
                        "from the renderer: Expansion.of(renderer.vision)"
                    )
        refusals = {m: str(r) for m, r in (self.refusals or {}).items() if r}
        object.__setattr__(self, "embed_token_ids", {m: v for m, v in ids.items() if v})
        object.__setattr__(self, "embed_swaps", swaps)
        object.__setattr__(self, "refusals", refusals)

    @classmethod
    def of(cls, vision: VisionFacts | None) -> Expansion:
        """The renderer's facts.

        Args:
            vision: ``renderer.vision`` (None, a text renderer's: no facts).
        """
        if vision is None:
            return cls()
        modalities = ("image", "video") if vision.video is not None else ("image",)
        return cls(
            embed_token_ids={m: frozenset(vision.embed_ids(m)) for m in modalities},
            embed_swaps={m: vision.vllm_embed_swaps(m) for m in modalities},
            refusals={m: r for m in ("image", "video") if (r := vision.vllm_refusal(m))},
        )


def _token_id(value: object) -> int:
    """A token id: an int (numpy's too), never a bool, a float or a string's digits."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(value)
    return int(value.__index__())


def _seconds(kind: str, name: str, value: object, wanted: str) -> float:
    """``value`` as a float, refusing a non-number (bool included) and NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{kind}({name}={value!r}): {name} must be {wanted}")
    if math.isnan(value):
        raise ValueError(f"{kind}({name}=nan): {name} must be {wanted}")
    return float(value)


class Unset(Enum):
    """The default of a keyword that builds a settings object: "not given"."""

    UNSET = "unset"

    def __repr__(self) -> str:
        return "<unset>"


UNSET = Unset.UNSET

T = TypeVar("T")


def with_keywords(kind: type[T], given: object, argument: str, **keywords: Any) -> T:
    """``given`` (a ``kind``, or None: the default), or the ``kind`` built from the
    keywords the caller gave (those not ``UNSET``); a ``kind`` given with such keywords
    is refused, since either could be meant."""
    passed = {k: v for k, v in keywords.items() if v is not UNSET}
    if given is None:
        return cast(Callable[..., T], kind)(**passed)
    if not isinstance(given, kind):
        raise TypeError(
            f"{argument} must be a {kind.__name__}(...) or None, not {type(given).__name__}"
        )
    if passed:
        raise TypeError(
            f"{', '.join(passed)} given with {argument}={kind.__name__}(...): give "
            f"{'them' if len(passed) > 1 else 'it'} inside the {kind.__name__}, or leave "
            f"{argument} out"
        )
    return given
