"""Wiring the second cache tier into an engine: the store, its fingerprint, the mirror.

The fingerprint names everything that gives a stored block its meaning, so that two engines
share objects exactly when they would compute the same bytes:

    model config + dtype + weights (every byte of every safetensors file, digested once when
    the engine starts; a preset's name and seed)
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

DIGEST_CHUNK_BYTES = 16 << 20  # read this much at a time while digesting a checkpoint


def file_digest(path: Path) -> str:
    """xxh3-128 of every byte of `path`, streamed (memory stays at one chunk)."""
    h = xxhash.xxh3_128()
    with path.open("rb") as fh:
        while chunk := fh.read(DIGEST_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def weights_identity(model: str | None) -> Any:
    """What identifies a checkpoint's weights: each safetensors file's name, size and a digest
    of all its bytes (two fine-tunes that differ in one middle tensor differ here; xxh3 reads
    at memory speed, a fraction of the load itself); a preset: its name."""
    if model is None:
        return None
    path = Path(model)
    if not path.is_dir():
        return {"preset": model}
    return [[f.name, f.stat().st_size, file_digest(f)] for f in sorted(path.glob("*.safetensors"))]


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
