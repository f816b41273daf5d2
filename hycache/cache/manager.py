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

from hycache.cache.admission import Admission, HintBound
from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import NULL_BLOCK, BlockEvent, BlockPool, CacheKey
from hycache.cache.boundaries import Boundaries, StateKind
from hycache.cache.coordinator import CacheHit, find_joint_hit, no_hit
from hycache.cache.eviction import FlopValue
from hycache.cache.mirror import BlockIO, StoreMirror
from hycache.cache.ssm import SSMManager, StateIO
from hycache.config import (
    CacheConfig,
    Eviction,
    GroupKind,
    Policy,
    RecomputeCost,
    SpeculativeConfig,
)
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
        first, protect = value is None, cache.protect_reused
        self.pool = BlockPool(cache.num_blocks, value, snapshots_first=first, protect=protect)
        self.state_pool = (
            BlockPool(cache.num_state_pages, value, snapshots_first=first, protect=protect)
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
        self._live: set[str] = set()
        self.admission = (
            Admission(self.state_pool, saving=self.bounds.hit_saving) if cache.admission else None
        )
        self._snapshot_admitted: dict[str, bool] = {}  # admission: per live request
        ssm_groups = tuple(s.group for s in self.ssm)
        self._hints = HintBound(self.state_pool, ssm_groups) if ssm_groups else None
        # admission: per held decode snapshot, its position and the pool's evictions then
        self._held: dict[str, tuple[int, int]] = {}
        self._final: dict[str, int] = {}  # per live request: prompt + max_tokens + k tokens
        self._k = spec.num_speculative_tokens
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
        self.admission = None
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
        (`Boundaries.should_checkpoint`) that admission keeps (`admits`)."""
        return (
            bool(self.ssm)
            and self.config.enable_prefix_caching
            and self.bounds.should_checkpoint(end, req.num_prompt_tokens, req.junction_stops)
            and self.admits(req, end)
        )

    def internal_writes(self, req: Request, start: int, end: int) -> tuple[int, ...]:
        """Checkpoints the forward of [start, end) writes inside the chunk (internal
        checkpoints that admission keeps; the chunk end's own state is `will_checkpoint`'s)."""
        if not self.ssm or not self.config.enable_prefix_caching:
            return ()
        writes = self.bounds.internal_writes(start, end, req.num_prompt_tokens, req.junction_stops)
        return tuple(p for p in writes if self.admits(req, p))

    @property
    def gates_prompt_states(self) -> bool:
        """Admission decides on prompt states: every one is written inside a forward and no
        prefill stop promises it (internal checkpoints, any policy but `lookahead`, whose
        stops and export are vLLM's)."""
        return (
            self.admission is not None
            and self.bounds.internal
            and self.bounds.effective_policy is not Policy.LOOKAHEAD
        )

    def admits(self, req: Request, position: int) -> bool:
        """Whether the prompt state at `position` (a checkpoint position) takes a page now."""
        if not self.gates_prompt_states:
            return True
        assert self.admission is not None
        kind = self.bounds.state_kind(
            position, req.num_prompt_tokens, req.junction_stops, req.drop_stops, req.hint_stops
        )
        hints = self._hints if kind == StateKind.HINT else None
        if hints is not None and not hints.room(req, position):
            return False  # past the request's or its salt's bound (`HintBound`)
        saved = self.bounds.hit_saving(kind, position)
        admitted = self.admission.admit(kind, saved, len(self._live))
        if admitted and hints is not None:
            hints.record(req, position)
        return admitted

    def _fit_writes(self, req: Request, writes: tuple[int, ...], need: int) -> tuple[int, ...]:
        """The internal checkpoints this step can write beside the `need` pages it takes from
        the state pool anyway (one page per SSM group each): all of them, or, under pressure,
        the observed junctions first, then the lower positions. What is left out is counted
        (`internal_writes_dropped`), never an admission refused for it."""
        if not writes or not self.ssm:
            return writes
        room = max(self.state_pool.num_free - need, 0) // len(self.ssm)
        if room >= len(writes):
            return writes
        junctions = set(req.junction_stops)
        ranked = sorted(writes, key=lambda p: (p not in junctions, p))
        self.internal_writes_dropped += len(writes) - room
        return tuple(sorted(ranked[:room]))

    def will_snapshot(self, req: Request, end: int, num_drafts: int) -> bool:
        """A step that samples (its chunk reaches the last known token) and may verify a unit
        boundary: its SSM groups get a snapshot block (`limit`). With admission the request's
        first such step decides for its whole decode (`Admission.admit` of a snapshot at
        `end`): the page is held from then on, unless a page runs short (`_release`)."""
        if not (
            bool(self.ssm)
            and self.config.enable_prefix_caching
            and end == req.num_tokens
            and self.bounds.decode_snapshot(end, end + num_drafts) > 0
        ):
            return False
        if self.admission is None:
            return True
        rid = req.request_id
        if rid not in self._snapshot_admitted:
            admitted = self.admission.admit(StateKind.SNAPSHOT, end, self.pages_to_come())
            self._snapshot_admitted[rid] = admitted
            if admitted:
                self._held[rid] = (end, self.state_pool.num_evicted)
        return self._snapshot_admitted[rid]

    def pages_to_come(self) -> int:
        """The pages the running requests, and the waiting ones that will join them (up to
        `max_num_seqs`), still take before they finish: one each (its state page), the
        attention blocks each live one lacks to its prompt, `max_tokens` and lookahead, and
        for each one to join as many as the live ones end with on average. A page held until
        its request finishes competes with all of them."""
        if not self._final:
            return 0
        b = self.bounds.block_size
        final = {rid: -(-t // b) * len(self.attention) for rid, t in self._final.items()}
        lacking = sum(
            max(final[rid] - sum(len(m.block_table(rid)) for m in self.attention), 0)
            for rid in self._live
        )
        to_join = self.num_waiting
        if self.max_num_seqs:
            to_join = min(to_join, max(self.max_num_seqs - len(self._live), 0))
        mean = sum(final.values()) / len(final)
        return len(self._live) + lacking + int(to_join * (mean + 1))

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
        if self._held:
            self._release(rid, need, need_pages, running=not first)
        if need > self.pool.num_free or need_pages > self.state_pool.num_free:
            return None
        internal = self._fit_writes(
            req, internal, need if self.state_pool is self.pool else need_pages
        )
        if first:
            assert hit is not None
            for i, m in enumerate(self.attention):
                m.adopt(rid, hit.attention_blocks[i], resume, req.num_prompt_tokens)
            for i, s in enumerate(self.ssm):
                s.adopt(rid, hit.ssm_blocks[i] if resume else None)
            self._live.add(rid)
            self._final[rid] = req.num_prompt_tokens + req.sampling.max_tokens + self._k
            self._record_admission(req, hit)
        for m in self.attention:
            m.grow(rid, total, self._copies)
        t, stops, drop, hints = (
            req.num_prompt_tokens, req.junction_stops, req.drop_stops, req.hint_stops
        )
        kinds = tuple(self.bounds.state_kind(p, t, stops, drop, hints) for p in internal)
        kind = self.bounds.state_kind(end, t, stops, drop, hints) if checkpoint else ""
        states = tuple(
            s.plan_step(rid, end, checkpoint, snapshot, internal, kinds, kind) for s in self.ssm
        )
        return StepAllocation(tuple(m.block_table(rid) for m in self.attention), states, checkpoint)

    def _release(self, rid: str, need: int, need_pages: int, running: bool) -> None:
        """Before a step of `rid` takes `need` attention and `need_pages` state pages (one
        pool: `need`): give back decode snapshot pages other live requests hold (newest first;
        never one the planned step writes). While the pages would not all come from unkeyed
        free ones, a snapshot worth less than a page (`Admission.page_value`) goes back; then,
        if `running` (a running request's step: else it waits) and the pages still do not
        fit, any held snapshot goes back rather than a request being preempted. A snapshot
        given back counts as one never hit (`ReuseStats`); its request keeps none."""
        assert self.admission is not None
        shared = self.state_pool is self.pool
        pool, n = (self.pool, need) if shared else (self.state_pool, need_pages)
        if pool.unkeyed_free(n) >= n:  # the step's pages come from unkeyed free ones
            return
        chance = pool.reuse.chance(StateKind.SNAPSHOT)
        # newest request first (the one a preemption would pick)
        held = [r for r in reversed(self.ssm[0].request_ids()) if r in self._held and r != rid]
        for other in held:
            if pool.unkeyed_free(n) >= n or pool.peek_victim() is None:
                break
            position = self.ssm[0].snapshot_position(other) or self._held[other][0]
            if chance * position < self.admission.page_value(StateKind.SNAPSHOT):
                self._give_back(other)
        if running:
            for other in held:
                if n <= pool.num_free or (not shared and need > self.pool.num_free):
                    break
                if other in self._held:
                    self._give_back(other)

    def _give_back(self, rid: str) -> None:
        if all(s.release_snapshot(rid) for s in self.ssm):
            del self._held[rid]
            self._snapshot_admitted[rid] = False

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
        self._snapshot_admitted.pop(rid, None)
        if self._hints is not None:
            self._hints.free(rid)
        held = self._held.pop(rid, None)
        if held is not None and self.admission is not None:
            self.admission.record_hold(self.state_pool.num_evicted - held[1])
        if rid not in self._live:
            return
        self._live.discard(rid)
        self._final.pop(rid, None)
        for s in reversed(self.ssm):
            s.free(rid, req.hashes)
        for m in reversed(self.attention):
            m.free(rid)

    def take_copies(self) -> list[tuple[int, int]]:
        """Block copies (src, dst) for the runner to perform before the next forward. The
        sources were pinned until now; they are released here."""
        copies, self._copies = self._copies, []
        self.pool.free(src for src, _ in copies)
        return copies

    # -- accounting ------------------------------------------------------------------------------

    def _record_admission(self, req: Request, hit: CacheHit) -> None:
        if self.admission is not None and self.admission.pool.num_evicted:
            self._record_ghost_hit(req, hit)
        st = self._stats
        st.admissions += 1
        st.query_tokens += req.num_tokens
        st.hit_tokens += hit.resume_point
        st.store_hit_tokens += hit.store_hit_tokens
        st.lost_reuse_tokens += hit.lost_reuse

    def _record_ghost_hit(self, req: Request, hit: CacheHit) -> None:
        """Tell admission how much deeper this admission's hit would have been had the state
        pool still held its ghosts (`BlockPool.ghosts`)."""
        assert self.admission is not None
        pool = self.admission.pool

        def lookup(key: CacheKey) -> int | None:
            found = self.pool_for(key.group).lookup(key)
            if found is None and self.pool_for(key.group) is pool and pool.is_ghost(key):
                return NULL_BLOCK  # a stand-in: the joint hit only reads its position
            return found

        ghost = find_joint_hit(
            self.attention, self.ssm, req.hashes, req.num_tokens, self.bounds, lookup
        )
        if ghost.resume_point > hit.resume_point:
            self.admission.record_ghost_hit(ghost.resume_point - hit.resume_point)

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
