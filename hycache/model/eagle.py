"""EAGLE draft head for a hybrid target model (any architecture `loader.py` builds).

Owns `EagleHead`: a one-layer drafter that predicts the token after t+1 from the target's
hidden state at t and the embedding of token t+1:

    x = fc(concat(target.embed(token_{t+1}), hidden_t))     Linear 2H -> H
    h = x + attn(input_layernorm(x))                        GQA (+ RoPE), own PagedKVCache
    h = h + mlp(post_attention_layernorm(h))                SwiGLU
    logits = target.compute_logits(target.final_layernorm(h))

The embedding (with the target's embedding multiplier), final norm and LM head (with its logit
scale) are the target's (shared, not stored here). `h` is returned so a chain of draft steps
can feed it back in place of the target hidden state. The attention has the same shape (heads,
KV heads, head_dim, score scale, RoPE or none) as the target's attention; its KV lives in its
own one-layer `PagedKVCache` with its own block tables, driven by the same `StepBatch` type
(the state fields are unused).

Checkpoint tensor names: `fc.weight`, `fc.bias` (optional), `layers.0.input_layernorm.weight`,
`layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.post_attention_layernorm.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from hycache.model.configs.base import HybridConfig
from hycache.model.hybrid import ConfigBuilt, HybridForCausalLM
from hycache.model.layers import MLP, Attention, AttentionPlan, RMSNorm, rope_cos_sin
from hycache.model.paged import PagedKVCache, StepBatch
from hycache.model.weights import load_checked, read_safetensors

__all__ = ["EagleHead"]


class EagleDecoderLayer(nn.Module):
    """RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention.for_config(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)


class DraftHead(ConfigBuilt):
    """What every drafter (`EagleHead`, `model.mtp.MtpHead`) shares: one decoder layer behind
    an `fc` projection, with a one-layer paged KV cache of its own, run by one `forward`; a
    drafter says what `fc` reads (`fc_input`), what it returns (`output`) and its logits
    (`draft_logits`)."""

    fc: nn.Linear
    layers: nn.ModuleList
    placed_by = "fc"
    kv_layers = 1  # the draft attention's

    def fc_input(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """What `fc` projects: the token embeddings and the hidden states side by side."""
        return torch.cat([emb, hidden], dim=-1)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """The head's output from its decoder layer's (EAGLE: as it is)."""
        return x

    @torch.no_grad()
    def forward(
        self,
        batch: StepBatch,
        hidden: torch.Tensor,
        kv: PagedKVCache,
        target: HybridForCausalLM,
        *,
        compute_logits: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft step.

        Args:
            batch: the tokens t+1 (`input_ids`) at their positions, with the draft KV's block
                tables; state fields are ignored.
            hidden: (N, hidden_size) the target's final hidden state at t (or, when chaining,
                the hidden this head returned for the previous draft token).
            kv: this head's one-layer KV cache; the new tokens' K/V are written into it.
            target: the target model, for its embedding (and final norm and LM head).
            compute_logits: set False to skip the LM head.

        Returns:
            (draft hidden (N, hidden_size), logits (N, vocab) or None).
        """
        batch.validate(need_states=False)
        if hidden.shape != (batch.num_tokens, self.config.hidden_size):
            raise ValueError(
                f"hidden must be ({batch.num_tokens}, {self.config.hidden_size}), "
                f"got {tuple(hidden.shape)}"
            )
        device, dtype = self.device, self.dtype
        emb = target.embed(batch.input_ids.to(device)).to(dtype)  # (N, hidden_size)
        x = self.fc(self.fc_input(emb, hidden.to(device=device, dtype=dtype)))  # (N, H)
        plan = AttentionPlan.build(batch, kv, device)
        cos = sin = None
        if self.config.use_rope:
            cos, sin = rope_cos_sin(
                plan.positions, self.config.rotary_dim, self.config.rope_theta, dtype
            )  # (N, rotary_dim) each
        layer = self.layers[0]
        x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, plan, kv, 0)
        x = self.output(x + layer.mlp(layer.post_attention_layernorm(x)))  # (N, hidden_size)
        return x, self.draft_logits(x, target) if compute_logits else None

    def draft_logits(self, x: torch.Tensor, target: HybridForCausalLM) -> torch.Tensor:
        """Logits of this head's output (N, hidden_size) -> (N, vocab)."""
        raise NotImplementedError


class EagleHead(DraftHead):
    """One-layer EAGLE drafter sharing the target's embedding, final norm and LM head."""

    def __init__(self, target_config: HybridConfig, *, fc_bias: bool = True) -> None:
        super().__init__()
        self.config = target_config
        h = target_config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList([EagleDecoderLayer(target_config)])

    # ------------------------------------------------------------------ construction
    # `empty(target_config, dtype, device, fc_bias=...)` and `random(target_config, seed,
    # dtype, device, fc_bias=...)`: ConfigBuilt's
    @classmethod
    def load(
        cls,
        path: str | Path,
        target_config: HybridConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> EagleHead:
        """Load from a safetensors file (or a directory holding `*.safetensors`).

        Raises ValueError naming missing, unexpected or misshaped tensors, FileNotFoundError
        when there is nothing to load.
        """
        p = Path(path)
        if p.is_dir():
            files = sorted(p.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in {p}")
        elif p.is_file():
            files = [p]
        else:
            raise FileNotFoundError(f"{p} does not exist")
        tensors = read_safetensors(files)
        head = cls.empty(target_config, dtype, device, fc_bias="fc.bias" in tensors)
        load_checked(head, tensors, what=f"EAGLE head {p}")
        return head

    def save(self, path: str | Path) -> None:
        """Write all weights to one safetensors file that `load` reads back."""
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path), metadata={"format": "pt"})

    # ------------------------------------------------------------------ forward
    def draft_logits(self, x: torch.Tensor, target: HybridForCausalLM) -> torch.Tensor:
        """Logits of a draft hidden state (this head's output): the target's final norm and
        LM head."""
        return target.compute_logits(target.final_layernorm(x.to(target.dtype)))
