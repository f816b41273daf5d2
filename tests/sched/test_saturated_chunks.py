"""`SchedulerConfig.saturated_chunk_tokens`: while requests wait for a sequence slot behind
decoding requests, prefill chunks are capped, so more steps carry the decodes (each hides
their memory-bound pass under its prefill compute; docs/admission.md)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.config import HycacheConfig
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, newcomer_prefill, sharing_requests


def config(cap: int, max_num_seqs: int, policy: str = "limit") -> HycacheConfig:
    cfg = make_config(
        block_size=16, unit=4, policy=policy, budget=256, max_num_seqs=max_num_seqs,
        max_model_len=1024,
    )  # fmt: skip
    return replace(cfg, scheduler=replace(cfg.scheduler, saturated_chunk_tokens=cap))


def prefill_chunks(cap: int, max_num_seqs: int, queued: bool) -> list[int]:
    """r0 decodes; then r1 (300-token prompt) arrives, with r2 behind it when `queued`: the
    lengths of r1's prefill chunks."""
    cfg = config(cap, max_num_seqs)
    ex = DryRunExecutor(num_speculative_tokens=3, acceptance_rate=0.5)
    return [s.num_tokens for s in newcomer_prefill(Scheduler(cfg), ex, 300, queued)]


def test_a_prefill_behind_which_requests_wait_for_a_slot_is_chunked_at_the_cap() -> None:
    capped = prefill_chunks(cap=32, max_num_seqs=2, queued=True)
    assert max(capped) <= 32 and sum(capped) == 300
    # nobody waiting, or slots to spare: the whole budget
    assert max(prefill_chunks(cap=32, max_num_seqs=2, queued=False)) > 32
    assert max(prefill_chunks(cap=32, max_num_seqs=8, queued=True)) > 32
    # no cap
    assert max(prefill_chunks(cap=0, max_num_seqs=2, queued=True)) > 32


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    cap=st.sampled_from([0, 8, 24, 64]),
    max_num_seqs=st.integers(1, 4),
    policy=st.sampled_from(["limit", "lookahead", "junction"]),
)
def test_no_chunk_exceeds_the_cap_while_requests_wait_behind_decodes(
    seed: int, cap: int, max_num_seqs: int, policy: str
) -> None:
    cfg = config(cap, max_num_seqs, policy)
    sched = Scheduler(cfg)
    ex = DryRunExecutor(num_speculative_tokens=3, acceptance_rate=0.6, seed=seed)
    rng = random.Random(seed)
    pending = sharing_requests(cfg, rng)
    done = 0
    for _ in range(5000):
        if pending and rng.random() < 0.3:
            sched.add_request(pending.pop())
        if not sched.has_unfinished():
            if not pending:
                break
            continue
        free = max_num_seqs - len(sched.running)
        decoding = any(r.num_tokens - r.num_computed_tokens == 1 for r in sched.running)
        saturated = free <= 1 and len(sched.waiting) > free and decoding
        out = sched.schedule()
        for s in out.scheduled:
            if s.request.num_tokens - s.start > 1 and cap:
                # capped exactly while saturated (a chunk may end short of the cap anyway)
                assert s.num_tokens <= cap or not saturated
        done += len(sched.update(out, ex.execute(out)))
        sched.cache.check_integrity()
    assert done == 8
