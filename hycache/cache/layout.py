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

The byte sizes themselves are defined here too, once, for the engine (`engine.py`, from the
model config and its torch dtype), the store's block payloads (`engine/block_io.py`) and the
simulator (`sim/model_spec.py`, `sim/costmodel.py`), in plain integers (no torch):

    K/V of one token in one attention layer    2 x kv_heads x head_dim x item bytes
    attention block                            layers x block_size x the above
    conv window of one Mamba layer             (d_conv - 1) x conv_dim x item bytes
    SSM state of one Mamba layer               n_heads x d_head x d_state x state item bytes
    SSM state item                             4 (float32), 8 in a float64 model
    SSM page                                   Mamba layers x (conv window + SSM state)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

# the SSM pages a running sequence may hold at once: the state it resumed from, its running
# state, a checkpoint being written, and a decode snapshot
PAGES_PER_SEQUENCE = 4


# --------------------------------------------------------------------------------- byte sizes
class MambaShape(Protocol):
    """The Mamba2 geometry a state page is sized from (`HybridConfig` has it)."""

    @property
    def num_mamba_layers(self) -> int: ...
    @property
    def mamba_conv_dim(self) -> int: ...
    @property
    def mamba_d_conv(self) -> int: ...
    @property
    def mamba_n_heads(self) -> int: ...
    @property
    def mamba_d_head(self) -> int: ...
    @property
    def mamba_d_state(self) -> int: ...


def kv_bytes_per_token(num_kv_heads: int, head_dim: int, item_bytes: int) -> int:
    """K and V of one token in one attention layer."""
    return 2 * num_kv_heads * head_dim * item_bytes


def attention_block_bytes(
    layers: int, block_size: int, num_kv_heads: int, head_dim: int, item_bytes: int
) -> int:
    """K and V of `block_size` tokens in each of `layers` attention layers."""
    return layers * block_size * kv_bytes_per_token(num_kv_heads, head_dim, item_bytes)


def ssm_state_item_bytes(item_bytes: int) -> int:
    """SSM states are float32, except in a float64 model (then float64)."""
    return 8 if item_bytes == 8 else 4


def conv_state_bytes(conv_dim: int, d_conv: int, item_bytes: int) -> int:
    """One Mamba layer's conv window: the last d_conv - 1 inputs of every conv channel."""
    return (d_conv - 1) * conv_dim * item_bytes


def ssm_state_bytes(n_heads: int, d_head: int, d_state: int, state_item_bytes: int) -> int:
    """One Mamba layer's SSM hidden state h."""
    return n_heads * d_head * d_state * state_item_bytes


def state_page_bytes(shape: MambaShape, item_bytes: int) -> int:
    """One SSM page: the conv window (model dtype) and SSM state of every Mamba layer."""
    conv = conv_state_bytes(shape.mamba_conv_dim, shape.mamba_d_conv, item_bytes)
    state_item = ssm_state_item_bytes(item_bytes)
    ssm = ssm_state_bytes(shape.mamba_n_heads, shape.mamba_d_head, shape.mamba_d_state, state_item)
    return shape.num_mamba_layers * (conv + ssm)


# --------------------------------------------------------------------------------- pools
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


def unsized_num_blocks(max_model_len: int, block_size: int, max_num_seqs: int) -> int:
    """Pages of one shared pool when no memory budget sizes it (a simulation without a cost
    model): twice what `max_num_seqs` sequences of `max_model_len` tokens hold at once, their
    attention blocks and SSM pages alike, plus a margin."""
    per_seq = -(-max_model_len // block_size) + PAGES_PER_SEQUENCE
    return max(max_num_seqs, 1) * per_seq * 2 + 16
