"""Model layer of hycache: the Bamba hybrid (Mamba2 + attention) model on a paged cache.

Files:
    config.py   BambaConfig (from a Hugging Face config.json)
    paged.py    StepBatch, PagedKVCache, StateCache (the runner-facing cache interface)
    ssd.py      the Mamba2 SSD scan (chunked + recurrent)
    layers.py   RMSNorm, RoPE, SwiGLU MLP, paged GQA attention
    bamba.py    Mamba2Mixer, decoder layers, BambaForCausalLM (alias BambaModel)
    eagle.py    EagleHead, the one-layer EAGLE draft head
    loader.py   load_model / save_model, presets (`tiny`)
"""

from hycache.model.bamba import BambaForCausalLM, BambaModel
from hycache.model.config import BambaConfig
from hycache.model.eagle import EagleHead
from hycache.model.loader import load_model, preset_config, save_model
from hycache.model.paged import PagedKVCache, StateCache, StepBatch

__all__ = [
    "BambaConfig",
    "BambaForCausalLM",
    "BambaModel",
    "EagleHead",
    "PagedKVCache",
    "StateCache",
    "StepBatch",
    "load_model",
    "preset_config",
    "save_model",
]
