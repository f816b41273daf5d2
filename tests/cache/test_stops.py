"""`hycache.cache.stops`: a stop is made only where what it saves later pays for its pass."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hycache.cache.boundaries import StateKind
from hycache.cache.stops import (
    FREE_PASSES,
    PRIOR_CHANCE,
    FlatPrice,
    observed_chance,
    observed_use,
    resume_pays,
    stop_pays,
    tail_pays,
)


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


def test_resume_seed_shape_idle_and_busy() -> None:
    """B=4416, seed shape: a sibling resuming at 57,536 instead of the floor 57,408 saves 128
    tokens for vLLM's split at 61,824: it pays alone (a pass = 96 tokens), not when the step
    it adds carries another request's prefill (6,600 tokens), and a resume on the block grid
    or one that forces no split always pays."""
    price = FlatPrice(96.0, 1.0)
    assert resume_pays(price, 57_408, 57_536, 61_824, 64_016, busy=0)
    assert not resume_pays(price, 57_408, 57_536, 61_824, 64_016, busy=6_600)
    assert resume_pays(price, 57_408, 57_408, 61_824, 64_016, busy=6_600)
    assert resume_pays(price, 57_408, 57_536, 61_824, 61_000, busy=6_600)


@given(
    floor=st.integers(0, 10_000),
    deeper=st.integers(1, 4_000),
    rest=st.integers(1, 10_000),
    busy=st.integers(0, 10_000),
    pass_cost=st.floats(0, 1_000),
)
def test_resume_flat_price_is_saving_against_pass_and_wait(
    floor: int, deeper: int, rest: int, busy: int, pass_cost: float
) -> None:
    hit, boundary = floor + deeper, floor + 4_096
    if hit >= boundary:
        return
    end = boundary + rest
    pays = resume_pays(FlatPrice(pass_cost, 1.0), floor, hit, boundary, end, busy)
    assert pays == (deeper >= pass_cost + busy)
    if pays:  # less load or a cheaper pass never turns a paying resume down
        assert resume_pays(FlatPrice(pass_cost / 2, 1.0), floor, hit, boundary, end, busy // 2)


def test_observed_chance_scales_the_prior() -> None:
    assert observed_chance(StateKind.JUNCTION, 1) == PRIOR_CHANCE[StateKind.JUNCTION]
    assert observed_chance(StateKind.JUNCTION, 0) == PRIOR_CHANCE[StateKind.JUNCTION]
    assert observed_chance(StateKind.GRID, 6) == 6 * PRIOR_CHANCE[StateKind.GRID]
    # a junction 256 tokens above the floor of a 576-token block, a pass worth 1,500 tokens:
    # one sibling's saving does not pay, six sightings do
    price = FlatPrice(1_500.0, 1.0)
    assert not stop_pays(price, observed_chance(StateKind.JUNCTION, 1), 0, 256, 0, 576)
    assert stop_pays(price, observed_chance(StateKind.JUNCTION, 6), 0, 256, 0, 576)


def test_observed_use_starts_at_one_and_follows_what_was_seen() -> None:
    """One use expected before anything is seen; then uses over tails left: a chat whose
    every turn is continued stays near 1, a stream of one-shot prompts falls toward 0."""
    assert observed_use(0, 0) == 1.0
    assert observed_use(2, 3) == 0.75
    assert observed_use(0, 99) == 0.01
    assert observed_use(128, 192) == pytest.approx(0.67, abs=0.01)


def test_tail_seed_shape_alone_and_busy() -> None:
    """A chat turn whose last chunk starts at the block start 4,416 and reaches its tail
    checkpoint 4,480 (prompt 4,482): the tail saves the next turn 64 tokens, below a pass of
    96 even if every turn is continued; a tail 1,024 tokens above the floor pays alone, and
    not when the step its last tokens then wait for carries 2,000 tokens of other work at
    an even chance. A tail on the block grid, or past the prompt, costs no pass."""
    price = FlatPrice(96.0, 1.0)
    assert not tail_pays(price, 1.0, 4_416, 4_480, 4_482, busy=0)
    assert tail_pays(price, 1.0, 4_416, 5_440, 5_442, busy=0)
    assert not tail_pays(price, 0.5, 4_416, 5_440, 5_442, busy=2_000)
    assert tail_pays(price, 0.5, 4_416, 4_416, 4_482, busy=2_000)
    assert tail_pays(price, 0.0, 4_416, 4_482, 4_482, busy=2_000)


@given(
    gap=st.integers(1, 4_000),
    rest=st.integers(1, 64),
    busy=st.integers(0, 10_000),
    chance=st.floats(0, 2),
    pass_cost=st.floats(0, 1_000),
)
def test_tail_flat_price_is_saving_against_pass_and_wait(
    gap: int, rest: int, busy: int, chance: float, pass_cost: float
) -> None:
    floor = 8_192
    tail, end = floor + gap, floor + gap + rest
    pays = tail_pays(FlatPrice(pass_cost, 1.0), chance, floor, tail, end, busy)
    assert pays == (chance * gap >= pass_cost + busy)
    if pays:  # more use, less load or a cheaper pass never turns a paying tail down
        assert tail_pays(FlatPrice(pass_cost / 2, 1.0), chance * 2, floor, tail, end, busy // 2)
