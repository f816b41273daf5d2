"""Simulator model presets from a Hugging Face `config.json`: the engine's own config parser
(`hycache.model.config`) reads it, so the simulator and the engine agree on every size.

    hycache simulate --model-config path/to/config.json      # Bamba, Nemotron-H, Granite 4.0

The cost model's quantities follow from the architecture:

    bamba             every layer: mixer (Mamba2 or attention) + a gated (SwiGLU) MLP
    nemotron_h        one block per layer: Mamba2 `M`, attention `*`, a squared-ReLU MLP `-` or
                      a MoE `E` of squared-ReLU experts plus a shared one
    granitemoehybrid  every layer: mixer + a shared gated MLP (+ routed experts when it has any)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hycache.model.configs import config_from_hf_dict
from hycache.model.configs.bamba import BambaConfig
from hycache.model.configs.base import HybridConfig
from hycache.model.configs.granite_hybrid import GraniteHybridConfig
from hycache.model.configs.nemotron_h import NemotronHConfig
from hycache.sim.presets import (
    AttentionSpec,
    LayerCounts,
    MambaSpec,
    MlpSpec,
    ModelSpec,
    MoeSpec,
)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def is_hf_config(data: Any) -> bool:
    return isinstance(data, Mapping) and "model_type" in data


def model_spec_from_hf(data: Mapping[str, Any], name: str, where: str = "<dict>") -> ModelSpec:
    """The simulator's `ModelSpec` for a checkpoint's `config.json` dict."""
    try:
        cfg = config_from_hf_dict(data)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    n = cfg.num_hidden_layers
    attention, mamba = len(cfg.attn_layer_indices), len(cfg.mamba_layer_indices)
    mlp_only, moe_only = n - attention - mamba, 0
    moe: MoeSpec | None = None
    if isinstance(cfg, NemotronHConfig):
        mlp_only, moe_only = cfg.num_mlp_layers, cfg.num_moe_layers
        mlp = MlpSpec(cfg.intermediate_size, gated=False, num_blocks=mlp_only)
        if moe_only:
            # (experts in a `moe_latent_size` space are counted at hidden_size width)
            moe = MoeSpec(
                num_blocks=moe_only,
                num_experts=cfg.n_routed_experts,
                experts_per_token=cfg.num_experts_per_tok,
                expert_intermediate_size=cfg.moe_intermediate_size,
                shared_expert_intermediate_size=cfg.moe_shared_expert_intermediate_size,
                gated=False,
            )
    elif isinstance(cfg, GraniteHybridConfig):
        mlp = MlpSpec(cfg.intermediate_size, gated=True, num_blocks=n)
        if cfg.num_local_experts:
            moe = MoeSpec(
                num_blocks=n,
                num_experts=cfg.num_local_experts,
                experts_per_token=cfg.num_experts_per_tok,
                expert_intermediate_size=cfg.expert_intermediate_size,
            )
    elif isinstance(cfg, BambaConfig):
        mlp = MlpSpec(cfg.intermediate_size, gated=True, num_blocks=n)
    else:  # pragma: no cover - config_from_hf_dict knows no other class
        raise ValueError(f"{where}: no simulator mapping for {type(cfg).__name__}")
    return ModelSpec(
        name=name,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        num_layers=n,
        layers=LayerCounts(attention=attention, mamba=mamba, mlp_only=mlp_only, moe_only=moe_only),
        attention=AttentionSpec(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
        mamba=_mamba(cfg),
        mlp=mlp,
        moe=moe,
        dtype_bytes=DTYPE_BYTES.get(str(data.get("torch_dtype", "bfloat16")), 2),
        state_dtype_bytes=4,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attention_layer_indices=cfg.attn_layer_indices,
        description=str(data.get("description", f"{cfg.model_type} from its config.json")),
        source=str(data.get("source", where)),
    )


def _mamba(cfg: HybridConfig) -> MambaSpec:
    expand = cfg.mamba_expand
    if expand is None:  # Nemotron-H: the width is heads x head_dim, not tied to hidden_size
        expand = max(cfg.mamba_intermediate_size // cfg.hidden_size, 1)
    return MambaSpec(
        num_heads=cfg.mamba_n_heads,
        head_dim=cfg.mamba_d_head,
        d_state=cfg.mamba_d_state,
        n_groups=cfg.mamba_n_groups,
        d_conv=cfg.mamba_d_conv,
        expand=expand,
        chunk_size=cfg.mamba_chunk_size,
    )
