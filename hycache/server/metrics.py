"""Prometheus metrics for `hycache serve` (`GET /metrics`), on a per-app `CollectorRegistry`.

Names follow vLLM where a counterpart exists, so its dashboards work unchanged (each sample is
labelled `model_name`):

- `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`: prompt tokens looked up in / taken
  from the prefix cache (counters, exposed with `_total`);
- `vllm:prompt_tokens` / `vllm:generation_tokens`: prompt and output tokens the engine
  computed (counters), as vLLM counts them: a request's prompt once it produced its first
  token, every output token once, requests aborted later (a client gone) included;
- `vllm:num_requests_running` / `vllm:num_requests_waiting` (gauges);
- `vllm:kv_cache_usage_perc`: the fraction of cache blocks in use, 0-1 (gauge);
- `vllm:time_to_first_token_seconds` / `vllm:inter_token_latency_seconds` (histograms, measured
  by the HTTP layer from the request's arrival).

hycache's own: `hycache:lost_reuse_tokens` (tokens attention matched that the joint hit did not
reach), `hycache:junctions_observed` (finished requests whose first lookup observed a junction)
and `hycache:ssm_state_pages` (cache blocks holding a keyed SSM state). With a second cache tier
(`--kv-store`), also: `hycache:store_hit_tokens` (prompt tokens loaded from the store, part of
`vllm:prefix_cache_hits`), `hycache:store_put_objects` (objects written to it),
`hycache:store_errors` (store calls that failed: master unreachable, timed out) and
`hycache:store_corrupt` (objects read back that failed their check; each was a miss) - counters,
exposed with `_total`, present only when the server has a store.

No `_created` series are exported (vLLM disables them too).

Engine values are read on the engine's worker thread (`LLM.snapshot`, through
`EngineWorker.call`: the same reading `/v1/stats` shows) and handed to the collector just
before the registry is rendered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hycache.engine.outputs import EngineSnapshot

if TYPE_CHECKING:
    from hycache.engine.outputs import RequestOutput

disable_created_metrics()  # process-wide, as vLLM does: no `*_created` series
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def metric_values(snap: EngineSnapshot) -> dict[str, float]:
    """The collector's values of an engine snapshot (the `store_*` keys only with a second
    tier)."""
    cs = snap.cache
    values: dict[str, float] = {
        "running": snap.running,
        "waiting": snap.waiting,
        "query_tokens": cs.query_tokens,
        "hit_tokens": cs.hit_tokens,
        "lost_reuse_tokens": cs.lost_reuse_tokens,
        "kv_usage": snap.kv_usage,
        "ssm_pages": snap.ssm_pages,
        "prompt_tokens": snap.engine.prefilled_prompt_tokens,
        "output_tokens": snap.engine.generated_tokens,
    }
    if snap.store is not None:
        values["store_hit_tokens"] = cs.store_hit_tokens
        values["store_put_objects"] = snap.store.put_objects
        values["store_errors"] = snap.store.stats["errors"]
        values["store_corrupt"] = snap.store.stats["corrupt"]
    return values


class _EngineCollector(Collector):
    """Yields the engine's counters and gauges from the snapshot last handed to it."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        labels = ["model_name"]

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric([self.model_name], float(s.get(key, 0)))
            return family

        def gauge(name: str, doc: str, key: str) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric([self.model_name], float(s.get(key, 0)))
            return family

        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", "query_tokens"
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", "hit_tokens")
        yield counter("vllm:prompt_tokens", "Prompt tokens processed.", "prompt_tokens")
        yield counter("vllm:generation_tokens", "Generation tokens produced.", "output_tokens")
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", "running")
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", "waiting")
        yield gauge("vllm:kv_cache_usage_perc", "Cache block usage, 0-1 (1: full).", "kv_usage")
        yield counter(
            "hycache:lost_reuse_tokens",
            "Prompt tokens attention matched that the joint (attention + SSM) hit did not reach.",
            "lost_reuse_tokens",
        )
        yield gauge(
            "hycache:ssm_state_pages", "Cache blocks holding a keyed SSM state.", "ssm_pages"
        )
        if "store_hit_tokens" not in s:  # no second tier
            return
        yield counter(
            "hycache:store_hit_tokens",
            "Prompt tokens loaded from the second cache tier (part of the prefix cache hits).",
            "store_hit_tokens",
        )
        yield counter(
            "hycache:store_put_objects",
            "Objects written to the second cache tier.",
            "store_put_objects",
        )
        yield counter(
            "hycache:store_errors",
            "Second-tier calls that failed (store unreachable or timed out): misses.",
            "store_errors",
        )
        yield counter(
            "hycache:store_corrupt",
            "Second-tier objects that failed their check when read back: misses, dropped.",
            "store_corrupt",
        )


class ServerMetrics:
    """The registry behind `/metrics` and the instruments the HTTP layer feeds."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engine = _EngineCollector(model_name)
        self.registry.register(self.engine)
        labels = ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from a request's arrival to its first output token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between successive output chunks of a request.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        ).labels(model_name)
        self.junctions = Counter(
            "hycache:junctions_observed",
            "Finished requests whose first cache lookup observed a junction.",
            labels,
            registry=self.registry,
        ).labels(model_name)

    def render(self, snapshot: EngineSnapshot) -> bytes:
        """The exposition text, with `snapshot`'s engine values."""
        self.engine.snapshot = metric_values(snapshot)
        return generate_latest(self.registry)

    def finished(self, out: RequestOutput) -> None:
        if out.junction:
            self.junctions.inc()

    def timer(self, arrival: float) -> RequestTimer:
        return RequestTimer(self, arrival)


class RequestTimer:
    """Observes one request's TTFT and inter-token latencies as its tokens arrive."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self.metrics = metrics
        self.last: float | None = None
        self.arrival = arrival

    def tokens(self, n: int) -> None:
        """`n` new output tokens arrived now."""
        if n <= 0:
            return
        now = time.monotonic()
        if self.last is None:
            self.metrics.ttft.observe(now - self.arrival)
        else:
            self.metrics.itl.observe(now - self.last)
        self.last = now
