"""Model layer of hycache: hybrid (Mamba2 / Gated DeltaNet + attention) models on a paged cache.

Files:
    configs/           torch-free config parsing: HybridConfig, one file per architecture's HF
                       mapping (bamba, nemotron_h, granite_hybrid), the one field validator,
                       the built-in presets (`tiny`)
    paged.py           StepBatch, PagedKVCache, StateCache (the runner-facing cache interface)
    ssd.py             the Mamba2 SSD scan (chunked + recurrent)
    mamba2.py          Mamba2Mixer, its gated RMSNorm and MambaPlan (shared by every arch)
    gated_delta.py     the gated delta rule (chunked + recurrent), the causal conv
    gdn.py             GatedDeltaNet, the GDN mixer of Qwen3-Next / Qwen3.5 (Mamba2's state pages)
    layers.py          RMSNorm, RoPE, SwiGLU MLP, paged GQA attention
    hybrid.py          HybridForCausalLM: forward / logits / caches shared by every arch
    bamba.py           BambaForCausalLM
    nemotron_h.py      NemotronHForCausalLM
    granite_hybrid.py  GraniteHybridForCausalLM
    qwen3_next.py      Qwen3NextForCausalLM, Qwen35ForCausalLM, Qwen35MoeForCausalLM
    eagle.py           EagleHead, the one-layer EAGLE draft head
    loader.py          load_model / save_model, the model_type registry, building presets

The names below resolve on first use, so that reading a config (`hycache.model.configs`)
does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "MODEL_CLASSES": "loader",
    "load_model": "loader",
    "save_model": "loader",
    "BambaForCausalLM": "bamba",
    "EagleHead": "eagle",
    "GraniteHybridForCausalLM": "granite_hybrid",
    "HybridForCausalLM": "hybrid",
    "NemotronHForCausalLM": "nemotron_h",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen35ForCausalLM": "qwen3_next",
    "Qwen35MoeForCausalLM": "qwen3_next",
    "PagedKVCache": "paged",
    "StateCache": "paged",
    "StepBatch": "paged",
    "BambaConfig": "configs.bamba",
    "GraniteHybridConfig": "configs.granite_hybrid",
    "HybridConfig": "configs.base",
    "NemotronHConfig": "configs.nemotron_h",
    "Qwen3NextConfig": "configs.qwen3_next",
    "Qwen35Config": "configs.qwen3_next",
    "Qwen35MoeConfig": "configs.qwen3_next",
    "preset_config": "configs.presets",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
