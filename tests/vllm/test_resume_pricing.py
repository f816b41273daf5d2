"""The plugin's priced resume and its observed junction chance, on vLLM 0.33 / 0.34's real
scheduler (`hycache.cache.stops.resume_pays`, `observed_chance`; issue 45):

- a sibling's mid-block hit makes vLLM split its prefill at the next block boundary; it is
  taken when the tokens it saves pay for that pass and the step it adds (the batch's load),
  else the sibling resumes at the block floor, as stock, in one pass;
- a junction stop that one sibling's saving does not pay for is made once enough requests
  have observed the same junction without a state there."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from hycache.bench.vllm.reference import QWEN3_NEXT, ReferenceScheduler, VllmSetup, run_reference
from hycache.bench.vllm.scenario import Turn
from hycache.cache.stops import FlatPrice
from hycache.config import CacheKnobs
from hycache.vllm import compat
from hycache.vllm.scheduler import JUNCTIONS_REMEMBERED
from tests.helpers import tokens
from tests.vllm.shapes import SYNC, family, with_cls

pytestmark = pytest.mark.skipif(
    not compat.has_lookahead_keys(), reason="0.32's lookup takes no cap (drop mode)"
)

SEED = VllmSetup(CacheKnobs(4416, 64), 8192, num_speculative_tokens=1, scheduler_cls=SYNC)


def _ran(ref: ReferenceScheduler, turns: list[Any], busy: int) -> list[Any]:
    """The turns one after another, the scheduler told the batch carries `busy` tokens a
    step for the last one (the estimate is the scheduler's own, tested below)."""
    traces = [ref.run(f"r{i}", t) for i, t in enumerate(turns[:-1])]
    ref.scheduler.hycache_busy = lambda request: busy
    return [*traces, ref.run(f"r{len(turns) - 1}", turns[-1])]


@pytest.mark.parametrize(("busy", "hit", "chunks"), [(0, 57_536, 2), (6_600, 57_408, 1)])
def test_seed_shape_sibling_resumes_deeper_alone_at_the_floor_when_busy(
    busy: int, hit: int, chunks: int
) -> None:
    """B=4416, seed shape: alone (the acceptance shape) the second sibling resumes at 57,536
    for vLLM's split at 61,824 (128 tokens saved, a pass = 96); when each step carries
    another request's prefill (6,600 tokens), the extra step costs more than the 128 tokens:
    it resumes at 57,408 in one pass, exactly stock's chunk."""
    traces = _ran(ReferenceScheduler(SEED), family(1, 57_600, 6_416, 3), busy)
    assert [t.hit for t in traces] == [0, 0, hit]
    assert len(traces[-1].chunk_ends) == chunks
    assert traces[-1].chunk_ends[-1] == 64_016


def test_the_load_estimate_is_none_alone() -> None:
    """A request deciding its resume with nobody else in the batch waits for nobody, whatever
    the earlier steps carried (its predecessors' prefill)."""
    ref = ReferenceScheduler(SEED)
    ref.run_all(family(1, 57_600, 6_416, 2))
    s = ref.scheduler
    assert s.hycache_load > 0
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    req = Request("x", [1, 2, 3], SamplingParams(max_tokens=1), None, block_hasher=ref.hasher)
    assert s.hycache_busy(req) == 0
    s.add_request(req)
    assert s.hycache_busy(req) == 0  # itself is no one's load
    other = Request("y", [4, 5, 6], SamplingParams(max_tokens=1), None, block_hasher=ref.hasher)
    s.add_request(other)
    assert s.hycache_busy(req) == round(s.hycache_load)


def test_many_sightings_make_a_junction_stop_pay() -> None:
    """B=1024, u=64, 10,100 shared + 3,000 (a sibling at the junction exports its tail inside
    its one forward: its resume costs no pass), a pass priced at 2,000 tokens: the junction
    10,048 lies 832 tokens above the block floor, so its stop does not pay at one sighting
    (the prior: 832 < 2,000) or two; the third request to observe it makes it (3 x 832), and
    the siblings after it resume there. At 96 the first observer makes it."""
    turns = family(1, 10_100, 3_000, 6)
    setup = VllmSetup(CacheKnobs(1024, 64), 8192, num_speculative_tokens=1, scheduler_cls=SYNC)
    dear = ReferenceScheduler(setup)
    dear.scheduler.hycache_pricer = FlatPrice(2_000.0, 1.0)
    traces = dear.run_all(turns)
    assert [t.hit for t in traces] == [0, 0, 9_216, 9_216, 10_048, 10_048]
    assert 10_048 not in traces[1].chunk_ends + traces[2].chunk_ends
    assert 10_048 in traces[3].chunk_ends
    assert list(dear.scheduler.hycache_sightings.values()) == [3]
    cheap = ReferenceScheduler(setup).run_all(turns)
    assert [t.hit for t in cheap] == [0, 0, *[10_048] * 4]


def test_sightings_are_bounded_and_counted_once_per_request() -> None:
    ref = ReferenceScheduler(SEED)
    s = ref.scheduler
    s.hycache_sightings.update({i: 1 for i in range(JUNCTIONS_REMEMBERED)})
    ref.run_all(family(1, 57_600, 6_416, 2))
    assert len(s.hycache_sightings) == JUNCTIONS_REMEMBERED
    assert 0 not in s.hycache_sightings  # the oldest went
    assert list(s.hycache_sightings.values())[-1] == 1  # the observer, once


def test_a_capped_request_waits_rather_than_start_a_cut_chunk() -> None:
    """Capped at 57,408 (6,608 tokens to go): a budget that cuts the chunk makes it wait a
    step; a whole chunk, an uncapped request, or a chunk that could never fit beside the
    batch's decodes does not."""
    s = ReferenceScheduler(SEED).scheduler
    req = SimpleNamespace(num_prompt_tokens=64_016, num_tokens=64_016, hycache_capped=57_408)
    assert s._defers_capped(req, 57_408, 4_416)
    assert not s._defers_capped(req, 57_408, 6_608)
    assert not s._defers_capped(
        SimpleNamespace(**{**vars(req), "hycache_capped": None}), 57_408, 4_416
    )
    s.running.extend([object()] * 1_000)  # 2,000 decode tokens a step: 6,608 never fits
    assert not s._defers_capped(req, 57_408, 4_416)
    s.running.clear()


def test_a_chat_turn_on_qwen3_next_resumes_at_stocks_point_or_the_block_start_below() -> None:
    """Qwen3-Next's shape (GDN, B = 576, u = 64, a pass priced as 3,600 prefill tokens: its
    weight read on a B200): two sessions share a 3,000-token system prompt; the second one's
    first turn stops at the junction's floor 2,880 (vLLM's own stop). The first session's
    next turn finds its previous prompt's tail checkpoint 3,712 (stock's in-forward export),
    256 tokens above its block floor 3,456, where nothing is kept. The resume is not capped:
    the capped lookup would land on 2,880, below stock's resume point (issue 45's multi-turn
    regression, -215 hit tokens a later turn). vLLM's tail stops after a chunk that starts on
    the block grid (3,328 for the second session's first turn, 4,288 for the next turn) save
    at most 448 tokens for a pass of 3,600: priced out (`stops.tail_pays`). The second
    session's next turn then resumes at that tail's block floor 2,880 in one pass, where stock
    resumes at 3,328 in two; the junction it observes at 3,328 is the priced-out tail, not a
    sibling's: no stop there. Three passes fewer than stock's nine."""
    rng = random.Random(3)
    system = tokens(rng, 3_000)
    first = Turn(system + tokens(rng, 725), tokens(rng, 320), ())
    other = Turn(system + tokens(rng, 335), tokens(rng, 8), ())
    nxt = Turn(first.prompt + first.answer + tokens(rng, 273), tokens(rng, 8), ())
    after = Turn(other.prompt + other.answer + tokens(rng, 100), tokens(rng, 8), ())
    turns = [first, other, nxt, after]
    setup = VllmSetup(
        CacheKnobs(576, 64), 8192, num_speculative_tokens=1, model=QWEN3_NEXT,
        pass_price=(3_600.0, 1.0),
    )  # fmt: skip
    stock = run_reference(setup, turns)
    plugin = run_reference(with_cls(setup, SYNC), turns)
    assert [t.hit for t in stock] == [0, 0, 3_712, 3_328]
    assert [t.hit for t in plugin] == [0, 0, 3_712, 2_880]
    assert stock[1].chunk_ends == [2_880, 3_328, 3_335]
    assert plugin[1].chunk_ends == [2_880, 3_335]
    assert stock[2].chunk_ends == [4_032, 4_288, 4_318]
    assert plugin[2].chunk_ends == [4_032, 4_318]
    assert stock[3].chunk_ends == [3_392, 3_443]
    assert plugin[3].chunk_ends == [3_443]


def test_a_prefix_cache_reset_forgets_what_the_plugin_remembered() -> None:
    """After `reset_prefix_cache` the plugin decides as a fresh scheduler would: the same
    family, priced as in `test_many_sightings_make_a_junction_stop_pay`, resumes at the same
    points the second time (sightings, load and stop states forgotten with the cache; kept,
    the first observer of the second run would already make the junction stop)."""
    turns = family(1, 10_100, 3_000, 6)
    setup = VllmSetup(CacheKnobs(1024, 64), 8192, num_speculative_tokens=1, scheduler_cls=SYNC)
    ref = ReferenceScheduler(setup)
    ref.scheduler.hycache_pricer = FlatPrice(2_000.0, 1.0)
    first = [t.hit for t in ref.run_all(turns)]
    assert ref.scheduler.reset_prefix_cache()
    assert ref.scheduler.hycache_sightings == {} and ref.scheduler.hycache_load == 0.0
    again = [t.hit for t in ref.run_all(turns)]
    assert again == first == [0, 0, 9_216, 9_216, 10_048, 10_048]
