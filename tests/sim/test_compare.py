"""Comparison arms: `eagle-off` next to the five policies, ratios to `lookahead`, and the
counts that tell "neutral" from "never exercised" (junctions observed, SSM state pages)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hycache.config import Policy
from hycache.sim.compare import (
    ARM_NAMES,
    ARMS,
    BASELINE,
    DEFAULT_ARMS,
    EAGLE_OFF,
    NO_CACHING,
    SUMMARY_KEYS,
    Workload,
    arm_config,
    arm_cost,
    compare_policies,
    headline,
    parse_arms,
    policies_json,
    ratio,
    reference_arm,
)
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.workloads import multi_turn_workload, system_prompt_workload
from tests.helpers import make_config

CFG = make_config(policy="limit", k=2, num_blocks=400, max_model_len=128, budget=64, max_num_seqs=4)


def tiny_cost() -> CostModel:
    return CostModel(
        load_model_spec("tiny"),
        load_gpu("h100"),
        speculative=True,
        num_speculative_tokens=2,
        block_size=16,
    )


def test_arm_names_and_defaults() -> None:
    assert DEFAULT_ARMS == (
        "eagle-off",
        "replay",
        "junction",
        "lookahead-split",
        "lookahead",
        "limit",
        "limit-split",
    )
    policies = {p.value for p in Policy}
    assert set(ARM_NAMES) == {
        EAGLE_OFF,
        NO_CACHING,
        *policies,
        *(p + "-split" for p in policies),
    }
    assert ARMS[EAGLE_OFF].policy is Policy.REPLAY and not ARMS[EAGLE_OFF].drafter
    assert all(ARMS[p.value].drafter and ARMS[p.value].policy is p for p in Policy)
    for p in Policy:  # `-split`: the same policy, checkpoints by splitting the prefill
        split = ARMS[p.value + "-split"]
        assert split.policy is p and split.drafter and split.internal is False
        assert ARMS[p.value].internal is None  # as the config says (on by default)


def test_split_arm_turns_internal_checkpoints_off() -> None:
    from hycache.sim.compare import arm_config
    from tests.helpers import make_config

    cfg = make_config(policy="lookahead")
    assert cfg.cache.internal_checkpoints
    assert not arm_config(cfg, ARMS["limit-split"]).cache.internal_checkpoints
    assert arm_config(cfg, ARMS["limit-split"]).cache.policy is Policy.LIMIT
    assert arm_config(cfg, ARMS["limit"]).cache.internal_checkpoints


def test_no_caching_arm_turns_prefix_caching_off_and_hits_nothing() -> None:
    from hycache.sim.compare import caching_overhead

    cfg = arm_config(CFG, ARMS[NO_CACHING])
    assert not cfg.cache.enable_prefix_caching and cfg.speculative == CFG.speculative
    assert arm_config(CFG, ARMS["limit"]).cache.enable_prefix_caching
    res = compare_policies(siblings(), CFG, ("limit", NO_CACHING), cost=tiny_cost())
    assert [r.hit_tokens for r in res["limit"].records][2:] == [20, 20]
    assert [r.hit_tokens for r in res[NO_CACHING].records] == [0, 0, 0, 0]
    doc = policies_json(res)
    assert doc[NO_CACHING]["ssm_pages_stored"] == 0  # nothing kept for reuse
    over = caching_overhead(doc)
    assert over is not None and over["name"] == "limit/no-caching"
    assert over["output_tokens_per_s"] == pytest.approx(
        doc["limit"]["output_tokens_per_s"] / doc[NO_CACHING]["output_tokens_per_s"]
    )
    # here caching saves prefill: the siblings share 20 tokens
    assert doc["limit"]["prefill_tokens_computed"] < doc[NO_CACHING]["prefill_tokens_computed"]
    assert caching_overhead({"limit": doc["limit"]}) is None
    assert "output_tokens_per_cpu_s" not in over  # the simulator has no engine thread


def test_caching_overhead_carries_the_engine_cpu_clock_when_timed() -> None:
    from hycache.sim.compare import caching_overhead

    doc = {
        "limit": {
            "output_tokens_per_s": 9.0,
            "ttft_p50_s": 2.0,
            "ttft_p95_s": 4.0,
            "output_tokens_per_cpu_s": 12.0,
            "ttft_cpu_p50_s": 1.5,
            "ttft_cpu_p95_s": 3.0,
        },
        NO_CACHING: {
            "output_tokens_per_s": 10.0,
            "ttft_p50_s": 1.0,
            "ttft_p95_s": 2.0,
            "output_tokens_per_cpu_s": 12.0,
            "ttft_cpu_p50_s": 1.0,
            "ttft_cpu_p95_s": 2.0,
        },
    }
    over = caching_overhead(doc)
    assert over is not None
    assert over["output_tokens_per_s"] == pytest.approx(0.9)
    assert over["output_tokens_per_cpu_s"] == pytest.approx(1.0)
    assert over["ttft_cpu_p50_s"] == pytest.approx(1.5)
    assert over["ttft_cpu_p95_s"] == pytest.approx(1.5)


def test_parse_arms() -> None:
    assert parse_arms("eagle-off, lookahead,limit") == ("eagle-off", "lookahead", "limit")
    assert parse_arms(["limit"]) == ("limit",)
    with pytest.raises(ValueError, match="unknown arm 'bogus'"):
        parse_arms("limit,bogus")
    with pytest.raises(ValueError, match="twice"):
        parse_arms("limit,limit")
    with pytest.raises(ValueError, match="no arm"):
        parse_arms(" , ")


def test_eagle_off_drops_the_drafter_and_its_costs() -> None:
    cfg = arm_config(CFG, ARMS[EAGLE_OFF])
    assert cfg.cache.policy is Policy.REPLAY
    assert cfg.speculative.num_speculative_tokens == 0 and cfg.speculative.eagle_drop is False
    limit = arm_config(CFG, ARMS["limit"])
    assert limit.cache.policy is Policy.LIMIT and limit.speculative == CFG.speculative
    cost = tiny_cost()
    off = arm_cost(cost, ARMS[EAGLE_OFF])
    assert off is not None and not off.speculative and off.num_speculative_tokens == 0
    assert off.resident_weight_bytes < cost.resident_weight_bytes  # no drafter weights
    assert off.num_blocks(16) >= cost.num_blocks(16)  # memory the drafter held
    assert arm_cost(cost, ARMS["lookahead"]) is cost
    assert arm_cost(None, ARMS[EAGLE_OFF]) is None


def siblings(hint: bool = False) -> Workload:
    """Owner + 3 siblings sharing 24 tokens (B=16, u=4): sharing ends mid-block."""
    reqs = system_prompt_workload(4, 24, 16, 6, seed=0, prefix_hint=hint)
    return Workload("sp", reqs, sequential=True)


def test_all_arms_run_side_by_side_in_order() -> None:
    res = compare_policies(siblings(), CFG, DEFAULT_ARMS, cost=None)
    assert list(res) == list(DEFAULT_ARMS)
    hits = {n: [r.hit_tokens for r in res[n].records] for n in res}
    # architecture §4's worked numbers at small scale: the first sibling observes the
    # junction; from the second on, replay resumes at 0, junction at 12, lookahead at the
    # block (16), limit at the limit floor((24-1)/4)*4 = 20; without a drafter, at the block (16)
    assert hits["replay"][2:] == [0, 0]
    assert hits["junction"][2:] == [12, 12]
    assert hits["lookahead"][2:] == [16, 16]
    assert hits["limit"][2:] == [20, 20]
    assert hits[EAGLE_OFF][2:] == [16, 16]
    # no drafts without a drafter: more steps for the same outputs
    assert res[EAGLE_OFF].steps > res["replay"].steps
    doc = policies_json(res)
    for name in DEFAULT_ARMS:
        assert set(doc[name]) == set(SUMMARY_KEYS)
        assert doc[name]["num_blocks"] == 400
        assert doc[name]["requests"] == 4


def test_junctions_observed_and_state_pages() -> None:
    plain = compare_policies(siblings(), CFG, ["lookahead", "limit"], cost=None)
    hinted = compare_policies(siblings(hint=True), CFG, ["lookahead", "limit"], cost=None)
    s, h = plain["limit"].summary, hinted["limit"].summary
    assert s["junctions_observed"] == 1  # the first sibling observes it ...
    assert h["junctions_observed"] == 0  # ... unless the producer was told (a prefix hint)
    assert [r.hit_tokens for r in hinted["limit"].records] == [0, 20, 20, 20]
    assert hinted["lookahead"].summary["junctions_observed"] == 1  # lookahead ignores hints
    look = plain["lookahead"].summary
    # limit keeps more states (junction stops on the unit grid, decode snapshots)
    assert s["ssm_pages_stored"] > look["ssm_pages_stored"] > 0
    assert s["ssm_snapshot_pages"] > 0 and look["ssm_snapshot_pages"] == 0
    for summary in (s, h, look):
        assert summary["ssm_pages_peak"] <= summary["ssm_pages_stored"]
    # extra prefill steps are measured against the baseline
    assert plain["lookahead"].summary["extra_prefill_steps_max"] == 0
    assert 0 <= s["extra_prefill_steps_max"] <= 2


def test_a_workload_without_sharing_observes_no_junction() -> None:
    # neutral vs never exercised: a workload without sharing observes no junction anywhere
    reqs = system_prompt_workload(4, 0, 30, 3, seed=1)
    res = compare_policies(Workload("none", reqs, concurrency=2), CFG, DEFAULT_ARMS, cost=None)
    assert all(r.summary["junctions_observed"] == 0 for r in res.values())
    assert all(r.summary["hit_tokens"] == 0 for r in res.values())


def test_decode_snapshots_let_the_next_turn_resume_past_the_answer() -> None:
    sessions = multi_turn_workload(3, 3, 10, 13, seed=0)
    w = Workload("chat", sessions=sessions, concurrency=3)
    res = compare_policies(w, CFG, ["lookahead", "limit"], cost=None)
    look, lim = res["lookahead"].by_id(), res["limit"].by_id()
    later = [k for k in look if not str(k).endswith("t0")]
    assert all(lim[k].hit_tokens >= look[k].hit_tokens for k in later)
    assert sum(lim[k].hit_tokens for k in later) > sum(look[k].hit_tokens for k in later)
    assert res["limit"].summary["ssm_snapshot_pages"] > 0


def test_size_cache_gives_each_arm_its_own_memory() -> None:
    cost = tiny_cost()
    cfg = replace(CFG, cache=replace(CFG.cache, num_blocks=cost.num_blocks(16)))
    res = compare_policies(siblings(), cfg, [EAGLE_OFF, "limit"], cost=cost, size_cache=True)
    assert res["limit"].summary["num_blocks"] == cost.num_blocks(16)
    assert res[EAGLE_OFF].summary["num_blocks"] == cost.without_drafter().num_blocks(16)
    assert res[EAGLE_OFF].summary["num_blocks"] > res["limit"].summary["num_blocks"]


def test_ratios_are_to_lookahead_and_the_headline_is_limit_over_lookahead() -> None:
    pol = {
        "eagle-off": {"output_tokens_per_s": 50.0},
        "lookahead": {
            "output_tokens_per_s": 100.0,
            "ttft_p50_s": 2.0,
            "ttft_p95_s": 4.0,
            "ssm_pages_stored": 10,
            "ssm_pages_peak": 5,
            "ssm_snapshot_pages": 0,
        },
        "limit": {
            "output_tokens_per_s": 125.0,
            "ttft_p50_s": 1.0,
            "ttft_p95_s": 4.0,
            "ssm_pages_stored": 30,
            "ssm_pages_peak": 8,
            "ssm_snapshot_pages": 12,
        },
    }
    assert reference_arm(list(pol)) == BASELINE
    assert reference_arm(["replay", "junction"]) == "replay"
    assert ratio(pol, "output_tokens_per_s", "eagle-off", "lookahead") == 0.5
    assert ratio(pol, "ttft_p50_s", "eagle-off", "lookahead") is None  # missing value
    h = headline(pol)
    assert h is not None and h["name"] == "limit/lookahead"
    assert h["output_tokens_per_s"] == 1.25 and h["ttft_p50_s"] == 0.5
    assert h["extra_ssm_pages_stored"] == 20 and h["extra_ssm_pages_peak"] == 3
    assert h["extra_ssm_snapshot_pages"] == 12
    assert headline({"replay": pol["lookahead"]}) is None


def test_without_drafter_has_no_draft_passes() -> None:
    cost = tiny_cost()
    off = cost.without_drafter()
    work = StepWork((SeqWork(1, 100, 0, False), SeqWork(40, 0, 0, True)))
    assert [p.name for p in off.phases(work)] == ["target", "step_overhead"]
    assert any(p.name.startswith("draft_") for p in cost.phases(work))
    assert off.step_time(work) < cost.step_time(work)
    assert (off.compute_efficiency, off.step_overhead_s) == (
        cost.compute_efficiency,
        cost.step_overhead_s,
    )
