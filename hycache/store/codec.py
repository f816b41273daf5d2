"""Store object names and value framing.

A name says exactly what an object is, so two engines agree on it and nothing else can:

    hycache/<model fingerprint>/<group>/<position>/<chained prefix hash, hex>[/<kind>]

A value is framed with a header that repeats the name's digest and carries the payload's
length and checksum; `decode` returns None for anything that does not check out (a truncated
or half-written object, another key's value, bit rot), so a bad object is a miss, never a
wrong hit:

    magic "HYC1" | u32 header version | u64 xxh64(name) | u64 payload length | u64 xxh64(payload)
    | payload
"""

from __future__ import annotations

import json
import struct
from typing import Any

import xxhash

from hycache.config import HycacheConfig

MAGIC = b"HYC1"
VERSION = 1
_HEADER = struct.Struct("<4sIQQQ")
HEADER_BYTES = _HEADER.size


def object_name(
    fingerprint: str, group: int, position: int, prefix_hash: bytes, kind: str = ""
) -> str:
    """`kind` names an object other than a block or state at that key (e.g. "units")."""
    suffix = f"/{kind}" if kind else ""
    return f"hycache/{fingerprint}/{group}/{position}/{prefix_hash.hex()}{suffix}"


def layout_parts(config: HycacheConfig) -> dict[str, Any]:
    """The cache layout and key scheme in a fingerprint: what every engine (and simulated
    instance) sharing objects must agree on besides the model."""
    c = config.cache
    return {
        "block_size": c.block_size,
        "unit": c.unit,
        "hash_seed": c.hash_seed,
        "policy": str(c.policy),
        "speculative": config.speculative.num_speculative_tokens > 0,
        "groups": [str(g) for g in c.groups],
    }


def fingerprint(parts: dict[str, Any]) -> str:
    """A short stable digest of everything that gives a stored block its meaning (model
    config, dtype, weights' identity, cache layout, key scheme)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return xxhash.xxh64_hexdigest(blob)


def encode(name: str, payload: bytes) -> bytes:
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        xxhash.xxh64_intdigest(name.encode()),
        len(payload),
        xxhash.xxh64_intdigest(payload),
    )
    return header + payload


def decode(name: str, value: bytes | None) -> bytes | None:
    """The payload of `value` stored under `name`, or None if it is missing or does not check."""
    if value is None or len(value) < HEADER_BYTES:
        return None
    magic, version, name_digest, length, checksum = _HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION:
        return None
    if name_digest != xxhash.xxh64_intdigest(name.encode()):
        return None
    payload = bytes(memoryview(value)[HEADER_BYTES:])
    if len(payload) != length or xxhash.xxh64_intdigest(payload) != checksum:
        return None
    return payload
