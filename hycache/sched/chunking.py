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
"""

from __future__ import annotations

from collections.abc import Sequence


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
