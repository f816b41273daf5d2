"""Run comparison arms side by side on the identical request stream.

This owns the comparison:

* the arms: a checkpoint policy with the EAGLE drafter on (`tail`, `replay`, `junction`,
  `lookahead`, `limit`), the same with checkpoints made by splitting the prefill instead of
  writing them inside the forward (`limit-split`, ...: `--no-internal-checkpoints`), or
  `eagle-off` (`replay` with no drafter at all: no speculative decoding, no EAGLE drop, a cost
  model without drafter passes, weights or KV), or `no-caching` (prefix caching off, the
  drafter on: the control that prices caching when nothing is shared);
* one `Simulator` run per arm (same workload, same seed, same GPU and model), in
  `compare_policies`, the one function that runs arms side by side;
* the summary per arm, the ratios to the baseline `lookahead` (vLLM 0.33's default EAGLE
  setup; the headline is `limit / lookahead`), and the extra prefill steps an arm spends
  relative to the baseline on the requests that observed a junction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hycache.config import POLICY_NAMES, CacheConfig, Eviction, HycacheConfig, Policy
from hycache.sim.costmodel import CostModel
from hycache.sim.simulator import RequestRecord, SimResult, Simulator
from hycache.sim.tier import TierConfig
from hycache.sim.workloads import Workload

EAGLE_OFF = "eagle-off"
NO_CACHING = "no-caching"  # prefix caching off (`--no-prefix-caching`), the drafter on
BASELINE = "lookahead"  # vLLM 0.33's default EAGLE setup: the arm to beat
HEADLINE = "limit"  # hycache's own policy; the headline ratio is HEADLINE / BASELINE
SPLIT = "-split"  # suffix: the policy without internal checkpoints (it splits at each)
HEADLINE_SPLIT = HEADLINE + SPLIT
BASELINE_SPLIT = BASELINE + SPLIT  # vLLM 0.33 with a Mamba layer that cannot export
DEFAULT_ARMS: tuple[str, ...] = (
    EAGLE_OFF,
    "replay",
    "junction",
    BASELINE_SPLIT,
    BASELINE,
    HEADLINE,
    HEADLINE_SPLIT,
)

SUMMARY_KEYS = (
    "output_tokens_per_s",
    "request_throughput",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "prefill_tokens_computed",
    "hit_tokens",
    "token_hit_rate",
    "lost_reuse_tokens",
    "junctions_observed",
    "extra_prefill_steps_max",
    "ssm_pages_stored",
    "ssm_snapshot_pages",
    "ssm_pages_peak",
    "peak_blocks_used",
    "num_blocks",
    "preemptions",
    "requests",
    "makespan_s",
)
# with separate pools (`CostModel.pool_layout` "separate"): reported only then
POOL_KEYS = ("num_state_pages",)
# with a second tier (and several instances): reported only when the run had them
STORE_KEYS = (
    "store_hit_tokens",
    "store_token_hit_rate",
    "store_loaded_bytes",
    "store_load_s",
    "store_round_trips",
    "store_put_bytes",
    "store_write_busy",
    "store_used_bytes",
    "store_objects",
    "store_evictions",
    "store_put_refused",
)


# with a scoring router (`prefix-aware`, `attention-only`): its predicted hit, reported only then
ROUTING_KEYS = ("predicted_hit_tokens", "overstated_hit_tokens", "overstated_requests")


@dataclass(frozen=True)
class Arm:
    """One column of a comparison: a checkpoint policy, with or without the drafter;
    `internal`: checkpoints written inside the forward (None: as the config says);
    `caching`: False for the arm that runs with prefix caching off."""

    name: str
    policy: Policy
    drafter: bool
    internal: bool | None = None
    caching: bool = True


ARMS: dict[str, Arm] = {
    EAGLE_OFF: Arm(EAGLE_OFF, Policy.REPLAY, drafter=False),
    **{p: Arm(p, Policy(p), drafter=True) for p in POLICY_NAMES},
    **{p + SPLIT: Arm(p + SPLIT, Policy(p), drafter=True, internal=False) for p in POLICY_NAMES},
    NO_CACHING: Arm(NO_CACHING, Policy.LIMIT, drafter=True, caching=False),
}
ARM_NAMES: tuple[str, ...] = tuple(ARMS)


def parse_arms(value: str | Sequence[str]) -> tuple[str, ...]:
    """Arm names from `a,b,c` (or a sequence): each known, none twice, at least one."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"no arm named; choose from {', '.join(ARM_NAMES)}")
    for n in names:
        if n not in ARMS:
            raise ValueError(f"unknown arm {n!r}; choose from {', '.join(ARM_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"an arm is listed twice in {','.join(names)!r}")
    return tuple(names)


def arm_config(config: HycacheConfig, arm: Arm) -> HycacheConfig:
    """`config` with the arm's policy (and checkpoint writing, for a `-split` arm); `eagle-off`
    also drops the drafter (k = 0), `no-caching` turns prefix caching off."""
    internal = config.cache.internal_checkpoints if arm.internal is None else arm.internal
    caching = config.cache.enable_prefix_caching and arm.caching
    cache = config.cache.with_knobs(
        policy=arm.policy, internal_checkpoints=internal, enable_prefix_caching=caching
    )
    cfg = replace(config, cache=cache)
    if not arm.drafter:
        spec = replace(config.speculative, num_speculative_tokens=0, eagle_drop=None)
        cfg = replace(cfg, speculative=spec)
    return cfg


def arm_cost(cost: CostModel | None, arm: Arm) -> CostModel | None:
    """The arm's cost model: `eagle-off` runs without drafter passes, weights and KV."""
    if cost is None or arm.drafter or not cost.speculative:
        return cost
    return cost.without_drafter()


def sized_cache(cache: CacheConfig, cost: CostModel) -> CacheConfig:
    """`cache` with the pools `cost`'s memory holds in its layout (`CostModel.pool_layout`):
    one shared pool of `CostModel.num_blocks` pages, or separate attention and SSM pools
    (`CostModel.pool_sizes`), for the cache's block size, `max_model_len` and groups."""
    pools = cost.pool_sizes(
        cache.block_size,
        cache.max_model_len,
        layout=cost.pool_layout,
        attention_groups=cache.num_attention_groups,
    )
    return replace(cache, num_blocks=pools.num_blocks, num_state_pages=pools.num_state_pages)


def reference_arm(names: Sequence[str]) -> str:
    """The arm ratios are taken against: the baseline when present, else the first."""
    return BASELINE if BASELINE in names else names[0]


def ratio(policies: Mapping[str, Mapping[str, Any]], key: str, num: str, den: str) -> float | None:
    """`policies[num][key] / policies[den][key]`, or None when either is missing or zero."""
    if num not in policies or den not in policies:
        return None
    a, b = policies[num].get(key), policies[den].get(key)
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return a / b


def headline(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The headline `limit / lookahead`: throughput and TTFT ratios, and the extra state pages
    `limit` keyed and held (its price), or None when either arm is missing."""
    if HEADLINE not in policies or BASELINE not in policies:
        return None
    h, b = policies[HEADLINE], policies[BASELINE]
    return {
        "name": f"{HEADLINE}/{BASELINE}",
        "output_tokens_per_s": ratio(policies, "output_tokens_per_s", HEADLINE, BASELINE),
        "ttft_p50_s": ratio(policies, "ttft_p50_s", HEADLINE, BASELINE),
        "ttft_p95_s": ratio(policies, "ttft_p95_s", HEADLINE, BASELINE),
        "extra_ssm_pages_stored": h.get("ssm_pages_stored", 0) - b.get("ssm_pages_stored", 0),
        "extra_ssm_snapshot_pages": h.get("ssm_snapshot_pages", 0) - b.get("ssm_snapshot_pages", 0),
        "extra_ssm_pages_peak": h.get("ssm_pages_peak", 0) - b.get("ssm_pages_peak", 0),
    }


CPU_CLOCK_KEYS = ("output_tokens_per_cpu_s", "ttft_cpu_p50_s", "ttft_cpu_p95_s")
"""The CPU engine's figures on its thread's CPU clock (`hycache.bench.suite`), beside wall."""


def caching_overhead(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """What caching costs against `no-caching` (`limit / no-caching`: output tokens/s and TTFT),
    or None when either arm is missing; on a stream that shares nothing this is the price."""
    if HEADLINE not in policies or NO_CACHING not in policies:
        return None
    out: dict[str, Any] = {"name": f"{HEADLINE}/{NO_CACHING}"}
    for k in ("output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", *CPU_CLOCK_KEYS):
        value = ratio(policies, k, HEADLINE, NO_CACHING)
        if value is not None or k not in CPU_CLOCK_KEYS:  # the engine's CPU clock, if timed
            out[k] = value
    return out


def extra_prefill_steps(base: SimResult, other: SimResult) -> int:
    """Most extra prefill steps `other`'s checkpoint stops cost over `base`'s on a request that
    observed a junction under `other` and resumed at the same point in both. Counted as
    chunks a checkpoint stop ended before the budget or the prompt did (`checkpoint_splits`):
    under concurrency the budget a chunk gets depends on its neighbours, so raw step counts
    differ between arms for reasons no policy chose."""
    ref = base.by_id()
    worst = 0
    for r in other.records:
        b = ref.get(r.id)
        if b is not None and r.junction and r.hit_tokens == b.hit_tokens:
            worst = max(worst, r.checkpoint_splits - b.checkpoint_splits)
    return worst


def compare_policies(
    workload: Workload,
    config: HycacheConfig,
    arms: Sequence[str],
    *,
    cost: CostModel | None,
    seed: int = 0,
    vocab_size: int = 32000,
    size_cache: bool = False,
    on_finish: Callable[[str, RequestRecord], None] | None = None,
    tier: TierConfig | None = None,
    instances: int = 1,
    routing: str = "round-robin",
) -> dict[str, SimResult]:
    """One simulation per arm on the same stream, in the order given.

    `size_cache`: each arm's cache gets the pools its own memory holds in the cost model's
    `pool_layout` (`sized_cache` of the arm's cost model: without a drafter, more); otherwise
    every arm uses `config.cache.num_blocks` (and `num_state_pages`). Summaries gain
    `num_blocks`, `num_state_pages` with separate pools, and `extra_prefill_steps_max`
    (against the reference arm, see `reference_arm`).

    `tier`, `instances`, `routing`: see `Simulator`; each arm gets its own fresh store.
    """
    names = parse_arms(arms)
    results: dict[str, SimResult] = {}
    for name in names:
        arm = ARMS[name]
        cfg = arm_config(config, arm)
        arm_cm = arm_cost(cost, arm)
        if size_cache and arm_cm is not None:
            cfg = replace(cfg, cache=sized_cache(cfg.cache, arm_cm))
        flop_aware = cfg.cache.eviction is Eviction.FLOP_AWARE
        if flop_aware and arm_cm is not None and cfg.cache.recompute_cost is None:
            # the arm's own model prices its entries
            cfg = replace(cfg, cache=replace(cfg.cache, recompute_cost=arm_cm.recompute_cost()))
        sim = Simulator(
            cfg,
            cost=arm_cm,
            seed=seed,
            vocab_size=vocab_size,
            tier=tier,
            instances=instances,
            routing=routing,
        )
        cb = (lambda rec, n=name: on_finish(n, rec)) if on_finish else None
        res = sim.run(
            workload.requests,
            sessions=workload.sessions,
            concurrency=workload.concurrency,
            sequential=workload.sequential,
            on_finish=cb,
        )
        res.summary["num_blocks"] = cfg.cache.num_blocks
        if cfg.cache.num_state_pages is not None:
            res.summary["num_state_pages"] = cfg.cache.num_state_pages
        results[name] = res
    ref = results[reference_arm(names)]
    for res in results.values():
        res.summary["extra_prefill_steps_max"] = extra_prefill_steps(ref, res)
    return results


def policies_json(results: Mapping[str, SimResult]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, res in results.items():
        doc = {k: res.summary.get(k) for k in SUMMARY_KEYS}
        keys = POOL_KEYS + STORE_KEYS + ROUTING_KEYS
        doc.update({k: res.summary[k] for k in keys if k in res.summary})
        out[name] = doc
    return out


def instances_json(results: Mapping[str, SimResult]) -> dict[str, list[dict[str, Any]]]:
    """Per arm, each instance's summary (empty lists for a single instance)."""
    return {name: list(res.instances) for name, res in results.items()}
