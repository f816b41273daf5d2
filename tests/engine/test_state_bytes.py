"""The engine's caches hold exactly the bytes `cache/layout.py` sizes them by, in every dtype:
one SSM page is one slot of the runner's conv + SSM state tensors, one attention block one
block of its K/V tensors (the drafter's too), and the store's payloads are those sizes."""

from __future__ import annotations

import pytest
import torch

from hycache.cache import layout
from hycache.config import GroupKind
from hycache.engine.block_io import RunnerBlockIO
from hycache.engine.build import DTYPES, attention_block_bytes, state_bytes
from hycache.engine.engine import LLM


def _slot_bytes(t: torch.Tensor) -> int:
    """Bytes of one slot (dim 1) of a per-layer cache tensor."""
    return t.numel() // t.shape[1] * t.element_size()


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_allocated_state_and_kv_bytes_follow_the_layout(name: str) -> None:
    dtype = DTYPES[name]
    llm = LLM("tiny", dtype=name, max_model_len=64, num_speculative_tokens=1, max_num_seqs=2)
    mc, runner = llm.model_config, llm.runner
    assert runner.states is not None and runner.kv is not None and runner.draft_kv is not None
    conv, ssm = runner.states.conv, runner.states.ssm
    assert ssm.element_size() == layout.ssm_state_item_bytes(dtype.itemsize)
    assert _slot_bytes(conv) + _slot_bytes(ssm) == state_bytes(mc, dtype)
    assert state_bytes(mc, dtype) == layout.state_page_bytes(mc, dtype.itemsize)
    b = llm.config.cache.block_size
    kv_block = _slot_bytes(runner.kv.kv.transpose(1, 2)) + _slot_bytes(
        runner.draft_kv.kv.transpose(1, 2)
    )
    assert kv_block == attention_block_bytes(mc, b, dtype, drafter=True)
    groups = llm.config.cache.groups
    io = RunnerBlockIO(groups, runner.kv, runner.draft_kv, runner.states)
    assert io.payload_bytes(groups.index(GroupKind.SSM), 1) == state_bytes(mc, dtype)
    assert io.payload_bytes(0, b) == attention_block_bytes(mc, b, dtype, drafter=False)
