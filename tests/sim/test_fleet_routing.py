"""The simulated fleet's routers: what each predicts against what a request gets.

`attention-only` (today's KV-aware routers: attention blocks counted whatever the SSM states)
never predicts below the actual hit and overstates where states are sparse; `prefix-aware`
(the joint hit) predicts exactly; routing is deterministic; one instance is one engine
whatever the router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.cli.main import main
from hycache.config import HycacheConfig, Policy
from hycache.sim.cluster import ROUTINGS
from hycache.sim.simulator import RequestRecord, SimResult, Simulator
from hycache.sim.workloads import RequestSpec, family_workload
from tests.helpers import make_config, tiny_family_simulate

B, U = 16, 4


def config(policy: Policy, num_blocks: int = 400, drafts: int = 2) -> HycacheConfig:
    return make_config(
        block_size=B, unit=U, policy=policy, k=drafts, num_blocks=num_blocks, max_model_len=160,
        budget=64, max_num_seqs=4,
    )  # fmt: skip


def families(seed: int, n: int = 6) -> list[RequestSpec]:
    """Families whose shared prefixes end anywhere in a block (off the unit grid too)."""
    return family_workload(n, (2, 5), (20, 90), (3, 20), (2, 6), seed=seed)


def run(
    policy: Policy,
    reqs: list[RequestSpec],
    routing: str,
    instances: int = 3,
    *,
    sequential: bool = True,
    num_blocks: int = 400,
) -> SimResult:
    sim = Simulator(config(policy, num_blocks), instances=instances, routing=routing)
    return sim.run(reqs, sequential=sequential, concurrency=None if sequential else 6)


def predicted(r: RequestRecord) -> int:
    assert r.predicted_hit_tokens is not None
    return r.predicted_hit_tokens


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(list(Policy)))
def test_prefix_aware_predicts_the_actual_hit(seed: int, policy: Policy) -> None:
    # one request at a time: nothing changes the cache between routing and admission
    res = run(policy, families(seed), "prefix-aware")
    assert all(predicted(r) == r.hit_tokens for r in res.records)
    assert res.summary["predicted_hit_tokens"] == res.summary["hit_tokens"]
    assert res.summary["overstated_requests"] == res.summary["overstated_hit_tokens"] == 0


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(list(Policy)))
def test_attention_only_never_predicts_below_the_actual_hit(seed: int, policy: Policy) -> None:
    res = run(policy, families(seed), "attention-only")
    assert all(predicted(r) >= r.hit_tokens for r in res.records)


@pytest.mark.parametrize("policy", [Policy.REPLAY, Policy.TAIL, Policy.LOOKAHEAD, Policy.LIMIT])
def test_attention_only_overstates_where_states_are_sparse(policy: Policy) -> None:
    """EAGLE on, siblings meeting mid-block: the attention blocks a sibling matches reach
    past the deepest SSM state below them (the drop, and states only where the policy keeps
    them), so today's router counts tokens the request recomputes."""
    reqs = families(3, n=8)
    res = run(policy, reqs, "attention-only")
    over = [r for r in res.records if predicted(r) > r.hit_tokens]
    assert over, "no request overstated"
    assert res.summary["overstated_requests"] == len(over)
    excess = sum(predicted(r) - r.hit_tokens for r in over)
    assert res.summary["overstated_hit_tokens"] == excess > 0
    assert res.summary["predicted_hit_tokens"] > res.summary["hit_tokens"]
    exact = run(policy, reqs, "prefix-aware")
    assert exact.summary["predicted_hit_tokens"] == exact.summary["hit_tokens"]


def test_predictions_are_per_request_lines_and_round_robin_predicts_nothing() -> None:
    reqs = families(5)
    rr = run(Policy.LIMIT, reqs, "round-robin")
    assert all(r.predicted_hit_tokens is None for r in rr.records)
    assert "predicted_hit_tokens" not in rr.summary
    assert all("predicted_hit_tokens" not in r.line() for r in rr.records)
    att = run(Policy.LIMIT, reqs, "attention-only")
    assert all(r.line()["predicted_hit_tokens"] == predicted(r) for r in att.records)
    per_instance = sum(i.get("predicted_hit_tokens", 0) for i in att.instances)
    assert per_instance == att.summary["predicted_hit_tokens"]


def fingerprint(res: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.id, r.instance, r.hit_tokens, r.predicted_hit_tokens, r.first_token_s, r.finish_s)
        for r in res.records
    ]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_routing_is_deterministic(routing: str) -> None:
    reqs = families(11)
    a = run(Policy.LIMIT, reqs, routing, instances=4, sequential=False, num_blocks=120)
    b = run(Policy.LIMIT, reqs, routing, instances=4, sequential=False, num_blocks=120)
    assert fingerprint(a) == fingerprint(b)
    assert len({r.instance for r in a.records}) > 1


@pytest.mark.parametrize("sequential", [True, False])
def test_one_instance_is_one_engine_whatever_the_router(sequential: bool) -> None:
    reqs = families(17)
    runs = [run(Policy.LIMIT, reqs, r, 1, sequential=sequential) for r in ROUTINGS]
    plain = Simulator(config(Policy.LIMIT)).run(
        reqs, sequential=sequential, concurrency=None if sequential else 6
    )

    def outcome(res: SimResult) -> list[tuple[object, ...]]:
        return [(r.id, r.hit_tokens, r.first_token_s, r.finish_s) for r in res.records]

    for res in runs:
        assert outcome(res) == outcome(plain)
        assert res.summary["token_hit_rate"] == plain.summary["token_hit_rate"]


def test_cli_simulate_attention_only(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    args = [
        *tiny_family_simulate(3), "--policy", "replay", "--instances", "2",
        "--routing", "attention-only", "--sequential", "--quiet", "--json", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["inputs"]["routing"] == "attention-only"
    arm = doc["policies"]["replay"]
    assert arm["predicted_hit_tokens"] >= arm["hit_tokens"]
    lines = doc["requests"]["replay"]
    assert sum(r["predicted_hit_tokens"] for r in lines) == arm["predicted_hit_tokens"]
