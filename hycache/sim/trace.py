"""Mooncake-format request traces: read, generate, write and measure them.

This module owns the trace side of the simulator's inputs:

* :func:`read_mooncake_trace` turns a Mooncake JSONL trace (``timestamp`` in ms,
  ``input_length``, ``output_length``, ``hash_ids``) into :class:`RequestSpec` objects, expanding
  every hash id into ``block_tokens`` deterministic token ids, so requests that share hash ids
  share prompt tokens. Malformed input raises :class:`TraceFormatError` naming the line.
* :func:`lazy_mooncake_trace` reads the same trace as :class:`TraceRequest` objects, which keep
  only the hash ids and expand the prompt each time it is read: the simulator reads it when it
  admits the request, so a 12,000-request trace (135M prompt tokens) never has all its prompts
  in memory at once. The whole file is still validated before the first request is returned.
* :func:`generate_mooncake_like` synthesises a trace with the published statistics of
  Mooncake's conversation trace (request count, input/output medians, arrival rate, and an
  unbounded token hit ceiling of about 40%); :func:`write_trace` saves it;
  :func:`token_hit_ceiling` and :func:`trace_stats` measure a trace; :func:`trace_gen` is the
  one call behind ``hycache trace-gen``.

Reader decisions: blank lines are skipped and consume no request id (ids are 0-based indices
among non-blank lines; error line numbers are 1-based physical lines); timestamps may go
backwards and the result is sorted by timestamp, stably; ``hash_ids`` beyond the
``ceil(input_length / block_tokens)`` needed are ignored; fields other than the four are
ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hycache.sim.workloads import DEFAULT_VOCAB, MAX_VOCAB, TOKEN_DTYPE, RequestSpec

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormatError",
    "TraceRecord",
    "TraceRequest",
    "generate_mooncake_like",
    "hash_block_tokens",
    "iter_mooncake_trace",
    "lazy_mooncake_trace",
    "read_mooncake_records",
    "read_mooncake_trace",
    "token_hit_ceiling",
    "trace_gen",
    "trace_stats",
    "write_trace",
]

MOONCAKE_BLOCK_TOKENS = 512


class TraceFormatError(ValueError):
    """A trace line that cannot be used; ``line`` is 1-based."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}, line {line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class TraceRecord:
    """One validated trace line."""

    request_id: int  # index among non-blank lines
    line: int  # 1-based physical line
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # exactly the ceil(input_length / block_tokens) ids used


# ---------------------------------------------------------------------------------------------
# Tokens from hash ids
# ---------------------------------------------------------------------------------------------

_U64 = np.uint64


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = x + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def hash_block_tokens(
    hash_ids: Sequence[int] | np.ndarray, block_tokens: int, vocab: int, seed: int = 0
) -> np.ndarray:
    """``block_tokens`` token ids per hash id, concatenated (int32).

    A pure function of ``(seed, id, position)`` (SplitMix64), so the same id gives the same
    tokens in every call and every process, whatever else is in the trace.
    """
    if block_tokens < 1 or seed < 0 or not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(
            f"need block_tokens >= 1, seed >= 0 and 1 <= vocab <= {MAX_VOCAB}; got "
            f"block_tokens={block_tokens}, seed={seed}, vocab={vocab}"
        )
    ids = np.asarray(hash_ids, dtype=np.int64)
    if ids.size and ids.min() < 0:
        raise ValueError("hash ids must be >= 0")
    key = _splitmix64(np.array([seed], dtype=_U64))
    base = _splitmix64(ids.astype(_U64) ^ key)
    pos = np.arange(block_tokens, dtype=_U64)
    mixed = _splitmix64(base[:, None] + pos[None, :] * _U64(0xD1B54A32D192ED03))
    return (mixed % _U64(vocab)).astype(TOKEN_DTYPE).reshape(-1)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_LENGTH = 4_000_000  # tokens per request: far beyond any context window, and still a few MB


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse(obj: Any, where: str, line: int, rid: int, block_tokens: int) -> TraceRecord:
    def bad(reason: str) -> TraceFormatError:
        return TraceFormatError(where, line, reason)

    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    for key in _FIELDS:
        if key not in obj:
            raise bad(f"missing field '{key}'")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise bad(f"field 'timestamp' must be a number (ms), got {ts!r}")
    if ts < 0:
        raise bad(f"field 'timestamp' must not be negative, got {ts}")
    for key in ("input_length", "output_length"):
        v = obj[key]
        if not _is_int(v):
            raise bad(f"field '{key}' must be an integer, got {v!r}")
        if v < 0:
            raise bad(f"field '{key}' must not be negative, got {v}")
        if v == 0:
            raise bad(f"field '{key}' must be >= 1, got 0")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise bad(f"field 'hash_ids' must be a list of integers, got {type(ids).__name__}")
    for j, h in enumerate(ids):
        if not _is_int(h) or not 0 <= h < 2**63:
            raise bad(f"field 'hash_ids'[{j}] must be an integer in [0, 2**63), got {h!r}")
    for key in ("input_length", "output_length"):
        if obj[key] > MAX_LENGTH:
            raise bad(
                f"field '{key}' is {obj[key]:,}, above the {MAX_LENGTH:,} tokens a request may have"
            )
    need = -(-obj["input_length"] // block_tokens)
    if len(ids) < need:
        raise bad(
            f"input_length {obj['input_length']} needs {need} hash_ids at "
            f"{block_tokens} tokens per block, got {len(ids)}"
        )
    return TraceRecord(
        request_id=rid,
        line=line,
        timestamp_ms=float(ts),
        input_length=obj["input_length"],
        output_length=obj["output_length"],
        hash_ids=tuple(ids[:need]),
    )


def read_mooncake_records(
    path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[TraceRecord]:
    """Validated records of a Mooncake JSONL trace, sorted by timestamp (stable)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    where = str(path)
    records: list[TraceRecord] = []
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(where, lineno, f"invalid JSON: {exc.msg}") from exc
            records.append(_parse(obj, where, lineno, len(records), block_tokens))
    records.sort(key=lambda r: r.timestamp_ms)
    return records


@dataclass(frozen=True)
class TraceRequest:
    """A trace request that keeps its hash ids and expands its prompt on every read.

    It has the attributes of a :class:`RequestSpec` (``request_id``, ``prompt_token_ids``,
    ``prompt_len``, ``max_tokens``, ``arrival_s``, ``prefix_hints``) and survives
    ``dataclasses.replace`` (new arrival times) without expanding anything. Nothing caches the
    prompt: read it once where it is needed and let it go.
    """

    request_id: int
    hash_ids: tuple[int, ...]  # exactly the ceil(input_length / block_tokens) ids used
    input_length: int
    max_tokens: int
    arrival_s: float | None
    block_tokens: int
    vocab: int
    seed: int = 0
    prefix_hints: tuple[int, ...] = ()

    @property
    def prompt_len(self) -> int:
        return self.input_length

    @property
    def prompt_token_ids(self) -> np.ndarray:
        """The prompt (read-only int32), computed now from the hash ids."""
        prompt = hash_block_tokens(self.hash_ids, self.block_tokens, self.vocab, self.seed)
        prompt = prompt[: self.input_length]
        prompt.setflags(write=False)
        return prompt

    def expand(self) -> RequestSpec:
        """The same request with its prompt in memory."""
        return RequestSpec(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            max_tokens=self.max_tokens,
            arrival_s=self.arrival_s,
            prefix_hints=self.prefix_hints,
        )


def lazy_mooncake_trace(
    path: str | Path,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    vocab: int = DEFAULT_VOCAB,
    *,
    seed: int = 0,
    limit: int | None = None,
) -> list[TraceRequest]:
    """The requests of :func:`read_mooncake_trace`, prompts not expanded (see
    :class:`TraceRequest`): a few hundred bytes per request instead of 4 per prompt token.

    The whole file is validated first (a :class:`TraceFormatError` names the bad line before
    any request is returned); sorting by timestamp needs every line anyway.
    """
    if not 1 <= vocab <= MAX_VOCAB or seed < 0:
        raise ValueError(f"need 1 <= vocab <= {MAX_VOCAB} and seed >= 0")
    records = read_mooncake_records(path, block_tokens)
    if limit is not None:
        records = records[: max(limit, 0)]
    return [
        TraceRequest(
            request_id=r.request_id,
            hash_ids=r.hash_ids,
            input_length=r.input_length,
            max_tokens=r.output_length,
            arrival_s=r.timestamp_ms / 1000.0,
            block_tokens=block_tokens,
            vocab=vocab,
            seed=seed,
        )
        for r in records
    ]


def iter_mooncake_trace(
    path: str | Path,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    vocab: int = DEFAULT_VOCAB,
    *,
    seed: int = 0,
    limit: int | None = None,
) -> Iterator[RequestSpec]:
    """Like :func:`read_mooncake_trace`, but expands each prompt only when it is reached.

    The whole file is validated before the first request is yielded; a long trace's tokens
    (about 135M for the default generated trace) are then never all in memory at once.
    """
    lazy = lazy_mooncake_trace(path, block_tokens, vocab, seed=seed, limit=limit)
    return (r.expand() for r in lazy)


def requests_from_records(
    records: Sequence[Mapping[str, Any]],
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    vocab: int = DEFAULT_VOCAB,
    *,
    seed: int = 0,
) -> list[RequestSpec]:
    """In-memory Mooncake records (e.g. from :func:`generate_mooncake_like`) as requests,
    validated and expanded exactly like a trace file, in arrival order."""
    parsed = [_parse(r, "<records>", i + 1, i, block_tokens) for i, r in enumerate(records)]
    parsed.sort(key=lambda r: r.timestamp_ms)
    return list(_expand(parsed, block_tokens, vocab, seed))


def _expand(
    records: Sequence[TraceRecord], block_tokens: int, vocab: int, seed: int
) -> Iterator[RequestSpec]:
    if not 1 <= vocab <= MAX_VOCAB or seed < 0:
        raise ValueError(f"need 1 <= vocab <= {MAX_VOCAB} and seed >= 0")
    for r in records:
        prompt = hash_block_tokens(r.hash_ids, block_tokens, vocab, seed)[: r.input_length]
        prompt.setflags(write=False)
        yield RequestSpec(
            request_id=r.request_id,
            prompt_token_ids=prompt,
            max_tokens=r.output_length,
            arrival_s=r.timestamp_ms / 1000.0,
        )


def read_mooncake_trace(
    path: str | Path,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    vocab: int = DEFAULT_VOCAB,
    *,
    seed: int = 0,
    limit: int | None = None,
) -> list[RequestSpec]:
    """Requests of a Mooncake JSONL trace, in arrival order.

    ``arrival_s`` is ``timestamp / 1000``; the prompt is the concatenated tokens of the hash
    ids (:func:`hash_block_tokens`) cut to ``input_length``; ``max_tokens`` is
    ``output_length``; ``request_id`` is the index among non-blank lines. ``limit`` keeps the
    first ``limit`` requests by arrival. Raises :class:`TraceFormatError` on a bad line.
    """
    return list(iter_mooncake_trace(path, block_tokens, vocab, seed=seed, limit=limit))


# ---------------------------------------------------------------------------------------------
# Writing and measuring
# ---------------------------------------------------------------------------------------------


def write_trace(records: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write records (dicts with the four Mooncake fields) as JSONL: the whole file or
    nothing (an interrupted write leaves no truncated trace)."""
    from hycache.report import jsonl, write_atomic

    rows = []
    for rec in records:
        row = {k: rec[k] for k in _FIELDS}
        row["hash_ids"] = [int(h) for h in row["hash_ids"]]
        rows.append(row)
    write_atomic(path, jsonl(rows))


def _ordered(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(records, key=lambda r: r["timestamp"])


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
        lead = 0
        for h in ids:
            if h not in seen:
                break
            lead += 1
        hit += min(lead * block_tokens, length)
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
    if turn_gap_s is not None:
        max_open_sessions = max(max_open_sessions, 2048)

    def ready(now_ms: float) -> float:
        if turn_gap_s is None:
            return 0.0
        return now_ms + float(rng.lognormal(math.log(turn_gap_s * 1000.0), 0.5))

    gaps = rng.exponential(1000.0 / arrival_rate, n)
    times_ms = np.rint(np.cumsum(gaps) - (gaps[0] if n else 0.0)).astype(np.int64)
    inputs = _lognormal_ints(rng, n, input_median, input_sigma, 1, max_input_tokens)
    outputs = _lognormal_ints(rng, n, output_median, output_sigma, 1, max_output_tokens)

    next_id = 0

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    sys_tokens = _lognormal_ints(
        rng, num_system_prompts, system_prompt_median_tokens, 0.6, block_tokens, max_input_tokens
    )
    sys_blocks = sys_tokens // block_tokens
    system_prompts = [fresh(int(b)) for b in sys_blocks]
    zipf = 1.0 / np.arange(1, num_system_prompts + 1)
    zipf /= zipf.sum()

    sessions: list[_Session] = []
    seen: set[int] = set()
    hit_sum = 0.0
    tok_sum = 0.0
    p_continue = 0.75  # share of reuses that continue a conversation (vs. a system prompt)
    records: list[dict[str, Any]] = []

    for i in range(n):
        length = int(inputs[i])
        need = -(-length // block_tokens)
        full = length // block_tokens
        # Integral control: the token deficit against the target sets the odds of reusing.
        deficit = target_hit_ceiling * tok_sum - hit_sum
        p_reuse = float(np.clip(0.5 + deficit / (20.0 * input_median), 0.0, 1.0))
        ids: list[int] | None = None
        continued = False
        if rng.random() < p_reuse:
            want_session = rng.random() < p_continue
            if want_session:
                eligible = [
                    s
                    for s in sessions
                    if s.length // block_tokens > 0
                    and s.length < length
                    and s.ready_ms <= times_ms[i]
                ]
                if eligible:
                    # The next turn of a conversation is a little longer than the last one:
                    # pick among the few longest conversations that still fit under this prompt.
                    eligible.sort(key=lambda c: c.length, reverse=True)
                    s = eligible[int(rng.integers(min(len(eligible), 4)))]
                    prefix = s.ids[: s.length // block_tokens]
                    ids = prefix + fresh(need - len(prefix))
                    s.ids, s.length = ids, length
                    s.ready_ms = ready(float(times_ms[i]))
                    continued = True
                    s.turns_left -= 1
                    if s.turns_left <= 0:
                        sessions.remove(s)
            if ids is None and full > 0 and num_system_prompts > 0:
                k = int(rng.choice(num_system_prompts, p=zipf))
                prefix = system_prompts[k][:full]
                ids = prefix + fresh(need - len(prefix))
        if ids is None:
            ids = fresh(need)
        if not continued:
            # A new conversation (fresh or behind a system prompt) may be continued later.
            turns = int(rng.geometric(1.0 / max(mean_turns, 1.0)))
            if turns > 1:
                sessions.append(_Session(ids, length, turns - 1, ready(float(times_ms[i]))))
                if len(sessions) > max_open_sessions:
                    sessions.pop(0)

        lead = 0
        for h in ids:
            if h not in seen:
                break
            lead += 1
        hit_sum += min(lead * block_tokens, length)
        tok_sum += length
        seen.update(ids)
        records.append(
            {
                "timestamp": int(times_ms[i]),
                "input_length": length,
                "output_length": int(outputs[i]),
                "hash_ids": ids,
            }
        )
    return records


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
        num_requests=num_requests,
        seed=seed,
        block_tokens=block_tokens,
        turn_gap_s=turn_gap_s,
        num_system_prompts=num_system_prompts,
    )
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
