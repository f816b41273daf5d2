"""Step packing (`Scheduler(step_cost=...)`, `chunking.packing_cap`): the chunk that would
finish a prefill, in a step with decoding requests, is cut (once per admission) at the prefill
tokens the step cost oracle says hide under the step's memory time; without an oracle nothing
changes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.config import POLICY_NAMES, HycacheConfig
from hycache.sched.chunking import PACK_RATIO, StepSeq, packing_cap
from hycache.sched.scheduler import Scheduler
from tests.helpers import RecordingExecutor, make_config, newcomer_prefill, sharing_requests
from tests.sched.conftest import check_step


class FixedOracle:
    """Says `free` tokens hide in any step; records what it was asked."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.calls: list[tuple[list[StepSeq], int, int]] = []

    def free_prefill_tokens(self, step: Sequence[StepSeq], context_len: int, limit: int) -> int:
        self.calls.append((list(step), context_len, limit))
        return min(self.free, limit)


def config(policy: str = "limit", internal: bool = True) -> HycacheConfig:
    return make_config(
        block_size=16, unit=4, policy=policy, budget=256, max_num_seqs=8, max_model_len=1024,
        internal_checkpoints=internal,
    )  # fmt: skip


def newcomer_chunks(
    oracle: FixedOracle | None, prompt_len: int = 300, policy: str = "limit", packing: bool = True
) -> tuple[list[tuple[int, int, bool]], Scheduler]:
    """r0 decodes; then r1 (`prompt_len` tokens) arrives: r1's chunks (start, end, split)."""
    cfg = config(policy)
    if not packing:
        off = dataclasses.replace(cfg.scheduler, step_packing=False)
        cfg = dataclasses.replace(cfg, scheduler=off)
    sched = Scheduler(cfg, step_cost=oracle)
    ex = RecordingExecutor(num_speculative_tokens=3, acceptance_rate=0.5)
    chunks = [(s.start, s.end, s.split) for s in newcomer_prefill(sched, ex, prompt_len)]
    return chunks, sched


def test_the_final_chunk_beside_decodes_ends_at_the_free_tokens_once() -> None:
    chunks, _ = newcomer_chunks(FixedOracle(64), prompt_len=200)
    assert chunks == [(0, 64, False), (64, 200, False)]  # a cut is no checkpoint split
    # a longer prompt: the budget's chunks as before, then its last one is cut
    plain, _ = newcomer_chunks(None, prompt_len=600)
    assert plain == [(0, 240, False), (240, 480, False), (480, 600, False)]
    chunks, _ = newcomer_chunks(FixedOracle(64), prompt_len=600)
    assert chunks == [(0, 240, False), (240, 480, False), (480, 544, False), (544, 600, False)]


def test_without_an_oracle_or_with_no_cut_worth_it_the_chunks_are_unchanged() -> None:
    plain, _ = newcomer_chunks(None)
    assert plain == [(0, 240, False), (240, 300, False)]  # the budget the decode left
    assert newcomer_chunks(FixedOracle(0))[0] == plain  # nothing hides
    assert newcomer_chunks(FixedOracle(10**6))[0] == plain  # everything hides
    # the chunk is more than PACK_RATIO times the free tokens: not cut
    assert newcomer_chunks(FixedOracle(11), prompt_len=200)[0] == [(0, 200, False)]
    assert newcomer_chunks(FixedOracle(11), prompt_len=9)[0] == [(0, 9, False)]  # fits


def test_step_packing_off_never_asks_the_oracle_and_cuts_nothing() -> None:
    oracle = FixedOracle(64)
    chunks, _ = newcomer_chunks(oracle, prompt_len=600, packing=False)
    assert chunks == newcomer_chunks(None, prompt_len=600)[0]
    assert oracle.calls == []


def test_the_oracle_sees_the_step_and_is_asked_once_per_admission_beside_decodes() -> None:
    oracle = FixedOracle(64)
    newcomer_chunks(oracle, prompt_len=200)
    assert len(oracle.calls) == 1  # r0 admitted alone (no decodes); r1's rest: never
    step, context, limit = oracle.calls[0]
    assert step == [StepSeq(8, 4, 3, False)]  # r0 at its first decode: 1 + 3 drafts
    assert context == 0
    assert limit == 200  # the chunk it would run


def test_packing_cap_bounds() -> None:
    decode = [StepSeq(100, 4, 3, False)]
    prefill = [StepSeq(0, 64, 0, True)]
    assert packing_cap(None, decode, 0, 100) == 100
    assert packing_cap(FixedOracle(40), prefill, 0, 100) == 100  # no decoding request
    assert packing_cap(FixedOracle(40), decode, 0, 100) == 40
    assert packing_cap(FixedOracle(40), decode, 0, PACK_RATIO * 40) == 40
    assert packing_cap(FixedOracle(40), decode, 0, PACK_RATIO * 40 + 1) == PACK_RATIO * 40 + 1
    assert packing_cap(FixedOracle(40), decode, 0, 30) == 30
    # the cut lands on the unit grid: (10 + 40) floored to 16 is 48, 38 tokens from 10
    assert packing_cap(FixedOracle(40), decode, 10, 100, unit=16) == 38
    assert packing_cap(FixedOracle(5), decode, 10, 20, unit=16) == 20  # no grid point: no cut


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    free=st.sampled_from([1, 5, 16, 37]),
    policy=st.sampled_from(POLICY_NAMES),
    internal=st.booleans(),
)
def test_packing_keeps_the_cache_sound_and_every_stop_checkpointed(
    seed: int, free: int, policy: str, internal: bool
) -> None:
    """Random requests sharing prefixes, arriving while others decode, under a packing oracle:
    integrity after every step; a cut is never counted as a checkpoint split (with internal
    checkpoints only `lookahead` splits at one); every junction stop is written (stop <->
    checkpoint); some cuts happen."""
    cfg = config(policy, internal)
    oracle = FixedOracle(free)
    sched = Scheduler(cfg, step_cost=oracle)
    ex = RecordingExecutor(num_speculative_tokens=3, acceptance_rate=0.6, seed=seed)
    rng = random.Random(seed)
    pending = sharing_requests(cfg, rng)
    reqs = list(pending)
    for _ in range(5000):
        if pending and rng.random() < 0.3:
            sched.add_request(pending.pop())
        if not sched.has_unfinished():
            if not pending:
                break
            continue
        out = sched.schedule()
        for s in out.scheduled:
            assert not (internal and s.split and policy != "lookahead")
        sched.update(out, ex.execute(out))
        check_step(sched, out)
    assert all(r.status.finished for r in reqs)
    assert sched.cache.num_live_requests == 0
    for r in reqs:
        for stop in r.junction_stops:
            assert stop in ex.written[r.request_id]
    assert oracle.calls  # packing was asked
