"""Assembling an engine: the model and its drafter, the layer groups, the memory budget split
into pools, the `HycacheConfig`, the scheduler and runner, the second tier (`build_engine`);
and the byte and FLOP sizes these are computed from.

`LLM.__init__` calls `build_engine` and keeps what it returns; nothing here steps the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hycache.cache import layout
from hycache.config import (
    CacheConfig,
    CacheKnobs,
    GroupKind,
    HycacheConfig,
    RecomputeCost,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.engine.host_memory import keep_freed_memory
from hycache.engine.options import EngineOptions
from hycache.engine.runner import ModelRunner
from hycache.engine.tier import attach_store, engine_fingerprint
from hycache.model.configs.base import HybridConfig
from hycache.model.eagle import EagleHead
from hycache.model.loader import load_model
from hycache.model.mtp import MtpHead, checkpoint_mtp_tensors
from hycache.sched.scheduler import Scheduler
from hycache.store import KVStore

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
MAX_DEFAULT_MODEL_LEN = 8192  # `max_model_len` unset: the model's, at most this


def state_bytes(mc: HybridConfig, dtype: torch.dtype) -> int:
    """Bytes of one conv + SSM state slot over every Mamba layer (`layout.state_page_bytes`)."""
    return layout.state_page_bytes(mc, dtype.itemsize)


def attention_block_bytes(
    mc: HybridConfig, block_size: int, dtype: torch.dtype, drafter: bool
) -> int:
    """Bytes behind one attention block id: its K/V rows in every attention cache (the
    drafter's too). SSM states have a pool of their own (`state_bytes` a page)."""
    layers = mc.num_attention_layers + (1 if drafter else 0)
    return layout.attention_block_bytes(
        layers, block_size, mc.num_key_value_heads, mc.head_dim, dtype.itemsize
    )


def recompute_cost(model: torch.nn.Module, mc: HybridConfig, drafter: bool) -> RecomputeCost:
    """The prefill FLOPs `flop-aware` eviction prices entries with, from the model's own
    layers (the simulator's `CostModel.recompute_cost` terms): 2 FLOPs per weight of every
    decoder layer and token (MLP-only layers split over the mixer kinds by count), attention
    `4 * heads * head_dim` per (query, key) pair per attention layer (+ the drafter's)."""
    layers = list(getattr(model, "decoder_layers", ()))
    ssm = attn = other = 0
    for i, layer in enumerate(layers):
        n = sum(p.numel() for p in layer.parameters())
        if mc.is_mamba_layer(i):
            ssm += n
        elif mc.is_attention_layer(i):
            attn += n
        else:
            other += n
    mixers = mc.num_mamba_layers + mc.num_attention_layers
    ssm_params = ssm + (other * mc.num_mamba_layers / mixers if mixers else 0)
    token = 2.0 * (ssm + attn + other)
    pair = 4.0 * mc.num_attention_heads * mc.head_dim * (mc.num_attention_layers + drafter)
    if token == 0 and pair == 0:
        return RecomputeCost()
    return RecomputeCost(token, pair, 2.0 * ssm_params / token if token else 0.0)


def make_drafter(
    model: str,
    mc: HybridConfig,
    draft_model: str | None,
    draft_seed: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> EagleHead | MtpHead:
    """The drafter: the EAGLE head at `draft_model`; else, for an architecture whose own MTP
    layer drafts (`mc.mtp_drafter`: Qwen3-Next / Qwen3.5), the layer its checkpoint carries
    (`mtp.*`; a random one for a preset); else a random EAGLE head."""
    if draft_model:
        return EagleHead.load(draft_model, mc, dtype, device)
    if mc.mtp_drafter:
        if Path(model).is_dir():
            tensors = checkpoint_mtp_tensors(model)
            if tensors:
                return MtpHead.from_tensors(tensors, mc, dtype, device, what=f"{model} mtp.*")
        else:
            return MtpHead.random(mc, draft_seed, dtype, device)
    return EagleHead.random(mc, draft_seed, dtype, device)


def scratch_bytes(mc: HybridConfig, dtype: torch.dtype, max_num_seqs: int, k: int) -> int:
    """Speculative scratch: one state slot per verified position of every sequence."""
    return max_num_seqs * (k + 1) * state_bytes(mc, dtype) if k else 0


def eos_token_ids(model: str) -> tuple[int, ...]:
    """Every end-of-sequence id the checkpoint names: `eos_token_id` in `config.json` and in
    `generation_config.json`, each an int or a list (presets have none)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model) / name
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a broken file is the loader's to report; it names no EOS here
        eos = doc.get("eos_token_id") if isinstance(doc, dict) else None
        for t in eos if isinstance(eos, list) else [eos]:
            if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
                ids.add(t)
    return tuple(sorted(ids))


def layer_groups(mc: HybridConfig, drafter: bool) -> tuple[GroupKind, ...]:
    """The layer groups in the order the runner sees them: the target's attention, its SSM
    layers, the drafter's attention."""
    groups: list[GroupKind] = []
    if mc.num_attention_layers:
        groups.append(GroupKind.ATTENTION)
    if mc.num_mamba_layers:
        groups.append(GroupKind.SSM)
    if drafter:
        groups.append(GroupKind.ATTENTION)
    return tuple(groups)


def pool_sizes(
    mc: HybridConfig,
    knobs: CacheKnobs,
    o: EngineOptions,
    dtype: torch.dtype,
    groups: tuple[GroupKind, ...],
    max_len: int,
) -> tuple[int, int | None]:
    """(attention blocks, SSM state pages or None): as `o` sets them, else split from what the
    speculative scratch states leave of `o.cache_memory_gb` (`layout.split_budget`)."""
    num_blocks, num_state_pages = o.num_blocks, o.num_state_pages
    if num_blocks is None:
        budget = int(o.cache_memory_gb * 2**30)
        k = o.num_speculative_tokens
        scratch = scratch_bytes(mc, dtype, o.max_num_seqs, k)
        if scratch >= budget:
            raise ValueError(
                f"cache_memory_gb: {o.cache_memory_gb} GiB cannot hold the speculative scratch "
                f"states ({o.max_num_seqs} sequences x {k + 1} positions = "
                f"{scratch / 2**30:.2f} GiB); lower num_speculative_tokens or max_num_seqs, or "
                "raise cache_memory_gb"
            )
        drafter = k > 0
        sizes = layout.split_budget(
            budget - scratch,
            attention_block_bytes=attention_block_bytes(mc, knobs.block_size, dtype, drafter),
            state_page_bytes=state_bytes(mc, dtype),
            max_model_len=max_len,
            block_size=knobs.block_size,
            attention_groups=groups.count(GroupKind.ATTENTION),
        )
        num_blocks = sizes.num_blocks
        if num_state_pages is None:
            num_state_pages = sizes.num_state_pages
    return num_blocks, num_state_pages if mc.num_mamba_layers else None


@dataclass
class EngineParts:
    """What `build_engine` assembles (what `LLM` holds)."""

    model: torch.nn.Module
    model_config: HybridConfig
    tokenizer: Any
    config: HycacheConfig
    scheduler: Scheduler
    runner: ModelRunner
    store: KVStore | None
    eos_token_ids: tuple[int, ...]


def build_engine(
    model: str,
    knobs: CacheKnobs,
    o: EngineOptions,
    prebuilt: tuple[torch.nn.Module, HybridConfig] | None = None,
) -> EngineParts:
    """Load `model` (or take `prebuilt`, a (model, config) built by the caller) and its
    drafter, size the pools and build the config, the scheduler, the runner and the store."""
    dtype = DTYPES[o.dtype] if isinstance(o.dtype, str) else o.dtype
    dev = o.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(dev).type == "cpu":
        keep_freed_memory()  # the forward's temporaries stop faulting in fresh pages
    if prebuilt is not None:
        net, mc, tokenizer = (*prebuilt, None)
    else:
        net, mc, tokenizer = load_model(model, dtype, dev)
    max_len = o.max_model_len or min(mc.max_position_embeddings, MAX_DEFAULT_MODEL_LEN)
    k = o.num_speculative_tokens
    drafter = make_drafter(model, mc, o.draft_model, o.draft_seed, dtype, dev) if k else None
    groups = layer_groups(mc, drafter is not None)
    num_blocks, num_state_pages = pool_sizes(mc, knobs, o, dtype, groups, max_len)
    cache = CacheConfig(
        knobs,
        num_blocks=num_blocks,
        num_state_pages=num_state_pages,
        max_model_len=max_len,
        groups=groups,
        recompute_cost=recompute_cost(net, mc, drafter is not None),
    )
    config = HycacheConfig(
        cache,
        SpeculativeConfig(num_speculative_tokens=k),
        SchedulerConfig(o.max_num_batched_tokens, o.max_num_seqs),
    )
    scheduler = Scheduler(config, keep_finished=0)  # `LLM.step` reports each finish
    runner = ModelRunner(net, config, drafter=drafter, seed=o.seed)
    if o.warmup:
        runner.warmup(min(o.max_num_batched_tokens, max_len))
    store = None
    if o.kv_store is not None:
        seed_id = None if o.draft_model else o.draft_seed
        fp = engine_fingerprint(model, mc, dtype, config, o.draft_model, seed_id)
        store = attach_store(o.kv_store, o.kv_store_gb, scheduler.cache, runner, fp).store
    return EngineParts(net, mc, tokenizer, config, scheduler, runner, store, eos_token_ids(model))
