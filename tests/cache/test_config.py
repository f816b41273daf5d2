"""Validation: one clear ValueError naming the field, for each bad input."""

from __future__ import annotations

import pytest

from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"block_size": 16, "prefix_match_unit": 5}, "prefix_match_unit"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": -16}, "block_size"),
        ({"prefix_match_unit": 0}, "prefix_match_unit"),
        ({"retention": 24}, "retention"),
        ({"retention": "sparse"}, "retention"),
        ({"num_blocks": 10, "max_model_len": 4096}, "num_blocks"),
        ({"policy": "greedy"}, "policy"),
    ],
)
def test_bad_cache_config_names_the_field(kwargs: dict, field: str) -> None:
    knobs = {k: v for k, v in kwargs.items() if k in CacheKnobs.__dataclass_fields__}
    sizes = {k: v for k, v in kwargs.items() if k not in knobs}
    with pytest.raises(ValueError, match=rf"^{field}:"):
        CacheConfig(CacheKnobs(**knobs), **sizes)


def test_unit_defaults_to_block() -> None:
    c = CacheConfig(CacheKnobs(block_size=32, prefix_match_unit=None), num_blocks=1024)
    assert c.unit == 32
    assert SpeculativeConfig(num_speculative_tokens=2).drop(c) == 32
    assert SpeculativeConfig().drop(c) == 0


def test_interval_retention_and_policy_parse() -> None:
    c = CacheConfig(
        CacheKnobs(block_size=16, prefix_match_unit=None, retention="64", policy="replay")
    )
    assert c.retention == 64
    assert c.policy.value == "replay"


def test_budget_below_block_is_accepted_for_ssm_models() -> None:
    # sub-block chunks are scheduled (vLLM does the same); see tests/sched/test_vllm_parity.py
    cfg = HycacheConfig(
        CacheConfig(CacheKnobs(block_size=64, prefix_match_unit=None), num_blocks=1024),
        SpeculativeConfig(),
        SchedulerConfig(max_num_batched_tokens=32),
    )
    assert cfg.scheduler.max_num_batched_tokens == 32


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"acceptance_rate": 1.5}, "acceptance_rate"),
    ],
)
def test_bad_speculative_config(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        SpeculativeConfig(**kwargs)


def test_blocks_must_cover_the_speculative_lookahead() -> None:
    cache = CacheConfig(
        CacheKnobs(block_size=16, prefix_match_unit=None),
        num_blocks=1 + 4 + 1 + 3,
        max_model_len=64,
    )
    HycacheConfig(cache, SpeculativeConfig(), SchedulerConfig(64, 4))  # fits without drafts
    with pytest.raises(ValueError, match=r"^num_blocks:.*speculative"):
        HycacheConfig(cache, SpeculativeConfig(num_speculative_tokens=2), SchedulerConfig(64, 4))
