"""The simulator's model description, derived from the model configs.

Owns :class:`ModelSpec` (frozen) and its parts: the quantities the cost model needs
(parameter counts, KV bytes per token, SSM state bytes, the drafter's size), derived from the
architecture. A spec comes from one of two places:

    ModelSpec.from_config      a parsed model config (`hycache.model.configs`, the engine's
                               own description): `model_spec_from_hf` for a `config.json`
    presets._model_from_dict   a hycache model preset file (counts, not a layer layout)

Byte sizes are `hycache.cache.layout`'s formulas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hycache.cache.layout import (
    conv_state_bytes,
    kv_bytes_per_token,
    ssm_state_bytes,
    ssm_state_item_bytes,
)
from hycache.model.configs import config_from_hf_dict
from hycache.model.configs.base import HybridConfig, conv_channels
from hycache.model.configs.granite_hybrid import GraniteHybridConfig
from hycache.model.configs.nemotron_h import NemotronHConfig
from hycache.model.configs.qwen3_next import Qwen3NextConfig

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # q_proj also yields a per-head output gate, q/k norms (Qwen3-Next); out of the repr, which
    # tests/sim/test_model_spec_pins.py pins for the Mamba2 presets
    output_gate: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class MambaSpec:
    """The recurrent mixer: ``num_heads * head_dim`` is the inner width (d_inner).

    ``kind`` "mamba2", or "gdn" (Gated DeltaNet, in the same geometry: value heads, value head
    dim, key head dim as ``d_state``, key heads as ``n_groups``; see
    `hycache.model.configs.qwen3_next`)."""

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    expand: int
    chunk_size: int = 256
    kind: str = field(default="mamba2", repr=False)  # (out of the repr, as output_gate)

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d (`conv_channels`)."""
        return conv_channels(self.d_inner, self.n_groups, self.d_state)


@dataclass(frozen=True)
class MlpSpec:
    """Dense feed-forward blocks. ``num_blocks`` counts every dense MLP in the stack, wherever
    it sits (Bamba: one per decoder layer; Nemotron-H: the MLP-only layers)."""

    intermediate_size: int
    gated: bool
    num_blocks: int


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts blocks (optional)."""

    num_blocks: int
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int = 0
    gated: bool = True


@dataclass(frozen=True)
class LayerCounts:
    """Layers by mixer kind. ``mlp_only`` and ``moe_only`` are layers without a mixer."""

    attention: int
    mamba: int
    mlp_only: int = 0
    moe_only: int = 0

    @property
    def total(self) -> int:
        return self.attention + self.mamba + self.mlp_only + self.moe_only


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int


@dataclass(frozen=True)
class DrafterSpec:
    """EAGLE/MTP-style drafter: ``num_layers`` decoder layers (attention with the target's
    geometry + a dense MLP) plus an ``fc`` that fuses the target hidden state with the token
    embedding. It shares the target's embedding and LM head."""

    num_layers: int = 1
    intermediate_size: int | None = None  # None: the target's dense MLP width
    params: int | None = None  # None: derived


@dataclass(frozen=True)
class ModelSpec:
    """A hybrid attention + Mamba2 model, in the quantities the cost model needs."""

    name: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    layers: LayerCounts
    attention: AttentionSpec
    mamba: MambaSpec
    mlp: MlpSpec
    dtype_bytes: int = 2
    state_dtype_bytes: int = 4
    tie_word_embeddings: bool = False
    moe: MoeSpec | None = None
    drafter: DrafterSpec = DrafterSpec()
    params: ParamCounts | None = None  # None: derived from the architecture
    attention_layer_indices: tuple[int, ...] | None = None
    description: str = ""
    source: str = ""

    @classmethod
    def from_config(
        cls,
        config: HybridConfig,
        *,
        name: str,
        dtype_bytes: int = 2,
        description: str = "",
        source: str = "",
    ) -> ModelSpec:
        """The spec of a model config (any architecture `hycache.model.configs` parses), its
        weights and conv windows `dtype_bytes` wide, SSM states as the engine keeps them."""
        attention, mamba = config.num_attention_layers, config.num_mamba_layers
        mlp, moe, mlp_only, moe_only = _feed_forward(config)
        return cls(
            name=name,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            num_layers=config.num_hidden_layers,
            layers=LayerCounts(attention, mamba, mlp_only=mlp_only, moe_only=moe_only),
            attention=AttentionSpec(
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                output_gate=isinstance(config, Qwen3NextConfig),
            ),
            mamba=_mamba(config),
            mlp=mlp,
            moe=moe,
            dtype_bytes=dtype_bytes,
            state_dtype_bytes=ssm_state_item_bytes(dtype_bytes),
            tie_word_embeddings=config.tie_word_embeddings,
            attention_layer_indices=config.attn_layer_indices,
            description=description,
            source=source,
        )

    # --- parameter counts (derived) ---------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters read to produce logits (the embedding itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def attention_layer_params(self) -> int:
        a, h = self.attention, self.hidden_size
        q = h * a.num_heads * a.head_dim * (2 if a.output_gate else 1)
        kv = 2 * h * a.num_kv_heads * a.head_dim
        o = a.num_heads * a.head_dim * h
        qk_norms = 2 * a.head_dim if a.output_gate else 0
        return q + kv + o + qk_norms + h  # + pre-norm

    @property
    def mamba_layer_params(self) -> int:
        m, h = self.mamba, self.hidden_size
        if m.kind == "gdn":  # in-proj q, k, v, z, b, a; bias-free conv; dt_bias, A_log
            in_proj = h * (m.conv_dim + m.d_inner + 2 * m.num_heads)
            conv = m.conv_dim * m.d_conv
            return in_proj + conv + 2 * m.num_heads + m.head_dim + m.d_inner * h + h
        in_proj = h * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.num_heads)
        conv = m.conv_dim * m.d_conv + m.conv_dim
        per_head = 3 * m.num_heads  # dt_bias, A_log, D
        gated_norm = m.d_inner
        out_proj = m.d_inner * h
        return in_proj + conv + per_head + gated_norm + out_proj + h  # + pre-norm

    def _mlp_params(self, intermediate: int, gated: bool) -> int:
        return (3 if gated else 2) * self.hidden_size * intermediate

    @property
    def mlp_block_params(self) -> int:
        return self._mlp_params(self.mlp.intermediate_size, self.mlp.gated) + self.hidden_size

    def _moe_block_params(self, active: bool) -> int:
        moe = self.moe
        if moe is None:
            return 0
        experts = moe.experts_per_token if active else moe.num_experts
        routed = experts * self._mlp_params(moe.expert_intermediate_size, moe.gated)
        shared = self._mlp_params(moe.shared_expert_intermediate_size, moe.gated)
        router = self.hidden_size * moe.num_experts
        return routed + shared + router + self.hidden_size

    def _derived_params(self, active: bool) -> int:
        body = (
            self.layers.attention * self.attention_layer_params
            + self.layers.mamba * self.mamba_layer_params
            + self.mlp.num_blocks * self.mlp_block_params
            + (self.moe.num_blocks * self._moe_block_params(active) if self.moe else 0)
            + self.hidden_size  # final norm
        )
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return body + self.embedding_params + head

    @property
    def derived_params(self) -> ParamCounts:
        return ParamCounts(total=self._derived_params(False), active=self._derived_params(True))

    @property
    def total_params(self) -> int:
        return self.params.total if self.params else self.derived_params.total

    @property
    def active_params(self) -> int:
        return self.params.active if self.params else self.derived_params.active

    @property
    def _embedding_and_head(self) -> int:
        return self.embedding_params + (0 if self.tie_word_embeddings else self.lm_head_params)

    @property
    def body_active_params(self) -> int:
        """Active parameters each token multiplies through, excluding embedding and LM head."""
        return max(self.active_params - self._embedding_and_head, 0)

    @property
    def body_total_params(self) -> int:
        return max(self.total_params - self._embedding_and_head, 0)

    @property
    def moe_expert_params(self) -> int:
        """Routed-expert parameters of the whole stack (0 for dense models)."""
        moe = self.moe
        if moe is None:
            return 0
        per = self._mlp_params(moe.expert_intermediate_size, moe.gated)
        return moe.num_blocks * moe.num_experts * per

    @property
    def weight_bytes(self) -> int:
        """Bytes of the target's weights resident on the GPU (embedding and head included)."""
        return self.total_params * self.dtype_bytes

    # --- drafter ----------------------------------------------------------------------------

    @property
    def drafter_layer_params(self) -> int:
        """Parameters of the drafter's own layers (not the shared embedding / LM head)."""
        if self.drafter.params is not None:
            return self.drafter.params
        inter = self.drafter.intermediate_size
        if inter is None:
            inter = self.mlp.intermediate_size
        h = self.hidden_size
        per_layer = self.attention_layer_params + self._mlp_params(inter, self.mlp.gated) + h
        fc = 2 * h * h
        return self.drafter.num_layers * per_layer + fc + h

    @property
    def drafter_weight_bytes(self) -> int:
        return self.drafter_layer_params * self.dtype_bytes

    # --- cache geometry ---------------------------------------------------------------------

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        a = self.attention
        return kv_bytes_per_token(a.num_kv_heads, a.head_dim, self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all of the target's attention layers."""
        return self.layers.attention * self.kv_bytes_per_token_per_layer

    @property
    def ssm_state_bytes_per_layer(self) -> int:
        """One Mamba layer's recurrent state: SSM state (state dtype) + conv window (dtype)."""
        m = self.mamba
        ssm = ssm_state_bytes(m.num_heads, m.head_dim, m.d_state, self.state_dtype_bytes)
        return ssm + conv_state_bytes(m.conv_dim, m.d_conv, self.dtype_bytes)

    @property
    def ssm_state_bytes(self) -> int:
        """One request's state across all Mamba layers (one SSM "block")."""
        return self.layers.mamba * self.ssm_state_bytes_per_layer


def _feed_forward(cfg: HybridConfig) -> tuple[MlpSpec, MoeSpec | None, int, int]:
    """(dense MLPs, MoE or None, MLP-only layers, MoE-only layers) of an architecture:

    bamba             every layer: mixer (Mamba2 or attention) + a gated (SwiGLU) MLP
    nemotron_h        one block per layer: Mamba2 `M`, attention `*`, a squared-ReLU MLP `-` or
                      a MoE `E` of squared-ReLU experts plus a shared one
    granitemoehybrid  every layer: mixer + a shared gated MLP (+ routed experts when it has any)
    qwen3_next/3_5    every layer: mixer (GDN or attention) + a gated MLP, or a gated MoE with
                      a shared expert on its MoE layers
    """
    n = cfg.num_hidden_layers
    if isinstance(cfg, Qwen3NextConfig):
        moe_layers = sum(cfg.is_moe_layer(i) for i in range(n))
        mlp = MlpSpec(cfg.intermediate_size, gated=True, num_blocks=n - moe_layers)
        if not moe_layers:
            return mlp, None, 0, 0
        moe = MoeSpec(
            num_blocks=moe_layers,
            num_experts=cfg.num_experts,
            experts_per_token=cfg.num_experts_per_tok,
            expert_intermediate_size=cfg.moe_intermediate_size,
            shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
        )
        return mlp, moe, 0, 0
    if isinstance(cfg, NemotronHConfig):
        mlp_only, moe_only = cfg.num_mlp_layers, cfg.num_moe_layers
        mlp = MlpSpec(cfg.intermediate_size, gated=False, num_blocks=mlp_only)
        if not moe_only:
            return mlp, None, mlp_only, 0
        # (experts in a `moe_latent_size` space are counted at hidden_size width)
        moe = MoeSpec(
            num_blocks=moe_only,
            num_experts=cfg.n_routed_experts,
            experts_per_token=cfg.num_experts_per_tok,
            expert_intermediate_size=cfg.moe_intermediate_size,
            shared_expert_intermediate_size=cfg.moe_shared_expert_intermediate_size,
            gated=False,
        )
        return mlp, moe, mlp_only, moe_only
    mlp_only = n - cfg.num_attention_layers - cfg.num_mamba_layers
    mlp = MlpSpec(cfg.intermediate_size, gated=True, num_blocks=n)
    if isinstance(cfg, GraniteHybridConfig) and cfg.num_local_experts:
        moe = MoeSpec(
            num_blocks=n,
            num_experts=cfg.num_local_experts,
            experts_per_token=cfg.num_experts_per_tok,
            expert_intermediate_size=cfg.expert_intermediate_size,
        )
        return mlp, moe, mlp_only, 0
    return mlp, None, mlp_only, 0


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
        kind=cfg.recurrent_mixer,
    )


def is_hf_config(data: Any) -> bool:
    """Whether a parsed model file is a checkpoint's `config.json` (not a hycache preset)."""
    return isinstance(data, Mapping) and "model_type" in data


def model_spec_from_hf(data: Mapping[str, Any], name: str, where: str = "<dict>") -> ModelSpec:
    """The simulator's `ModelSpec` for a checkpoint's `config.json` dict, read by the engine's
    own parser so the simulator and the engine agree on every size:

        hycache simulate --model-config path/to/config.json   # Bamba, Nemotron-H, Granite 4.0,
                                                              # Qwen3-Next, Qwen3.5
    """
    try:
        cfg = config_from_hf_dict(data)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    return ModelSpec.from_config(
        cfg,
        name=name,
        dtype_bytes=DTYPE_BYTES.get(str(data.get("torch_dtype", "bfloat16")), 2),
        description=str(data.get("description", f"{cfg.model_type} from its config.json")),
        source=str(data.get("source", where)),
    )
