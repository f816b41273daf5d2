"""The second cache tier in the simulator: the real mirror over a host store of stand-in
values, load time charged against recompute, several instances sharing one store, routing."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hycache.cli.main import main
from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.sim.costmodel import CostModel
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.simulator import SimResult, Simulator
from hycache.sim.tier import STORE_LINKS, SimBlockIO, SimHostStore, StoreLink, TierConfig
from hycache.sim.workloads import RequestSpec, family_workload
from hycache.store.codec import encode
from hycache.store.host import HostStore
from tests.helpers import tiny_family_simulate

B, U = 16, 4


def config(num_blocks: int) -> HycacheConfig:
    return HycacheConfig(
        CacheConfig(
            CacheKnobs(block_size=B, prefix_match_unit=U), num_blocks=num_blocks, max_model_len=128
        ),
        SpeculativeConfig(num_speculative_tokens=2),
        SchedulerConfig(64, 4),
    )


COST = CostModel(
    load_model_spec("tiny"),
    load_gpu("h100"),
    speculative=True,
    num_speculative_tokens=2,
    block_size=B,
)
ROW = COST.attention_bytes_per_token  # drafter layer included
PAGE = COST.model.ssm_state_bytes
NO_LATENCY = StoreLink("test", read_bandwidth=1e9, write_bandwidth=1e9, latency_s=0.0)
FREE = StoreLink("free", read_bandwidth=1e30, write_bandwidth=1e30, latency_s=0.0)

PREFIX = 60  # limit resumes siblings at floor((60-1)/4)*4 = 56


def evicting_stream() -> list[RequestSpec]:
    """An owner, fillers that push its prefix out of a small pool, then three siblings."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(10, 30000, PREFIX)

    def req(i: int, prompt: np.ndarray, hint: bool) -> RequestSpec:
        hints = (PREFIX,) if hint else ()
        return RequestSpec(i, prompt, max_tokens=4, arrival_s=None, prefix_hints=hints)

    def tail(first: int) -> np.ndarray:
        return np.concatenate([[first], rng.integers(10, 30000, 9)])

    out = [req(0, np.concatenate([prefix, tail(1)]), True)]
    out += [req(1 + k, rng.integers(10, 30000, 100), False) for k in range(4)]
    out += [req(5 + k, np.concatenate([prefix, tail(2 + k)]), True) for k in range(3)]
    return out


def run(
    reqs: list[RequestSpec],
    num_blocks: int,
    tier: TierConfig | None = None,
    **kw: object,
) -> SimResult:
    sim = Simulator(config(num_blocks), cost=COST, tier=tier, **kw)  # type: ignore[arg-type]
    return sim.run(reqs, sequential=True)


def test_host_store_counts_values_at_their_modelled_size() -> None:
    io = SimBlockIO(config(64).cache.groups, attention_row_bytes=10, ssm_page_bytes=1000)
    attn, ssm = io.read(0, 1, rows=3), io.read(1, 1, rows=0)
    assert len(attn) == len(ssm) == io.payload_bytes(0, 3) == io.payload_bytes(1, 0)
    store = SimHostStore(capacity_bytes=2100)
    store.put([("a", encode("a", attn)), ("s", encode("s", ssm))])
    assert store.used_bytes == len(encode("a", attn)) + 30 + len(encode("s", ssm)) + 1000
    store.put([("t", encode("t", ssm))])  # a second page does not fit: the oldest goes
    assert store.evictions == 1 and store.exists(["a", "s", "t"]) == [False, True, True]
    io.write(1, 5, ssm)
    assert (io.loaded_bytes, io.loaded_objects) == (1000, 1)
    plain = HostStore(100)  # default: a value is its length
    plain.put([("x", b"12345")])
    assert plain.used_bytes == 5


def test_store_links_and_load_time() -> None:
    host, rdma = STORE_LINKS["host"], STORE_LINKS["rdma"]
    assert host.latency_s < rdma.latency_s and host.source and rdma.source
    assert host.load_time(25 * 10**9, 0) == pytest.approx(1.0)
    assert host.load_time(0, 3) == pytest.approx(3 * host.latency_s)
    with pytest.raises(ValueError, match="kv-store-gb"):
        TierConfig(0)
    assert TierConfig(1.5).capacity_bytes == int(1.5 * 2**30)


def test_a_huge_pool_makes_the_store_a_no_op() -> None:
    reqs = family_workload(3, 4, (30, 90), (3, 12), (2, 5), seed=3, prefix_hint=True)
    off = Simulator(config(600), cost=COST).run(reqs, concurrency=3)
    on = Simulator(config(600), cost=COST, tier=TierConfig(1, NO_LATENCY)).run(reqs, concurrency=3)
    assert on.summary["store_hit_tokens"] == 0 and on.summary["store_loaded_bytes"] == 0
    assert on.summary["store_put_bytes"] > 0  # everything was mirrored all the same
    keys = ("hit_tokens", "prefill_tokens_computed", "first_token_s", "finish_s")
    for a, b in zip(off.records, on.records, strict=True):
        assert [getattr(a, k) for k in keys] == [getattr(b, k) for k in keys]
        assert a.store_hit_tokens is None and b.store_hit_tokens == 0
    assert off.makespan_s == on.makespan_s and off.steps == on.steps
    assert "store_hit_tokens" not in off.summary
    # with latency, misses cost their round trips and nothing else changes
    slow = Simulator(config(600), cost=COST, tier=TierConfig(1)).run(reqs, concurrency=3)
    assert [r.hit_tokens for r in slow.records] == [r.hit_tokens for r in off.records]


def test_store_hits_after_eviction_and_ttft_drops() -> None:
    reqs = evicting_stream()
    off = run(reqs, 24)
    on = run(reqs, 24, TierConfig(1))
    limit = (PREFIX - 1) // U * U
    first_sibling_off, first_sibling_on = off.records[5], on.records[5]
    assert first_sibling_off.hit_tokens == 0  # the pool lost the owner's prefix
    assert first_sibling_on.hit_tokens == first_sibling_on.store_hit_tokens == limit
    assert on.summary["hit_tokens"] > off.summary["hit_tokens"]
    assert on.summary["prefill_tokens_computed"] < off.summary["prefill_tokens_computed"]

    def ttft(r: object) -> float:
        return r.first_token_s - r.arrival_s  # type: ignore[attr-defined]

    assert ttft(first_sibling_on) < ttft(first_sibling_off)


def test_load_time_charged_is_bytes_over_bandwidth() -> None:
    reqs = evicting_stream()
    limit = (PREFIX - 1) // U * U
    timed = run(reqs, 24, TierConfig(1, NO_LATENCY))
    free = run(reqs, 24, TierConfig(1, FREE))
    s = timed.summary
    # one store hit: rows [0, 56) (three full blocks and 8 mid-block rows) and one SSM page
    assert s["store_hit_tokens"] == limit
    assert s["store_loaded_bytes"] == limit * ROW + PAGE
    assert s["store_load_s"] == pytest.approx(s["store_loaded_bytes"] / NO_LATENCY.read_bandwidth)
    # sequential: the same steps, the clock longer by exactly the load time
    assert timed.steps == free.steps
    assert timed.makespan_s - free.makespan_s == pytest.approx(s["store_load_s"])
    # latency: one per round trip (batched exists, batched get)
    lat = StoreLink("lat", read_bandwidth=1e30, write_bandwidth=1e30, latency_s=1e-3)
    slow = run(reqs, 24, TierConfig(1, lat)).summary
    assert slow["store_round_trips"] >= 2
    assert slow["store_load_s"] == pytest.approx(slow["store_round_trips"] * 1e-3)
    assert s["store_put_bytes"] > 0 and 0 < s["store_write_busy"] < 1


def families(reqs: list[RequestSpec]) -> dict[int, list[int]]:
    """Request indices per family (a family's prompts start with its own token)."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(reqs):
        out[int(r.prompt_token_ids[0])].append(i)
    return out


def test_four_instances_share_a_store_and_siblings_resume_at_the_limit() -> None:
    reqs = family_workload(4, 5, (30, 100), (3, 12), (2, 5), seed=7, prefix_hint=True)
    res = run(reqs, 400, TierConfig(1), instances=4, routing="round-robin")
    recs = res.records
    assert [r.instance for r in recs] == [i % 4 for i in range(len(recs))]
    store_hits = 0
    for members in families(reqs).values():
        p = reqs[members[0]].prefix_hints[0]
        limit = (p - 1) // U * U
        owner = recs[members[0]]
        assert owner.hit_tokens == 0
        seen = {owner.instance}
        for i in members[1:]:
            r = recs[i]
            assert r.hit_tokens == limit, (i, r.instance, r.hit_tokens, limit)
            if r.instance not in seen:  # this instance never saw the family: from the store
                assert r.store_hit_tokens == limit
                store_hits += 1
            seen.add(r.instance)
    assert store_hits >= 4
    assert len(res.instances) == 4
    assert sum(i["requests"] for i in res.instances) == len(recs)
    assert sum(i["store_hit_tokens"] for i in res.instances) == res.summary["store_hit_tokens"]
    # without the store every instance computes each family's prefix once itself
    alone = run(reqs, 400, None, instances=4, routing="round-robin")
    assert alone.summary["hit_tokens"] < res.summary["hit_tokens"]


def test_prefix_aware_routing_keeps_a_family_on_one_instance() -> None:
    reqs = family_workload(4, 5, (30, 100), (3, 12), (2, 5), seed=7, prefix_hint=True)
    sim = Simulator(config(400), cost=COST, instances=4, routing="prefix-aware")
    res = sim.run(reqs, concurrency=8)  # siblings in flight together: nothing cached yet
    used = set()
    for members in families(reqs).values():
        where = {res.records[i].instance for i in members}
        assert len(where) == 1
        used |= where
    assert len(used) > 1  # families spread over the instances (ties go to the least loaded)
    rr = Simulator(config(400), cost=COST, instances=4).run(reqs, concurrency=8)
    assert res.summary["hit_tokens"] > rr.summary["hit_tokens"]


def test_bad_instances_and_routing() -> None:
    with pytest.raises(ValueError, match="instances"):
        Simulator(config(64), instances=0)
    with pytest.raises(ValueError, match="routing"):
        Simulator(config(64), routing="random")


def test_cli_simulate_with_a_store_and_instances(tmp_path: Path) -> None:
    args = [*tiny_family_simulate(2), "--quiet"]
    plain, tiered = tmp_path / "plain.json", tmp_path / "tiered.json"
    assert main([*args, "--json", str(plain)]) == 0
    extra = ["--kv-store-gb", "1", "--kv-store-link", "rdma", "--instances", "2"]
    assert main([*args, *extra, "--json", str(tiered)]) == 0
    a, b = json.loads(plain.read_text()), json.loads(tiered.read_text())
    assert "instances" not in a and "kv_store_gb" not in a["inputs"]
    assert "store_hit_tokens" not in a["policies"]["limit"]
    assert "store_hit_tokens" not in a["requests"]["limit"][0]
    assert b["inputs"]["instances"] == 2 and b["inputs"]["kv_store_link"] == "rdma"
    assert "store_hit_tokens" in b["policies"]["limit"]
    assert len(b["instances"]["limit"]) == 2
    assert {r["instance"] for r in b["requests"]["limit"]} == {0, 1}
    for bad in ("-1", "inf", "nan"):
        assert main([*args, "--kv-store-gb", bad]) == 2


def test_cli_rejects_an_auto_rate_for_several_instances() -> None:
    rc = main(["simulate", "--workload", "family", "--instances", "2", "--request-rate", "auto"])
    assert rc == 2


def test_tier_config_is_per_arm_fresh() -> None:
    # each run builds its own store: running twice gives the same result
    reqs = evicting_stream()
    a, b = run(reqs, 24, TierConfig(1)), run(reqs, 24, TierConfig(1))
    assert [r.hit_tokens for r in a.records] == [r.hit_tokens for r in b.records]
    assert replace(a, records=[]).summary == replace(b, records=[]).summary


def test_without_hints_four_instances_sharing_a_store_resume_where_one_does() -> None:
    """No prefix hints: the junction is observed from the store's unit indexes, to the unit,
    so every request resumes where it would on one instance, and members 3+ at the limit."""
    reqs = family_workload(4, 5, (30, 100), (3, 12), (2, 5), seed=7, prefix_hint=False)
    hinted = family_workload(4, 5, (30, 100), (3, 12), (2, 5), seed=7, prefix_hint=True)
    one = run(reqs, 400, TierConfig(1), instances=1)
    four = run(reqs, 400, TierConfig(1), instances=4, routing="round-robin")
    assert [r.hit_tokens for r in four.records] == [r.hit_tokens for r in one.records]
    for members in families(reqs).values():
        limit = (hinted[members[0]].prefix_hints[0] - 1) // U * U
        assert all(four.records[i].hit_tokens == limit for i in members[2:])
    assert four.summary["store_hit_tokens"] > 0
