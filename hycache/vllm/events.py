"""hycache's KV events from inside vLLM: `hycache.vllm.Scheduler` with `--kv-events-config`
publishes the `resumable` or the `full` stream of docs/events.md instead of vLLM's own.

    vllm serve ... --scheduler-cls hycache.vllm.Scheduler \\
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                             "endpoint": "tcp://*:5557"}' \\
        --additional-config '{"hycache": {"kv_events": "resumable"}}'

`{"kv_events": "full"}` publishes vLLM's own per-group events plus the resumable tail;
`"kv_events_wire": "dynamo"` leaves the tail out for Dynamo's decoder
(`hycache.cache.events.encode_batch`). Without `kv_events`, vLLM's events go out untouched.

vLLM's block pool queues its events in the scheduler process; once per step the scheduler
takes them (`KVCacheManager.take_events`, in `update_from_output`) and hands a batch to its own
publisher (`kv_event_publisher`: vLLM's ZMQ PUB with its replay socket and DP-rank port). `install`
wraps `take_events` (and `free`, to see a request that finishes in its first step) on the
scheduler's manager instance: each step the wrapper takes vLLM's events itself, gives vLLM's
publisher hycache's batch, and returns nothing to the scheduler, which then sends nothing of
its own. What external consumers read of the scheduler (`kv_cache_config.kv_cache_groups`,
the coordinator's managers) is not touched.

Where a path can resume has one home, and in vLLM it is vLLM's own lookup, the one its
scheduler admits a request with (`compat.longest_cache_hit`: the coordinator's
`find_longest_cache_hit` over the path's block hashes, hence the attention hit, the Mamba state
and the drafter's rule as vLLM and the plugin's managers keep them). It is asked of every
tracked path (each request the scheduler held, until it has finished, resumes nowhere and none
of its keys is cached) after each step that changed anything: one lookup per tracked path per
such step. The chain itself is `hycache.cache.event_log.ResumableChain`; its units are named
by the content of their prefix (hycache's `PrefixHashes`, seed 0, the request's cache salt as
extra key).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from hycache.cache.event_log import MODES, EventMode, ResumableChain
from hycache.cache.events import (
    WIRES,
    AllBlocksCleared,
    KVEvent,
    KVEventBatch,
    Wire,
    for_wire,
)
from hycache.hashing import Hash, PrefixHashes, extra_key_bytes
from hycache.vllm import compat

logger = logging.getLogger("hycache.vllm")

CONFIG_KEY = "hycache"  # the plugin's section of `--additional-config` (as `pass_cost`'s)
MODE_KEY = "kv_events"
WIRE_KEY = "kv_events_wire"


def events_config(sched: Any) -> tuple[EventMode, Wire] | None:
    """The event mode and wire this deployment names in `--additional-config '{"hycache":
    {"kv_events": "resumable" | "full", "kv_events_wire": "vllm" | "dynamo"}}'`, or None
    (vLLM's own events). A value it does not know is a ValueError (vLLM's start fails
    naming it)."""
    extra = getattr(sched.vllm_config, "additional_config", None)
    conf = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
    mode = conf.get(MODE_KEY) if isinstance(conf, dict) else None
    if mode is None:
        return None
    assert isinstance(conf, dict)
    wire = conf.get(WIRE_KEY, "vllm")
    if mode not in MODES:
        raise ValueError(f"hycache.{MODE_KEY}: one of {', '.join(MODES)}, got {mode!r}")
    if wire not in WIRES:
        raise ValueError(f"hycache.{WIRE_KEY}: one of {', '.join(WIRES)}, got {wire!r}")
    return mode, wire


class _Path:
    """A vLLM request as `ResumableChain` reads it (a `PathView`)."""

    def __init__(self, request: Any, unit: int) -> None:
        self.request = request
        self._hashes = PrefixHashes(unit, extra=extra_key_bytes(request.cache_salt))
        self._fed = 0

    def prefix_hash(self, p: int) -> Hash:
        if self._hashes.num_prefix_hashed_tokens < p:
            tokens = self.request.all_token_ids
            self._hashes.extend(tokens[self._fed :])
            self._fed = len(tokens)
        return self._hashes.prefix_hash(p)

    def tokens(self, start: int, end: int) -> Sequence[int]:
        return list(self.request.all_token_ids[start:end])


class VllmEventLog:
    """The plugin's KV events for one vLLM scheduler, in `mode`; `drain(vllm_events)` once a
    step (see the module docstring)."""

    def __init__(self, sched: Any, mode: EventMode) -> None:
        self.sched = sched
        self.mode: EventMode = mode
        self.unit = int(sched.hash_block_size)
        self.num_groups = len(sched.kv_cache_config.kv_cache_groups)
        self._chain = ResumableChain(self.unit)
        self._paths: dict[str, _Path] = {}  # by request id, in the order first seen
        self._fresh = True

    def track(self, request: Any) -> None:
        """Follow `request`'s path (a request id used again starts a new path)."""
        rid = request.request_id
        path = self._paths.get(rid)
        if path is not None and path.request is not request:
            self._chain.set_depth(rid, path, 0)
            path = None
        if path is None:
            self._paths[rid] = _Path(request, self.unit)

    def resume_point(self, request: Any) -> int:
        """Where a request continuing `request`'s path resumes now: vLLM's own lookup over
        its hashed tokens (the one rule)."""
        hashes = request.block_hashes
        return compat.longest_cache_hit(
            self.sched.kv_cache_manager, hashes, len(hashes) * self.unit
        )

    def drain(self, vllm_events: list[Any]) -> KVEventBatch | None:
        """This step's batch (None: nothing to send): `resumable`, or vLLM's own events with
        the resumable stream as the tail (`full`)."""
        for request in list(self.sched.requests.values()):
            self.track(request)
        opening: list[KVEvent] = [AllBlocksCleared()] if self._fresh else []
        self._fresh = False
        if vllm_events or self._paths:
            self._recheck()
        resumable = opening + self._chain.events()
        ts = time.time()
        if self.mode == "resumable":
            return KVEventBatch(ts, resumable) if resumable else None
        if not (vllm_events or resumable):
            return None
        return KVEventBatch(ts, opening + list(vllm_events), None, resumable)

    def _recheck(self) -> None:
        for rid, path in list(self._paths.items()):
            request = path.request
            depth = self.resume_point(request) // self.unit * self.unit
            self._chain.set_depth(rid, path, depth)
            if not depth and request.is_finished() and not self._cached(request):
                del self._paths[rid]

    def _cached(self, request: Any) -> bool:
        pool = self.sched.kv_cache_manager.block_pool
        return any(
            compat.key_cached(pool, h, g)
            for h in request.block_hashes
            for g in range(self.num_groups)
        )

    def depth(self, request_id: str) -> int:
        """The depth request `request_id`'s path has published (its resume point at the last
        drain, floored to the unit)."""
        return self._chain.depth(request_id)

    @property
    def num_tracked_paths(self) -> int:
        return len(self._paths)

    def published(self) -> dict[Hash, int]:
        return self._chain.published()


def install(sched: Any) -> VllmEventLog | None:
    """Publish the plugin's events from `sched` when the deployment asks for them (see
    `events_config`); None (vLLM's own events, untouched) otherwise, with a WARNING where it
    asked but cannot have them."""
    conf = events_config(sched)
    if conf is None:
        return None
    mode, wire = conf
    why = compat.events_problem(sched)
    if why is None and not sched.enable_kv_cache_events:
        why = "no --kv-events-config with enable_kv_cache_events"
    if why is not None:
        logger.warning("hycache.vllm: KV events %r not published (%s)", mode, why)
        return None
    log = VllmEventLog(sched, mode)
    manager = sched.kv_cache_manager
    take_events, free = manager.take_events, manager.free

    def take_and_publish() -> list[Any]:
        batch = log.drain(take_events())
        if batch is not None:
            sched.kv_event_publisher.publish(for_wire(batch, wire))
        return []  # the scheduler publishes nothing of its own

    def track_and_free(request: Any) -> None:
        log.track(request)
        free(request)

    manager.take_events = take_and_publish
    manager.free = track_and_free
    logger.info("hycache.vllm: publishing KV events, mode %s, %s wire", mode, wire)
    return log
