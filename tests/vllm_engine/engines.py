"""Building the real-engine tests' vLLM engines: what every one shares (token ids in, eager,
seed 0) and what each cache arm sets (`nocache`, `cache`, `hycache`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ARMS = ("nocache", "cache", "hycache")
SYNC_SCHEDULER = "hycache.vllm.SyncScheduler"


def arm_options(arm: str) -> dict[str, Any]:
    """The engine arguments of a cache arm: `nocache`, prefix caching off; `cache`, vLLM's own
    (Mamba `align` mode); `hycache`, that and hycache's scheduler."""
    cache = arm != "nocache"
    out: dict[str, Any] = {
        "enable_prefix_caching": cache,
        "mamba_cache_mode": "align" if cache else "none",
    }
    if arm == "hycache":
        out["scheduler_cls"] = SYNC_SCHEDULER
    return out


def tiny_llm(model: Path, **options: Any) -> Any:
    """vLLM's `LLM` on a tiny checkpoint: token-id prompts, eager, float32, 8 sequences, seed
    0; `options` add to or override those."""
    from vllm import LLM

    base: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "max_num_seqs": 8,
        "seed": 0,
    }
    return LLM(str(model), **{**base, **options})
