"""Mooncake-format request traces: writing, measuring and synthesising them.

* :func:`generate_mooncake_like` synthesises a trace with the published statistics of
  Mooncake's conversation trace (request count, input/output medians, arrival rate, and an
  unbounded token hit ceiling of about 40%); :func:`write_trace` saves it;
  :func:`token_hit_ceiling` and :func:`trace_stats` measure a trace; :func:`trace_gen` is the
  one call behind ``hycache trace-gen``. Reading traces lives in :mod:`hycache.sim.trace`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hycache.sim.trace import MOONCAKE_BLOCK_TOKENS, TRACE_FIELDS

__all__ = [
    "generate_mooncake_like",
    "token_hit_ceiling",
    "trace_gen",
    "trace_stats",
    "write_trace",
]


# ---------------------------------------------------------------------------------------------
# Writing and measuring
# ---------------------------------------------------------------------------------------------


def write_trace(records: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write records (dicts with the four Mooncake fields) as JSONL: the whole file or
    nothing (an interrupted write leaves no truncated trace)."""
    from hycache.files import jsonl, write_atomic

    rows = []
    for rec in records:
        row = {k: rec[k] for k in TRACE_FIELDS}
        row["hash_ids"] = [int(h) for h in row["hash_ids"]]
        rows.append(row)
    write_atomic(path, jsonl(rows))


def _ordered(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(records, key=lambda r: r["timestamp"])


def _leading_seen(ids: Sequence[int], seen: set[int]) -> int:
    """How many of `ids`, from the first, some earlier request already had."""
    lead = 0
    for h in ids:
        if h not in seen:
            break
        lead += 1
    return lead


def token_hit_ceiling(
    records: Sequence[Mapping[str, Any]], block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> float:
    """Unbounded prefix-cache token hit ceiling of a trace.

    In timestamp order, each request hits the leading run of its hash ids that some earlier
    request already had, times ``block_tokens``, capped at its ``input_length``; the ceiling is
    the sum of hits over the sum of input lengths (an infinite cache, no EAGLE drop, no SSM
    checkpoint constraint).
    """
    seen: set[int] = set()
    hit = 0
    total = 0
    for r in _ordered(records):
        length = int(r["input_length"])
        ids = list(r["hash_ids"])[: -(-length // block_tokens)]
        hit += min(_leading_seen(ids, seen) * block_tokens, length)
        total += length
        seen.update(ids)
    return hit / total if total else 0.0


def trace_stats(
    records: Sequence[Mapping[str, Any]], block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> dict[str, float]:
    """Summary statistics of a trace (request count, medians, rate, hit ceiling...)."""
    n = len(records)
    if n == 0:
        return {"num_requests": 0}
    rs = _ordered(records)
    ts = np.array([r["timestamp"] for r in rs], dtype=np.float64) / 1000.0
    inp = np.array([r["input_length"] for r in rs], dtype=np.int64)
    outp = np.array([r["output_length"] for r in rs], dtype=np.int64)
    duration = float(ts[-1] - ts[0])
    unique = len({h for r in rs for h in r["hash_ids"]})
    return {
        "num_requests": n,
        "duration_s": duration,
        "arrival_rate_per_s": (n - 1) / duration if duration > 0 else float("inf"),
        "input_median": float(np.median(inp)),
        "input_mean": float(inp.mean()),
        "input_p99": float(np.percentile(inp, 99)),
        "input_max": int(inp.max()),
        "output_median": float(np.median(outp)),
        "output_mean": float(outp.mean()),
        "total_input_tokens": int(inp.sum()),
        "unique_blocks": unique,
        "token_hit_ceiling": token_hit_ceiling(rs, block_tokens),
    }


# ---------------------------------------------------------------------------------------------
# Generating
# ---------------------------------------------------------------------------------------------


@dataclass
class _Session:
    ids: list[int]
    length: int
    turns_left: int
    ready_ms: float = 0.0  # the next turn comes no earlier (with a turn gap)


def _lognormal_ints(
    rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int
) -> np.ndarray:
    x = np.exp(np.log(median) + sigma * rng.standard_normal(n))
    out: np.ndarray = np.clip(np.rint(x), lo, hi).astype(np.int64)
    return out


def generate_mooncake_like(
    num_requests: int = 12000,
    seed: int = 0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    *,
    arrival_rate: float = 3.4,
    input_median: float = 6900.0,
    input_sigma: float = 1.0,
    max_input_tokens: int = 131072,
    output_median: float = 350.0,
    output_sigma: float = 0.7,
    max_output_tokens: int = 8192,
    target_hit_ceiling: float = 0.40,
    num_system_prompts: int = 64,
    system_prompt_median_tokens: float = 2048.0,
    max_open_sessions: int = 128,
    mean_turns: float = 6.0,
    turn_gap_s: float | None = None,
) -> list[dict[str, Any]]:
    """A synthetic trace shaped like Mooncake's conversation trace (see ``docs/cost-model.md``).

    Arrivals are Poisson at ``arrival_rate``; input and output lengths are lognormal around
    their medians (inputs capped at ``max_input_tokens``). Prefix structure: each request
    either continues an open conversation (its hash ids start with all the full blocks of the
    conversation's previous prompt), opens a new conversation behind one of
    ``num_system_prompts`` shared system prompts (Zipf popularity), or starts fresh. The odds
    of reusing are steered by the running token deficit against the target (an integral
    controller), so the unbounded token hit ceiling lands near ``target_hit_ceiling`` for any
    seed and any size past a few hundred requests.

    ``turn_gap_s``: a conversation's next turn comes no sooner than a gap drawn lognormal
    around this median (sigma 0.5) after its last one, as a user reads and types (Mooncake's
    conversation trace: about two minutes); None (default): whenever it is picked. With a gap,
    at least 2,048 conversations stay open, so that they outlive it.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if block_tokens < 1 or arrival_rate <= 0 or not 0.0 <= target_hit_ceiling < 1.0:
        raise ValueError("need block_tokens >= 1, arrival_rate > 0, 0 <= target_hit_ceiling < 1")
    if turn_gap_s is not None and turn_gap_s <= 0:
        raise ValueError(f"turn_gap_s must be > 0, got {turn_gap_s}")
    rng = np.random.default_rng(seed)
    n = num_requests
    gaps = rng.exponential(1000.0 / arrival_rate, n)
    times_ms = np.rint(np.cumsum(gaps) - (gaps[0] if n else 0.0)).astype(np.int64)
    inputs = _lognormal_ints(rng, n, input_median, input_sigma, 1, max_input_tokens)
    outputs = _lognormal_ints(rng, n, output_median, output_sigma, 1, max_output_tokens)
    convs = _Conversations(
        rng,
        block_tokens,
        turn_gap_s,
        max(max_open_sessions, 2048) if turn_gap_s is not None else max_open_sessions,
        mean_turns,
    )
    sys_tokens = _lognormal_ints(
        rng, num_system_prompts, system_prompt_median_tokens, 0.6, block_tokens, max_input_tokens
    )
    convs.add_system_prompts(sys_tokens // block_tokens)
    records: list[dict[str, Any]] = []
    for i in range(n):
        length = int(inputs[i])
        # Integral control: the token deficit against the target sets the odds of reusing.
        deficit = target_hit_ceiling * convs.tok_sum - convs.hit_sum
        p_reuse = float(np.clip(0.5 + deficit / (20.0 * input_median), 0.0, 1.0))
        records.append(
            {
                "timestamp": int(times_ms[i]),
                "input_length": length,
                "output_length": int(outputs[i]),
                "hash_ids": convs.prompt(length, float(times_ms[i]), p_reuse),
            }
        )
    return records


_P_CONTINUE = 0.75  # share of reuses that continue a conversation (vs. a system prompt)


@dataclass
class _Conversations:
    """The generator's running state: the open conversations, the shared system prompts
    (Zipf popularity), the next fresh block id and the hit ceiling so far (`hit_sum` of
    `tok_sum` tokens). Every draw comes from the one `rng`, in request order."""

    rng: np.random.Generator
    block_tokens: int
    turn_gap_s: float | None
    max_open: int
    mean_turns: float
    next_id: int = 0
    sessions: list[_Session] = field(default_factory=list)
    system_prompts: list[list[int]] = field(default_factory=list)
    zipf: np.ndarray = field(default_factory=lambda: np.ones(0))
    seen: set[int] = field(default_factory=set)
    hit_sum: float = 0.0
    tok_sum: float = 0.0

    def fresh(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def add_system_prompts(self, blocks: np.ndarray) -> None:
        self.system_prompts = [self.fresh(int(b)) for b in blocks]
        zipf = 1.0 / np.arange(1, len(blocks) + 1)
        zipf /= zipf.sum()
        self.zipf = zipf

    def ready(self, now_ms: float) -> float:
        """When a conversation's next turn may come, after one at `now_ms`."""
        if self.turn_gap_s is None:
            return 0.0
        return now_ms + float(self.rng.lognormal(math.log(self.turn_gap_s * 1000.0), 0.5))

    def prompt(self, length: int, now_ms: float, p_reuse: float) -> list[int]:
        """The hash ids of a `length`-token prompt arriving at `now_ms`: with odds `p_reuse`
        behind an open conversation or a system prompt, else fresh; counted in the ceiling."""
        need = -(-length // self.block_tokens)
        full = length // self.block_tokens
        ids: list[int] | None = None
        continued = False
        if self.rng.random() < p_reuse:
            if self.rng.random() < _P_CONTINUE:
                ids = self._next_turn(length, need, now_ms)
                continued = ids is not None
            if ids is None and full > 0 and self.system_prompts:
                k = int(self.rng.choice(len(self.system_prompts), p=self.zipf))
                prefix = self.system_prompts[k][:full]
                ids = prefix + self.fresh(need - len(prefix))
        if ids is None:
            ids = self.fresh(need)
        if not continued:
            # A new conversation (fresh or behind a system prompt) may be continued later.
            turns = int(self.rng.geometric(1.0 / max(self.mean_turns, 1.0)))
            if turns > 1:
                self.sessions.append(_Session(ids, length, turns - 1, self.ready(now_ms)))
                if len(self.sessions) > self.max_open:
                    self.sessions.pop(0)
        self.hit_sum += min(_leading_seen(ids, self.seen) * self.block_tokens, length)
        self.tok_sum += length
        self.seen.update(ids)
        return ids

    def _next_turn(self, length: int, need: int, now_ms: float) -> list[int] | None:
        """The prompt as the next turn of an open conversation, or None when none fits."""
        b = self.block_tokens
        eligible = [
            s
            for s in self.sessions
            if s.length // b > 0 and s.length < length and s.ready_ms <= now_ms
        ]
        if not eligible:
            return None
        # The next turn of a conversation is a little longer than the last one: pick among
        # the few longest conversations that still fit under this prompt.
        eligible.sort(key=lambda c: c.length, reverse=True)
        s = eligible[int(self.rng.integers(min(len(eligible), 4)))]
        prefix = s.ids[: s.length // b]
        ids = prefix + self.fresh(need - len(prefix))
        s.ids, s.length = ids, length
        s.ready_ms = self.ready(now_ms)
        s.turns_left -= 1
        if s.turns_left <= 0:
            self.sessions.remove(s)
        return ids


def trace_gen(
    out_path: str | Path,
    num_requests: int = 12000,
    seed: int = 0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    turn_gap_s: float | None = None,
    num_system_prompts: int = 64,
) -> dict[str, Any]:
    """Generate a Mooncake-like trace, write it to ``out_path``, return its statistics."""
    records = generate_mooncake_like(
        num_requests, seed, block_tokens, turn_gap_s=turn_gap_s,
        num_system_prompts=num_system_prompts,
    )  # fmt: skip
    write_trace(records, out_path)
    stats: dict[str, Any] = dict(trace_stats(records, block_tokens))
    stats["path"] = str(out_path)
    stats["seed"] = seed
    stats["block_tokens"] = block_tokens
    if turn_gap_s is not None:
        stats["turn_gap_s"] = turn_gap_s
    if num_system_prompts != 64:
        stats["num_system_prompts"] = num_system_prompts
    return stats
