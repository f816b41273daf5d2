"""The fast decode paths equal the general ones: SSM states updated in place through strided
views of the state cache (`InPlaceDecode`) vs gathered and scattered, and block-gathered decode
attention (`DecodeAttention`) vs the per-request path; `ssd_update_` vs `ssd_step`."""

from __future__ import annotations

import random

import pytest
import torch

from hycache.model.bamba import BambaForCausalLM
from hycache.model.mamba2 import InPlaceDecode, MambaPlan
from hycache.model.paged import PagedKVCache, StateCache, StepBatch
from hycache.model.ssd import ssd_step, ssd_update_
from tests.model.utils import fresh_caches, prefill, shuffled_blocks, small_config

F64 = torch.float64
ATOL = 1e-10


@pytest.fixture(scope="module")
def model() -> BambaForCausalLM:
    return BambaForCausalLM.random(small_config(), seed=11, dtype=F64)


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(97) for _ in range(n)]


def test_ssd_update_in_place_on_strided_view_equals_ssd_step() -> None:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(9, 4, 3, 5, generator=gen, dtype=F64)  # (slots, heads, hd, d_state)
    view = cache[1:9:3]  # three slots, strided
    x = torch.randn(3, 4, 3, generator=gen, dtype=F64)
    dt = torch.rand(3, 4, generator=gen, dtype=F64)
    A = -torch.rand(4, generator=gen, dtype=F64)
    B = torch.randn(3, 2, 5, generator=gen, dtype=F64)
    C = torch.randn(3, 2, 5, generator=gen, dtype=F64)
    y_ref, s_ref = ssd_step(view.clone(), x, dt, A, B, C)
    untouched = cache[[0, 2, 3, 5, 6, 8]].clone()
    y = ssd_update_(view, x, dt, A, B, C)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache[1:9:3], s_ref, rtol=0, atol=1e-12)
    assert torch.equal(cache[[0, 2, 3, 5, 6, 8]], untouched)


def _decode_batch(prompts: list[list[int]], tables: list[list[int]], slots: list[int]) -> StepBatch:
    return StepBatch(
        torch.tensor([p[-1] for p in prompts]),
        torch.tensor([len(p) - 1 for p in prompts]),
        [1] * len(prompts),
        [len(p) - 1 for p in prompts],
        tables,
        list(slots),
        [[(1, s)] for s in slots],
    )


def _prefilled(
    model: BambaForCausalLM, prompts: list[list[int]], slots: list[int], num_slots: int = 12
) -> tuple[PagedKVCache, StateCache, list[list[int]]]:
    kv, states = fresh_caches(model, num_blocks=40, block_size=4, num_slots=num_slots)
    blocks = shuffled_blocks(40, 5)
    tables = [blocks[i * 10 : (i + 1) * 10] for i in range(len(prompts))]
    for r, p in enumerate(prompts):
        prefill(model, p[:-1], [len(p) - 1], tables[r], kv, states, slot=slots[r])
    return kv, states, tables


def _copies(
    model: BambaForCausalLM, kv: PagedKVCache, states: StateCache
) -> tuple[PagedKVCache, StateCache]:
    """Copies of `_prefilled`'s caches: a reference step runs on them beside the one tested."""
    kv2 = PagedKVCache.for_model(model.config, 40, 4, F64)
    kv2.kv.copy_(kv.kv)
    states2 = StateCache(model.config, 12, F64)
    states2.conv.copy_(states.conv)
    states2.ssm.copy_(states.ssm)
    return kv2, states2


@pytest.mark.parametrize(
    ("slots", "in_place"),
    [
        ([2, 3, 4], True),  # contiguous, in request order
        ([3, 5, 7], True),  # strided
        ([7, 3, 5], True),  # strided, requests out of slot order
        ([1, 2, 9], False),  # not a progression: gathered and scattered
    ],
)
def test_in_place_decode_equals_gathered(
    model: BambaForCausalLM, slots: list[int], in_place: bool
) -> None:
    """The same decode step from the same states gives the same outputs and written states
    whether its slots are updated in place or gathered (reference: slots 8, 10, 0 - not a
    progression, so gathered)."""
    prompts = [_tokens(n, n) for n in (6, 13, 22)]
    ref_slots = [8, 10, 0]
    kv, states, tables = _prefilled(model, prompts, ref_slots)
    for s, r in zip(slots, ref_slots, strict=True):
        if s != r:
            states.copy_slot(r, s)
    kv_ref, ref_states = _copies(model, kv, states)

    batch = _decode_batch(prompts, tables, slots)
    plan = MambaPlan.build(batch, torch.device("cpu"))
    assert (plan.in_place is not None) == in_place
    out = model(batch, kv, states)
    ref = model(_decode_batch(prompts, tables, ref_slots), kv_ref, ref_states)
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    for s, r in zip(slots, ref_slots, strict=True):
        torch.testing.assert_close(states.ssm[:, s], ref_states.ssm[:, r], rtol=0, atol=ATOL)
        torch.testing.assert_close(states.conv[:, s], ref_states.conv[:, r], rtol=0, atol=ATOL)


def test_in_place_decode_alongside_other_requests(model: BambaForCausalLM) -> None:
    """Decoding requests in place next to a prefill chunk and a verify step in one batch give
    what separate steps give."""
    prompts = [_tokens(n, 40 + n) for n in (9, 14, 19)]
    kv, states, tables = _prefilled(model, prompts, [1, 2, 3])
    kv_ref, ref_states = _copies(model, kv, states)
    fresh = _tokens(11, 99)  # a prefill chunk from zeros
    verify = [prompts[2][-1], 5, 6, 7]  # a verify step, writing after 1 and after 4 tokens
    n0, n1, n2 = (len(p) - 1 for p in prompts)
    free = sorted(set(range(40)) - {b for t in tables for b in t})
    batch = StepBatch(
        torch.tensor([prompts[0][-1], *fresh, prompts[1][-1], *verify]),
        torch.tensor([n0, *range(11), n1, *range(n2, n2 + 4)]),
        [1, 11, 1, 4],
        [n0, 0, n1, n2],
        [tables[0], free, tables[1], tables[2]],
        [1, -1, 2, 3],
        [[(1, 1)], [(11, 6)], [(1, 2)], [(1, 7), (4, 8)]],
    )
    plan = MambaPlan.build(batch, torch.device("cpu"))
    assert plan.in_place is not None and plan.in_place.reqs == [0, 2]
    out = model(batch, kv, states)
    starts = batch.query_starts()
    for r in range(4):
        q = batch.query_lens[r]
        sub = StepBatch(
            batch.input_ids[starts[r] : starts[r + 1]],
            batch.positions[starts[r] : starts[r + 1]],
            [q],
            [batch.context_lens[r]],
            [batch.block_tables[r]],
            [batch.state_src[r]],
            [batch.state_writes[r]],
        )
        ref = model(sub, kv_ref, ref_states)
        torch.testing.assert_close(out[starts[r] : starts[r + 1]], ref, rtol=0, atol=ATOL)
    torch.testing.assert_close(states.ssm, ref_states.ssm, rtol=0, atol=ATOL)
    torch.testing.assert_close(states.conv, ref_states.conv, rtol=0, atol=ATOL)


def test_in_place_refused_when_another_request_touches_the_slot() -> None:
    def batch(srcs: list[int], writes: list[list[tuple[int, int]]]) -> StepBatch:
        n = len(srcs)
        return StepBatch(
            torch.zeros(n, dtype=torch.int64),
            torch.full((n,), 5),
            [1] * n,
            [5] * n,
            [[0, 1]] * n,
            srcs,
            writes,
        )

    # request 1 reads slot 3, which request 0 would update in place: request 0 is gathered
    cpu = torch.device("cpu")
    clash = [[(1, 3)], [(1, 4)]]
    assert InPlaceDecode.build(batch([3, 3], clash), clash, cpu) is None
    writes = [[(1, 2)], [(1, 4)], [(1, 6)]]
    ip = InPlaceDecode.build(batch([2, 4, 6], writes), writes, cpu)
    assert ip is not None and (ip.first, ip.stop, ip.stride) == (2, 7, 2) and ip.rows is None


@pytest.mark.parametrize("lengths", [(9, 9, 9), (5, 17, 30)], ids=["equal", "unequal"])
def test_decode_attention_equals_per_request_path(
    model: BambaForCausalLM, lengths: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block-gathered decode attention (mask-free when every context is as long) equals the
    per-request path."""
    import hycache.model.layers as layers

    prompts = [_tokens(n, 3 * n) for n in lengths]
    slots = [0, 1, 2]
    kv, states, tables = _prefilled(model, prompts, slots)
    kv2, states2 = _copies(model, kv, states)
    batch = _decode_batch(prompts, tables, slots)
    plan = layers.AttentionPlan.build(batch, kv, torch.device("cpu"))
    assert plan.decode is not None
    assert (plan.decode.mask is None) == (len(set(lengths)) == 1)
    out = model(batch, kv, states)
    monkeypatch.setattr(layers, "PADDED_ATTENTION_MAX_QUERY", 0)
    ref = model(_decode_batch(prompts, tables, slots), kv2, states2)
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
