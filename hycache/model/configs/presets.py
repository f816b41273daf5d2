"""The built-in model presets: configs the engine builds with random weights, by name.

    tiny   a 6-layer Bamba (attention at layers 2 and 5), seed 1234: the tests' and demos' model

The simulator's `tiny` preset (`hycache/sim/presets/models/tiny.json`) describes this model.
"""

from __future__ import annotations

from collections.abc import Callable

from hycache.model.configs.bamba import BambaConfig


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


PRESET_SEEDS: dict[str, int] = {"tiny": 1234}
PRESETS: dict[str, Callable[[], BambaConfig]] = {"tiny": _tiny_config}


def preset_config(name: str) -> BambaConfig:
    """The config of a built-in preset (`tiny`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]()
