"""The machinery every hybrid (Mamba2 + attention) model shares, on the paged cache.

Owns `HybridForCausalLM`, the base of each architecture's top-level model (`bamba.py`,
`nemotron_h.py`, `granite_hybrid.py`), and `HybridStep`, the per-forward context its decoder
layers mix through. The base holds everything the engine relies on:

    forward(StepBatch, PagedKVCache | None, StateCache | None) -> final-normed hidden states
    compute_logits(hidden)      the (tied or untied) LM head, with the arch's logit scale
    final_layernorm, embed_tokens, embed(ids), make_kv_cache, make_state_cache, config,
    dtype, device, empty / random construction

An architecture defines only what differs: its decoder layers (norms, MLP / MoE, residual
scaling), where its embedding / layers / final norm live (so parameter names match its
checkpoints), an optional embedding multiplier and logit divisor, and checkpoint-name renames.
Each decoder layer is called as `layer(hidden, step, i)` and runs its mixer through
`step.mix(i, mixer, x)`, which picks attention (paged KV, RoPE or none) or Mamba2 (state
slots) from the config's layer placement.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

import torch
import torch._dynamo  # imported up front: see `empty_module`
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.base import HybridConfig
from hycache.model.layers import Attention, AttentionPlan, RMSNorm, compute_dtype, rope_cos_sin
from hycache.model.mamba2 import Mamba2Mixer, MambaPlan
from hycache.model.paged import PagedKVCache, StateCache, StepBatch

M = TypeVar("M", bound=nn.Module)

__all__ = [
    "ConfigBuilt",
    "DecoderNames",
    "HybridForCausalLM",
    "HybridStep",
    "MambaOrAttentionLayer",
]


@dataclass
class HybridStep:
    """What the mixers of one forward share: the plans, RoPE tables and caches.

    Attributes:
        kv_layer_of / state_layer_of: model layer -> its index in the KV / state cache.
        cos, sin: (N, rotary_dim) RoPE tables, or None for models without RoPE.
    """

    kv: PagedKVCache | None
    states: StateCache | None
    attn_plan: AttentionPlan | None
    mamba_plan: MambaPlan | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    kv_layer_of: dict[int, int]
    state_layer_of: dict[int, int]

    def mix(self, layer: int, mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Run layer `layer`'s token mixer (attention, or Mamba2 / GDN) on x (N, hidden)."""
        if layer in self.kv_layer_of:
            assert isinstance(mixer, Attention)
            assert self.attn_plan is not None and self.kv is not None
            return mixer(x, self.cos, self.sin, self.attn_plan, self.kv, self.kv_layer_of[layer])
        # a recurrent mixer on the state cache: Mamba2Mixer or gdn.GatedDeltaNet
        assert self.mamba_plan is not None and self.states is not None
        return mixer(x, self.mamba_plan, self.states, self.state_layer_of[layer])


class MambaOrAttentionLayer(nn.Module):
    """A decoder layer whose token mixer is attention (`self_attn`) or Mamba2 (`mamba`) by
    the config's layer placement (Bamba's and Granite's layers). The mixer is added last, by
    `_add_mixer`, so the parameters keep the checkpoint's order."""

    is_attention: bool

    def _add_mixer(self, config: HybridConfig, layer_idx: int) -> None:
        self.is_attention = config.is_attention_layer(layer_idx)
        if self.is_attention:
            self.self_attn = Attention.for_config(config)
        else:
            self.mamba = Mamba2Mixer(config)

    def _mix(self, step: HybridStep, i: int, x: torch.Tensor) -> torch.Tensor:
        """This layer's mixer on x (N, hidden), through `step.mix`."""
        return step.mix(i, self.self_attn if self.is_attention else self.mamba, x)


@dataclass(frozen=True)
class DecoderNames:
    """Where an architecture's checkpoints keep the decoder: the prefix of its tensors and
    the names of the embedding, the layer list and the final norm under it."""

    prefix: str = "model"
    embedding: str = "embed_tokens"
    layers: str = "layers"
    norm: str = "norm"


class ConfigBuilt(nn.Module):
    """A module built from one config (`cls(config)`), the models' and the drafters' base:
    `empty` and seeded `random` construction, its dtype and device, and a paged KV cache for
    its attention layers."""

    config: HybridConfig
    # submodules of these types are kept in the compute dtype (`layers.compute_dtype`) of the
    # module's dtype instead of in the dtype itself
    compute_dtype_modules: ClassVar[tuple[type[nn.Module], ...]] = ()
    # the submodule whose weight's dtype and device are the module's
    placed_by: ClassVar[str]
    # the attention layers of its KV cache (None: every attention layer of the config)
    kv_layers: ClassVar[int | None] = None

    @property
    def dtype(self) -> torch.dtype:
        return getattr(self, self.placed_by).weight.dtype  # type: ignore[no-any-return]

    @property
    def device(self) -> torch.device:
        return getattr(self, self.placed_by).weight.device  # type: ignore[no-any-return]

    def make_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """An empty KV cache for this module's attention layers, in its dtype and device."""
        return PagedKVCache.for_model(
            self.config, num_blocks, block_size, self.dtype, self.device, num_layers=self.kv_layers
        )

    @classmethod
    def empty(
        cls,
        config: HybridConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        **kw: Any,
    ) -> Self:
        """Uninitialised weights (no RNG use) of `cls(config, **kw)`; fill them with
        `load_state_dict`."""
        module = empty_module(lambda: cls(config, **kw), dtype, device)  # type: ignore[call-arg]
        for sub in module.modules():
            if isinstance(sub, cls.compute_dtype_modules):
                sub.to(compute_dtype(dtype))
        return module

    @classmethod
    def random(
        cls,
        config: HybridConfig,
        seed: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        **kw: Any,
    ) -> Self:
        """Random weights (`randomised`'s rules); the same seed gives bit-identical weights."""
        return randomised(cls.empty(config, torch.float32, "cpu", **kw), seed, dtype, device)


class HybridForCausalLM(ConfigBuilt):
    """Decoder + LM head of a hybrid model, run one paged `StepBatch` at a time.

    Subclasses build the decoder in `__init__` with `self._add_decoder(layer, norm)` (the
    container is declared once, here: embedding, one `layer(config, i)` per layer, the final
    norm, then the LM head, in the checkpoint's parameter order, under `decoder_names`);
    `embed_tokens`, `decoder_layers` and `final_layernorm` reach its parts.
    """

    # the checkpoint's names for the decoder's parts
    decoder_names: ClassVar[DecoderNames] = DecoderNames()
    placed_by = "embed_tokens"

    config_class: ClassVar[type[HybridConfig]] = HybridConfig
    # (regex, replacement) pairs mapping other spellings of checkpoint tensor names onto ours
    checkpoint_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    # regexes of checkpoint tensors that are not part of the model (derived buffers, MTP heads)
    checkpoint_ignored: ClassVar[tuple[str, ...]] = (r"rotary_emb\.inv_freq$",)
    embedding_multiplier: float = 1.0
    logits_divisor: float = 1.0

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.lm_head: nn.Linear | None = None
        # Position of each layer among the attention layers / among the Mamba layers.
        self.kv_layer_of: dict[int, int] = {i: k for k, i in enumerate(config.attn_layer_indices)}
        self.state_layer_of: dict[int, int] = {
            i: k for k, i in enumerate(config.mamba_layer_indices)
        }

    def _add_decoder(self, layer: Callable[[Any, int], nn.Module], norm: nn.Module) -> None:
        """The decoder (embedding, `layer(config, i)` for every layer, `norm`) under
        `decoder_names`, then the LM head (none when the embeddings are tied)."""
        config, names = self.config, self.decoder_names
        decoder = nn.Module()
        decoder.add_module(names.embedding, nn.Embedding(config.vocab_size, config.hidden_size))
        layers = nn.ModuleList(layer(config, i) for i in range(config.num_hidden_layers))
        decoder.add_module(names.layers, layers)
        decoder.add_module(names.norm, norm)
        self.add_module(names.prefix, decoder)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def _decoder_part(self, name: str) -> Any:
        return getattr(getattr(self, self.decoder_names.prefix), name)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._decoder_part(self.decoder_names.embedding)  # type: ignore[no-any-return]

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self._decoder_part(self.decoder_names.layers)  # type: ignore[no-any-return]

    @property
    def final_layernorm(self) -> RMSNorm:
        return self._decoder_part(self.decoder_names.norm)  # type: ignore[no-any-return]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N,) token ids -> (N, hidden_size) inputs of the first layer."""
        hidden = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        return hidden

    @classmethod
    def checkpoint_key(cls, key: str) -> str | None:
        """Our name for checkpoint tensor `key`, or None when the model does not use it."""
        if any(re.search(p, key) for p in cls.checkpoint_ignored):
            return None
        for pattern, repl in cls.checkpoint_renames:
            key = re.sub(pattern, repl, key)
        return key

    def make_state_cache(self, num_slots: int) -> StateCache:
        """An empty state cache for this model's Mamba layers, in its dtype and device."""
        return StateCache(self.config, num_slots, self.dtype, self.device)

    # ------------------------------------------------------------------ forward
    def _check_caches(self, kv: PagedKVCache | None, states: StateCache | None) -> None:
        cfg = self.config
        if cfg.num_attention_layers:
            if kv is None:
                raise ValueError("this model has attention layers: a PagedKVCache is required")
            if (
                kv.num_layers < cfg.num_attention_layers
                or kv.num_kv_heads != cfg.num_key_value_heads
                or kv.head_dim != cfg.head_dim
            ):
                raise ValueError(
                    f"PagedKVCache shape (layers={kv.num_layers}, kv_heads={kv.num_kv_heads}, "
                    f"head_dim={kv.head_dim}) does not fit the config (layers="
                    f"{cfg.num_attention_layers}, kv_heads={cfg.num_key_value_heads}, "
                    f"head_dim={cfg.head_dim})"
                )
        if cfg.num_mamba_layers:
            if states is None:
                raise ValueError("this model has Mamba layers: a StateCache is required")
            want = (cfg.num_mamba_layers, cfg.mamba_conv_dim, cfg.mamba_d_conv - 1)
            got = (states.conv.shape[0], states.conv.shape[2], states.conv.shape[3])
            want_ssm = (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state)
            if got != want or tuple(states.ssm.shape[2:]) != want_ssm:
                raise ValueError(
                    f"StateCache shape {tuple(states.conv.shape)}/{tuple(states.ssm.shape)} "
                    "does not fit the config"
                )

    def _step(
        self, batch: StepBatch, kv: PagedKVCache | None, states: StateCache | None
    ) -> HybridStep:
        cfg = self.config
        device = self.device
        attn_plan = cos = sin = None
        if cfg.num_attention_layers:
            assert kv is not None
            attn_plan = AttentionPlan.build(batch, kv, device)
            if cfg.use_rope:
                cos, sin = rope_cos_sin(
                    attn_plan.positions, cfg.rotary_dim, cfg.rope_theta, self.dtype
                )  # (N, rotary_dim) each
        mamba_plan = None
        if cfg.num_mamba_layers:
            in_place = cfg.recurrent_mixer == "mamba2"  # the GDN mixer gathers every request
            mamba_plan = MambaPlan.build(batch, device, in_place=in_place)
        return HybridStep(
            kv, states, attn_plan, mamba_plan, cos, sin, self.kv_layer_of, self.state_layer_of
        )

    @torch.no_grad()
    def forward(
        self, batch: StepBatch, kv: PagedKVCache | None, states: StateCache | None
    ) -> torch.Tensor:
        """Run one step; returns (N, hidden_size) hidden states after the final norm.

        Attention layers write the new tokens' K/V, then attend causally over positions
        [0, context_len + query_len). Mamba layers start from `state_src` (or zeros) and write
        the conv + SSM state after each offset requested in `state_writes`.
        """
        batch.validate(need_states=self.config.num_mamba_layers > 0)
        self._check_caches(kv, states)
        hidden = self.embed(batch.input_ids.to(self.device))  # (N, hidden_size)
        step = self._step(batch, kv, states)
        for i, layer in enumerate(self.decoder_layers):
            hidden = layer(hidden, step, i)
        return self.final_layernorm(hidden)  # (N, hidden_size)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, hidden_size) final-normed hidden states -> (M, vocab) logits (float32, or
        float64 for float64 models)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden.to(weight.dtype), weight)
        if self.logits_divisor != 1.0:
            logits = logits / self.logits_divisor
        return logits.to(compute_dtype(weight.dtype))


def empty_module(build: Callable[[], M], dtype: torch.dtype, device: torch.device | str) -> M:
    """`build()` on the meta device, then uninitialised storage on `device` (no RNG use).

    A module's init on the meta device goes through `torch._refs`, which imports
    `torch._dynamo` on first use; its import makes a frame cycle (`torch.fx.wrap`) that would
    hold the whole call stack, the first engine of the process with it, until Python's cyclic
    collector runs. So this module imports it up front."""
    with torch.device("meta"):
        module = build()
    return module.to_empty(device=device).to(dtype=dtype).eval()


def randomised(module: M, seed: int, dtype: torch.dtype, device: torch.device | str) -> M:
    """`module` (float32, on the CPU) filled by `_random_init`'s rules from `seed`, then moved
    to `dtype` and `device`: the same seed gives bit-identical weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(_random_init(name, param, gen))
    return module.to(device=device, dtype=dtype).eval()


def _random_init(name: str, param: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Deterministic float32 CPU values for parameter `name` (drawn in named_parameters order)."""
    shape = param.shape
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
    if leaf == "D":
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if leaf == "dt_bias":
        # dt log-uniform in [1e-3, 1e-1], stored as softplus^-1(dt) (the Mamba2 init).
        lo, hi = torch.log(torch.tensor(1e-3)), torch.log(torch.tensor(1e-1))
        dt = torch.exp(lo + (hi - lo) * torch.rand(shape, generator=gen))
        return dt + torch.log(-torch.expm1(-dt))
    if "norm" in name:  # RMSNorm / gated norm weights
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if "conv1d" in name:
        std = 0.3 if leaf == "weight" else 0.05
        return std * torch.randn(shape, generator=gen)
    return 0.02 * torch.randn(shape, generator=gen)
