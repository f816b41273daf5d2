"""The gated delta rule: the chunked form equals the token-by-token recurrence in float64
(within 1e-9) for any length, chunk size, head shape and initial state, and cut at any offset
(inside a chunk too) it gives the state after exactly that many tokens."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.model.gated_delta import gdr_chunked, gdr_reference, gdr_update_, l2_normalize

F64 = torch.float64
ATOL = 1e-9


def _inputs(
    seed: int, t: int, h: int, k: int, v: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, h, k, generator=gen, dtype=F64)) * k**-0.5
    key = l2_normalize(torch.randn(t, h, k, generator=gen, dtype=F64))
    val = torch.randn(t, h, v, generator=gen, dtype=F64)
    g = -3.0 * torch.rand(t, h, generator=gen, dtype=F64)  # log decay <= 0
    beta = torch.rand(t, h, generator=gen, dtype=F64)
    state = torch.randn(h, v, k, generator=gen, dtype=F64)
    return q, key, val, g, beta, state


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    t=st.integers(1, 70),
    h=st.integers(1, 3),
    k=st.integers(1, 9),
    v=st.integers(1, 7),
    chunk=st.sampled_from([1, 2, 5, 8, 16, 64]),
)
def test_chunked_equals_recurrence(seed: int, t: int, h: int, k: int, v: int, chunk: int) -> None:
    q, key, val, g, beta, s0 = _inputs(seed, t, h, k, v)
    want_o, want_s = gdr_reference(q, key, val, g, beta, s0)
    got_o, got_s = gdr_chunked(q, key, val, g, beta, s0, chunk)
    assert got_o.shape == (t, h, v) and got_s.shape == (h, v, k)
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=ATOL)
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=ATOL)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(2, 60), data=st.data())
def test_cut_at_any_offset(seed: int, t: int, data: st.DataObject) -> None:
    """Scanning [0, c) then [c, T) from the state at c equals the whole recurrence, and the
    state at c equals c recurrence steps, for cuts inside a chunk of 8."""
    cut = data.draw(st.integers(1, t - 1))
    q, key, val, g, beta, s0 = _inputs(seed, t, 2, 4, 3)
    o1, s_cut = gdr_chunked(q[:cut], key[:cut], val[:cut], g[:cut], beta[:cut], s0, 8)
    o2, s_end = gdr_chunked(q[cut:], key[cut:], val[cut:], g[cut:], beta[cut:], s_cut, 8)
    ref_o, ref_end = gdr_reference(q, key, val, g, beta, s0)
    _, ref_cut = gdr_reference(q[:cut], key[:cut], val[:cut], g[:cut], beta[:cut], s0)
    torch.testing.assert_close(s_cut, ref_cut, rtol=0, atol=ATOL)
    torch.testing.assert_close(torch.cat([o1, o2]), ref_o, rtol=0, atol=ATOL)
    torch.testing.assert_close(s_end, ref_end, rtol=0, atol=ATOL)


def test_update_is_the_delta_rule() -> None:
    """One step by hand: S <- a S + beta (v - a S k) k^T, o = S q."""
    q, key, val, g, beta, s0 = _inputs(3, 1, 2, 4, 3)
    a = torch.exp(g[0])[:, None, None]  # (H, 1, 1)
    decayed = a * s0
    delta = beta[0][:, None] * (val[0] - torch.einsum("hvk,hk->hv", decayed, key[0]))
    want = decayed + delta[:, :, None] * key[0][:, None, :]
    state = s0.clone()[None]
    o = gdr_update_(state, q[:1], key[:1], val[:1], g[:1], beta[:1])[0]
    torch.testing.assert_close(state[0], want, rtol=0, atol=ATOL)
    torch.testing.assert_close(o, torch.einsum("hvk,hk->hv", want, q[0]), rtol=0, atol=ATOL)


def test_zero_decay_and_beta_keep_the_state() -> None:
    """g = 0, beta = 0 (the chunked form's padding) leave the state unchanged."""
    q, key, val, _, _, s0 = _inputs(5, 9, 2, 4, 3)
    zeros = torch.zeros(9, 2, dtype=F64)
    _, s = gdr_chunked(q, key, val, zeros, zeros, s0, 4)
    torch.testing.assert_close(s, s0, rtol=0, atol=0)
