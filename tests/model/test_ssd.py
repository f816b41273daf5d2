"""The chunked SSD scan agrees with the token-by-token recurrence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.model.ssd import (
    segment_sum,
    ssd_chunked,
    ssd_chunked_states,
    ssd_recurrent,
    ssd_step,
)


def _inputs(seed: int, b: int, t: int, h: int, p: int, g: int, n: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    x = torch.randn(b, t, h, p, generator=gen, dtype=f64)
    dt = torch.rand(b, t, h, generator=gen, dtype=f64) * 0.5 + 0.01
    A = -torch.rand(h, generator=gen, dtype=f64) * 4 - 0.1
    B = torch.randn(b, t, g, n, generator=gen, dtype=f64)
    C = torch.randn(b, t, g, n, generator=gen, dtype=f64)
    s0 = torch.randn(b, h, p, n, generator=gen, dtype=f64)
    return x, dt, A, B, C, s0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    t=st.integers(1, 40),
    chunk=st.integers(1, 16),
    groups=st.sampled_from([(4, 1), (4, 2), (6, 3), (4, 4)]),
    with_state=st.booleans(),
)
def test_chunked_equals_recurrence(
    seed: int, t: int, chunk: int, groups: tuple[int, int], with_state: bool
) -> None:
    h, g = groups
    x, dt, A, B, C, s0 = _inputs(seed, 2, t, h, 3, g, 5)
    init = s0 if with_state else None
    y_ref, s_ref = ssd_recurrent(x, dt, A, B, C, init)
    y, s = ssd_chunked(x, dt, A, B, C, chunk, init)
    assert y.shape == (2, t, h, 3) and s.shape == (2, h, 3, 5)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    t=st.integers(2, 40),
    chunk=st.integers(1, 16),
    data=st.data(),
)
def test_states_inside_the_scan_equal_the_recurrence(
    seed: int, t: int, chunk: int, data: st.DataObject
) -> None:
    """The states after any token counts inside the sequence, read out of one scan, equal the
    recurrence's after that many tokens; y and the final state are those of the scan asked
    for nothing, bit for bit (the chunk grid does not depend on what is asked)."""
    offsets = data.draw(st.lists(st.integers(1, t - 1), max_size=6))
    x, dt, A, B, C, s0 = _inputs(seed, 2, t, 4, 3, 2, 5)
    y, final, states = ssd_chunked_states(x, dt, A, B, C, chunk, s0, offsets)
    y_plain, final_plain = ssd_chunked(x, dt, A, B, C, chunk, s0)
    assert torch.equal(y, y_plain) and torch.equal(final, final_plain)
    assert states.shape == (2, len(offsets), 4, 3, 5)
    for k, o in enumerate(offsets):
        _, s_ref = ssd_recurrent(x[:, :o], dt[:, :o], A, B[:, :o], C[:, :o], s0)
        torch.testing.assert_close(states[:, k], s_ref, rtol=0, atol=1e-10)


def test_long_scans_run_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long sequence is scanned a piece of `SCAN_PIECE_CHUNKS` chunks at a time (the
    within-chunk tensors stay small), with the same results as the recurrence."""
    import hycache.model.ssd as ssd

    seen: list[int] = []
    decay = ssd.segment_decay

    def recorded(a: torch.Tensor) -> torch.Tensor:
        seen.append(a.shape[1])  # (batch, chunk, group, head_in_group, l)
        return decay(a)

    monkeypatch.setattr(ssd, "segment_decay", recorded)
    t = 4 * ssd.SCAN_PIECE_CHUNKS * 3 + 5  # chunk 4: three whole pieces and a partial one
    x, dt, A, B, C, s0 = _inputs(3, 1, t, 4, 3, 2, 5)
    offsets = [1, 31, 32, 33, 64, t - 1]
    y, final, states = ssd.ssd_chunked_states(x, dt, A, B, C, 4, s0, offsets)
    assert seen == [ssd.SCAN_PIECE_CHUNKS] * 3 + [2]
    y_ref, s_ref = ssd_recurrent(x, dt, A, B, C, s0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(final, s_ref, rtol=0, atol=1e-10)
    for k, o in enumerate(offsets):
        _, s_o = ssd_recurrent(x[:, :o], dt[:, :o], A, B[:, :o], C[:, :o], s0)
        torch.testing.assert_close(states[:, k], s_o, rtol=0, atol=1e-10)


def test_states_inside_the_scan_refuse_the_ends() -> None:
    x, dt, A, B, C, s0 = _inputs(0, 1, 10, 4, 3, 2, 5)
    for bad in ([0], [10], [3, 11]):
        with pytest.raises(ValueError, match="state_at"):
            ssd_chunked_states(x, dt, A, B, C, 4, s0, bad)


def test_split_scan_carries_state() -> None:
    x, dt, A, B, C, s0 = _inputs(1, 1, 50, 4, 6, 2, 7)
    y_all, s_all = ssd_chunked(x, dt, A, B, C, 16, s0)
    y1, s1 = ssd_chunked(x[:, :23], dt[:, :23], A, B[:, :23], C[:, :23], 16, s0)
    y2, s2 = ssd_chunked(x[:, 23:], dt[:, 23:], A, B[:, 23:], C[:, 23:], 5, s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y_all, rtol=0, atol=1e-10)
    torch.testing.assert_close(s2, s_all, rtol=0, atol=1e-10)


def test_group_sharing_matches_explicit_heads() -> None:
    """Heads in a group share B, C: expanding B, C to one group per head gives the same."""
    x, dt, A, B, C, s0 = _inputs(2, 1, 19, 6, 4, 2, 3)
    y, s = ssd_chunked(x, dt, A, B, C, 7, s0)
    Bh, Ch = B.repeat_interleave(3, dim=2), C.repeat_interleave(3, dim=2)
    y_h, s_h = ssd_chunked(x, dt, A, Bh, Ch, 7, s0)
    torch.testing.assert_close(y, y_h, rtol=0, atol=1e-12)
    torch.testing.assert_close(s, s_h, rtol=0, atol=1e-12)


def test_step_matches_definition() -> None:
    x, dt, A, B, C, s0 = _inputs(3, 2, 1, 2, 3, 1, 4)
    y, s = ssd_step(s0, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])
    for b in range(2):
        for hh in range(2):
            want = torch.exp(dt[b, 0, hh] * A[hh]) * s0[b, hh] + dt[b, 0, hh] * torch.outer(
                x[b, 0, hh], B[b, 0, 0]
            )
            torch.testing.assert_close(s[b, hh], want)
            torch.testing.assert_close(y[b, hh], want @ C[b, 0, 0])


def test_segment_sum() -> None:
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    out = segment_sum(a)
    for l in range(4):  # noqa: E741
        for s in range(4):
            want = a[s + 1 : l + 1].sum().item() if s <= l else float("-inf")
            assert out[l, s].item() == want


def test_float32_scan_close_to_float64() -> None:
    x, dt, A, B, C, s0 = _inputs(4, 1, 300, 4, 8, 2, 16)
    y64, s64 = ssd_chunked(x, dt, A, B, C, 64, s0)
    y32, s32 = ssd_chunked(*(v.float() for v in (x, dt, A, B, C)), 64, s0.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s32.double(), s64, rtol=1e-4, atol=1e-4)
