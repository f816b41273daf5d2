"""Paged-cache data structures shared by every hybrid model and the EAGLE head.

Owns:

* `StepBatch` - the description of one forward step over several requests whose new tokens are
  concatenated (the interface the runner drives).
* `PagedKVCache` - key/value blocks for a list of attention layers that share one block table.
* `StateCache` - conv + SSM state slots for every Mamba layer.

Nothing here knows about weights; the model reads and writes these caches in its forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hycache.cache.layout import ssm_state_item_bytes

if TYPE_CHECKING:
    from hycache.model.configs.base import HybridConfig


@dataclass
class StepBatch:
    """One forward step over R requests; their new tokens are concatenated in request order.

    Attributes:
        input_ids: (N,) int64 token ids.
        positions: (N,) int64 absolute positions; request r's tokens sit at
            context_lens[r] .. context_lens[r] + query_lens[r] - 1.
        query_lens: new tokens per request, sum == N.
        context_lens: tokens already in the KV cache before this step (== first position).
        block_tables: per request, attention block ids: the token at position p lives in block
            block_tables[r][p // block_size], row p % block_size.
        state_src: per request, the state slot to start the SSM/conv state from, or -1 for zeros.
        state_writes: per request, (offset, slot) pairs: after the first `offset` tokens of this
            step (1 <= offset <= query_len) write the SSM + conv state into `slot`.

    All state reads of a step happen (per layer) before any state write, so a request may read
    and write the same slot, and a slot written by one request is not seen by another request
    in the same step.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    state_src: list[int] = field(default_factory=list)
    state_writes: list[list[tuple[int, int]]] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def query_starts(self) -> list[int]:
        """Start index of each request's tokens in the concatenated batch (length R + 1)."""
        starts = [0]
        for q in self.query_lens:
            starts.append(starts[-1] + q)
        return starts

    def validate(self, *, need_states: bool) -> None:
        """Raise ValueError when the fields are inconsistent with each other."""
        r = self.num_requests
        if self.input_ids.dim() != 1 or self.positions.shape != self.input_ids.shape:
            raise ValueError(
                f"StepBatch.input_ids/positions must both be (N,), got "
                f"{tuple(self.input_ids.shape)} and {tuple(self.positions.shape)}"
            )
        if any(q < 1 for q in self.query_lens):
            raise ValueError(f"StepBatch.query_lens must be >= 1, got {self.query_lens}")
        if sum(self.query_lens) != self.num_tokens:
            raise ValueError(
                f"StepBatch.query_lens sum to {sum(self.query_lens)} but there are "
                f"{self.num_tokens} tokens"
            )
        if len(self.context_lens) != r or len(self.block_tables) != r:
            raise ValueError("StepBatch.context_lens and block_tables need one entry per request")
        if any(c < 0 for c in self.context_lens):
            raise ValueError(f"StepBatch.context_lens must be >= 0, got {self.context_lens}")
        if not need_states:
            return
        if len(self.state_src) != r or len(self.state_writes) != r:
            raise ValueError("StepBatch.state_src and state_writes need one entry per request")
        for i, (q, writes) in enumerate(zip(self.query_lens, self.state_writes, strict=True)):
            for off, _slot in writes:
                if not 1 <= off <= q:
                    raise ValueError(f"StepBatch.state_writes[{i}]: offset {off} outside [1, {q}]")


class PagedKVCache:
    """K/V blocks for `num_layers` attention layers sharing one block table.

    Storage: `self.kv` of shape (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim);
    index 0 of the second axis holds keys, 1 holds values. Keys are stored after RoPE.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("PagedKVCache sizes must all be >= 1")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # (layers, k/v, blocks, block_size, kv_heads, head_dim)
        self.kv = torch.zeros(
            num_layers,
            2,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=self.device,
        )

    @classmethod
    def for_model(
        cls,
        config: HybridConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        num_layers: int | None = None,
    ) -> PagedKVCache:
        """A cache sized for the attention layers of `config` (or `num_layers` of that shape)."""
        layers = config.num_attention_layers if num_layers is None else num_layers
        return cls(
            max(layers, 1),
            num_blocks,
            block_size,
            config.num_key_value_heads,
            config.head_dim,
            dtype,
            device,
        )

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one layer's keys and values as (num_blocks * block_size, kv_heads, head_dim)."""
        k = self.kv[layer, 0].view(-1, self.num_kv_heads, self.head_dim)
        v = self.kv[layer, 1].view(-1, self.num_kv_heads, self.head_dim)
        return k, v

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (n, kv_heads, head_dim) at flat slot ids (n,) = block * block_size + row."""
        kf, vf = self.flat(layer)
        kf.index_copy_(0, slots, k.to(self.dtype))
        vf.index_copy_(0, slots, v.to(self.dtype))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at flat slot ids (any shape S) -> (*S, kv_heads, head_dim) each."""
        kf, vf = self.flat(layer)
        flat_slots = slots.reshape(-1)
        shape = (*slots.shape, self.num_kv_heads, self.head_dim)
        return kf.index_select(0, flat_slots).view(shape), vf.index_select(0, flat_slots).view(
            shape
        )

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block `src` into block `dst` in every layer (copy-on-write support)."""
        self.kv[:, :, dst].copy_(self.kv[:, :, src])


def ssm_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """SSM states are float32, except for float64 models (then float64): the dtype of
    `layout.ssm_state_item_bytes`."""
    return torch.float64 if ssm_state_item_bytes(dtype.itemsize) == 8 else torch.float32


class StateCache:
    """Conv + SSM state of every Mamba layer, in `num_slots` slots.

    Storage:
        conv: (num_mamba_layers, num_slots, conv_dim, d_conv - 1) in the model dtype - the last
            d_conv - 1 inputs (x, B, C channels) of the causal conv.
        ssm: (num_mamba_layers, num_slots, n_heads, d_head, d_state) in float32 (float64 for
            float64 models) - the SSM hidden state h.
    """

    def __init__(
        self,
        config: HybridConfig,
        num_slots: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots < 1:
            raise ValueError("StateCache.num_slots must be >= 1")
        self.config = config
        self.num_slots = num_slots
        self.dtype = dtype
        self.ssm_dtype = ssm_state_dtype(dtype)
        self.device = torch.device(device)
        layers = max(config.num_mamba_layers, 1)
        # (layers, slots, conv_dim, d_conv - 1)
        self.conv = torch.zeros(
            layers,
            num_slots,
            config.mamba_conv_dim,
            config.mamba_d_conv - 1,
            dtype=dtype,
            device=self.device,
        )
        # (layers, slots, heads, head_dim, d_state)
        self.ssm = torch.zeros(
            layers,
            num_slots,
            config.mamba_n_heads,
            config.mamba_d_head,
            config.mamba_d_state,
            dtype=self.ssm_dtype,
            device=self.device,
        )

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy every layer's conv and SSM state from slot `src` into slot `dst`."""
        self.conv[:, dst].copy_(self.conv[:, src])
        self.ssm[:, dst].copy_(self.ssm[:, src])

    def read(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of (conv (layers, conv_dim, d_conv - 1), ssm (layers, heads, d_head, d_state))."""
        return self.conv[:, slot].clone(), self.ssm[:, slot].clone()

    def write(self, slot: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Inverse of `read`."""
        self.conv[:, slot].copy_(conv)
        self.ssm[:, slot].copy_(ssm)
