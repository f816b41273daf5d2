"""The Nemotron-H hybrid architecture (NVIDIA; `NemotronHForCausalLM` in transformers).

Owns what is Nemotron-H's own: one block per layer, chosen by the config's pattern - Mamba2 `M`,
attention `*` (grouped-query, no positional encoding) or a squared-ReLU MLP `-` - each as
RMSNorm -> block -> residual; the `backbone.`-prefixed module tree whose parameter names match
NVIDIA's checkpoints (`backbone.embeddings`, `backbone.layers.{i}.mixer.*`,
`backbone.norm_f`); and `NemotronHForCausalLM`. Checkpoints written with transformers'
in-memory names (`model.` prefix) load too; multi-token-prediction tensors (`mtp.*`) are
ignored, as transformers does. MoE blocks (`E`) are refused by `NemotronHConfig`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.config import NemotronHConfig
from hycache.model.hybrid import HybridForCausalLM, HybridStep
from hycache.model.layers import Attention, RMSNorm
from hycache.model.mamba2 import Mamba2Mixer

__all__ = ["NemotronHBlock", "NemotronHForCausalLM", "ReluSquaredMLP"]


class ReluSquaredMLP(nn.Module):
    """Non-gated feed-forward: down(relu(up(x)) ** 2)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(F.relu(self.up_proj(x))))


class NemotronHBlock(nn.Module):
    """RMSNorm -> (Mamba2 | attention | MLP) -> residual."""

    def __init__(self, config: NemotronHConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_in_compute_dtype=True)
        self.is_mlp = False
        self.mixer: nn.Module
        if config.is_attention_layer(layer_idx):
            self.mixer = Attention.for_config(config)
        elif config.is_mamba_layer(layer_idx):
            self.mixer = Mamba2Mixer(config)
        else:
            self.is_mlp = True
            self.mixer = ReluSquaredMLP(
                config.hidden_size, config.intermediate_size, config.mlp_bias
            )

    def forward(self, hidden: torch.Tensor, step: HybridStep, i: int) -> torch.Tensor:
        x = self.norm(hidden)  # (N, hidden_size)
        return hidden + (self.mixer(x) if self.is_mlp else step.mix(i, self.mixer, x))


class NemotronHBackbone(nn.Module):
    """Embedding, blocks and final norm (the `backbone.` prefix of the checkpoint)."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            NemotronHBlock(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_in_compute_dtype=True)


class NemotronHForCausalLM(HybridForCausalLM):
    """Nemotron-H backbone + LM head, run one paged `StepBatch` at a time."""

    config_class = NemotronHConfig
    config: NemotronHConfig
    checkpoint_renames = ((r"^model\.", "backbone."),)
    checkpoint_ignored = (*HybridForCausalLM.checkpoint_ignored, r"^mtp\.")

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__(config)
        self.backbone = NemotronHBackbone(config)
        self._add_lm_head()

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.backbone.embeddings

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def final_layernorm(self) -> RMSNorm:
        return self.backbone.norm_f
