"""The passes the plugin adds, at its default price (issue 45 item 2), on vLLM 0.33 / 0.34's
real scheduler: on random families whose shared prefix ends anywhere in a block, no sibling
pays more than stock + 1 prefill passes, the request that observes the junction (or the
hinted producer) no more than stock + 2; hits never below stock. (0.32's drop mode:
tests/vllm_engine/test_plugin_032.py.)"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import VllmSetup, run_reference
from hycache.bench.vllm.scenario import Turn
from hycache.config import CacheKnobs
from tests.vllm.shapes import (
    PRICED_GEOMETRIES,
    SYNC,
    budget,
    hits,
    passes_over_stock,
    priced_family,
    within_the_pass_bound,
)

settings.load_profile("vllm-reference")

@st.composite
def priced_families(draw: st.DrawFn) -> tuple[VllmSetup, list[Turn], bool]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    b, u = rng.choice(PRICED_GEOMETRIES)
    k = rng.choice([0, 1, 1, 3])
    knobs = CacheKnobs(b, u, internal_checkpoints=draw(st.booleans()))
    turns, hinted = priced_family(rng, b)
    return VllmSetup(knobs, budget(rng, b), num_speculative_tokens=k), turns, hinted


@given(case=priced_families())
def test_priced_passes_stay_within_stock_plus_one_the_observer_plus_two(
    case: tuple[VllmSetup, list[Turn], bool],
) -> None:
    setup, turns, hinted = case
    stock = run_reference(setup, turns)
    plugin = run_reference(dataclasses.replace(setup, scheduler_cls=SYNC), turns)
    extra = passes_over_stock(stock, plugin)
    assert within_the_pass_bound(extra, hinted), (extra, hits(stock), hits(plugin))
    assert all(s <= p for s, p in zip(hits(stock), hits(plugin), strict=True))

