"""`build_llm`: the engine the command-line flags describe: load the model, size the cache,
attach the second tier (`--kv-store` / `--kv-store-gb`, when the namespace has them). The one
place `generate`, `serve` and the serving benchmark get their `LLM` from.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hycache.engine.engine import LLM


def build_llm(args: argparse.Namespace) -> LLM:
    """The `LLM` of `hycache.engine.args.add_engine_args`'s flags (and the store flags)."""
    from hycache.engine.engine import LLM  # torch: only once an engine is really built

    store = getattr(args, "kv_store", None)
    tier = {"kv_store": store, "kv_store_gb": args.kv_store_gb} if store is not None else {}
    return LLM(
        args.model,
        dtype=args.dtype,
        block_size=args.block_size,
        prefix_match_unit=args.prefix_match_unit,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        policy=args.policy,
        enable_prefix_caching=not args.no_prefix_caching,
        num_speculative_tokens=args.num_speculative_tokens,
        draft_model=args.draft_model,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        eviction=args.eviction,
        eviction_alpha=args.eviction_alpha,
        internal_checkpoints=args.internal_checkpoints,
        **tier,
    )
