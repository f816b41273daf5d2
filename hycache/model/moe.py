"""The mixture-of-experts dispatch every MoE architecture shares (Granite 4.0, Nemotron-H's `E`
blocks, Qwen3-Next / Qwen3.5 MoE): each chosen expert runs once over its tokens, weighted and
summed back. Routing (which experts, with what weights) is each architecture's own."""

from __future__ import annotations

from collections.abc import Callable

import torch


def dispatch_to_experts(
    x: torch.Tensor,
    top_idx: torch.Tensor,
    weights: torch.Tensor,
    expert: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """sum_k weights[n, k] * expert(top_idx[n, k], x[n]) for every token n, as one
    `expert(e, x[tokens of e])` call per chosen expert e, in ascending expert order.

    x: (N, d); top_idx, weights: (N, k); `expert` maps (n_e, d) -> (n_e, d). Returns (N, d),
    accumulated in `weights`' dtype.
    """
    out = x.new_zeros(x.shape, dtype=weights.dtype)
    for e in top_idx.unique().tolist():
        tok, slot = torch.where(top_idx == e)  # (n_e,) each
        y = expert(e, x[tok]) * weights[tok, slot, None]  # (n_e, d)
        out.index_add_(0, tok, y.to(out.dtype))
    return out
