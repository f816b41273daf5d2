"""hycache's KV event structs against vLLM's own: its decoder reads our bytes, ours read its."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from hycache.cache.events import (
    FULL_ATTENTION,
    MAMBA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    Wire,
    decode_batch,
    encode_batch,
    external_hash,
)


def sample_batch(resumable: bool = False) -> KVEventBatch:
    events = [
        AllBlocksCleared(),
        BlockStored([11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU", None,
                    group_idx=0, kv_cache_spec_kind=FULL_ATTENTION),
        BlockStored([2**63 - 1], 12, [9] * 16, 16, None, "GPU", None, group_idx=1,
                    kv_cache_spec_kind=MAMBA, lookahead_token_ids=[[10]]),
        BlockRemoved([12, 11], "GPU", 0),
    ]  # fmt: skip
    tail = [BlockRemoved([5], "GPU", 0)] if resumable else None
    return KVEventBatch(1234.5, events, None, tail)


def test_external_hash_is_stable_and_fits_a_signed_64_bit_int() -> None:
    h = bytes(range(16))
    assert external_hash(h) == int.from_bytes(h[:8], "big")
    assert external_hash(b"\xff" * 16) == 2**63 - 1


def test_our_bytes_round_trip_through_our_decoder() -> None:
    for tail in (False, True):
        batch = sample_batch(tail)
        assert decode_batch(encode_batch(batch)) == batch


def test_the_batch_is_an_array_and_events_are_tagged_maps() -> None:
    # [ts, events, dp rank] always (a None rank written, not omitted), the tail only on the
    # "vllm" wire and only when the batch has one; Dynamo's wire is exactly three fields
    raw = msgspec.msgpack.decode(encode_batch(sample_batch(False)))
    assert len(raw) == 3 and raw[2] is None
    assert encode_batch(sample_batch(False), "dynamo") == encode_batch(sample_batch(False))
    raw = msgspec.msgpack.decode(encode_batch(sample_batch(True)))
    assert len(raw) == 4 and raw[2] is None and raw[3][0]["type"] == "BlockRemoved"
    raw = msgspec.msgpack.decode(encode_batch(sample_batch(True), "dynamo"))
    assert len(raw) == 3 and raw[1][0] == {"type": "AllBlocksCleared"}
    assert decode_batch(encode_batch(sample_batch(True), "dynamo")) == sample_batch(False)
    with pytest.raises(ValueError, match="wire"):
        encode_batch(sample_batch(False), "sglang")  # type: ignore[arg-type]
    assert raw[1][1]["type"] == "BlockStored" and list(raw[1][1])[:4] == [
        "type", "block_hashes", "parent_block_hash", "token_ids"
    ]  # fmt: skip


CHECK = """
import sys, msgspec
from vllm.distributed import kv_events as v
from hycache.cache import events as h
data = sys.stdin.buffer.read()
ours = h.decode_batch(data)
theirs = msgspec.msgpack.Decoder(v.KVEventBatch).decode(data)
assert theirs.ts == ours.ts and len(theirs.events) == len(ours.events)
for a, b in zip(theirs.events, ours.events):
    assert type(a).__name__ == type(b).__name__
    assert [f for f in a.__struct_fields__] == [f for f in b.__struct_fields__], type(a)
    assert {f: getattr(a, f) for f in a.__struct_fields__} == \\
        {f: getattr(b, f) for f in b.__struct_fields__}
assert v.KVEventBatch.__struct_fields__ == h.KVEventBatch.__struct_fields__[:3]
# vLLM's encoder, our decoder: the same events back (vLLM drops the tail it never read)
back = msgspec.msgpack.Encoder().encode(theirs)
assert h.decode_batch(back).events == ours.events
assert msgspec.msgpack.decode(back)[1] == msgspec.msgpack.decode(data)[1]
print("ok", len(ours.events))
"""


def vllm_check(data: bytes, extra_path: str | None = None) -> str:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, root) if p)
    out = subprocess.run(
        [sys.executable, "-c", CHECK], input=data, capture_output=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return out.stdout.decode()


VLLM_034 = Path(os.environ.get("HYCACHE_VLLM_034", "/work/main/.vllm-0.34"))


@pytest.mark.parametrize(("tail", "wire"), [(False, "vllm"), (True, "vllm"), (True, "dynamo")])
def test_vllms_decoder_reads_our_batches_and_we_read_its(tail: bool, wire: Wire) -> None:
    """vLLM 0.33 (this venv): each event decodes field for field; vLLM's re-encoding of what
    it read decodes back to our events, its events' bytes equal to ours."""
    pytest.importorskip("vllm.distributed.kv_events")
    assert vllm_check(encode_batch(sample_batch(tail), wire)).startswith("ok 4")


@pytest.mark.skipif(not (VLLM_034 / "vllm").is_dir(), reason="no vLLM 0.34 tree")
def test_vllm_034_reads_them_too() -> None:
    assert vllm_check(encode_batch(sample_batch(True)), str(VLLM_034)).startswith("ok 4")
