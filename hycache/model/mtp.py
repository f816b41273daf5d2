"""The multi-token-prediction (MTP) layer a Qwen3-Next / Qwen3.5 checkpoint carries, as the
drafter.

Owns `MtpHead`, a drop-in for `EagleHead` (the same forward, KV cache and draft-logits
interface the model runner drives) built from the checkpoint's `mtp.*` tensors:

    x = fc(concat(pre_fc_norm_embedding(embed(token_{t+1})), pre_fc_norm_hidden(hidden_t)))
    h = x + gated_attn(input_layernorm(x))          the target's gated attention, own KV
    h = h + moe_or_mlp(post_attention_layernorm(h))  layer 0's MLP kind (vLLM's rule)
    h = norm(h)                                      returned (and fed back when chaining)
    logits = target.lm_head(h)

Tensor names (after `mtp.`): `fc.weight`, `pre_fc_norm_embedding.weight`,
`pre_fc_norm_hidden.weight`, `layers.0.*` (a Qwen3-Next decoder layer: `self_attn.*`, `mlp.*`,
the two layer norms), `norm.weight`. Norms are zero-centred, as in the target.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.eagle import DraftHead
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.qwen3_next import Qwen3NextDecoderLayer, ZeroCentredRMSNorm
from hycache.model.weights import load_checked

__all__ = ["MTP_PREFIX", "MtpHead", "checkpoint_mtp_tensors"]

MTP_PREFIX = "mtp."


class MtpHead(DraftHead):
    """A checkpoint's one MTP layer, run as the speculative drafter."""

    def __init__(self, target_config: Qwen3NextConfig) -> None:
        super().__init__()
        cfg = target_config
        self.config = cfg
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = ZeroCentredRMSNorm(h, eps)
        self.pre_fc_norm_hidden = ZeroCentredRMSNorm(h, eps)
        # vLLM builds this layer under the prefix `mtp.layers.0`, so its MLP kind is layer 0's
        # (`Qwen3NextDecoderLayer` reads the index off the prefix): MoE unless
        # `decoder_sparse_step` > 1 or 0 is in `mlp_only_layers`
        self.layers = nn.ModuleList(
            [Qwen3NextDecoderLayer(cfg, 0, attention=True, moe=cfg.is_moe_layer(0))]
        )
        self.norm = ZeroCentredRMSNorm(h, eps)

    # ------------------------------------------------------------------ construction
    # `empty(target_config, ...)` and `random(target_config, seed, ...)`: ConfigBuilt's (the
    # target's init rules)
    @classmethod
    def from_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        target_config: Qwen3NextConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        what: str = "MTP layer",
    ) -> MtpHead:
        """From the `mtp.*` tensors (prefix stripped); ValueError naming missing, unexpected or
        misshaped ones."""
        head = cls.empty(target_config, dtype, device)
        load_checked(head, tensors, what=what)
        return head

    def mtp_tensors(self) -> dict[str, torch.Tensor]:
        """The weights under their checkpoint names (`mtp.` prefixed)."""
        return {MTP_PREFIX + k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}

    # ------------------------------------------------------------------ forward
    # `forward`: DraftHead's, with the inputs of `fc` normed and the output normed
    def fc_input(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def draft_logits(self, x: torch.Tensor, target: HybridForCausalLM) -> torch.Tensor:
        """Logits of this head's (already normed) output through the target's LM head."""
        return target.compute_logits(x.to(target.dtype))


def checkpoint_mtp_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The `mtp.*` tensors of a checkpoint directory (prefix stripped; empty when none)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                if key.startswith(MTP_PREFIX):
                    out[key[len(MTP_PREFIX) :]] = fh.get_tensor(key)
    return out
