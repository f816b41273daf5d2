"""`hycache.cache.stops`: a stop is made only where what it saves later pays for its pass."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hycache.cache.stops import FREE_PASSES, FlatPrice, stop_pays


def test_flat_price_seed_shape() -> None:
    """B=4416, a pass priced at 96 tokens: a junction 128 tokens above the block floor pays
    (one sibling expected), the tail 2,176 tokens above the replay boundary does not at the
    tail's prior chance (0.01), and does at an even chance."""
    price = FlatPrice(96.0, 1.0)
    assert stop_pays(price, 1.0, 57_408, 57_536, 57_408, 61_824)
    assert not stop_pays(price, 0.01, 61_824, 64_000, 61_824, 64_016)
    assert stop_pays(price, 0.5, 61_824, 64_000, 61_824, 64_016)


def test_a_position_outside_the_chunk_costs_no_pass() -> None:
    price = FlatPrice(1e9, 1.0)
    assert stop_pays(price, 0.0, 0, 100, 100, 200) and stop_pays(price, 0.0, 0, 200, 100, 200)


def test_negative_prices_are_refused() -> None:
    with pytest.raises(ValueError):
        FlatPrice(-1.0, 1.0)


@given(
    prev=st.integers(0, 10_000),
    gap=st.integers(1, 10_000),
    rest=st.integers(1, 10_000),
    chance=st.floats(0, 4),
    pass_cost=st.floats(0, 1_000),
)
def test_monotone_in_chance_and_price(
    prev: int, gap: int, rest: int, chance: float, pass_cost: float
) -> None:
    stop, end = prev + gap, prev + gap + rest
    assert stop_pays(FREE_PASSES, chance, prev, stop, prev, end)
    pays = stop_pays(FlatPrice(pass_cost, 1.0), chance, prev, stop, prev, end)
    assert pays == (chance * gap >= pass_cost)
    if pays:
        assert stop_pays(FlatPrice(pass_cost / 2, 1.0), chance, prev, stop, prev, end)
        assert stop_pays(FlatPrice(pass_cost, 1.0), chance * 2, prev, stop, prev, end)
