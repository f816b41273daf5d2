"""The worked numbers of docs/architecture.md §4, pinned through the boundaries module."""

from __future__ import annotations

import pytest

from hycache.cache.boundaries import Boundaries
from hycache.config import Policy

B, U, T, SHARED = 4416, 64, 64_016, 57_600


def bounds(policy: Policy = Policy.JUNCTION, drop: int = U, unit: int = U) -> Boundaries:
    return Boundaries(B, unit, drop > 0, policy)


def test_replay_boundary_is_one_block_below_the_last_full_block() -> None:
    assert bounds().replay_boundary(T) == 57_408
    assert bounds().replay_boundary(100) == 0  # never negative


def test_tail_checkpoint_per_policy() -> None:
    assert bounds(Policy.JUNCTION).tail_checkpoint(T) == 63_936
    assert bounds(Policy.REPLAY).tail_checkpoint(T) == 63_936
    assert bounds(Policy.TAIL).tail_checkpoint(T) == 64_000  # unshifted: before the fix


def test_sibling_junction_stop_is_one_unit_under_the_last_shared_block() -> None:
    b = bounds()
    attention_match = SHARED // B * B  # 57,408: the last shared block boundary
    junction = attention_match - b.drop
    assert junction == 57_344
    assert b.is_block_grid_resume_point(junction)
    # vLLM's block-floored stop, the junction, and the block boundary right after it (the
    # mid-block chunk stops there anyway)
    assert b.junction_stops(junction, 0, T) == (52_992, 57_344, 57_408)
    assert b.should_checkpoint(57_344, T, (57_344, 57_408))


def test_replay_block_floors_the_junction() -> None:
    b = bounds(Policy.REPLAY)
    assert b.junction_stops(57_344, 0, T) == (52_992,)
    assert b.should_checkpoint(52_992, T, (52_992,))
    assert not b.should_checkpoint(57_344, T, (52_992,))
    assert not b.is_block_grid_resume_point(52_992)


def test_the_limit() -> None:
    assert bounds().limit(SHARED) == 57_536


def test_junction_past_the_prompt_is_block_floored_and_never_kept() -> None:
    b = Boundaries(512, 32, True, Policy.JUNCTION)
    assert b.junction_stops(2_208, 0, 2_000) == (2_048,)
    assert not b.should_checkpoint(2_048, 2_000, (2_048,))
    assert b.junction_stops(992, 0, 2_000) == (512, 992, 1_024)


def test_no_junction_stop_at_a_prompt_end_that_keeps_no_state() -> None:
    """The block boundary after a mid-block junction is a stop only where a prompt state is
    kept: with lookahead keys a prompt ending on it (T = 48, j = 44) keeps none there, so no
    stop is recorded there; without them it is kept. Every junction stop is a checkpoint."""
    look = Boundaries(16, 4, True, Policy.LIMIT)
    assert look.lookahead and look.last_prompt_state(48) == 47
    assert look.junction_stops(44, 0, 48) == (32, 44)
    assert look.junction_stops(44, 0, 49) == (32, 44, 48)
    plain = Boundaries(16, 4, False, Policy.LIMIT)  # no drafter: no lookahead keys
    assert plain.junction_stops(44, 0, 48) == (32, 44, 48)
    for b in (look, plain):
        for t in range(40, 70):
            for j in range(1, b.lookup_limit(t) + 1):  # every junction a lookup observes
                stops = b.junction_stops(j, 0, t)
                assert all(b.should_checkpoint(s, t, stops) for s in stops), (t, j)


@pytest.mark.parametrize("drop,unit", [(0, U), (B, B)])
def test_junction_is_replay_without_a_unit_or_a_drafter(drop: int, unit: int) -> None:
    b = bounds(Policy.JUNCTION, drop=drop, unit=unit)
    r = bounds(Policy.REPLAY, drop=drop, unit=unit)
    assert b.effective_policy is Policy.REPLAY
    for n in range(0, T, 61):
        assert b.should_checkpoint(n, T) == r.should_checkpoint(n, T)
        assert b.junction_stops(n, 0, T) == r.junction_stops(n, 0, T)


def test_prefill_stops_include_next_block_boundary_after_a_mid_block_start() -> None:
    b = bounds()
    assert b.prefill_stops(57_344, T) == [57_408, 63_936]
    assert b.prefill_stops(0, T, (57_344,)) == [57_344, 57_408, 63_936]


def test_lookahead_formulas_reproduce_vllm_033() -> None:
    b = bounds(Policy.LOOKAHEAD)
    assert b.lookahead and b.drop == 0
    assert b.replay_boundaries(T) == (61_824,)
    assert b.tail_checkpoint(T) == 64_000
    assert b.lookup_limit(T) == 64_000
    assert b.junction_stops(57_408, 0, T) == (57_408,)  # block-floored
    assert b.hint_stops([SHARED], 0, T) == ()  # hints belong to `limit`
    assert not b.should_checkpoint(T, T)  # the key of T would need token T


def test_limit_stops_at_the_limit_and_is_lookahead_when_the_unit_is_the_block() -> None:
    b = bounds(Policy.LIMIT)
    assert b.keys_every_unit and b.limit(SHARED) == 57_536 and b.limit(50_000) == 49_984
    assert b.junction_stops(57_536, 0, T) == (57_408, 57_536, 61_824)
    assert b.hint_stops([SHARED, 10**9, 1], 0, T) == (57_408, 57_536, 61_824)
    assert b.decode_snapshot(64_063, 64_066) == 64_064  # verified 64,063..64,066
    assert b.decode_snapshot(64_065, 64_066) == 0
    assert b.decode_snapshot(64_064, 64_064) == 64_064  # a prompt ending on the unit grid
    whole = bounds(Policy.LIMIT, unit=B)
    assert whole.effective_policy is Policy.LOOKAHEAD and not whole.keys_every_unit
    assert whole.decode_snapshot(0, 10 * B) == 0


def test_block_aligned_prompt_keeps_two_replay_positions_under_the_drop() -> None:
    t = 3 * B
    assert set(bounds(Policy.REPLAY).replay_boundaries(t)) == {B, 2 * B}
    assert bounds(Policy.REPLAY).replay_boundaries(t + 1) == (2 * B,)
    assert bounds(Policy.REPLAY, drop=0).replay_boundaries(t) == (2 * B,)


def test_attention_keys_lead_to_the_tail_checkpoint() -> None:
    # without a drafter the state sits at floor((T-1)/u)*u: a key must lead there (B16 u4, T 8)
    nd = Boundaries(16, 4, False, Policy.REPLAY)
    assert nd.tail_checkpoint(8) == 4 and 4 in nd.attention_keys(8)
    # under the drop, the unshifted tail key leads to the tail checkpoint one unit lower
    d = bounds(Policy.REPLAY)
    assert d.attention_keys(T) == (64_000,) and d.tail_checkpoint(T) == 64_000 - U
