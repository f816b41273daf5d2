"""`LLM(warmup=True)`: one forward at the scheduler's token budget before the first request
(`ModelRunner.warmup`) that no request can see: the same tokens and logits, bit for bit, and
the cache and statistics untouched."""

from __future__ import annotations

import pytest
import torch

from hycache.engine.engine import LLM
from tests.engine.conftest import LogitRecorder, drive, make_llm


@pytest.mark.parametrize("k", [0, 2])
def test_a_warmed_up_engine_answers_exactly_as_a_cold_one(k: int) -> None:
    cold, warm = make_llm(num_speculative_tokens=k), make_llm(num_speculative_tokens=k, warmup=True)
    rec_cold, rec_warm = LogitRecorder(cold), LogitRecorder(warm)
    assert drive(warm, seed=3) == drive(cold, seed=3)
    assert rec_warm.rows.keys() == rec_cold.rows.keys()
    for rid, rows in rec_cold.rows.items():
        assert all(torch.equal(a, b) for a, b in zip(rows, rec_warm.rows[rid], strict=True))


def test_warmup_leaves_the_cache_and_the_statistics_as_they_were() -> None:
    llm = make_llm(num_speculative_tokens=2, warmup=True)
    assert llm.scheduler.cache.pool.num_free == llm.config.cache.num_blocks - 1
    assert not llm.scheduler.has_unfinished()
    assert llm.stats == make_llm(num_speculative_tokens=2).stats


def test_warmup_runs_the_budget_capped_by_the_pool() -> None:
    llm = make_llm(num_speculative_tokens=2)  # 48 blocks of 16: 47 usable
    assert llm.runner.warmup(64) == 64
    assert llm.runner.warmup(10_000) == 47 * 16
    small = LLM("tiny", block_size=16, prefix_match_unit=4, max_model_len=32, num_blocks=8)
    assert small.runner.warmup(1000) == 7 * 16
    assert small.runner.warmup(0) == 0
