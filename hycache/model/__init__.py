"""Model layer of hycache: hybrid (Mamba2 + attention) models on a paged cache.

Files:
    config.py          HybridConfig and the per-architecture HF mappings (BambaConfig,
                       NemotronHConfig, GraniteHybridConfig)
    paged.py           StepBatch, PagedKVCache, StateCache (the runner-facing cache interface)
    ssd.py             the Mamba2 SSD scan (chunked + recurrent)
    mamba2.py          Mamba2Mixer, its gated RMSNorm and MambaPlan (shared by every arch)
    layers.py          RMSNorm, RoPE, SwiGLU MLP, paged GQA attention
    hybrid.py          HybridForCausalLM: forward / logits / caches shared by every arch
    bamba.py           BambaForCausalLM (alias BambaModel)
    nemotron_h.py      NemotronHForCausalLM
    granite_hybrid.py  GraniteHybridForCausalLM
    eagle.py           EagleHead, the one-layer EAGLE draft head
    loader.py          load_model / save_model, the model_type registry, presets (`tiny`)
"""

from hycache.model.bamba import BambaForCausalLM, BambaModel
from hycache.model.config import BambaConfig, GraniteHybridConfig, HybridConfig, NemotronHConfig
from hycache.model.eagle import EagleHead
from hycache.model.granite_hybrid import GraniteHybridForCausalLM
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.loader import MODEL_CLASSES, load_model, preset_config, save_model
from hycache.model.nemotron_h import NemotronHForCausalLM
from hycache.model.paged import PagedKVCache, StateCache, StepBatch

__all__ = [
    "MODEL_CLASSES",
    "BambaConfig",
    "BambaForCausalLM",
    "BambaModel",
    "EagleHead",
    "GraniteHybridConfig",
    "GraniteHybridForCausalLM",
    "HybridConfig",
    "HybridForCausalLM",
    "NemotronHConfig",
    "NemotronHForCausalLM",
    "PagedKVCache",
    "StateCache",
    "StepBatch",
    "load_model",
    "preset_config",
    "save_model",
]
