"""How one cache memory budget becomes pools: the one home of the sizing rule.

Two layouts:

    separate pools (the engine's default)      one shared pool (vLLM's hybrid allocator;
                                                the simulator's presets)
    attention blocks: B rows of K/V per layer   every page is max(attention block, SSM state)
    SSM pages: one conv + SSM state per layer   bytes, used as either kind

With separate pools, a small block size no longer pays for a whole SSM state per block (for
Bamba-9B at B = 64: 1 MiB of K/V against 117 MiB of state). The budget is split in the
proportion one sequence of `max_model_len` tokens uses, so neither pool runs out first on a full
batch of long requests:

    one sequence = ceil(max_model_len / B) attention blocks per attention group (the target's
                   and the drafter's tables each take their own block ids)
                 + PAGES_PER_SEQUENCE SSM pages per SSM group
    sequences    = budget / (bytes of one sequence)
    blocks       = sequences x blocks per sequence  (+ the null block),  pages likewise

Cached prefixes then compete within their own pool: attention blocks with attention blocks,
SSM checkpoints with SSM checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the SSM pages a running sequence may hold at once: the state it resumed from, its running
# state, a checkpoint being written, and a decode snapshot
PAGES_PER_SEQUENCE = 4


@dataclass(frozen=True)
class PoolSizes:
    num_blocks: int  # attention blocks (with the null block)
    num_state_pages: int | None  # SSM state pages (with the null page); None: one shared pool


def split_budget(
    budget_bytes: int,
    *,
    attention_block_bytes: int,
    state_page_bytes: int,
    max_model_len: int,
    block_size: int,
    attention_groups: int = 1,
) -> PoolSizes:
    """Separate pools for `budget_bytes` (see the module diagram). `attention_block_bytes`
    counts every attention group's K/V for one block (the drafter's too); 0 for a model
    without attention layers, and `state_page_bytes` 0 for one without Mamba layers."""
    if budget_bytes <= 0:
        raise ValueError(f"cache memory budget must be positive, got {budget_bytes} bytes")
    blocks_per_seq = attention_groups * math.ceil(max_model_len / block_size)
    if not attention_block_bytes:
        blocks_per_seq = 0
    pages_per_seq = PAGES_PER_SEQUENCE if state_page_bytes else 0
    per_seq = blocks_per_seq * attention_block_bytes + pages_per_seq * state_page_bytes
    if per_seq == 0:
        raise ValueError("the model has neither attention nor Mamba layers to cache")
    seqs = budget_bytes / per_seq
    blocks = int(seqs * blocks_per_seq) + 1 if attention_block_bytes else 2
    pages = int(seqs * pages_per_seq) + 1 if state_page_bytes else 2
    return PoolSizes(blocks, pages)


def shared_page_bytes(attention_block_bytes: int, state_page_bytes: int) -> int:
    """One page of a shared pool serves either kind: the larger of the two."""
    return max(attention_block_bytes, state_page_bytes)
