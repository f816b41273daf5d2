"""DESIGN §4's worked numbers, pinned through the boundaries module."""

from __future__ import annotations

import pytest

from hycache.cache.boundaries import Boundaries
from hycache.config import Policy

B, U, T, SHARED = 4416, 64, 64_016, 57_600


def bounds(policy: Policy = Policy.JUNCTION, drop: int = U, unit: int = U) -> Boundaries:
    return Boundaries(B, unit, drop, policy)


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
    # the stop, and the block boundary right after it (the mid-block chunk stops there anyway)
    assert b.junction_stops(junction, 0, T) == (57_344, 57_408)
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
    b = Boundaries(512, 32, 32, Policy.JUNCTION)
    assert b.junction_stops(2_208, 0, 2_000) == (2_048,)
    assert not b.should_checkpoint(2_048, 2_000, (2_048,))
    assert b.junction_stops(992, 0, 2_000) == (992, 1_024)


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
