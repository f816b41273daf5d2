"""The simulator tests' shared model geometry: `NEMOTRON_MOE`, a tiny Nemotron-H config with
MoE blocks, as transformers writes it."""

from __future__ import annotations

# a Nemotron-3 style config: MoE `E` blocks among Mamba2, attention and MLP layers
NEMOTRON_MOE = {
    "model_type": "nemotron_h",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "layers_block_type": ["mamba", "moe", "attention", "mlp", "moe", "mamba", "moe"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 8,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 40,
    "n_group": 2,
    "topk_group": 1,
}
