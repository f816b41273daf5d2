"""Stock's own tail stop, priced by the plugin on vLLM 0.33 / 0.34's real scheduler
(`hycache.cache.stops.tail_pays`, `observed_use`; issue 45):

- where vLLM ends a chunk that starts at the block floor of the prompt's tail checkpoint at
  that tail (the chunk starts in the prompt's last block column, so it cannot export the
  tail in the forward), the stop is one pass, one more step before the first token; it is
  made where what the next turn saves from it, at the tails' observed use, pays for that;
- without it the next turn resumes at that block start, on the grid, and the junction it
  observes at the tail is the priced-out tail, not a sibling's: no stop there either."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup, run_reference
from hycache.bench.vllm.scenario import Turn
from hycache.config import CacheKnobs
from hycache.vllm import compat
from tests.helpers import tokens
from tests.vllm.shapes import PRICED_GEOMETRIES, SYNC, budget, with_cls

pytestmark = pytest.mark.skipif(
    not compat.has_lookahead_keys(), reason="0.32 makes no tail stop from a block start"
)

settings.load_profile("vllm-reference")

# B = 1024, u = 64, MTP k = 1, a pass priced at 96 prefill tokens (the plugin's default)
SETUP = VllmSetup(CacheKnobs(1024, 64), 8192, num_speculative_tokens=1)


def chat(rng: random.Random, *messages: int) -> list[Turn]:
    """One conversation: a first prompt of `messages[0]` tokens, then each next turn the
    previous prompt, its 16-token answer and a message of the next length."""
    turns = [Turn(tokens(rng, messages[0]), tokens(rng, 16), ())]
    for n in messages[1:]:
        last = turns[-1]
        turns.append(Turn(last.prompt + last.answer + tokens(rng, n), tokens(rng, 16), ()))
    return turns


def test_a_tail_that_does_not_pay_is_not_made_and_the_next_turn_resumes_on_the_grid() -> None:
    """Prompts of 1,000, 1,116 and 1,192 tokens. Turn 1 resumes at turn 0's tail 960 and
    vLLM re-aligns at 1,024, then stops at its tail 1,088: 64 tokens for a pass of 96, not
    made (turn 1: two passes, stock three). Turn 2 resumes at 1,024, the block start, and the
    junction it observes at 1,088 is that tail (priced as a tail: no stop); its own tail
    1,152 saves 128 tokens, every tail so far used: made. Stock's passes 2 / 3 / 2, the
    plugin's 2 / 2 / 2; a price of 0 makes every stop, as stock."""
    turns = chat(random.Random(7), 1_000, 100, 60)
    assert [len(t.prompt) for t in turns] == [1_000, 1_116, 1_192]
    stock = run_reference(SETUP, turns)
    plugin = run_reference(with_cls(SETUP, SYNC), turns)
    assert [t.hit for t in stock] == [0, 960, 1_088]
    assert [t.chunk_ends for t in stock] == [[960, 1_000], [1_024, 1_088, 1_116], [1_152, 1_192]]
    assert [t.hit for t in plugin] == [0, 960, 1_024]
    assert [t.chunk_ends for t in plugin] == [[960, 1_000], [1_024, 1_116], [1_152, 1_192]]
    free = run_reference(replace(SETUP, scheduler_cls=SYNC, pass_price=(0.0, 1.0)), turns)
    assert [(t.hit, t.chunk_ends) for t in free] == [(t.hit, t.chunk_ends) for t in stock]


def test_a_prompt_on_the_unit_grid_its_next_turn_makes_no_stop_past_the_tail() -> None:
    """Turn 1's prompt, 1,152 tokens, ends on the unit grid: its tail 1,088 (64 tokens over
    its block start) is priced out, and its unit keys end at 1,152, one unit past the tail
    (the last key's lookahead is the first answer token). Turn 2 observes its junction
    there: the priced-out tail's, not a sibling's, so no stop (made, it cost turn 2 a third
    pass: stock takes two)."""
    turns = chat(random.Random(7), 1_000, 136, 60)
    assert [len(t.prompt) for t in turns] == [1_000, 1_152, 1_228]
    stock = run_reference(SETUP, turns)
    plugin = run_reference(with_cls(SETUP, SYNC), turns)
    assert [(t.hit, t.chunk_ends) for t in stock] == [
        (0, [960, 1_000]), (960, [1_024, 1_088, 1_152]), (1_088, [1_216, 1_228])
    ]  # fmt: skip
    assert [(t.hit, t.chunk_ends) for t in plugin] == [
        (0, [960, 1_000]), (960, [1_024, 1_152]), (1_024, [1_216, 1_228])
    ]  # fmt: skip


def test_the_tails_observed_use_prices_one_shot_prompts_tails_out() -> None:
    """One-shot prompts of 1,026 + n tokens, a budget of one block: vLLM cuts each at 1,024,
    then ends the last chunk at the tail 1,024 + n. Nothing ever resumes from a tail, so the
    chance falls as tails are left (1, 1/2, 1/3, ...), and a tail is made while chance * n
    pays for a pass of 96 tokens."""
    rng = random.Random(11)
    extra = [128, 256, 256, 384, 384, 512]
    turns = [Turn(tokens(rng, 1_026 + n), tokens(rng, 4), ()) for n in extra]
    setup = replace(SETUP, budget=1_024)
    stock = run_reference(setup, turns)
    assert [t.chunk_ends for t in stock] == [[1_024, 1_024 + n, 1_026 + n] for n in extra]
    ref = ReferenceScheduler(with_cls(setup, SYNC))
    got = ref.run_all(turns)
    made = [1_024 + n in t.chunk_ends for n, t in zip(extra, got, strict=True)]
    assert made == [n / (i + 1) >= 96 for i, n in enumerate(extra)]
    assert made == [True, True, False, True, False, False]
    assert ref.scheduler.hycache_tails == [len(turns), 0]


def test_a_prefix_cache_reset_forgets_the_tails() -> None:
    """After `reset_prefix_cache` the tails' use and the priced-out tails are forgotten with
    the cache: the same chat runs the same way again."""
    turns = chat(random.Random(7), 1_000, 100, 60)
    ref = ReferenceScheduler(with_cls(SETUP, SYNC))
    first = [(t.hit, t.chunk_ends) for t in ref.run_all(turns)]
    assert ref.scheduler.hycache_dropped_tails
    assert ref.scheduler.reset_prefix_cache()
    assert ref.scheduler.hycache_tails == [0, 0] and ref.scheduler.hycache_dropped_tails == {}
    assert [(t.hit, t.chunk_ends) for t in ref.run_all(turns)] == first


@st.composite
def conversations(draw: st.DrawFn) -> tuple[VllmSetup, list[Turn]]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    b, u = rng.choice(PRICED_GEOMETRIES)
    knobs = CacheKnobs(b, u, internal_checkpoints=draw(st.booleans()))
    setup = VllmSetup(knobs, budget(rng, b), num_speculative_tokens=rng.choice([1, 1, 3]))
    first = Turn(tokens(rng, rng.randint(1, 3 * b)), tokens(rng, rng.randint(1, 64)), ())
    turns = [first]
    for _ in range(rng.randint(1, 5)):
        last = turns[-1]
        grown = last.prompt + last.answer + tokens(rng, rng.randint(1, 2 * b))
        turns.append(Turn(grown, tokens(rng, rng.randint(1, 64)), ()))
    return setup, turns


@given(case=conversations())
def test_no_turn_of_a_conversation_takes_a_pass_more_than_on_stock(
    case: tuple[VllmSetup, list[Turn]],
) -> None:
    """Random conversations (any priced geometry, budget, drafter, exporting or not): every
    turn resumes at stock's point or at the block start below it (where the previous turn's
    tail stop was priced out), and takes at most stock's passes, but for one budget pass
    where its prefill from that block start is longer than the budget."""
    setup, turns = case
    b = setup.knobs.block_size
    stock = run_reference(setup, turns)
    plugin = run_reference(with_cls(setup, SYNC), turns)
    for turn, s, p in zip(turns, stock, plugin, strict=True):
        cut = p.hit < s.hit and len(turn.prompt) - p.hit > setup.budget
        assert len(p.chunk_ends) <= len(s.chunk_ends) + cut, (s.chunk_ends, p.chunk_ends)
        assert p.hit in (s.hit, s.hit // b * b), (s.hit, p.hit)
