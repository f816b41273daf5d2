"""What the engine is built with besides its cache knobs: loading, the drafter, the scheduler's
budget, the cache's memory and the second tier (`EngineOptions`), and the one rule that splits
`LLM(...)`'s keyword overrides between these and `CacheKnobs` (`resolve`).

Torch-free, so that the command line can build its typed engine arguments without loading
torch (`hycache.cli.args.EngineArgs`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from hycache.config import KNOB_NAMES, CacheKnobs

if TYPE_CHECKING:
    import torch

    from hycache.store import KVStore


@dataclass(frozen=True)
class EngineOptions:
    """`dtype` (a name in `hycache.engine.build.DTYPES`, or a torch dtype); `device` (None:
    CUDA when there is one, else the CPU).

    Cache memory: by default `cache_memory_gb` (speculative scratch included) is split into
    attention blocks and SSM state pages (`hycache.cache.layout`); `num_blocks` alone sizes
    one pool shared by both kinds, as the simulator does; both set two pools.
    `max_model_len` None: the model's, at most 8,192.

    Drafter: `num_speculative_tokens` drafts per step from the EAGLE head at `draft_model`,
    else the checkpoint's MTP layer, else a random head seeded by `draft_seed`
    (`hycache.engine.build.make_drafter`).

    `kv_store`: a second cache tier behind the device pool, "host" (this process's RAM,
    `kv_store_gb` GiB, LRU) or "mooncake://HOST:PORT" (a Mooncake master shared with other
    processes; this one contributes `kv_store_gb` GiB), or a `KVStore`.

    `warmup`: run one forward of `max_num_batched_tokens` positions before the first request
    (`ModelRunner.warmup`), as a server does before it listens: the first request's step then
    runs as fast as the ones after it."""

    dtype: str | torch.dtype = "float32"
    device: str | None = None
    num_blocks: int | None = None
    num_state_pages: int | None = None
    max_model_len: int | None = None
    cache_memory_gb: float = 1.0
    num_speculative_tokens: int = 0
    draft_model: str | None = None
    draft_seed: int = 0
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 64
    seed: int = 0
    kv_store: str | KVStore | None = None
    kv_store_gb: float = 1.0
    warmup: bool = False


OPTION_NAMES: frozenset[str] = frozenset(f.name for f in fields(EngineOptions))


def resolve(
    knobs: CacheKnobs | None, options: EngineOptions | None, overrides: dict[str, Any]
) -> tuple[CacheKnobs, EngineOptions]:
    """`knobs` and `options` (None: the defaults) with `overrides` applied, each name to the
    one of the two that declares it (TypeError for a name neither does)."""
    unknown = sorted(set(overrides) - KNOB_NAMES - OPTION_NAMES)
    if unknown:
        raise TypeError(f"LLM() got unexpected keyword arguments: {', '.join(unknown)}")
    knobs = knobs or CacheKnobs()
    options = options or EngineOptions()
    on_knobs = {k: v for k, v in overrides.items() if k in KNOB_NAMES}
    on_options = {k: v for k, v in overrides.items() if k in OPTION_NAMES}
    return (
        knobs.replace(**on_knobs) if on_knobs else knobs,
        replace(options, **on_options) if on_options else options,
    )
