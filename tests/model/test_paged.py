"""Paged-cache forward: chunking, resuming, batching and forking give the same numbers, for a
Mamba2 hybrid (Bamba) and a Gated DeltaNet hybrid (Qwen3-Next) alike (float64, 1e-9)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.model.bamba import BambaForCausalLM, StepBatch
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.paged import PagedKVCache, StateCache
from hycache.model.qwen3_next import Qwen3NextForCausalLM

from .utils import (
    fresh_caches,
    full_hidden,
    prefill,
    random_chunks,
    shuffled_blocks,
    small_config,
    small_gdn_config,
    step,
)

F64 = torch.float64
ATOL = 1e-9


@pytest.fixture(scope="module", params=["mamba2", "gdn"])
def model(request: pytest.FixtureRequest) -> HybridForCausalLM:
    if request.param == "gdn":
        return Qwen3NextForCausalLM.random(small_gdn_config(), seed=7, dtype=F64)
    return BambaForCausalLM.random(small_config(), seed=7, dtype=F64)


def _tokens(n: int, seed: int, vocab: int = 97) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _paged(
    model: HybridForCausalLM, num_blocks: int, table_seed: int, block_size: int = 16, **kw: int
) -> tuple[PagedKVCache, StateCache, list[int]]:
    """Empty caches of `num_blocks` blocks and a shuffled block table over all of them."""
    kv, states = fresh_caches(model, num_blocks=num_blocks, block_size=block_size, **kw)
    return kv, states, shuffled_blocks(num_blocks, table_seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_prefill_equals_whole(model: HybridForCausalLM, seed: int) -> None:
    tokens = _tokens(90, seed)
    whole = model.compute_logits(full_hidden(model, tokens))
    rng = random.Random(seed)
    chunks = random_chunks(len(tokens), rng, 40)
    assert len(chunks) > 1
    kv, states, table = _paged(model, 32, seed)
    chunked = model.compute_logits(prefill(model, tokens, chunks, table, kv, states, slot=3))
    assert whole.dtype == F64
    torch.testing.assert_close(chunked, whole, rtol=0, atol=ATOL)


def test_token_by_token_equals_whole(model: HybridForCausalLM) -> None:
    """Decode path (batched recurrence step, padded attention) == prefill path."""
    tokens = _tokens(40, 11)
    whole = full_hidden(model, tokens)
    kv, states, table = _paged(model, 8, 5)
    stepwise = prefill(model, tokens, [1] * 40, table, kv, states, slot=0)
    torch.testing.assert_close(stepwise, whole, rtol=0, atol=ATOL)


def test_resume_from_intermediate_state_write(model: HybridForCausalLM) -> None:
    tokens = _tokens(70, 3)
    whole = full_hidden(model, tokens)
    kv, states, table = _paged(model, 16, 1)
    # One step over the first 50 tokens that also snapshots the state after 29 of them.
    step(model, tokens[:50], 0, table, kv, states, src=-1, writes=[(29, 5), (50, 6)])
    # Resume from the snapshot: recompute tokens 29.. from slot 5 (KV of 0..28 is in place).
    resumed = step(model, tokens[29:], 29, table, kv, states, src=5, writes=[(41, 5)])
    torch.testing.assert_close(resumed, whole[29:], rtol=0, atol=ATOL)
    # The end-of-step snapshot continues as well.
    cont = step(model, tokens[50:], 50, table, kv, states, src=6, writes=[(20, 6)])
    torch.testing.assert_close(cont, whole[50:], rtol=0, atol=ATOL)
    torch.testing.assert_close(states.ssm[:, 5], states.ssm[:, 6], rtol=0, atol=ATOL)
    torch.testing.assert_close(states.conv[:, 5], states.conv[:, 6], rtol=0, atol=ATOL)


def test_verify_step_writes_every_offset(model: HybridForCausalLM) -> None:
    """A speculative verify step asks for the state after every offset; each equals the state
    obtained by feeding exactly that many tokens."""
    prompt, draft = _tokens(20, 4), _tokens(5, 5)
    kv, states, table = _paged(model, 8, 2, block_size=4, num_slots=16)
    prefill(model, prompt, [20], table, kv, states, slot=0)
    step(model, draft, 20, table, kv, states, src=0, writes=[(k, 10 + k) for k in range(1, 6)])
    for k in range(1, 6):
        kv2, st2 = fresh_caches(model, num_blocks=8, block_size=4, num_slots=1)
        prefill(model, prompt + draft[:k], [20 + k], table, kv2, st2, slot=0)
        torch.testing.assert_close(states.ssm[:, 10 + k], st2.ssm[:, 0], rtol=0, atol=ATOL)
        torch.testing.assert_close(states.conv[:, 10 + k], st2.conv[:, 0], rtol=0, atol=ATOL)


def test_mixed_batch_equals_separate_runs(model: HybridForCausalLM) -> None:
    """One step holding a fresh prefill, a continuing chunk and two decodes == separate runs."""
    prompts = [_tokens(n, 20 + n) for n in (37, 25, 12, 9)]
    kv, states = fresh_caches(model, num_blocks=40, block_size=8, num_slots=8)
    blocks = shuffled_blocks(40, 9)
    tables = [blocks[i * 10 : (i + 1) * 10] for i in range(4)]
    # Requests 1..3 already hold a prefix: 1 has 10 tokens, 2 and 3 all but the last token.
    done = [0, 10, 11, 8]
    for r in (1, 2, 3):
        prefill(model, prompts[r][: done[r]], [done[r]], tables[r], kv, states, slot=r)
    qlens = [len(prompts[r]) - done[r] for r in range(4)]
    assert qlens[2] == qlens[3] == 1
    ids = torch.tensor([t for r in range(4) for t in prompts[r][done[r] :]])
    pos = torch.cat([torch.arange(done[r], len(prompts[r])) for r in range(4)])
    batch = StepBatch(
        ids,
        pos,
        qlens,
        done,
        tables,
        state_src=[-1, 1, 2, 3],
        state_writes=[[(q, 4 + r)] for r, q in enumerate(qlens)],
    )
    out = model(batch, kv, states)
    starts = batch.query_starts()
    for r in range(4):
        ref = full_hidden(model, prompts[r])[done[r] :]
        torch.testing.assert_close(out[starts[r] : starts[r + 1]], ref, rtol=0, atol=ATOL)


def test_batched_decode_equals_single(model: HybridForCausalLM) -> None:
    prompts = [_tokens(n, n) for n in (5, 17, 33)]
    kv, states = fresh_caches(model, num_blocks=30, block_size=4, num_slots=4)
    blocks = shuffled_blocks(30, 4)
    tables = [blocks[i * 10 : (i + 1) * 10] for i in range(3)]
    for r, p in enumerate(prompts):
        prefill(model, p[:-1], [len(p) - 1], tables[r], kv, states, slot=r)
    batch = StepBatch(
        torch.tensor([p[-1] for p in prompts]),
        torch.tensor([len(p) - 1 for p in prompts]),
        [1, 1, 1],
        [len(p) - 1 for p in prompts],
        tables,
        [0, 1, 2],
        [[(1, 0)], [(1, 1)], [(1, 2)]],
    )
    out = model(batch, kv, states)
    for r, p in enumerate(prompts):
        torch.testing.assert_close(out[r], full_hidden(model, p)[-1], rtol=0, atol=ATOL)


def test_state_src_minus_one_ignores_slot_contents(model: HybridForCausalLM) -> None:
    tokens = _tokens(12, 8)
    kv, states = fresh_caches(model, num_blocks=4, block_size=16, num_slots=2)
    states.conv.normal_()
    states.ssm.normal_()
    out = step(model, tokens, 0, [2, 0, 1, 3], kv, states, src=-1, writes=[(12, 0)])
    torch.testing.assert_close(out, full_hidden(model, tokens), rtol=0, atol=ATOL)


def test_fork_with_copy_block_and_copy_slot(model: HybridForCausalLM) -> None:
    """Fork a sequence mid-block: copy the partial block and the state, continue both."""
    shared, tail_a, tail_b = _tokens(21, 30), _tokens(6, 31), _tokens(9, 32)
    kv, states = fresh_caches(model, num_blocks=12, block_size=8, num_slots=4)
    table_a = [7, 2, 9, 4]
    prefill(model, shared, [13, 8], table_a, kv, states, slot=1)
    # Position 21 is inside the third block: give B its own copy of that block.
    kv.copy_block(9, 5)
    table_b = [7, 2, 5, 0]
    states.copy_slot(1, 3)
    out_a = step(model, tail_a, 21, table_a, kv, states, src=1, writes=[(6, 1)])
    out_b = step(model, tail_b, 21, table_b, kv, states, src=3, writes=[(9, 3)])
    torch.testing.assert_close(out_a, full_hidden(model, shared + tail_a)[21:], rtol=0, atol=ATOL)
    torch.testing.assert_close(out_b, full_hidden(model, shared + tail_b)[21:], rtol=0, atol=ATOL)


def test_long_query_tiles(model: HybridForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-request attention path splits long queries into tiles without changing results."""
    import hycache.model.layers as layers

    tokens = _tokens(100, 40)
    ref = full_hidden(model, tokens)
    monkeypatch.setattr(layers, "ATTENTION_QUERY_TILE", 7)
    monkeypatch.setattr(layers, "PADDED_ATTENTION_MAX_QUERY", 0)
    kv, states = fresh_caches(model, num_blocks=16, block_size=16)
    out = prefill(model, tokens, [30, 1, 69], shuffled_blocks(16, 0), kv, states, slot=0)
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "overrides",
    [
        {"attn_layer_indices": ()},
        {"attn_layer_indices": (0, 1, 2, 3)},
        {"time_step_limit": (0.05, 0.3), "mamba_n_groups": 1, "partial_rotary_factor": 1.0},
    ],
    ids=["mamba-only", "attention-only", "dt-limit"],
)
def test_chunked_equals_whole_other_configs(overrides: dict[str, object]) -> None:
    m = BambaForCausalLM.random(small_config(**overrides), seed=3, dtype=F64)
    tokens = _tokens(45, 6)
    kv, states = fresh_caches(m, num_blocks=16, block_size=4)
    out = prefill(m, tokens, [10, 1, 1, 33], shuffled_blocks(16, 3), kv, states, slot=2)
    torch.testing.assert_close(out, full_hidden(m, tokens), rtol=0, atol=ATOL)


def test_state_dtypes() -> None:
    cfg = small_config()
    s32 = StateCache(cfg, 2, torch.float32, "cpu")
    s16 = StateCache(cfg, 2, torch.bfloat16, "cpu")
    s64 = StateCache(cfg, 2, torch.float64, "cpu")
    assert s32.ssm.dtype == torch.float32 and s16.ssm.dtype == torch.float32
    assert s16.conv.dtype == torch.bfloat16
    assert s64.ssm.dtype == torch.float64
    assert s32.ssm.shape == (2, 2, 4, 16, 8)  # (layers, slots, heads, head_dim, d_state)
    assert s32.conv.shape == (2, 2, 64 + 2 * 2 * 8, 3)


def test_bad_batches_rejected(model: HybridForCausalLM) -> None:
    kv, states = fresh_caches(model, num_blocks=2, block_size=4)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="query_lens"):
        model(StepBatch(ids, torch.arange(3), [2], [0], [[0]], [-1], [[(2, 0)]]), kv, states)
    with pytest.raises(ValueError, match="offset"):
        model(StepBatch(ids, torch.arange(3), [3], [0], [[0]], [-1], [[(4, 0)]]), kv, states)
    with pytest.raises(ValueError, match="block_tables"):
        model(StepBatch(ids, torch.arange(3), [3], [6], [[0, 1]], [-1], [[(3, 0)]]), kv, states)
    wrong = PagedKVCache(2, 2, 4, 1, 8, F64, "cpu")
    with pytest.raises(ValueError, match="PagedKVCache"):
        model(StepBatch(ids, torch.arange(3), [3], [0], [[0]], [-1], [[(3, 0)]]), wrong, states)


@pytest.mark.parametrize("arch", ["mamba2", "gdn"])
def test_bf16_forward_close_to_float32(arch: str) -> None:
    cls: type[HybridForCausalLM] = Qwen3NextForCausalLM if arch == "gdn" else BambaForCausalLM
    cfg = small_gdn_config() if arch == "gdn" else small_config()
    m32 = cls.random(cfg, seed=1)
    m16 = cls.random(cfg, seed=1, dtype=torch.bfloat16)
    tokens = _tokens(30, 1)
    l32 = m32.compute_logits(full_hidden(m32, tokens))
    l16 = m16.compute_logits(full_hidden(m16, tokens))
    assert l16.dtype == torch.float32
    assert (l32 - l16).abs().max() < 0.05 * l32.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu() -> None:
    cfg = small_config()
    cpu = BambaForCausalLM.random(cfg, seed=2, dtype=F64)
    gpu = BambaForCausalLM.random(cfg, seed=2, dtype=F64, device="cuda")
    tokens = _tokens(50, 2)
    ref = full_hidden(cpu, tokens)
    kv, states = fresh_caches(gpu, num_blocks=16, block_size=8)
    out = prefill(gpu, tokens, [20, 1, 29], shuffled_blocks(16, 2), kv, states, slot=1)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 1000),
    block_size=st.sampled_from([1, 3, 16]),
    n=st.integers(2, 60),
)
def test_any_chunking_any_block_size(
    model: HybridForCausalLM, seed: int, block_size: int, n: int
) -> None:
    tokens = _tokens(n, seed)
    rng = random.Random(seed)
    chunks = random_chunks(n, rng, 20)
    nblocks = -(-n // block_size)
    kv, states = fresh_caches(model, num_blocks=nblocks + 3, block_size=block_size)
    table = shuffled_blocks(nblocks + 3, seed)[:nblocks]
    out = prefill(model, tokens, chunks, table, kv, states, slot=seed % 8)
    torch.testing.assert_close(out, full_hidden(model, tokens), rtol=0, atol=ATOL)


@pytest.mark.parametrize("start", [0, 11])
def test_internal_checkpoints_equal_the_sequential_recurrence(
    model: HybridForCausalLM, start: int
) -> None:
    """States written inside one forward at offsets that cut the scan mid-chunk (chunk size
    8: offsets 5, 13, 29, 46) equal the token-by-token recurrence (the decode path) over the
    same tokens, conv and SSM alike, also for a chunk that resumes from a state."""
    tokens = _tokens(60, 9)
    kv, states = fresh_caches(model, num_blocks=16, block_size=16, num_slots=12)
    table = shuffled_blocks(16, 4)
    src = -1
    if start:
        prefill(model, tokens[:start], [start], table, kv, states, slot=0)
        src = 0
    offsets = [5, 13, 29, 46]
    assert all(o % model.config.mamba_chunk_size for o in offsets)
    writes = [(o, 1 + i) for i, o in enumerate(offsets)] + [(60 - start, 9)]
    step(model, tokens[start:], start, table, kv, states, src=src, writes=writes)
    want = {start + off: slot for off, slot in writes}
    kv2, ref = fresh_caches(model, num_blocks=16, block_size=16, num_slots=1)
    for pos, tok in enumerate(tokens):  # the recurrence: one token per step
        step(model, [tok], pos, table, kv2, ref, src=0 if pos else -1, writes=[(1, 0)])
        if pos + 1 in want:
            slot = want.pop(pos + 1)
            torch.testing.assert_close(states.ssm[:, slot], ref.ssm[:, 0], rtol=0, atol=ATOL)
            torch.testing.assert_close(states.conv[:, slot], ref.conv[:, 0], rtol=0, atol=ATOL)
    assert not want


def test_internal_checkpoints_change_nothing_else_and_cost_no_extra_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prefill chunk that writes states at internal offsets runs one scan per Mamba layer,
    as the chunk that writes none does, and its outputs are the same, bit for bit: the states
    are read out of the scan, which is not cut at them (a cut ended the scan there, so each
    checkpoint cost a scan call and a padded chunk per layer, and moved y's rounding)."""
    import hycache.model.mamba2 as mamba2

    model = BambaForCausalLM.random(small_config(), seed=7, dtype=F64)
    calls: list[int] = []
    scan = mamba2.ssd_chunked_states

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mamba2, "ssd_chunked_states", counted)
    tokens = _tokens(60, 9)
    outs = []
    for writes in ([(60, 9)], [(5, 1), (13, 2), (29, 3), (46, 4), (60, 9)]):
        kv, states = fresh_caches(model, num_blocks=16, block_size=16, num_slots=12)
        calls.clear()
        outs.append(
            step(model, tokens, 0, shuffled_blocks(16, 4), kv, states, src=-1, writes=writes)
        )
        assert len(calls) == model.config.num_mamba_layers
    assert torch.equal(outs[0], outs[1])
