"""Offered load: what one simulated GPU sustains on a request stream, and arrivals at a
chosen fraction of that.

An open-loop replay means something only at a rate the server keeps up with. A trace recorded
on a cluster (Mooncake's arrives at about 3.4 requests/s) overloads one simulated GPU: the queue
grows for the whole replay, every arm finishes when the last arrival is served, and TTFT
measures the backlog rather than the cache. This module

* measures capacity (:func:`capacity`): requests/s the `lookahead` arm (vLLM's default, the
  baseline) serves closed loop at the scheduler's `max_num_seqs`, i.e. saturated;
* rescales arrivals (:func:`at_rate`): a trace's timestamps are stretched or squeezed by one
  factor, keeping its burstiness; requests without timestamps get Poisson arrivals;
* combines the two (:func:`sustainable_arrivals`): arrivals at `load` (default 0.75) times the
  measured capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hycache.config import HycacheConfig
from hycache.sim.compare import BASELINE, compare_policies
from hycache.sim.costmodel import CostModel
from hycache.sim.workloads import OfferedLoad, RequestSpec, Workload, poisson_arrivals

DEFAULT_LOAD = 0.75  # offered load as a fraction of what the baseline sustains




def closed_loop(requests: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The same requests without arrival times (admitted as concurrency slots free)."""
    return [replace(r, arrival_s=None) for r in requests]


def capacity(
    requests: Sequence[RequestSpec],
    config: HycacheConfig,
    cost: CostModel | None,
    *,
    arm: str = BASELINE,
    seed: int = 0,
    size_cache: bool = False,
) -> float:
    """Requests/s `arm` serves closed loop at `max_num_seqs` in flight (saturated)."""
    if not requests:
        raise ValueError("capacity: no requests")
    w = Workload("capacity", closed_loop(requests), concurrency=config.scheduler.max_num_seqs)
    res = compare_policies(w, config, [arm], cost=cost, seed=seed, size_cache=size_cache)
    return float(res[arm].summary["request_throughput"])


def mean_rate(requests: Sequence[RequestSpec]) -> float | None:
    """Arrivals per second of timed requests ((n - 1) / span), or None without a span."""
    times = [r.arrival_s for r in requests]
    if len(times) < 2 or any(t is None for t in times):
        return None
    ts = [float(t) for t in times if t is not None]
    span = max(ts) - min(ts)
    return (len(ts) - 1) / span if span > 0 else None


def at_rate(
    requests: Sequence[RequestSpec], rate_per_s: float, *, seed: int = 0
) -> tuple[list[RequestSpec], float | None]:
    """Arrivals at a mean `rate_per_s`, and the time scale applied (None: Poisson).

    Timed requests keep their relative spacing: every timestamp (from the first) is multiplied
    by `observed rate / rate_per_s`. Untimed ones get seeded Poisson arrivals.
    """
    if not rate_per_s > 0:
        raise ValueError(f"request rate must be > 0 requests/s, got {rate_per_s}")
    observed = mean_rate(requests)
    if observed is None:
        return poisson_arrivals(requests, rate_per_s, seed), None
    t0 = min(float(r.arrival_s or 0.0) for r in requests)
    scale = observed / rate_per_s
    out = [replace(r, arrival_s=(float(r.arrival_s or 0.0) - t0) * scale) for r in requests]
    return out, scale


def sustainable_arrivals(
    requests: Sequence[RequestSpec],
    config: HycacheConfig,
    cost: CostModel | None,
    *,
    load: float = DEFAULT_LOAD,
    arm: str = BASELINE,
    seed: int = 0,
    size_cache: bool = False,
) -> tuple[list[RequestSpec], OfferedLoad]:
    """`requests` arriving at `load` times what `arm` sustains (see :func:`capacity`)."""
    if not 0 < load <= 1.5:
        raise ValueError(f"load must lie in (0, 1.5], got {load}")
    cap = capacity(requests, config, cost, arm=arm, seed=seed, size_cache=size_cache)
    rate = load * cap
    timed, scale = at_rate(requests, rate, seed=seed)
    return timed, OfferedLoad(cap, load, rate, scale)
