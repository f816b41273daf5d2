"""Wiring the second cache tier into an engine: the store, its fingerprint, the mirror.

The fingerprint names everything that gives a stored block its meaning, so that two engines
share objects exactly when they would compute the same bytes:

    model config + dtype + weights (file names, sizes and edge bytes; a preset's name and seed)
    + drafter (its checkpoint or random seed) + block size, match unit, hash seed, key scheme
    and group layout
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import xxhash

from hycache.cache.manager import CacheManager
from hycache.cache.mirror import StoreMirror
from hycache.config import HycacheConfig
from hycache.engine.block_io import RunnerBlockIO
from hycache.engine.runner import ModelRunner
from hycache.store import KVStore, open_store
from hycache.store.codec import fingerprint, layout_parts

EDGE_BYTES = 1 << 16


def weights_identity(model: str | None) -> Any:
    """What identifies a checkpoint's weights without reading them all: each safetensors
    file's name, size and a digest of its first and last 64 KiB (a preset: its name)."""
    if model is None:
        return None
    path = Path(model)
    if not path.is_dir():
        return {"preset": model}
    out = []
    for f in sorted(path.glob("*.safetensors")):
        size = f.stat().st_size
        with f.open("rb") as fh:
            head = fh.read(EDGE_BYTES)
            fh.seek(max(size - EDGE_BYTES, 0))
            tail = fh.read(EDGE_BYTES)
        out.append([f.name, size, xxhash.xxh64_hexdigest(head + tail)])
    return out


def engine_fingerprint(
    model: str,
    model_config: Any,
    dtype: torch.dtype,
    config: HycacheConfig,
    drafter: str | None,
    draft_seed: int | None,
) -> str:
    cfg = (
        dataclasses.asdict(model_config)
        if dataclasses.is_dataclass(model_config)
        else dict(vars(model_config))
    )
    return fingerprint(
        {
            "model": cfg,
            "dtype": str(dtype),
            "weights": weights_identity(model),
            "drafter": weights_identity(drafter) if drafter else draft_seed,
            **layout_parts(config),
        }
    )


def attach_store(
    store: str | KVStore,
    gb: float,
    cache: CacheManager,
    runner: ModelRunner,
    fingerprint_: str,
) -> StoreMirror:
    """Open `store` (a spec such as "host" or "mooncake://HOST:PORT", or a store object) and
    mirror `cache` into it through the runner's tensors."""
    kv_store = open_store(store, gb) if isinstance(store, str) else store
    io = RunnerBlockIO(cache.config.groups, runner.kv, runner.draft_kv, runner.states)
    return cache.attach_store(kv_store, fingerprint_, io)
