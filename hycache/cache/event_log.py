"""The KV event log: the cache's store/remove events as vLLM's KV events, in two modes.

`KVEventLog(cache, mode)` subscribes to the block pools' key events (`CacheManager.subscribe`)
and to the requests whose keys are committed (`CacheManager.observe_commits`, which supplies
the tokens and the prefix hashes the pool events lack); `drain()` returns what changed since
the last drain as one `KVEventBatch` (`hycache.cache.events`). docs/events.md has the picture.

`resumable` (for routers that score attention depth): one attention-like chain at the match
unit's granularity. Unit k of a path is stored exactly while a request on that path can resume
at or past its end, and removed as soon as it cannot (an SSM state evicted while the attention
stays counts):

    path:      [u0][u1][u2][u3][u4][u5][u6][u7]      attention cached through u7
    states:              ^3u          ^6u            SSM states at 3u and 6u
    published: [u0][u1][u2][u3][u4][u5]              depth 6u: where a request resumes

Where a path can resume is the cache's own lookup (`CacheManager.lookup`: the joint hit, the
drafter's rule, the boundaries), asked of every tracked path (a request that committed keys)
whose keys changed; a unit is published while one tracked path's resume point covers it. Units
are named by the content of their prefix (`PrefixHashes.prefix_hash`: under lookahead keys the
same content may carry several keys), carry their tokens and their parent, `block_size` u,
group 0, kind `full_attention`.

`full` (for consumers that read groups): every pool key as vLLM emits its group's blocks
(block size B, group index, `full_attention` or `mamba`; a key inside a block carries the
block's tokens up to it), plus the `resumable` stream in the batch's trailing
`resumable_events`.

The `resumable` bookkeeping (which units are published, their chains, the events when a
path's depth moves) is `ResumableChain`, whoever supplies the depths: here the cache's lookup,
inside vLLM vLLM's own (`hycache.vllm.events`).

A path is forgotten once its request has finished, it resumes nowhere and none of its keys is
cached any more. What was cached before the log was created is unknown to it: its first batch
opens with `AllBlocksCleared` (the log starts from nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from hycache.cache.block_pool import BlockEvent, CacheKey
from hycache.cache.events import (
    FULL_ATTENTION,
    MAMBA,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    external_hash,
)
from hycache.cache.manager import CacheManager
from hycache.config import GroupKind
from hycache.hashing import Hash
from hycache.request import Request

EventMode = Literal["resumable", "full"]
MODES: tuple[EventMode, ...] = ("resumable", "full")


@dataclass
class _Path:
    req: Request
    indexed: int = 0  # positions whose keys are in the log's index, up to here

    # a `PathView` of the request
    def prefix_hash(self, p: int) -> Hash:
        return self.req.hashes.prefix_hash(p)

    def tokens(self, start: int, end: int) -> Sequence[int]:
        return self.req.tokens(start, end)


class PathView(Protocol):
    """A request path as `ResumableChain` reads it: the content hash of [0, p) for a
    multiple p of the unit, and its tokens."""

    def prefix_hash(self, p: int) -> Hash: ...

    def tokens(self, start: int, end: int) -> Sequence[int]: ...


@dataclass(frozen=True)
class _Unit:
    """A published unit of the `resumable` chain: the prefix [0, position)."""

    hash: Hash  # the content hash of [0, position)
    parent: Hash | None
    position: int
    token_ids: tuple[int, ...]


class ResumableChain:
    """The `resumable` stream for paths whose depths someone else computes: unit k of a
    path is published while one path's depth covers its end (`set_depth`), and `events()`
    says which units crossed since the last call: removed (deepest first), then chains stored
    (parents first), `block_size` u, group 0, kind `full_attention`. Keeps no rule of where
    a path resumes."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._depth: dict[str, int] = {}  # path id -> the depth its published units cover
        self._support: dict[Hash, int] = {}  # published unit -> the paths covering it
        self._units: dict[Hash, _Unit] = {}
        # units whose support crossed zero since the last `events` -> published before it
        self._changed: dict[Hash, bool] = {}

    def depth(self, pid: str) -> int:
        return self._depth.get(pid, 0)

    def set_depth(self, pid: str, path: PathView, depth: int) -> None:
        """Move path `pid`'s support to `depth` (a multiple of the unit), noting the units
        whose support crossed zero (and whether each was published before)."""
        u, old = self.unit, self._depth.get(pid, 0)
        for p in range(old + u, depth + 1, u):  # deeper: support the new units
            h = path.prefix_hash(p)
            n = self._support.get(h, 0)
            self._support[h] = n + 1
            if not n:
                self._changed.setdefault(h, h in self._units)
                if h not in self._units:
                    parent = path.prefix_hash(p - u) if p > u else None
                    self._units[h] = _Unit(h, parent, p, tuple(path.tokens(p - u, p)))
        for p in range(old, depth, -u):  # shallower: drop the old ones, deepest first
            h = path.prefix_hash(p)
            self._support[h] -= 1
            if not self._support[h]:
                del self._support[h]
                self._changed.setdefault(h, True)
        if depth:
            self._depth[pid] = depth
        else:
            self._depth.pop(pid, None)

    def events(self) -> list[KVEvent]:
        changed, self._changed = self._changed, {}
        removed = [h for h, was in changed.items() if was and h not in self._support]
        stored = [h for h, was in changed.items() if not was and h in self._support]
        removed.sort(key=lambda h: -self._units[h].position)
        events: list[KVEvent] = []
        if removed:
            events.append(BlockRemoved([external_hash(h) for h in removed], MEDIUM_GPU, 0))
        events.extend(self._chains(stored))
        for h in changed:
            if h not in self._support:
                del self._units[h]
        return events

    def published(self) -> dict[Hash, int]:
        """The units published now: content hash -> the position it ends at."""
        return {h: unit.position for h, unit in self._units.items()}

    def _chains(self, stored: list[Hash]) -> list[BlockStored]:
        """The newly stored units as BlockStored events, one per run of units each the parent
        of the next (in the order they were covered: parents first)."""
        events: list[BlockStored] = []
        run: list[_Unit] = []
        for h in [*stored, None]:
            unit = self._units[h] if h is not None else None
            if run and (unit is None or unit.parent != run[-1].hash):
                parent = run[0].parent
                events.append(
                    BlockStored(
                        [external_hash(x.hash) for x in run],
                        external_hash(parent) if parent is not None else None,
                        [t for x in run for t in x.token_ids],
                        self.unit,
                        None,
                        MEDIUM_GPU,
                        None,
                        group_idx=0,
                        kv_cache_spec_kind=FULL_ATTENTION,
                    )
                )
                run = []
            if unit is not None:
                run.append(unit)
        return events


class KVEventLog:
    """The cache's KV events in `mode` ("resumable" or "full"), drained as batches.

    `clock`: the batches' timestamps (seconds). `data_parallel_rank`: put on every batch."""

    def __init__(
        self,
        cache: CacheManager,
        mode: EventMode = "resumable",
        *,
        clock: Callable[[], float] = time.time,
        data_parallel_rank: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}, got {mode!r}")
        self.cache = cache
        self.mode: EventMode = mode
        self.clock = clock
        self.data_parallel_rank = data_parallel_rank
        self.unit = cache.bounds.unit
        self._paths: dict[str, _Path] = {}  # by request id, in the order first committed
        self._by_key: dict[Hash, dict[str, None]] = {}  # a key's hash -> the paths carrying it
        self._dirty: dict[str, None] = {}  # paths whose keys changed since the last drain
        self._chain = ResumableChain(self.unit)
        self._raw: list[BlockEvent] = []  # `full`: pool events since the last drain
        self._full_stored: set[tuple[int, int]] = set()  # `full`: (group, block hash) out
        self._fresh = True
        cache.subscribe(self._on_block_event)
        cache.observe_commits(self.track)

    # -- inputs ----------------------------------------------------------------------------------

    def track(self, req: Request) -> None:
        """Follow `req`'s path (called at each commit): index its keys, recheck where it
        resumes at the next drain."""
        rid = req.request_id
        path = self._paths.get(rid)
        if path is not None and path.req is not req:  # a request id used again
            self._chain.set_depth(rid, path, 0)
            self._forget(rid)
            path = None
        if path is None:
            path = self._paths[rid] = _Path(req)
        hashes, u = req.hashes, self.unit
        for p in range(path.indexed + u, hashes.num_hashed_tokens + 1, u):
            self._by_key.setdefault(hashes.at(p), {})[rid] = None
        path.indexed = max(path.indexed, hashes.num_hashed_tokens)
        self._dirty[rid] = None

    def _on_block_event(self, event: BlockEvent) -> None:
        for rid in self._by_key.get(event.key.hash, ()):
            self._dirty[rid] = None
        if self.mode == "full":
            self._raw.append(event)

    # -- output ----------------------------------------------------------------------------------

    def drain(self) -> KVEventBatch | None:
        """The events since the last drain (None: nothing happened), in a deterministic order:
        `full`: the pool's events as they happened; `resumable`: units removed (deepest
        first), then chains stored (parents first)."""
        opening: list[KVEvent] = [AllBlocksCleared()] if self._fresh else []
        self._fresh = False
        full = self._full_events() if self.mode == "full" else []
        resumable = opening + self._resumable_events()
        ts = self.clock()
        if self.mode == "resumable":
            if not resumable:
                return None
            return KVEventBatch(ts, resumable, self.data_parallel_rank)
        if not (full or resumable):
            return None
        return KVEventBatch(ts, opening + full, self.data_parallel_rank, resumable)

    def published(self) -> dict[Hash, int]:
        """The `resumable` units published now: content hash -> the position it ends at."""
        return self._chain.published()

    @property
    def num_tracked_paths(self) -> int:
        return len(self._paths)

    # -- resumable -------------------------------------------------------------------------------

    def _resumable_events(self) -> list[KVEvent]:
        for rid in [r for r in self._paths if r in self._dirty]:
            path = self._paths[rid]
            resume = self.cache.lookup(path.req).resume_point  # the one rule
            self._chain.set_depth(rid, path, resume)
            if not resume and path.req.status.finished and not self._cached(path):
                self._forget(rid)
        self._dirty.clear()
        return self._chain.events()

    def _cached(self, path: _Path) -> bool:
        """Whether any key of the path's is still in a pool."""
        groups = range(len(self.cache.config.groups))
        hashes = path.req.hashes
        return any(
            self.cache.pool_for(g).lookup(CacheKey(g, hashes.at(p))) is not None
            for p in range(self.unit, path.indexed + 1, self.unit)
            for g in groups
        )

    def _forget(self, rid: str) -> None:
        path = self._paths.pop(rid)
        hashes = path.req.hashes
        for p in range(self.unit, path.indexed + 1, self.unit):
            holders = self._by_key.get(hashes.at(p))
            if holders is not None:
                holders.pop(rid, None)
                if not holders:
                    del self._by_key[hashes.at(p)]
        self._dirty.pop(rid, None)

    # -- full --------------------------------------------------------------------------------------

    def _full_events(self) -> list[KVEvent]:
        """The pool's events since the last drain, one per key, as vLLM emits its groups'."""
        events: list[KVEvent] = []
        for e in self._raw:
            g, h = e.key.group, external_hash(e.key.hash)
            if e.kind == "removed":
                if (g, h) in self._full_stored:
                    self._full_stored.discard((g, h))
                    events.append(BlockRemoved([h], MEDIUM_GPU, g))
                continue
            stored = self._full_stored_event(e)
            if stored is not None:
                self._full_stored.add((g, h))
                events.append(stored)
        self._raw.clear()
        return events

    def _full_stored_event(self, e: BlockEvent) -> BlockStored | None:
        """A stored key as its group's block: the tokens from its block's start to its position,
        the parent the previous block's key (None when no tracked path carries the key: a
        load from the store never committed)."""
        holders = self._by_key.get(e.key.hash)
        if not holders:
            return None
        req = self._paths[next(iter(holders))].req
        b, p, g = self.cache.bounds.block_size, e.position, e.key.group
        start = (p - 1) // b * b
        parent = external_hash(req.hashes.at(start)) if start else None
        lookahead = [[req.tokens(p, p + 1)[0]]] if self.cache.bounds.lookahead else None
        kind = MAMBA if self.cache.config.groups[g] is GroupKind.SSM else FULL_ATTENTION
        return BlockStored(
            [external_hash(e.key.hash)],
            parent,
            req.tokens(start, p),
            b,
            None,
            MEDIUM_GPU,
            None,
            group_idx=g,
            kv_cache_spec_kind=kind,
            lookahead_token_ids=lookahead,
        )
