"""The Bamba hybrid architecture (IBM; `BambaForCausalLM` in transformers), inference only.

Owns what is Bamba's own: the decoder layer (RMSNorm -> Mamba2 or attention mixer -> residual
-> RMSNorm -> SwiGLU MLP -> residual), the `model.`-prefixed module tree whose parameter names
match the Hugging Face checkpoints (`model.layers.{i}.mamba.in_proj.weight`, ...) and the
top-level `BambaForCausalLM`. The forward, the caches and the LM head are the shared
`HybridForCausalLM`'s; the Mamba2 mixer is `mamba2.py`'s. Attention layers are grouped-query
attention with RoPE applied to the first `head_dim * partial_rotary_factor` dims of each head.

Re-exports the config, mixer and cache types so callers can import everything from here.
"""

from __future__ import annotations

import torch

from hycache.model.configs.bamba import BambaConfig
from hycache.model.hybrid import DecoderNames, HybridForCausalLM, HybridStep, MambaOrAttentionLayer
from hycache.model.layers import MLP, RMSNorm
from hycache.model.mamba2 import GatedRMSNorm, Mamba2Mixer, MambaPlan
from hycache.model.paged import PagedKVCache, StateCache, StepBatch

__all__ = [
    "BambaConfig",
    "BambaDecoderLayer",
    "BambaForCausalLM",
    "GatedRMSNorm",
    "Mamba2Mixer",
    "MambaPlan",
    "PagedKVCache",
    "StateCache",
    "StepBatch",
]


class BambaDecoderLayer(MambaOrAttentionLayer):
    """RMSNorm -> (Mamba2 mixer | attention) -> residual -> RMSNorm -> SwiGLU MLP -> residual."""

    def __init__(self, config: BambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self._add_mixer(config, layer_idx)

    def forward(self, hidden: torch.Tensor, step: HybridStep, i: int) -> torch.Tensor:
        hidden = hidden + self._mix(step, i, self.input_layernorm(hidden))
        return hidden + self.feed_forward(self.pre_ff_layernorm(hidden))


class BambaForCausalLM(HybridForCausalLM):
    """Bamba decoder + LM head, run one paged `StepBatch` at a time."""

    config_class = BambaConfig
    config: BambaConfig
    decoder_names = DecoderNames(norm="final_layernorm")

    def __init__(self, config: BambaConfig) -> None:
        super().__init__(config)
        self._add_decoder(BambaDecoderLayer, RMSNorm(config.hidden_size, config.rms_norm_eps))
