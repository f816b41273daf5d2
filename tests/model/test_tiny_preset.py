"""The `tiny` preset runs through the paged API in float32 (short always; 8k tokens when slow
tests are selected)."""

from __future__ import annotations

import pytest
import torch

from hycache.model import StepBatch, load_model
from hycache.model.bamba import BambaForCausalLM

from .utils import prefill, shuffled_blocks


@pytest.fixture(scope="module")
def tiny() -> BambaForCausalLM:
    return load_model("tiny")[0]


def _chunked_vs_whole(model: BambaForCausalLM, n: int, chunks: list[int]) -> None:
    tokens = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    nblocks = n // 16 + 2
    kv, st = model.make_kv_cache(nblocks, 16), model.make_state_cache(2)
    whole = prefill(model, tokens, [n], list(range(nblocks)), kv, st, slot=0)
    kv, st = model.make_kv_cache(nblocks, 16), model.make_state_cache(2)
    parts = prefill(model, tokens, chunks, shuffled_blocks(nblocks, 1), kv, st, slot=1)
    assert whole.dtype == torch.float32 and st.ssm.dtype == torch.float32
    torch.testing.assert_close(
        model.compute_logits(parts), model.compute_logits(whole), rtol=1e-4, atol=1e-4
    )


def test_tiny_short_prompt(tiny: BambaForCausalLM) -> None:
    _chunked_vs_whole(tiny, 300, [100, 1, 1, 150, 48])


def test_tiny_batched_decode_shapes(tiny: BambaForCausalLM) -> None:
    kv, st = tiny.make_kv_cache(16, 16), tiny.make_state_cache(8)
    batch = StepBatch(
        torch.arange(8),
        torch.zeros(8, dtype=torch.int64),
        [1] * 8,
        [0] * 8,
        [[r] for r in range(8)],
        [-1] * 8,
        [[(1, r)] for r in range(8)],
    )
    logits = tiny.compute_logits(tiny(batch, kv, st))
    assert logits.shape == (8, 512)
    # Identical inputs in different requests give identical rows.
    same = StepBatch(
        torch.tensor([5, 5]),
        torch.zeros(2, dtype=torch.int64),
        [1, 1],
        [0, 0],
        [[8], [9]],
        [-1, -1],
        [[], []],
    )
    out = tiny.compute_logits(tiny(same, kv, st))
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)


@pytest.mark.slow
def test_tiny_8k_prefill_chunked_vs_whole(tiny: BambaForCausalLM) -> None:
    _chunked_vs_whole(tiny, 8000, [3000, 1, 2999, 2000])
