"""The Nemotron-H hybrid architecture (NVIDIA; `NemotronHForCausalLM` in transformers).

Owns what is Nemotron-H's own: one block per layer, chosen by the config's pattern - Mamba2 `M`,
attention `*` (grouped-query, no positional encoding), a squared-ReLU MLP `-` or a mixture of
squared-ReLU experts `E` (Nemotron-3) - each as RMSNorm -> block -> residual; the
`backbone.`-prefixed module tree whose parameter names match NVIDIA's checkpoints (and what
transformers' `save_pretrained` writes): `backbone.embeddings`, `backbone.layers.{i}.mixer.*`,
`backbone.norm_f`, and for `E` blocks `mixer.gate.weight`, `mixer.gate.e_score_correction_bias`,
`mixer.experts.{j}.up_proj.weight` / `.down_proj.weight` (one pair per routed expert),
`mixer.shared_experts.up_proj.weight` / `.down_proj.weight` and, with `moe_latent_size`,
`mixer.fc1_latent_proj.weight` / `mixer.fc2_latent_proj.weight`; and `NemotronHForCausalLM`.
Checkpoints written with transformers' in-memory names (`model.` prefix) load too, except its
in-memory stacked experts (`mixer.experts.up_proj` of shape (experts, width, hidden)), which no
file transformers writes holds; multi-token-prediction tensors (`mtp.*`) are ignored, as
transformers does. The router (weight and correction bias) is kept in float32 (float64 in a
float64 model) whatever the model dtype, as transformers keeps it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.nemotron_h import NemotronHConfig
from hycache.model.hybrid import DecoderNames, HybridForCausalLM, HybridStep
from hycache.model.layers import Attention, RMSNorm
from hycache.model.mamba2 import Mamba2Mixer
from hycache.model.moe import dispatch_to_experts

__all__ = [
    "NemotronHBlock",
    "NemotronHForCausalLM",
    "NemotronHMoE",
    "NemotronHRouter",
    "ReluSquaredMLP",
]


class ReluSquaredMLP(nn.Module):
    """Non-gated feed-forward: down(relu(up(x)) ** 2)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(F.relu(self.up_proj(x))))


class NemotronHRouter(nn.Module):
    """Sigmoid scores, biased for the choice only, restricted to the best expert groups."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scale = config.routed_scaling_factor
        experts = config.n_routed_experts
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size))
        # A parameter, not a buffer, so that it loads, saves and random-initialises like one.
        self.e_score_correction_bias = nn.Parameter(torch.empty(experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (N, hidden) -> (weights (N, k) in the router's dtype, expert ids (N, k))."""
        dt = self.weight.dtype
        scores = torch.sigmoid(F.linear(x.to(dt), self.weight))  # (N, experts)
        choice = scores + self.e_score_correction_bias  # (N, experts)
        if self.topk_group < self.n_group:
            n = choice.shape[0]
            grouped = choice.view(n, self.n_group, -1)  # (N, groups, experts per group)
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, groups)
            best = group_score.topk(self.topk_group, dim=-1).indices  # (N, topk_group)
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)
        top_idx = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, top_idx)  # (N, k)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, top_idx


class NemotronHMoE(nn.Module):
    """Routed squared-ReLU experts (in a latent space when `moe_latent_size` is set) plus one
    always-on shared expert: shared(x) + up(sum_k w_k expert_k(down(x)))."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        width = config.moe_latent_size or config.hidden_size
        self.experts = nn.ModuleList(
            ReluSquaredMLP(width, config.moe_intermediate_size, bias=False)
            for _ in range(config.n_routed_experts)
        )
        self.gate = NemotronHRouter(config)
        self.shared_experts = ReluSquaredMLP(
            config.hidden_size, config.moe_shared_expert_intermediate_size, config.mlp_bias
        )
        self.fc1_latent_proj: nn.Linear | None = None
        self.fc2_latent_proj: nn.Linear | None = None
        if config.moe_latent_size is not None:
            latent, bias = config.moe_latent_size, config.mlp_bias
            self.fc1_latent_proj = nn.Linear(config.hidden_size, latent, bias=bias)
            self.fc2_latent_proj = nn.Linear(latent, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, hidden) -> (N, hidden)."""
        weights, top_idx = self.gate(x)  # (N, k) each
        h = x if self.fc1_latent_proj is None else self.fc1_latent_proj(x)  # (N, width)
        experts = self.experts

        def expert(e: int, xe: torch.Tensor) -> torch.Tensor:
            return experts[e](xe)

        # summed in the router's precision, as transformers does
        routed = dispatch_to_experts(h, top_idx, weights, expert).to(x.dtype)  # (N, width)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed)
        return routed + self.shared_experts(x)


class NemotronHBlock(nn.Module):
    """RMSNorm -> (Mamba2 | attention | MLP | MoE) -> residual."""

    def __init__(self, config: NemotronHConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_in_compute_dtype=True)
        self.is_mlp = False
        self.mixer: nn.Module
        if config.is_attention_layer(layer_idx):
            self.mixer = Attention.for_config(config)
        elif config.is_mamba_layer(layer_idx):
            self.mixer = Mamba2Mixer(config)
        elif config.is_moe_layer(layer_idx):
            self.is_mlp = True
            self.mixer = NemotronHMoE(config)
        else:
            self.is_mlp = True
            self.mixer = ReluSquaredMLP(
                config.hidden_size, config.intermediate_size, config.mlp_bias
            )

    def forward(self, hidden: torch.Tensor, step: HybridStep, i: int) -> torch.Tensor:
        x = self.norm(hidden)  # (N, hidden_size)
        return hidden + (self.mixer(x) if self.is_mlp else step.mix(i, self.mixer, x))


class NemotronHForCausalLM(HybridForCausalLM):
    """Nemotron-H backbone + LM head, run one paged `StepBatch` at a time."""

    config_class = NemotronHConfig
    config: NemotronHConfig
    decoder_names = DecoderNames("backbone", embedding="embeddings", norm="norm_f")
    checkpoint_renames = ((r"^model\.", "backbone."),)
    checkpoint_ignored = (*HybridForCausalLM.checkpoint_ignored, r"^mtp\.")
    # expert choice compares nearby scores, so, as in transformers, the MoE routers run in
    # float32 (float64 for a float64 model), not in the model's reduced precision
    compute_dtype_modules = (NemotronHRouter,)

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__(config)
        norm = RMSNorm(config.hidden_size, config.rms_norm_eps, weight_in_compute_dtype=True)
        self._add_decoder(NemotronHBlock, norm)
