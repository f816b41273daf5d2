"""Synthetic workloads for the simulator: what requests arrive and what their prompts are.

This module owns the request and session descriptions the simulator consumes
(:class:`RequestSpec`, :class:`SessionSpec`), the stream of them one run replays
(:class:`Workload`) and how its arrivals were set (:class:`OfferedLoad`, which
:mod:`hycache.sim.load` fills), the ``LO:HI`` length ranges the command line
accepts (:func:`parse_int_or_range`), and the seeded generators of the shapes the project
measures:

* :func:`system_prompt_workload`: many requests behind one shared system prompt;
* :func:`family_workload`: families of requests, each family behind its own shared prefix of a
  random length (so sharing ends mid-block), the families' requests interleaved;
* :func:`multi_turn_workload`: multi-turn chat, optionally behind one shared system prompt.

Where requests share a prefix, the first token after it differs between them, so sharing ends
exactly where the workload says. Everything is generated from a ``numpy`` Generator seeded by
the caller, so the same arguments give the same token ids in every process; nothing is
downloaded. Trace files live in :mod:`hycache.sim.trace`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

__all__ = [
    "DEFAULT_VOCAB",
    "MAX_VOCAB",
    "TOKEN_DTYPE",
    "ChatShape",
    "FamilyShape",
    "IntOrRange",
    "RequestSpec",
    "SessionSpec",
    "SystemPromptShape",
    "Workload",
    "family_workload",
    "multi_turn_workload",
    "parse_int_or_range",
    "poisson_arrivals",
    "poisson_times",
    "system_prompt_workload",
]

DEFAULT_VOCAB = 32000

IntOrRange = int | tuple[int, int]
"""A fixed count, or an inclusive ``(low, high)`` range drawn uniformly per use."""


def parse_int_or_range(text: str) -> IntOrRange:
    """``"N"`` -> ``N``; ``"LO:HI"`` -> ``(LO, HI)`` (inclusive). Raises ``ValueError`` saying
    what was expected; minimums are checked where the value is used."""
    parts = text.strip().split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected an integer N or a range LO:HI, got {text!r}") from None
    if len(values) == 1:
        return values[0]
    if len(values) != 2:
        raise ValueError(f"expected an integer N or a range LO:HI, got {text!r}")
    lo, hi = values
    if hi < lo:
        raise ValueError(f"range {text!r}: LO must not exceed HI")
    return (lo, hi)


TOKEN_DTYPE = np.int32
"""Token ids the generators produce (int32 halves the memory of a long trace)."""

MAX_VOCAB = int(np.iinfo(np.int32).max)


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only contiguous copy; int32 and int64 are kept, other integer types widen."""
    dtype = a.dtype if a.dtype in (np.int32, np.int64) else np.int64
    if a.dtype == dtype and a.flags.c_contiguous and not a.flags.writeable:
        return a  # already frozen: nobody can change it under us
    out = np.array(a, dtype=dtype, copy=True, order="C")
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class RequestSpec:
    """One request: its prompt, how many tokens it generates, and when it arrives."""

    request_id: int
    prompt_token_ids: np.ndarray  # int32 or int64, 1-D, read-only
    max_tokens: int  # output tokens to generate
    arrival_s: float | None  # None = closed loop (admitted when a concurrency slot frees)
    prefix_hints: tuple[int, ...] = ()  # token counts where shared prefixes end (`limit`)

    def __post_init__(self) -> None:
        ids = np.asarray(self.prompt_token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"request {self.request_id}: prompt must be a non-empty 1-D array")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"request {self.request_id}: prompt token ids must be integers")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1")
        if self.arrival_s is not None and self.arrival_s < 0:
            raise ValueError(f"request {self.request_id}: arrival_s must be >= 0")
        object.__setattr__(self, "prompt_token_ids", _frozen(ids))

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_token_ids.size)


@dataclass(frozen=True, eq=False)
class SessionSpec:
    """A multi-turn conversation.

    Turn ``t + 1``'s prompt is turn ``t``'s prompt + turn ``t``'s output +
    ``user_messages[t + 1]``; turn 0's prompt is ``user_messages[0]`` (which already starts
    with the shared system prompt when the workload has one).
    """

    session_id: int
    user_messages: tuple[np.ndarray, ...]  # one per turn
    output_tokens: tuple[int, ...]  # output length of each turn
    prefix_hints: tuple[int, ...] = ()  # hints every turn names (e.g. the system prompt's end)

    def __post_init__(self) -> None:
        if not self.user_messages:
            raise ValueError(f"session {self.session_id}: needs at least one turn")
        if len(self.user_messages) != len(self.output_tokens):
            raise ValueError(
                f"session {self.session_id}: {len(self.user_messages)} user messages but "
                f"{len(self.output_tokens)} output lengths"
            )
        if any(n < 1 for n in self.output_tokens):
            raise ValueError(f"session {self.session_id}: output lengths must be >= 1")
        msgs = tuple(_frozen(np.asarray(m)) for m in self.user_messages)
        if any(m.ndim != 1 or m.size == 0 for m in msgs):
            raise ValueError(f"session {self.session_id}: user messages must be non-empty 1-D")
        object.__setattr__(self, "user_messages", msgs)
        object.__setattr__(self, "output_tokens", tuple(int(n) for n in self.output_tokens))
        object.__setattr__(self, "prefix_hints", tuple(int(h) for h in self.prefix_hints))

    @property
    def num_turns(self) -> int:
        return len(self.user_messages)

    def prompt_for_turn(self, turn: int, outputs: Sequence[np.ndarray]) -> np.ndarray:
        """Turn ``turn``'s prompt, given the tokens generated in turns ``0 .. turn - 1``."""
        if not 0 <= turn < self.num_turns:
            raise ValueError(f"session {self.session_id}: no turn {turn}")
        if len(outputs) < turn:
            raise ValueError(f"session {self.session_id}: turn {turn} needs {turn} outputs")
        parts: list[np.ndarray] = []
        for t in range(turn):
            parts.append(self.user_messages[t])
            parts.append(np.asarray(outputs[t], dtype=self.user_messages[0].dtype))
        parts.append(self.user_messages[turn])
        return np.concatenate(parts)


def _draw(rng: np.random.Generator, value: IntOrRange, what: str, minimum: int) -> int:
    if isinstance(value, tuple):
        lo, hi = value
        if lo < minimum or hi < lo:
            raise ValueError(f"{what} range {value} must satisfy {minimum} <= low <= high")
        return int(rng.integers(lo, hi + 1))
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _check_common(seed: int, vocab: int) -> None:
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"vocab must be in [1, {MAX_VOCAB}], got {vocab}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


def system_prompt_workload(
    num_requests: int,
    shared_prefix_tokens: int,
    suffix_tokens: IntOrRange,
    output_tokens: IntOrRange,
    seed: int,
    vocab: int = DEFAULT_VOCAB,
    *,
    prefix_hint: bool = False,
) -> list[RequestSpec]:
    """``num_requests`` requests behind one shared ``shared_prefix_tokens``-token prefix.

    Each request appends its own suffix (pairwise distinct whenever ``vocab ** suffix`` leaves
    room for that many) and generates ``output_tokens``. Arrivals are ``None`` (closed loop).
    With ``prefix_hint`` every request names the shared prefix's length as a prefix hint (what a
    chat API derives from the system message).
    """
    _check_common(seed, vocab)
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if shared_prefix_tokens < 0:
        raise ValueError(f"shared_prefix_tokens must be >= 0, got {shared_prefix_tokens}")
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab, shared_prefix_tokens, dtype=TOKEN_DTYPE)
    hints = (shared_prefix_tokens,) if prefix_hint and shared_prefix_tokens else ()
    seen: set[bytes] = set()
    out: list[RequestSpec] = []
    for i in range(num_requests):
        n_suffix = _draw(rng, suffix_tokens, "suffix_tokens", 0)
        n_out = _draw(rng, output_tokens, "output_tokens", 1)
        if shared_prefix_tokens + n_suffix == 0:
            raise ValueError("a prompt needs at least one token (prefix + suffix > 0)")
        suffix = rng.integers(0, vocab, n_suffix, dtype=TOKEN_DTYPE)
        # Keep prompts distinct when the suffix space allows it (it always does in practice).
        room = n_suffix > 0 and n_suffix * math.log(vocab) > math.log(max(num_requests, 1))
        while room and suffix.tobytes() in seen:
            suffix = rng.integers(0, vocab, n_suffix, dtype=TOKEN_DTYPE)
        seen.add(suffix.tobytes())
        out.append(
            RequestSpec(
                request_id=i,
                prompt_token_ids=np.concatenate([prefix, suffix]),
                max_tokens=n_out,
                arrival_s=None,
                prefix_hints=hints,
            )
        )
    return out


def _distinct_tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """``n`` pairwise-distinct token ids when the vocabulary allows it (else plain draws)."""
    if n <= vocab:
        return rng.choice(vocab, n, replace=False).astype(TOKEN_DTYPE)
    return rng.integers(0, vocab, n, dtype=TOKEN_DTYPE)


def family_workload(
    num_families: int,
    requests_per_family: IntOrRange,
    shared_prefix_tokens: IntOrRange,
    suffix_tokens: IntOrRange,
    output_tokens: IntOrRange,
    seed: int,
    vocab: int = DEFAULT_VOCAB,
    *,
    prefix_hint: bool = False,
) -> list[RequestSpec]:
    """``num_families`` families of requests; each family shares its own prefix.

    Per family, ``shared_prefix_tokens`` (the length ``P``) and ``requests_per_family`` are
    drawn once; per request, a ``suffix_tokens``-token suffix and ``output_tokens``. Sharing
    ends exactly at ``P``: families start with distinct tokens, and within a family every
    suffix starts with a distinct token (as long as ``vocab`` has room). A ``P`` drawn from a
    range almost never falls on a block boundary, so siblings meet mid-block. The requests of
    all families are shuffled (seeded) so the families interleave; request ids follow that
    arrival order, and arrivals are ``None`` (closed loop). With ``prefix_hint`` every request
    names its family's ``P`` as a prefix hint.
    """
    _check_common(seed, vocab)
    if num_families < 0:
        raise ValueError(f"num_families must be >= 0, got {num_families}")
    rng = np.random.default_rng(seed)
    heads = _distinct_tokens(rng, num_families, vocab)
    drawn: list[tuple[np.ndarray, int, int]] = []  # prompt, output tokens, shared prefix
    for f in range(num_families):
        p_len = _draw(rng, shared_prefix_tokens, "shared_prefix_tokens", 1)
        n_req = _draw(rng, requests_per_family, "requests_per_family", 1)
        prefix = rng.integers(0, vocab, p_len, dtype=TOKEN_DTYPE)
        prefix[0] = heads[f]
        firsts = _distinct_tokens(rng, n_req, vocab)
        for i in range(n_req):
            n_suffix = _draw(rng, suffix_tokens, "suffix_tokens", 1)
            suffix = rng.integers(0, vocab, n_suffix, dtype=TOKEN_DTYPE)
            suffix[0] = firsts[i]
            n_out = _draw(rng, output_tokens, "output_tokens", 1)
            drawn.append((np.concatenate([prefix, suffix]), n_out, p_len))
    order = rng.permutation(len(drawn))
    return [
        RequestSpec(
            request_id=i,
            prompt_token_ids=drawn[j][0],
            max_tokens=drawn[j][1],
            arrival_s=None,
            prefix_hints=(drawn[j][2],) if prefix_hint else (),
        )
        for i, j in enumerate(order)
    ]


def multi_turn_workload(
    sessions: int,
    turns: IntOrRange,
    user_tokens: IntOrRange,
    output_tokens: IntOrRange,
    seed: int,
    system_prompt_tokens: int = 0,
    vocab: int = DEFAULT_VOCAB,
    *,
    prefix_hint: bool = False,
) -> list[SessionSpec]:
    """``sessions`` chat sessions of ``turns`` turns each.

    Every user message has ``user_tokens`` fresh tokens and every turn generates
    ``output_tokens`` (ranges are drawn per session, per message, per answer). With
    ``system_prompt_tokens > 0`` one system prompt, shared by all sessions, is prepended to each
    session's first user message, and the first user messages start with distinct tokens, so
    sessions share exactly the system prompt. With ``prefix_hint`` (and a system prompt) every
    turn names the system prompt's length as a prefix hint.
    """
    _check_common(seed, vocab)
    if sessions < 0:
        raise ValueError(f"sessions must be >= 0, got {sessions}")
    if system_prompt_tokens < 0:
        raise ValueError(f"system_prompt_tokens must be >= 0, got {system_prompt_tokens}")
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_prompt_tokens, dtype=TOKEN_DTYPE)
    heads = _distinct_tokens(rng, sessions, vocab) if system_prompt_tokens else None
    hints = (system_prompt_tokens,) if prefix_hint and system_prompt_tokens else ()
    out: list[SessionSpec] = []
    for sid in range(sessions):
        n_turns = _draw(rng, turns, "turns", 1)
        msgs: list[np.ndarray] = []
        outs: list[int] = []
        for t in range(n_turns):
            n_user = _draw(rng, user_tokens, "user_tokens", 1)
            msg = rng.integers(0, vocab, n_user, dtype=TOKEN_DTYPE)
            if t == 0 and heads is not None:
                msg[0] = heads[sid]
                msg = np.concatenate([system, msg])
            msgs.append(msg)
            outs.append(_draw(rng, output_tokens, "output_tokens", 1))
        out.append(
            SessionSpec(
                session_id=sid,
                user_messages=tuple(msgs),
                output_tokens=tuple(outs),
                prefix_hints=hints,
            )
        )
    return out


@dataclass
class Workload:
    """What the simulator, the engine benches and the load search run: a stream of requests
    (open loop with arrival times, or closed loop under `concurrency`; `sequential` runs one
    at a time) or of multi-turn sessions, under a name for the tables."""

    name: str
    requests: Sequence[RequestSpec] = ()
    sessions: Sequence[SessionSpec] = ()
    concurrency: int | None = None
    sequential: bool = False

    @property
    def size(self) -> int:
        return len(self.requests) + sum(s.num_turns for s in self.sessions)

    def max_tokens_per_request(self) -> int:
        longest = max((r.prompt_len + r.max_tokens for r in self.requests), default=0)
        for s in self.sessions:
            total = sum(m.size for m in s.user_messages) + sum(s.output_tokens)
            longest = max(longest, total)
        return longest


class _RequestShape:
    """A request workload's shape: its fields are, in order, the leading arguments of its
    generator (`_draw_requests`), which `build` calls with the seed and the vocabulary."""

    _draw_requests: Callable[..., list[RequestSpec]]

    def build(
        self, seed: int, prefix_hint: bool = False, vocab: int = DEFAULT_VOCAB
    ) -> list[RequestSpec]:
        shape = [getattr(self, f.name) for f in fields(self)]
        return self._draw_requests(*shape, seed, vocab, prefix_hint=prefix_hint)


@dataclass(frozen=True)
class SystemPromptShape(_RequestShape):
    """The seed's shape (architecture §4): a 57,600-token system prompt and a 6,416-token suffix
    (T = 64,016); 256 output tokens is the seed's simulated default."""

    num_requests: int = 256
    shared_prefix_tokens: int = 57_600
    suffix_tokens: IntOrRange = 6_416
    output_tokens: IntOrRange = 256

    _draw_requests = staticmethod(system_prompt_workload)


@dataclass(frozen=True)
class FamilyShape(_RequestShape):
    """Defaults of the random family workload, and why.

    * shared prefix 2,000-40,000 tokens: from an assistant's system prompt with a few tool
      schemas (a few thousand tokens) to a long shared document or codebase excerpt (tens of
      thousands); uniform, so it lands anywhere inside a block (B = 4,416 on bamba-9b);
    * 4-12 requests per family (8 on average): a prompt is reused a handful of times while it
      stays cached, not hundreds;
    * suffix 128-2,048 tokens: a question or an instruction after the shared part, up to a
      pasted page;
    * output 64-640 tokens: mean 352, about the median output of Mooncake's conversation trace
      (350, the statistic `hycache trace-gen` reproduces).
    """

    families: int = 32
    requests_per_family: IntOrRange = (4, 12)
    shared_prefix_tokens: IntOrRange = (2_000, 40_000)
    suffix_tokens: IntOrRange = (128, 2_048)
    output_tokens: IntOrRange = (64, 640)

    _draw_requests = staticmethod(family_workload)


@dataclass(frozen=True)
class ChatShape:
    """Defaults of the multi-turn chat workload, and why.

    * one 3,000-token system prompt shared by every session: an assistant's instructions and a
      few tool definitions are one to a few thousand tokens (the Mooncake-like generator's
      system prompts have a median of 2,048); not a multiple of the unit, so sharing ends
      mid-unit as well as mid-block;
    * 2-10 turns per session (6 on average, the generator's mean conversation length);
    * user messages 32-1,024 tokens: a short question up to a pasted page;
    * answers 64-640 tokens: mean 352, Mooncake's median output (350).
    """

    sessions: int = 64
    turns: IntOrRange = (2, 10)
    system_prompt_tokens: int = 3_000
    user_tokens: IntOrRange = (32, 1_024)
    output_tokens: IntOrRange = (64, 640)

    def build(
        self, seed: int, prefix_hint: bool = False, vocab: int = DEFAULT_VOCAB
    ) -> list[SessionSpec]:
        return multi_turn_workload(
            self.sessions,
            self.turns,
            self.user_tokens,
            self.output_tokens,
            seed,
            system_prompt_tokens=self.system_prompt_tokens,
            vocab=vocab,
            prefix_hint=prefix_hint,
        )


def poisson_arrivals(
    requests: Sequence[RequestSpec], rate_per_s: float, seed: int, start_s: float = 0.0
) -> list[RequestSpec]:
    """Copies of ``requests`` with open-loop Poisson arrivals at ``rate_per_s``, in order."""
    times = poisson_times(len(requests), rate_per_s, seed, start_s)
    return [replace(r, arrival_s=float(t)) for r, t in zip(requests, times, strict=True)]


def poisson_times(n: int, rate_per_s: float, seed: int, start_s: float = 0.0) -> np.ndarray:
    """``n`` arrival times of a Poisson process at ``rate_per_s``, the first at ``start_s``."""
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, n)
    return start_s + np.cumsum(gaps) - (gaps[0] if n else 0.0)


@dataclass(frozen=True)
class OfferedLoad:
    """How a stream's arrivals were set: the measured capacity and the rate chosen."""

    capacity_requests_per_s: float | None  # None when the rate was given, not measured
    load: float | None
    request_rate_per_s: float
    time_scale: float | None  # new gap / trace gap; None for Poisson arrivals

    def as_dict(self) -> dict[str, float | None]:
        return {
            "capacity_requests_per_s": self.capacity_requests_per_s,
            "load": self.load,
            "request_rate_per_s": self.request_rate_per_s,
            "time_scale": self.time_scale,
        }
