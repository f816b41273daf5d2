"""The SSM-aligned chunk split (architecture §4.6): where a prefill chunk may end.

An SSM state exists only at the end of a forward step, so a chunk never runs past a position
where a checkpoint may be kept: it ends on the block grid, at a mandatory stop from the
boundaries module (replay boundary, tail checkpoint, junction, the next block boundary after a
mid-block start), or, when the budget does not reach the next block boundary, wherever the
budget ends (a sub-block chunk; its state is kept only where a checkpoint belongs).

    start          stop?         limit = min(num_tokens, start + budget)
      |--------------|--------------|
      first mandatory stop in (start, limit]  -> end there
      else the whole rest fits                -> end at num_tokens (the final chunk)
      else the last block-grid position <= limit, if it is past start
      else limit                              -> a sub-block chunk

Step packing (`packing_cap`): in a step with decoding requests, the chunk that would finish a
request's prefill is cut at the prefill tokens whose compute the step's memory-bound time
leaves free, as a `StepCostOracle` (the simulator's cost model) computes them, when it is at
most `PACK_RATIO` times longer; the rest runs in the next step, which the decodes take
anyway. One cut per admission, so a first token comes at most one step later (the short
last piece a checkpoint stop leaves usually hides whole, and is not cut). Without an oracle
(the engine) nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


def chunk_end(
    start: int, num_tokens: int, budget: int, stops: Sequence[int], block_size: int
) -> int:
    """End of the chunk starting at `start` (`start` only when `budget` is 0).

    `stops` are ascending mandatory stops (positions > start)."""
    limit = min(num_tokens, start + budget)
    for s in stops:
        if s >= num_tokens or s > limit:
            break
        return s
    if limit == num_tokens:
        return num_tokens
    end = limit // block_size * block_size
    return end if end > start else limit


# A final chunk is cut for packing only when it is at most this many times the free tokens.
# The cut costs its request one step (about the decodes' memory time) and saves at most that
# step's slack: worth it on a short chunk, not on a long one; without a bound the
# system-prompt workload's long suffixes were cut too (docs/admission.md, "Step packing").
PACK_RATIO = 4


class StepSeq(NamedTuple):
    """One request's share of a step, as a step-cost oracle sees it."""

    context_len: int  # tokens already cached before this step
    num_new_tokens: int  # a prefill chunk, or 1 + drafts when decoding
    num_draft_tokens: int
    is_prefill: bool


class StepCostOracle(Protocol):
    """What a model's step cost says about packing (the simulator's `CostModel`; an engine
    may have none)."""

    def free_prefill_tokens(self, step: Sequence[StepSeq], context_len: int, limit: int) -> int:
        """The most prefill tokens (at most `limit`), after `context_len` cached ones, that can
        join `step` with every part of the step still bound by its memory traffic: their
        compute hides under the time the step takes anyway. 0 when none can."""
        ...


def packing_cap(
    oracle: StepCostOracle | None,
    step: Sequence[StepSeq],
    context_len: int,
    chunk: int,
    unit: int = 1,
) -> int:
    """How long a request's final prefill chunk (`chunk` tokens after `context_len`) runs in
    `step`: cut at the tokens `oracle` says hide under the step's memory time, floored to the
    `unit` grid (a cut between unit positions lost hit rate: docs/admission.md), when
    `step` carries a decoding request and the chunk is longer, but at most `PACK_RATIO` times
    as long (the rest runs in the next step, which the decodes take anyway); else `chunk`."""
    if oracle is None or chunk <= 1 or all(s.is_prefill for s in step):
        return chunk
    free = oracle.free_prefill_tokens(step, context_len, chunk)
    if not 0 < free < chunk <= PACK_RATIO * free:
        return chunk
    cut = (context_len + free) // unit * unit - context_len
    return cut if cut > 0 else chunk
