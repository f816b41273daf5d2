"""Offered load: capacity measured closed loop, arrivals rescaled to a fraction of it."""

from __future__ import annotations

import numpy as np
import pytest

from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.sim.compare import compare_policies
from hycache.sim.costmodel import CostModel
from hycache.sim.load import (
    at_rate,
    capacity,
    closed_loop,
    mean_rate,
    sustainable_arrivals,
)
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.trace import requests_from_records
from hycache.sim.trace_gen import generate_mooncake_like
from hycache.sim.workloads import RequestSpec, Workload, system_prompt_workload


def trace(n: int = 60) -> list[RequestSpec]:
    records = generate_mooncake_like(num_requests=n, seed=2, block_tokens=64, input_median=600)
    return requests_from_records(records, block_tokens=64, seed=2)


def setup() -> tuple[HycacheConfig, CostModel]:
    cost = CostModel(
        load_model_spec("bamba-9b"),
        load_gpu("h200"),
        speculative=True,
        num_speculative_tokens=3,
        block_size=256,
    )
    cfg = HycacheConfig(
        CacheConfig(
            CacheKnobs(block_size=256, prefix_match_unit=16), num_blocks=3000, max_model_len=12_000
        ),
        SpeculativeConfig(num_speculative_tokens=3),
        SchedulerConfig(8192, 8),
    )
    return cfg, cost


def test_at_rate_keeps_the_trace_spacing() -> None:
    reqs = trace()
    before = np.array([r.arrival_s for r in reqs])
    timed, scale = at_rate(reqs, 2.0)
    after = np.array([r.arrival_s for r in timed])
    assert mean_rate(timed) == pytest.approx(2.0)
    assert scale == pytest.approx(mean_rate(reqs) / 2.0)
    assert after[0] == 0.0
    assert np.allclose(after, (before - before[0]) * scale)  # the same bursts, stretched
    pairs = zip(reqs, timed, strict=True)
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) for a, b in pairs)


def test_at_rate_gives_untimed_requests_poisson_arrivals() -> None:
    reqs = system_prompt_workload(400, 8, 8, 1, seed=0)
    assert mean_rate(reqs) is None
    timed, scale = at_rate(reqs, 5.0, seed=1)
    assert scale is None
    assert mean_rate(timed) == pytest.approx(5.0, rel=0.15)
    with pytest.raises(ValueError, match="> 0"):
        at_rate(reqs, 0.0)
    assert all(r.arrival_s is None for r in closed_loop(timed))


def test_sustainable_arrivals_offer_a_fraction_of_capacity() -> None:
    cfg, cost = setup()
    reqs = trace()
    cap = capacity(reqs, cfg, cost)
    assert cap > 0
    timed, offered = sustainable_arrivals(reqs, cfg, cost, load=0.5)
    assert offered.capacity_requests_per_s == pytest.approx(cap)
    assert offered.request_rate_per_s == pytest.approx(0.5 * cap)
    assert mean_rate(timed) == pytest.approx(0.5 * cap)
    assert set(offered.as_dict()) == {
        "capacity_requests_per_s",
        "load",
        "request_rate_per_s",
        "time_scale",
    }
    # at half of capacity the queue stays short: TTFT well below a replay at twice capacity
    calm = compare_policies(Workload("t", timed), cfg, ["lookahead"], cost=cost)
    jammed, _ = at_rate(reqs, 2.0 * cap)
    busy = compare_policies(Workload("t", jammed), cfg, ["lookahead"], cost=cost)
    assert calm["lookahead"].summary["ttft_p95_s"] < busy["lookahead"].summary["ttft_p95_s"]
    with pytest.raises(ValueError, match="load"):
        sustainable_arrivals(reqs, cfg, cost, load=0.0)
