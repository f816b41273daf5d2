"""The built-in model presets: configs the engine builds with random weights, by name.

    tiny       a 6-layer Bamba (attention at layers 2 and 5), seed 1234: the tests' and demos' model
    tiny-gdn   a 4-layer Qwen3-Next (3 Gated DeltaNet layers : 1 gated attention layer, a sparse
               MoE with a shared expert), seed 4321: the GDN engine tests' model

The simulator's `tiny` preset (`hycache/sim/presets/models/tiny.json`) describes this model.
"""

from __future__ import annotations

from collections.abc import Callable

from hycache.model.configs.bamba import BambaConfig
from hycache.model.configs.base import HybridConfig
from hycache.model.configs.qwen3_next import Qwen3NextConfig


def _tiny_config() -> BambaConfig:
    return BambaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        attn_layer_indices=(2, 5),
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_n_groups=2,
        mamba_d_state=64,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
        max_position_embeddings=65536,
    )


def _tiny_gdn_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        attn_layer_indices=(3,),
        mamba_layers=(0, 1, 2),
        mamba_n_heads=4,  # GDN value heads
        mamba_d_head=32,  # GDN value head dim
        mamba_n_groups=2,  # GDN key heads
        mamba_d_state=32,  # GDN key head dim
        mamba_d_conv=4,
        mamba_chunk_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=96,
        max_position_embeddings=65536,
    )


PRESET_SEEDS: dict[str, int] = {"tiny": 1234, "tiny-gdn": 4321}
PRESETS: dict[str, Callable[[], HybridConfig]] = {
    "tiny": _tiny_config,
    "tiny-gdn": _tiny_gdn_config,
}


def preset_config(name: str) -> HybridConfig:
    """The config of a built-in preset (`tiny`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]()
