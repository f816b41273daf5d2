"""Synthetic workloads for the simulator: what requests arrive and what their prompts are.

This module owns the request and session descriptions the simulator consumes
(:class:`RequestSpec`, :class:`SessionSpec`) and the seeded generators of the two shapes the
project measures: many requests behind one shared system prompt
(:func:`system_prompt_workload`) and multi-turn chat (:func:`multi_turn_workload`). Everything
is generated from a ``numpy`` Generator seeded by the caller, so the same arguments give the
same token ids in every process; nothing is downloaded. Trace files live in
:mod:`hycache.sim.trace`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "DEFAULT_VOCAB",
    "MAX_VOCAB",
    "TOKEN_DTYPE",
    "IntOrRange",
    "RequestSpec",
    "SessionSpec",
    "multi_turn_workload",
    "poisson_arrivals",
    "system_prompt_workload",
]

DEFAULT_VOCAB = 32000

IntOrRange = int | tuple[int, int]
"""A fixed count, or an inclusive ``(low, high)`` range drawn uniformly per use."""


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
) -> list[RequestSpec]:
    """``num_requests`` requests behind one shared ``shared_prefix_tokens``-token prefix.

    Each request appends its own suffix (pairwise distinct whenever ``vocab ** suffix`` leaves
    room for that many) and generates ``output_tokens``. Arrivals are ``None`` (closed loop).
    """
    _check_common(seed, vocab)
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if shared_prefix_tokens < 0:
        raise ValueError(f"shared_prefix_tokens must be >= 0, got {shared_prefix_tokens}")
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab, shared_prefix_tokens, dtype=TOKEN_DTYPE)
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
            )
        )
    return out


def multi_turn_workload(
    sessions: int,
    turns: IntOrRange,
    user_tokens: IntOrRange,
    output_tokens: IntOrRange,
    seed: int,
    system_prompt_tokens: int = 0,
    vocab: int = DEFAULT_VOCAB,
) -> list[SessionSpec]:
    """``sessions`` chat sessions of ``turns`` turns each.

    Every user message has ``user_tokens`` fresh tokens and every turn generates
    ``output_tokens``. With ``system_prompt_tokens > 0`` one system prompt, shared by all
    sessions, is prepended to each session's first user message.
    """
    _check_common(seed, vocab)
    if sessions < 0:
        raise ValueError(f"sessions must be >= 0, got {sessions}")
    if system_prompt_tokens < 0:
        raise ValueError(f"system_prompt_tokens must be >= 0, got {system_prompt_tokens}")
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_prompt_tokens, dtype=TOKEN_DTYPE)
    out: list[SessionSpec] = []
    for sid in range(sessions):
        n_turns = _draw(rng, turns, "turns", 1)
        msgs: list[np.ndarray] = []
        outs: list[int] = []
        for t in range(n_turns):
            n_user = _draw(rng, user_tokens, "user_tokens", 1)
            msg = rng.integers(0, vocab, n_user, dtype=TOKEN_DTYPE)
            if t == 0 and system_prompt_tokens:
                msg = np.concatenate([system, msg])
            msgs.append(msg)
            outs.append(_draw(rng, output_tokens, "output_tokens", 1))
        out.append(
            SessionSpec(session_id=sid, user_messages=tuple(msgs), output_tokens=tuple(outs))
        )
    return out


def poisson_arrivals(
    requests: Sequence[RequestSpec], rate_per_s: float, seed: int, start_s: float = 0.0
) -> list[RequestSpec]:
    """Copies of ``requests`` with open-loop Poisson arrivals at ``rate_per_s``, in order."""
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, len(requests))
    times = start_s + np.cumsum(gaps) - (gaps[0] if len(requests) else 0.0)
    return [replace(r, arrival_s=float(t)) for r, t in zip(requests, times, strict=True)]
