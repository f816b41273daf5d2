"""The cache manager: the one object the scheduler talks to.

lookup(req)                    -> CacheHit            pure; the joint hit and the junction
fetch(req, hit)                -> CacheHit            deeper from the store, if one is attached
allocate(req, start, end, k)   -> StepAllocation|None  slots for [start, end) + k lookahead;
                                                      None (nothing changed) if blocks run out
commit(req)                    after the forward: publish keys for verified tokens only
free(req)                      release everything, tail blocks first
take_copies()                  block copies (copy-on-write) the runner must do first
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import BlockEvent, BlockPool
from hycache.cache.boundaries import Boundaries
from hycache.cache.coordinator import CacheHit, find_joint_hit, no_hit
from hycache.cache.eviction import FlopValue
from hycache.cache.mirror import BlockIO, StoreMirror
from hycache.cache.retention.policy import (
    AdmissionPolicy,
    KeepEverything,
    Retention,
    fit_writes,
)
from hycache.cache.retention.protection import CopySources, protected_depth
from hycache.cache.ssm import SSMManager, StateIO
from hycache.config import CacheConfig, Eviction, GroupKind, RecomputeCost, SpeculativeConfig
from hycache.request import Request
from hycache.store.base import KVStore


@dataclass(frozen=True)
class StepAllocation:
    block_tables: tuple[list[int], ...]  # per attention group (live lists: read, don't keep)
    states: tuple[StateIO, ...]  # per SSM group
    checkpoint: bool  # this step's SSM end state is kept and keyed


@dataclass
class CacheStats:
    num_blocks: int = 0  # attention blocks (every page, with one shared pool)
    free_blocks: int = 0
    used_blocks: int = 0
    cached_blocks: int = 0
    num_state_pages: int = 0  # SSM pages in a pool of their own (0: the shared pool)
    free_state_pages: int = 0
    cached_state_pages: int = 0
    admissions: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    store_hit_tokens: int = 0  # of hit_tokens, supplied by the second tier
    lost_reuse_tokens: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class CacheManager:
    def __init__(self, cache: CacheConfig, spec: SpeculativeConfig, max_num_seqs: int = 0) -> None:
        """`max_num_seqs`: the most requests the scheduler runs at once (0: no limit). With
        `num_waiting` (the requests queued to join, which the scheduler sets each step) it
        bounds what a page held until a request finishes (a decode snapshot) competes with."""
        self.config = cache
        self.max_num_seqs = max_num_seqs
        self.num_waiting = 0
        self.bounds = Boundaries.from_config(cache, spec)
        value = None
        if cache.eviction is Eviction.FLOP_AWARE:
            cost = cache.recompute_cost or RecomputeCost()
            value = FlopValue(cost, cache.groups, cache.block_size, cache.eviction_alpha)
        # flop-aware: decode snapshots are scored too, their value times their observed reuse
        first = value is None
        protect = {"protect": cache.protect_declared, "protect_hits": cache.protect_reused}
        self.pool = BlockPool(cache.num_blocks, value, snapshots_first=first, **protect)
        self.state_pool = (
            BlockPool(cache.num_state_pages, value, snapshots_first=first, **protect)
            if cache.num_state_pages is not None
            else self.pool
        )
        for pool in self.pools:
            pool.saving = self.bounds.hit_saving
        self.attention: list[AttentionManager] = []
        self.ssm: list[SSMManager] = []
        for gid, kind in enumerate(cache.groups):
            if kind is GroupKind.ATTENTION:
                self.attention.append(AttentionManager(gid, self.pool, self.bounds))
            else:
                self.ssm.append(SSMManager(gid, self.state_pool, self.bounds))
        self._copies: list[tuple[int, int]] = []
        self._sources = CopySources()  # the copy sources a protected path frees early
        self._live: dict[str, int] = {}  # live request -> what it protects (`protected_depth`)
        # which SSM states earn a page (`hycache.cache.retention`)
        self.retention: Retention = KeepEverything()
        if cache.admission:
            # the group -> pool map as a dict: a bound method would make a reference cycle
            pool_for = {g: self.pool_for(g) for g in range(len(cache.groups))}.__getitem__
            self.retention = AdmissionPolicy(
                self.state_pool, self.bounds, self.attention, self.ssm, pool_for,
                max_num_seqs, spec.num_speculative_tokens,
            )  # fmt: skip
        self.internal_writes_dropped = 0  # internal checkpoints left out for want of pages
        self._stats = CacheStats(num_blocks=cache.num_blocks)
        self._mirror: StoreMirror | None = None
        self._commit_observers: list[Callable[[Request], None]] = []

    # -- pools ---------------------------------------------------------------------------------

    @property
    def pools(self) -> list[BlockPool]:
        """The distinct pools: attention blocks, then SSM pages when they have their own."""
        return [self.pool] if self.state_pool is self.pool else [self.pool, self.state_pool]

    def pool_for(self, group: int) -> BlockPool:
        return self.state_pool if self.config.groups[group] is GroupKind.SSM else self.pool

    def subscribe(self, callback: Callable[[BlockEvent], None]) -> None:
        """Key events (stored / removed) of every pool."""
        for pool in self.pools:
            pool.subscribe(callback)

    def observe_commits(self, callback: Callable[[Request], None]) -> None:
        """Call `callback(req)` at each `commit` of a live request, before its keys are
        published: what the key events' tokens come from (`hycache.cache.event_log`)."""
        self._commit_observers.append(callback)

    # -- lookup --------------------------------------------------------------------------------

    def check_keys(self, req: Request) -> None:
        """A request must be hashed with this cache's key scheme (`Request.new(lookahead=...)`
        with `Boundaries.lookahead`); anything else could never hit, or hit wrongly."""
        if req.hashes.lookahead != self.bounds.lookahead or req.hashes.unit != self.bounds.unit:
            raise ValueError(
                f"request {req.request_id}: hashed with unit {req.hashes.unit}, lookahead "
                f"{req.hashes.lookahead}; this cache (policy {self.bounds.policy}) needs unit "
                f"{self.bounds.unit}, lookahead {self.bounds.lookahead}"
            )

    def lookup(self, req: Request) -> CacheHit:
        """The joint hit for a request about to be (re)admitted. Does not modify the cache."""
        self.check_keys(req)
        if not self.config.enable_prefix_caching:
            return no_hit(len(self.attention), len(self.ssm))
        return find_joint_hit(self.attention, self.ssm, req.hashes, req.num_tokens, self.bounds)

    # -- the second tier ----------------------------------------------------------------------

    @property
    def mirror(self) -> StoreMirror | None:
        """The store mirror (`attach_store`), or None: no second tier."""
        return self._mirror

    def attach_store(self, store: KVStore, fingerprint: str, io: BlockIO) -> StoreMirror:
        """Mirror this cache into `store`: from now on what `commit` keys is put there
        (`flush_store`) and `fetch` loads deeper hits from it, through `io` (the bytes of
        one block). Once per cache."""
        if self._mirror is not None:
            raise ValueError("this cache already has a store attached")
        # what the device evicts lives on in the store, so a kept state's page displaces no
        # hit there: with a second tier every state is kept (admission off)
        self.retention = KeepEverything()
        groups = self.config.groups
        # the group -> pool map as a dict, not `self.pool_for`: a bound method would make
        # manager -> mirror -> manager a cycle, which holds the pools until the cyclic collector
        pool_for = {g: self.pool_for(g) for g in range(len(groups))}.__getitem__
        self._mirror = StoreMirror(
            store, fingerprint, self.pools, pool_for, groups, self.bounds, io
        )
        return self._mirror

    def fetch(self, req: Request, hit: CacheHit) -> CacheHit:
        """After `lookup`: a deeper hit from the second tier, loaded into fresh blocks that stay
        staged until `unstage`; `hit` itself when there is no store or nothing deeper."""
        if self._mirror is None or not self.config.enable_prefix_caching:
            return hit
        found = self._mirror.lookup(req, hit, self.attention, self.ssm)
        if not found.loads:
            return found.hit
        self._mirror.load(found)
        return self._mirror.settle(found, self.lookup(req))

    def unstage(self) -> None:
        """End of an admission round: blocks loaded from the store are now held by the
        requests that adopted them (or stay cached for the next lookup)."""
        if self._mirror is not None:
            self._mirror.unstage()

    def flush_store(self) -> None:
        """End of a step's update: write what it committed to the second tier."""
        if self._mirror is not None:
            self._mirror.flush()

    def will_checkpoint(self, req: Request, end: int) -> bool:
        """Whether the chunk ending at `end` keeps its SSM state: a checkpoint position
        (`Boundaries.should_checkpoint`) that retention keeps (`Retention.admits`)."""
        return (
            bool(self.ssm)
            and self.config.enable_prefix_caching
            and self.bounds.should_checkpoint(end, req.num_prompt_tokens, req.junction_stops)
            and self.retention.admits(req, end)
        )

    def internal_writes(self, req: Request, start: int, end: int) -> tuple[int, ...]:
        """Checkpoints the forward of [start, end) writes inside the chunk (internal
        checkpoints that admission keeps; the chunk end's own state is `will_checkpoint`'s)."""
        if not self.ssm or not self.config.enable_prefix_caching:
            return ()
        writes = self.bounds.internal_writes(start, end, req.num_prompt_tokens, req.junction_stops)
        return tuple(p for p in writes if self.retention.admits(req, p))

    def _fit_writes(self, req: Request, writes: tuple[int, ...], need: int) -> tuple[int, ...]:
        """The internal checkpoints this step can write beside the `need` pages it takes from
        the state pool anyway (one page per SSM group each): all of them, or, under pressure,
        the observed junctions first, then the lower positions. What is left out is counted
        (`internal_writes_dropped`), never an admission refused for it."""
        if not writes or not self.ssm:
            return writes
        room = max(self.state_pool.num_free - need, 0) // len(self.ssm)
        kept = fit_writes(writes, req.junction_stops, room)
        self.internal_writes_dropped += len(writes) - len(kept)
        return kept

    def will_snapshot(self, req: Request, end: int, num_drafts: int) -> bool:
        """A step that samples (its chunk reaches the last known token) and may verify a unit
        boundary: its SSM groups get a snapshot block (`limit`), if retention keeps it
        (`Retention.admits_snapshot`: with admission the request's first such step decides
        for its whole decode)."""
        if not (
            bool(self.ssm)
            and self.config.enable_prefix_caching
            and end == req.num_tokens
            and self.bounds.decode_snapshot(end, end + num_drafts) > 0
        ):
            return False
        return self.retention.admits_snapshot(req, end, self.num_waiting)

    # -- allocation ------------------------------------------------------------------------------

    def allocate(
        self,
        req: Request,
        start: int,
        end: int,
        num_lookahead: int = 0,
        hit: CacheHit | None = None,
        num_drafts: int = 0,
    ) -> StepAllocation | None:
        """Slots for tokens [start, end) plus `num_lookahead` draft slots (of which `num_drafts`
        are verified in this step). `hit` is given on the request's first allocation after a
        lookup. Returns None, changing nothing, when the free blocks do not suffice."""
        rid = req.request_id
        first = rid not in self._live
        if first and hit is None:
            hit = no_hit(len(self.attention), len(self.ssm))
        resume = hit.resume_point if hit else 0
        checkpoint = self.will_checkpoint(req, end)
        snapshot = self.will_snapshot(req, end, num_drafts)
        internal = self.internal_writes(req, start, end)
        total = end + num_lookahead
        need = need_pages = 0
        for i, m in enumerate(self.attention):
            blocks = hit.attention_blocks[i] if first and hit else []
            need += m.blocks_needed(rid, blocks, resume, total)
        for i, s in enumerate(self.ssm):
            hit_block = hit.ssm_blocks[i] if first and hit else None
            need_pages += s.blocks_needed(rid, hit_block, checkpoint, snapshot)
        if self.state_pool is self.pool:
            need, need_pages = need + need_pages, 0
        self.retention.make_room(rid, need, need_pages, not first, self.pool)
        if need > self.pool.num_free or need_pages > self.state_pool.num_free:
            return None
        internal = self._fit_writes(
            req, internal, need if self.state_pool is self.pool else need_pages
        )
        if first:
            assert hit is not None
            protect = self._live[rid] = protected_depth(self.config, self.bounds, req, resume)
            for i, m in enumerate(self.attention):
                m.adopt(rid, hit.attention_blocks[i], resume, req.num_prompt_tokens)
            for i, s in enumerate(self.ssm):
                s.adopt(rid, hit.ssm_blocks[i] if resume else None, protect)
            self.retention.on_admit(req, hit)
            self._record_admission(req, hit)
        copied = len(self._copies)
        for m in self.attention:
            m.grow(rid, total, self._copies)
        self._sources.note(self._copies[copied:], self._live[rid])
        t, stops, drop = req.num_prompt_tokens, req.junction_stops, req.drop_stops
        hints = req.hint_stops
        kinds = tuple(self.bounds.state_kind(p, t, stops, drop, hints) for p in internal)
        kind = self.bounds.state_kind(end, t, stops, drop, hints) if checkpoint else ""
        states = tuple(
            s.plan_step(rid, end, checkpoint, snapshot, internal, kinds, kind) for s in self.ssm
        )
        return StepAllocation(tuple(m.block_table(rid) for m in self.attention), states, checkpoint)

    def commit(self, req: Request) -> None:
        """After the forward: publish keys for the request's verified tokens (never drafts)."""
        rid = req.request_id
        if rid not in self._live:
            return
        for observe in self._commit_observers:
            observe(req)
        # verified states whose tokens the request kept (a stop or max_tokens may cut drafts)
        last = min(req.num_computed_tokens, req.num_tokens - 1)
        for s in self.ssm:
            s.commit(rid, req.hashes, last)
        if self.config.enable_prefix_caching:
            for m in self.attention:
                m.publish(rid, req.hashes, req.num_computed_tokens)

    def free(self, req: Request) -> None:
        rid = req.request_id
        self.retention.on_free(rid)
        if rid not in self._live:
            return
        reused = self._live.pop(rid)  # its path joins the protected queue (`protected_depth`)
        for s in reversed(self.ssm):
            s.free(rid, req.hashes, reused)
        for m in reversed(self.attention):
            m.free(rid, reused)

    def take_copies(self) -> list[tuple[int, int]]:
        """Block copies (src, dst) for the runner to perform before the next forward. The
        sources were pinned until now; they are released here."""
        copies, self._copies = self._copies, []
        self._sources.release(self.pool, copies)
        return copies

    # -- accounting ------------------------------------------------------------------------------

    def _record_admission(self, req: Request, hit: CacheHit) -> None:
        st = self._stats
        st.admissions += 1
        st.query_tokens += req.num_tokens
        st.hit_tokens += hit.resume_point
        st.store_hit_tokens += hit.store_hit_tokens
        st.lost_reuse_tokens += hit.lost_reuse

    def stats(self) -> CacheStats:
        st = self._stats
        st.free_blocks = self.pool.num_free
        st.used_blocks = self.pool.num_blocks - 1 - self.pool.num_free
        st.cached_blocks = self.pool.num_cached
        if self.state_pool is not self.pool:
            st.num_state_pages = self.state_pool.num_blocks
            st.free_state_pages = self.state_pool.num_free
            st.cached_state_pages = self.state_pool.num_cached
        return st

    def check_integrity(self) -> None:
        for pool in self.pools:
            pool.check_integrity()

    @property
    def num_live_requests(self) -> int:
        return len(self._live)
