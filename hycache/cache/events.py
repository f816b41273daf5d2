"""vLLM's KV event wire format, as hycache publishes it (docs/events.md).

The message types of vLLM 0.33/0.34's `vllm/distributed/kv_events.py`, written here (the cache
never imports vLLM) with the same tags, field names, field order and msgspec options, so that any
consumer of vLLM's events (Dynamo's KV router, llm-d) decodes hycache's bytes, and hycache decodes
vLLM's (tests/cache/test_events.py round-trips both ways through vLLM's own decoder):

    KVEventBatch [ts, events, data_parallel_rank(, resumable_events)]    (a msgpack array)
      events: {"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...}   (maps)

One addition: `KVEventBatch.resumable_events`, a trailing optional field (vLLM's decoder ignores
a trailing array element it does not declare). In `full` mode it carries the `resumable` stream
beside vLLM's per-group events (`hycache.cache.event_log`).

The wire each consumer reads (`encode_batch(batch, wire)`), the one place a batch is written:

    "vllm"    [ts, events, data_parallel_rank], plus `resumable_events` when the batch has them
              (`full` mode): what vLLM's decoder (0.33, 0.34) reads
    "dynamo"  exactly [ts, events, data_parallel_rank]: Dynamo 1.6.1 decodes a batch as that
              3-tuple (its `zmq_wire.rs`) and drops a batch of any other length whole, so the
              `full` mode's tail is left out (Dynamo could not read it anyway)

A `resumable` batch is the same three fields on both wires.
"""

from __future__ import annotations

from typing import Any, Literal

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


Wire = Literal["vllm", "dynamo"]
WIRES: tuple[Wire, ...] = ("vllm", "dynamo")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


class WireBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    """Exactly vLLM's `EventBatch` fields, written as three array elements whatever their
    values (the "dynamo" wire, and a batch without a tail on either)."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def for_wire(batch: KVEventBatch, wire: Wire = "vllm") -> KVEventBatch | WireBatch:
    """The struct whose msgpack encoding is `batch` on `wire` (module docstring): the batch
    itself on the "vllm" wire when it carries a tail, else its three fields. A publisher that
    encodes structs itself (vLLM's, which also fills `data_parallel_rank`) is handed this."""
    if wire not in WIRES:
        raise ValueError(f"wire: one of {', '.join(WIRES)}, got {wire!r}")
    if wire == "vllm" and batch.resumable_events is not None:
        return batch
    return WireBatch(batch.ts, batch.events, batch.data_parallel_rank)


def encode_batch(batch: KVEventBatch, wire: Wire = "vllm") -> bytes:
    """A batch's msgpack bytes as `wire`'s consumer reads them (`for_wire`): always `ts,
    events, data_parallel_rank` (a rank of None written as nil, never omitted), then, on the
    "vllm" wire only, the `resumable_events` tail when the batch carries one."""
    return _encoder.encode(for_wire(batch, wire))


def decode_batch(data: bytes) -> KVEventBatch:
    """A batch from msgpack bytes (hycache's, or a vLLM engine's)."""
    return _decoder.decode(data)
