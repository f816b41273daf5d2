"""The spread of repeated timings and the rule that ranks two arms (`hycache.bench.repeats`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hycache.bench.repeats import arm_order, ratio_spread, spread, verdict

times = st.floats(0.01, 100.0, allow_nan=False)


def test_the_issues_repeats_cannot_rank() -> None:
    """`lookahead` at 37.8, 10.1 and 10.6 tok/s beside a steady arm: no ranking."""
    r = ratio_spread([15.0, 15.2, 14.9], [37.8, 10.1, 10.6])
    assert r is not None
    assert r["min"] < 1 < r["max"] and not r["rankable"]
    assert r["median"] == pytest.approx(14.9 / 10.6)  # the median of the per-repeat ratios
    assert "cannot rank: the repeats cross 1" in verdict(r)
    steady = ratio_spread([12.0, 11.5, 12.4], [10.0, 10.1, 10.6])
    assert steady is not None and steady["rankable"]
    assert "cannot rank" not in verdict(steady)


@given(st.lists(st.tuples(times, times), min_size=1, max_size=9))
def test_rankable_iff_every_repeat_is_on_one_side_of_one(pairs: list[tuple[float, float]]) -> None:
    nums, dens = [n for n, _ in pairs], [d for _, d in pairs]
    r = ratio_spread(nums, dens)
    assert r is not None
    per = [n / d for n, d in pairs]
    assert r["per_repeat"] == per
    same_side = all(x > 1 for x in per) or all(x < 1 for x in per)
    assert r["rankable"] == (len(per) > 1 and same_side)
    assert r["min"] <= r["median"] <= r["max"]


def test_spread_and_zero_denominators() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert ratio_spread([1.0], [0.0]) is None
    one = ratio_spread([2.0], [1.0])
    assert one is not None and not one["rankable"]
    assert "cannot rank: one repeat" in verdict(one)


@given(st.integers(2, 3), st.integers(1, 7), st.integers(1, 9), st.integers(0, 2))
def test_each_arm_takes_each_place_in_turn(
    n_arms: int, repeats: int, slots: int, place: int
) -> None:
    """`arm_order`: every order is the arms; along a repeat's slots, along a slot's repeats
    and over the whole plan, no arm takes a place (first, second, ...) more than once more
    often than another."""
    arms = tuple("abc"[:n_arms])
    place %= n_arms
    plan = [[arm_order(r, s, arms) for s in range(slots)] for r in range(repeats)]
    assert all(sorted(o) == list(arms) for row in plan for o in row)

    def even(orders: list[tuple[str, ...]]) -> bool:
        counts = [sum(o[place] == a for o in orders) for a in arms]
        return max(counts) - min(counts) <= 1

    assert all(even(row) for row in plan)
    assert all(even([row[s] for row in plan]) for s in range(slots))
    assert even([o for row in plan for o in row])


def test_two_arms_alternate_wave_by_wave_and_repeat_by_repeat() -> None:
    plan = [[arm_order(r, s, ("stock", "plugin"))[0] for s in range(4)] for r in range(2)]
    assert plan == [["stock", "plugin", "stock", "plugin"], ["plugin", "stock", "plugin", "stock"]]
