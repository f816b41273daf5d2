"""vLLM's KV event wire format, as hycache publishes it (docs/events.md).

The message types of vLLM 0.33/0.34's `vllm/distributed/kv_events.py`, written here (the cache
never imports vLLM) with the same tags, field names, field order and msgspec options, so that any
consumer of vLLM's events (Dynamo's KV router, llm-d) decodes hycache's bytes, and hycache decodes
vLLM's (tests/cache/test_events.py round-trips both ways through vLLM's own decoder):

    KVEventBatch [ts, events, data_parallel_rank, resumable_events]      (a msgpack array)
      events: {"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...}   (maps)

One addition: `KVEventBatch.resumable_events`, a trailing optional field (vLLM's decoder ignores
a trailing array element it does not declare). In `full` mode it carries the `resumable` stream
beside vLLM's per-group events (`hycache.cache.event_log`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from hycache.hashing import Hash

# vLLM's `ExternalBlockHash`: hycache publishes ints (`external_hash`); vLLM may send bytes
BlockHash = int | bytes

# vLLM's `KVCacheSpecKind` values for hycache's two group kinds
FULL_ATTENTION = "full_attention"
MAMBA = "mamba"
MEDIUM_GPU = "GPU"


def external_hash(h: Hash) -> int:
    """A hycache prefix hash (16 bytes) as an event's block hash: its first 8 bytes, big-endian,
    kept below 2**63 so that consumers reading a signed or an unsigned 64-bit id agree."""
    return int.from_bytes(h[:8], "big") & (2**63 - 1)


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base of the three events: a msgpack map tagged `"type": <class name>`."""


class BlockStored(KVCacheEvent):
    """Blocks stored, a chain: `block_hashes[i]`'s parent is `block_hashes[i-1]`, the first's is
    `parent_block_hash`; `token_ids` are the blocks' tokens in order. Same fields and order as
    vLLM's (the comments there name each)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks no longer cached (any order; hycache sends a chain's deepest first)."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every block of the publisher is gone (a cache reset)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    """vLLM's `KVEventBatch` (its `EventBatch` fields, in order), plus `resumable_events`:
    the `resumable` stream for the same interval, sent in `full` mode (None otherwise)."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    resumable_events: list[KVEvent] | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack bytes vLLM's publisher sends for a batch."""
    return _encoder.encode(batch)


def decode_batch(data: bytes) -> KVEventBatch:
    """A batch from msgpack bytes (hycache's, or a vLLM engine's)."""
    return _decoder.decode(data)
