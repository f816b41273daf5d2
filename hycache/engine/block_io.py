"""Block bytes for the store mirror: one cache block of the runner's tensors as a payload.

    attention group: rows [0, r) of block b in every layer of that group's paged KV cache
                     (the target's, or the drafter's), K then V: (layers, 2, r, kv_heads, dim)
    SSM group:       slot b of every Mamba layer: conv (layers, conv_dim, d_conv - 1), then
                     the SSM state (layers, heads, d_head, d_state)

Payloads are raw little-endian tensor bytes; the store's framing adds the checksum.
"""

from __future__ import annotations

import torch

from hycache.cache.layout import attention_block_bytes, state_page_bytes
from hycache.config import GroupKind
from hycache.model.paged import PagedKVCache, StateCache


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def _from_bytes(payload: bytes, like: torch.Tensor) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return flat.view(like.dtype).view(like.shape).to(like.device)


class RunnerBlockIO:
    """`BlockIO` over a runner's caches; `groups` is the cache's group list."""

    def __init__(
        self,
        groups: tuple[GroupKind, ...],
        kv: PagedKVCache | None,
        draft_kv: PagedKVCache | None,
        states: StateCache | None,
    ) -> None:
        attention = [g for g, k in enumerate(groups) if k is GroupKind.ATTENTION]
        self._kv: dict[int, PagedKVCache] = {}
        for i, g in enumerate(attention):
            cache = kv if i == 0 and kv is not None else draft_kv
            if cache is not None:
                self._kv[g] = cache
        self._states = states

    def _rows(self, group: int, block: int, rows: int) -> torch.Tensor:
        return self._kv[group].kv[:, :, block, :rows]

    def _state(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._states is not None
        return self._states.conv[:, block], self._states.ssm[:, block]

    def read(self, group: int, block: int, rows: int) -> bytes:
        if group in self._kv:
            return _to_bytes(self._rows(group, block, rows))
        conv, ssm = self._state(block)
        return _to_bytes(conv) + _to_bytes(ssm)

    def write(self, group: int, block: int, payload: bytes) -> None:
        if group in self._kv:
            rows = len(payload) // self.payload_bytes(group, 1)
            target = self._rows(group, block, rows)
            target.copy_(_from_bytes(payload, target))
            return
        conv, ssm = self._state(block)
        split = conv.numel() * conv.element_size()
        conv.copy_(_from_bytes(payload[:split], conv))
        ssm.copy_(_from_bytes(payload[split:], ssm))

    def payload_bytes(self, group: int, rows: int) -> int:
        if group in self._kv:
            t = self._kv[group].kv  # (layers, 2, blocks, block_size, kv_heads, head_dim)
            return attention_block_bytes(t.shape[0], rows, t.shape[4], t.shape[5], t.element_size())
        assert self._states is not None
        return state_page_bytes(self._states.config, self._states.dtype.itemsize)
