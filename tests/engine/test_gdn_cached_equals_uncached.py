"""Cached = uncached on a Gated DeltaNet hybrid (the `tiny-gdn` Qwen3-Next preset, float64):
the same sharing script as test_cached_equals_uncached (system prompt + suffix, resend, longer
sibling, multi-turn, an abort) in a pool small enough to preempt, with the model's MTP layer
drafting k = 2 tokens, under every policy, checkpoints written inside the forward (GDN scans cut
mid-chunk); the GDN state rides the SSM group's pages unchanged."""

from __future__ import annotations

import pytest

from hycache.config import POLICY_NAMES
from hycache.model.mtp import MtpHead
from tests.engine.conftest import drive, make_llm, tight_pool

MODEL = "tiny-gdn"


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_cached_equals_uncached_with_drafts(policy: str) -> None:
    """Checkpoints written inside the forward (the Mamba2 model's tests cover the split-only
    path, which does not depend on the recurrent layer)."""
    tight = {**tight_pool(policy, 2, True), "internal_checkpoints": True}
    on = make_llm(MODEL, policy=policy, num_speculative_tokens=2, **tight)
    off = make_llm(
        MODEL, policy=policy, num_speculative_tokens=2, enable_prefix_caching=False, **tight
    )
    assert isinstance(on.runner.drafter, MtpHead)
    got_on, got_off = drive(on, 7), drive(off, 7)
    assert got_on == got_off
    assert set(got_on) == {"a", "b", "resend", "longer", "c", "turn2", "d", "e"}
    assert on.stats.hit_tokens > 0 and off.stats.hit_tokens == 0
    assert on.scheduler.num_preemptions > 0, "the pool should be small enough to preempt"
    on.scheduler.cache.check_integrity()
    assert on.scheduler.cache.pool.num_free == on.config.cache.num_blocks - 1


def test_speculative_equals_plain() -> None:
    plain = drive(make_llm(MODEL, num_speculative_tokens=0), 11)
    assert drive(make_llm(MODEL, num_speculative_tokens=2), 11) == plain
