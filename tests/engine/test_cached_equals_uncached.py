"""Cached = uncached on the real model: same greedy tokens, logits within 1e-9 (float64).

Workloads mix the sharing shapes of docs/architecture.md (system prompt + suffix, identical
resend, longer sibling, multi-turn continuation), run several requests at once in a pool
small enough to preempt, and abort one request mid-flight.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from hycache.cache.ssm import SSMManager
from hycache.config import POLICY_NAMES
from hycache.request import SamplingParams
from tests.engine.conftest import (
    B,
    LogitRecorder,
    U,
    drive,
    make_llm,
    tight_pool,
)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("internal", [False, True])
def test_cached_equals_uncached(policy: str, k: int, internal: bool) -> None:
    """Also with checkpoints written inside the forward (at offsets that are not multiples of
    the model's scan chunk): the states they key equal those a split would have left."""
    tight = {**tight_pool(policy, k, internal), "internal_checkpoints": internal}
    on = make_llm(policy=policy, num_speculative_tokens=k, **tight)
    off = make_llm(policy=policy, num_speculative_tokens=k, enable_prefix_caching=False, **tight)
    written: list[tuple[int, ...]] = []
    plan = on.scheduler.cache.internal_writes

    def recording(req, start, end):  # type: ignore[no-untyped-def]
        out = plan(req, start, end)
        written.extend([out] if out else [])
        return out

    on.scheduler.cache.internal_writes = recording  # type: ignore[method-assign]
    rec_on, rec_off = LogitRecorder(on), LogitRecorder(off)
    got_on, got_off = drive(on, 7), drive(off, 7)
    assert got_on == got_off
    if not internal:
        assert not written
    elif policy != "lookahead":  # lookahead writes only vLLM's export, when a chunk allows it
        assert written
    assert set(got_on) == {"a", "b", "resend", "longer", "c", "turn2", "d", "e"}
    assert on.stats.hit_tokens > 0 and off.stats.hit_tokens == 0
    assert on.scheduler.num_preemptions > 0, "the pool should be small enough to preempt"
    if k == 0:  # one logits row per output token: compare them all
        for rid in got_on:
            a, b = torch.stack(rec_on.rows[rid]), torch.stack(rec_off.rows[rid])
            assert torch.allclose(a, b, rtol=0, atol=1e-9), rid
    on.scheduler.cache.check_integrity()
    assert on.scheduler.cache.pool.num_free == on.config.cache.num_blocks - 1


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_equals_plain(k: int) -> None:
    plain = drive(make_llm(num_speculative_tokens=0), 11)
    spec = drive(make_llm(num_speculative_tokens=k), 11)
    assert spec == plain


def test_resumed_ssm_state_equals_state_from_scratch() -> None:
    llm = make_llm(num_blocks=80, max_num_batched_tokens=160)
    rng = random.Random(3)
    prompt = [rng.randrange(512) for _ in range(45)]
    llm.generate([prompt], SamplingParams(max_tokens=1))
    cache = llm.scheduler.cache
    ssm: SSMManager = cache.ssm[0]
    from hycache.request import Request

    probe = Request.new("p", prompt, SamplingParams(), unit=U, lookahead=cache.bounds.lookahead)
    n, block = ssm.find_hit(probe.hashes, 44)
    assert n > 0 and block is not None
    fresh = make_llm(num_blocks=80, enable_prefix_caching=False)
    states = fresh.runner.states
    from hycache.model.paged import StepBatch

    batch = StepBatch(
        input_ids=torch.tensor(prompt[:n]),
        positions=torch.arange(n),
        query_lens=[n],
        context_lens=[0],
        block_tables=[list(range(1, 1 + -(-n // B)))],
        state_src=[-1],
        state_writes=[[(n, 0)]],
    )
    fresh.model.forward(batch, fresh.runner.kv, states)
    got_conv, got_ssm = llm.runner.states.read(block)
    want_conv, want_ssm = states.read(0)
    assert torch.allclose(got_ssm, want_ssm, rtol=0, atol=1e-9)
    assert torch.allclose(got_conv, want_conv, rtol=0, atol=1e-9)


def test_a_checkpoint_keyed_one_unit_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The equality check must fail when the SSM state after n tokens is keyed at n - u (at
    a chunk end, or written inside the forward)."""
    original: Callable = SSMManager.commit

    def off_by_one(self: SSMManager, request_id: str, hashes, num_computed: int) -> None:  # type: ignore[no-untyped-def]
        st = self._states[request_id]
        if st.pending_checkpoint and st.pending_end > U:
            st.pending_end -= U
        st.pending_writes = tuple((p - U if p > U else p, b) for p, b in st.pending_writes)
        original(self, request_id, hashes, num_computed)

    monkeypatch.setattr(SSMManager, "commit", off_by_one)
    on, off = make_llm(), make_llm(enable_prefix_caching=False)
    rec_on, rec_off = LogitRecorder(on), LogitRecorder(off)
    drive(on, 7)
    drive(off, 7)
    worst = max(
        float((torch.stack(rec_on.rows[r]) - torch.stack(rec_off.rows[r])).abs().max())
        for r in rec_on.rows
        if r in rec_off.rows and len(rec_on.rows[r]) == len(rec_off.rows[r])
    )
    assert worst > 1e-6
