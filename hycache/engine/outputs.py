"""What the engine hands out: each request's `RequestOutput`, its `StreamEvent`s, a running
request's `RequestProgress`, the running `EngineStats`, `LastSchedule` (a step observer keeping
the last step's schedule), and `EngineSnapshot`, the one reading of the engine's counters behind
both `/v1/stats` (`EngineSnapshot.as_stats`) and `/metrics` (`hycache.server.metrics`).

A snapshot (`LLM.snapshot`) is taken on the thread that owns the engine (the server's worker)
and copies what it reads, so it can be rendered anywhere afterwards.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hycache.cache.manager import CacheStats
from hycache.request import TokenLogprob
from hycache.sched.scheduler import Scheduler
from hycache.store import KVStore


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    hit_tokens: int
    finish_reason: str | None
    num_preemptions: int = 0
    prefill_tokens: int = 0  # prompt (and replayed) tokens this request computed
    junction: int = 0  # the junction its first lookup observed (0: none)
    prefill_steps: int = 0
    lost_reuse: int = 0  # tokens attention matched that the joint hit did not reach
    # one per output token when the request asked for `SamplingParams.logprobs`
    logprobs: list[TokenLogprob] | None = None
    store_hit_tokens: int = 0  # of hit_tokens, loaded from the second tier (`kv_store`)
    checkpoint_splits: int = 0  # of prefill_steps, those a checkpoint stop ended early


@dataclass
class StreamEvent:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    output: RequestOutput | None = None  # set when finished
    new_logprobs: list[TokenLogprob] | None = None  # for new_token_ids, when asked for
    # set on the last event of a request whose sampling failed (NaN logits): it ended alone,
    # with finish reason "error"
    error: str | None = None


@dataclass(frozen=True)
class RequestProgress:
    """A running request's progress at one moment (`LLM.running`)."""

    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int  # prompt (and output) tokens the model has run over

    @property
    def prefilled(self) -> bool:
        """Its whole prompt is computed: its steps are decode (verify) steps now."""
        return self.num_computed_tokens >= self.num_prompt_tokens


@dataclass
class EngineStats:
    """`requests`, `prompt_tokens`, `hit_tokens`, `store_hit_tokens`, `output_tokens`: sums
    over finished requests of what each reported (its `RequestOutput`: the hits are its first
    admission's). `prefilled_prompt_tokens` / `generated_tokens`: what the engine computed, also
    for requests aborted later: a request's prompt once it produced its first token, every
    output token once (vLLM's `prompt_tokens` / `generation_tokens`)."""

    steps: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    store_hit_tokens: int = 0
    output_tokens: int = 0
    prefilled_prompt_tokens: int = 0
    generated_tokens: int = 0

    def count(self, output: RequestOutput) -> None:
        """Add a finished request's output."""
        self.requests += 1
        self.prompt_tokens += len(output.prompt_token_ids)
        self.hit_tokens += output.hit_tokens
        self.store_hit_tokens += output.store_hit_tokens
        self.output_tokens += len(output.token_ids)


@dataclass(frozen=True)
class StoreSnapshot:
    """The second tier: the backend, its capacity and use, its own counters (`StoreStats`:
    calls, hits, refused puts, errors, corrupt objects) and the mirror's (`MirrorStats`:
    lookups that asked it, hits, tokens gained, puts)."""

    backend: str
    capacity_bytes: int
    used_bytes: int
    stats: dict[str, Any]
    mirror: dict[str, Any] | None

    @property
    def put_objects(self) -> int:
        return int(self.mirror["put_objects"]) if self.mirror is not None else 0


@dataclass(frozen=True)
class EngineSnapshot:
    """The scheduler, cache, store and engine counters at one moment."""

    running: int
    waiting: int
    cache: CacheStats
    ssm_pages: int  # cache blocks holding a keyed SSM state
    engine: EngineStats
    store: StoreSnapshot | None

    @classmethod
    def of(cls, sched: Scheduler, stats: EngineStats, kv_store: KVStore | None) -> EngineSnapshot:
        """Read an engine's scheduler, stats and second tier (`LLM.snapshot`, on the thread
        that owns the engine)."""
        cache = sched.cache
        ssm_groups = {m.group for m in cache.ssm}
        keys = cache.state_pool.keys
        ssm_pages = sum(1 for k in keys if any(key.group in ssm_groups for key, _ in k))
        store = None
        if kv_store is not None:
            mirror = cache.mirror  # (a mirror with nothing staged has len 0: test for None)
            store = StoreSnapshot(
                kv_store.name,
                kv_store.capacity_bytes,
                kv_store.used_bytes,
                kv_store.stats.as_dict(),
                mirror.stats.as_dict() if mirror is not None else None,
            )
        return cls(
            len(sched.running),
            len(sched.waiting),
            dataclasses.replace(cache.stats()),
            ssm_pages,
            dataclasses.replace(stats),
            store,
        )

    @property
    def kv_usage(self) -> float:
        """The fraction of usable cache blocks in use (block 0 is the null block)."""
        return self.cache.used_blocks / max(self.cache.num_blocks - 1, 1)

    def as_stats(self) -> dict[str, Any]:
        """The `/v1/stats` document. `cache.*` counts every cache lookup, a re-admission after a
        preemption included: `cache.hit_tokens` = `device_hit_tokens` (found in the device
        pool) + `store_hit_tokens` (loaded from the second tier); `lost_reuse_tokens` is what
        attention matched beyond the joint hit. `engine.*` sums what finished requests
        reported in their usage (a re-admitted request reports its first admission's hits, as
        vLLM's `cached_tokens` does), so `engine.hit_tokens` and `engine.store_hit_tokens` are
        the sums of the responses' `cached_tokens` and `store_cached_tokens`."""
        cs = self.cache
        cache = {
            "num_blocks": cs.num_blocks,
            "free_blocks": cs.free_blocks,
            "used_blocks": cs.used_blocks,
            "cached_blocks": cs.cached_blocks,
            "admissions": cs.admissions,
            "query_tokens": cs.query_tokens,
            "hit_tokens": cs.hit_tokens,
            "device_hit_tokens": cs.hit_tokens - cs.store_hit_tokens,
            "store_hit_tokens": cs.store_hit_tokens,
            "lost_reuse_tokens": cs.lost_reuse_tokens,
            "token_hit_rate": cs.token_hit_rate,
        }
        store = dataclasses.asdict(self.store) if self.store is not None else None
        return {
            "running": self.running,
            "waiting": self.waiting,
            "cache": cache,
            "store": store,
            "engine": dataclasses.asdict(self.engine),
        }


class LastSchedule:
    """A step observer (`LLM.add_step_observer`) that keeps the last step's `SchedulerOutput`.

    It holds no reference to the engine: an observer that did (a bound method of an object
    holding the `LLM`) would make a reference cycle, and an engine's tensors (GBs) would then
    wait for Python's cyclic collector, which counts objects, not bytes."""

    def __init__(self) -> None:
        self.last: Any = None

    def __call__(self, schedule: Any) -> None:
        self.last = schedule
