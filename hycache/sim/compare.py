"""Run several checkpoint policies side by side on the identical request stream.

This owns the comparison: one `Simulator` run per policy (same workload, same seed, same
cost model), the summary per policy, the ratio to the first policy, and the extra prefill
steps a policy spends relative to the first on the requests that observed a junction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hycache.config import HycacheConfig, parse_policy
from hycache.sim.costmodel import CostModel
from hycache.sim.simulator import RequestRecord, SimResult, Simulator
from hycache.sim.workloads import RequestSpec, SessionSpec

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
    "extra_prefill_steps_max",
    "peak_blocks_used",
    "preemptions",
    "makespan_s",
)


@dataclass
class Workload:
    """A request stream: open/closed-loop requests or multi-turn sessions."""

    name: str
    requests: Sequence[RequestSpec] = ()
    sessions: Sequence[SessionSpec] = ()
    concurrency: int | None = None
    sequential: bool = False

    @property
    def size(self) -> int:
        return len(self.requests) + sum(s.num_turns for s in self.sessions)

    def max_tokens_per_request(self) -> int:
        longest = max((r.prompt_len + r.max_tokens for r in self.requests), default=0)
        for s in self.sessions:
            total = sum(m.size for m in s.user_messages) + sum(s.output_tokens)
            longest = max(longest, total)
        return longest


def extra_prefill_steps(base: SimResult, other: SimResult) -> int:
    """Most extra prefill steps `other` took over `base` on a request that observed a junction
    under `other` and resumed at the same point in both."""
    ref = base.by_id()
    worst = 0
    for r in other.records:
        b = ref.get(r.id)
        if b is not None and r.junction and r.hit_tokens == b.hit_tokens:
            worst = max(worst, r.prefill_steps - b.prefill_steps)
    return worst


def compare_policies(
    workload: Workload,
    config: HycacheConfig,
    policies: Sequence[str],
    *,
    cost: CostModel | None,
    seed: int = 0,
    vocab_size: int = 32000,
    on_finish: Callable[[str, RequestRecord], None] | None = None,
) -> dict[str, SimResult]:
    """One simulation per policy on the same stream; summaries include the extra steps."""
    results: dict[str, SimResult] = {}
    for name in policies:
        cfg = replace(config, cache=replace(config.cache, policy=parse_policy(name)))
        sim = Simulator(cfg, cost=cost, seed=seed, vocab_size=vocab_size)
        cb = (lambda rec, n=name: on_finish(n, rec)) if on_finish else None
        results[name] = sim.run(
            workload.requests,
            sessions=workload.sessions,
            concurrency=workload.concurrency,
            sequential=workload.sequential,
            on_finish=cb,
        )
    first = next(iter(results.values()), None)
    for res in results.values():
        res.summary["extra_prefill_steps_max"] = extra_prefill_steps(first, res) if first else 0
    return results


def policies_json(results: dict[str, SimResult]) -> dict[str, dict[str, Any]]:
    return {name: {k: res.summary.get(k) for k in SUMMARY_KEYS} for name, res in results.items()}
