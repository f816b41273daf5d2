"""Mooncake-format request traces: reading them.

This module owns the trace side of the simulator's inputs:

* :func:`read_mooncake_trace` turns a Mooncake JSONL trace (``timestamp`` in ms,
  ``input_length``, ``output_length``, ``hash_ids``) into :class:`RequestSpec` objects, expanding
  every hash id into ``block_tokens`` deterministic token ids, so requests that share hash ids
  share prompt tokens. Malformed input raises :class:`TraceFormatError` naming the line.
* :func:`lazy_mooncake_trace` reads the same trace as :class:`TraceRequest` objects, which keep
  only the hash ids and expand the prompt each time it is read: the simulator reads it when it
  admits the request, so a 12,000-request trace (135M prompt tokens) never has all its prompts
  in memory at once. The whole file is still validated before the first request is returned.
* Writing, measuring and synthesising traces (``hycache trace-gen``) live in
  :mod:`hycache.sim.trace_gen`.

Reader decisions: blank lines are skipped and consume no request id (ids are 0-based indices
among non-blank lines; error line numbers are 1-based physical lines); timestamps may go
backwards and the result is sorted by timestamp, stably; ``hash_ids`` beyond the
``ceil(input_length / block_tokens)`` needed are ignored; fields other than the four are
ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from hycache.sim.workloads import DEFAULT_VOCAB, MAX_VOCAB, TOKEN_DTYPE, RequestSpec

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormatError",
    "TraceRecord",
    "TraceRequest",
    "hash_block_tokens",
    "iter_mooncake_trace",
    "lazy_mooncake_trace",
    "read_mooncake_records",
    "read_mooncake_trace",
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

TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_LENGTH = 4_000_000  # tokens per request: far beyond any context window, and still a few MB


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse(obj: Any, where: str, line: int, rid: int, block_tokens: int) -> TraceRecord:
    def bad(reason: str) -> TraceFormatError:
        return TraceFormatError(where, line, reason)

    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    for key in TRACE_FIELDS:
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
        """The same request with its prompt in memory (every `RequestSpec` field, read by
        name)."""
        return RequestSpec(**{f.name: getattr(self, f.name) for f in fields(RequestSpec)})


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
    _check_expansion(vocab, seed)
    records = read_mooncake_records(path, block_tokens)
    if limit is not None:
        records = records[: max(limit, 0)]
    return _requests(records, block_tokens, vocab, seed)


def _check_expansion(vocab: int, seed: int) -> None:
    if not 1 <= vocab <= MAX_VOCAB or seed < 0:
        raise ValueError(f"need 1 <= vocab <= {MAX_VOCAB} and seed >= 0")


def _requests(
    records: Sequence[TraceRecord], block_tokens: int, vocab: int, seed: int
) -> list[TraceRequest]:
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
    _check_expansion(vocab, seed)
    return [r.expand() for r in _requests(parsed, block_tokens, vocab, seed)]


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
