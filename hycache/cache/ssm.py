"""SSM (Mamba, "align" mode) group manager: state blocks and exact-position checkpoints.

An SSM layer keeps one state, overwritten in place, so a prefix is reusable only where a copy
of the state at exactly that position was kept. Each step reads its initial state from `src`
and writes its final state to `dst`:

    step ends at a checkpoint:   src ──forward──▶ fresh block F   (F keyed at `end` after the
                                                                   forward; next step reads F)
    any other step:              src ──forward──▶ running block R (overwritten every step)

So a checkpoint is frozen the moment it is written: the next forward writes elsewhere, and the
running block is never keyed. States that are not checkpoints live only in R and are gone at
once (retention). Keys are published in `commit`, after the forward that wrote them, so a
request scheduled in the same step cannot hit them (architecture §4.7).

Decode snapshots (`limit`): a decoding request holds one more block S, into which the runner
copies the exact state whenever a sampling step verifies a unit boundary. S is keyed when the
request releases its blocks, at the last position it holds, so the next chat turn resumes
there. Where released states go in the eviction order: `hycache.cache.retention.aging`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hycache.cache.block_pool import BlockPool, CacheKey, KeyLookup
from hycache.cache.boundaries import Boundaries, StateKind
from hycache.cache.retention.aging import ReleaseAging
from hycache.hashing import PrefixHashes


def find_ssm_hit(
    hashes: PrefixHashes, lookup: KeyLookup, group: int, unit: int, limit: int
) -> tuple[int, int | None]:
    """Largest n <= limit with a checkpoint keyed at exactly n, scanning right to left, and its
    block. Pure: `lookup` is only read."""
    for n in range(limit // unit * unit, 0, -unit):
        b = lookup(CacheKey(group, hashes.at(n)))
        if b is not None:
            return n, b
    return 0, None


@dataclass
class _State:
    src: int | None = None  # block the next step starts from (None: zeros)
    src_held: bool = False  # src is a hit block or our own checkpoint, referenced by us
    hit: int | None = None  # the block it resumed from, until it lets go of it
    protect: int = 0  # a protected path: its blocks keyed at or below this (`BlockPool.free`)
    running: int | None = None
    pending_dst: int | None = None
    pending_end: int = 0
    pending_checkpoint: bool = False
    pending_snapshot: bool = False
    pending_writes: tuple[tuple[int, int], ...] = ()  # (position, block) written in the forward
    pending_kinds: tuple[str, ...] = ()  # the `StateKind` of each pending write
    pending_kind: str = ""  # the `StateKind` of a pending checkpoint
    snapshot: int | None = None  # decode snapshot block S (never keyed while we hold it)
    snapshot_pos: int = 0  # the position S holds (0: nothing written yet)
    # the states this request keyed, (block, key): refreshed when it lets go
    kept: list[tuple[int, CacheKey]] = field(default_factory=list)


@dataclass(frozen=True)
class StateIO:
    """Where one request's step reads and writes its SSM state (None: start from zeros), and
    the block a decode snapshot is copied into when the step reaches a unit boundary."""

    src: int | None
    dst: int
    snapshot: int | None = None
    # internal checkpoints: (position, block) pairs the forward writes before reaching `dst`
    writes: tuple[tuple[int, int], ...] = ()


class SSMManager:
    kind = "ssm"

    def __init__(self, group: int, pool: BlockPool, bounds: Boundaries) -> None:
        self.group, self.pool, self.bounds = group, pool, bounds
        self._states: dict[str, _State] = {}
        self.aging = ReleaseAging(pool)  # where its states go when a request lets go

    def find_hit(
        self, hashes: PrefixHashes, limit: int, lookup: KeyLookup | None = None
    ) -> tuple[int, int | None]:
        return find_ssm_hit(hashes, lookup or self.pool.lookup, self.group, self.bounds.unit, limit)

    def blocks_needed(
        self, request_id: str, hit_block: int | None, checkpoint: bool, snapshot: bool = False
    ) -> int:
        st = self._states.get(request_id)
        need = 0
        if st is None and hit_block is not None and self.pool.ref_cnt[hit_block] == 0:
            need += 1
        if checkpoint or st is None or st.running is None:
            need += 1
        if snapshot and (st is None or st.snapshot is None):
            need += 1
        return need

    def adopt(self, request_id: str, hit_block: int | None, protect: int = 0) -> None:
        """Start from `hit_block` (None: zeros); `protect`: its path's (`BlockPool.free`)."""
        st = self._states[request_id] = _State(hit=hit_block, protect=protect)
        if hit_block is not None:
            self.pool.touch([hit_block])
            st.src, st.src_held = hit_block, True

    def plan_step(
        self,
        request_id: str,
        end: int,
        checkpoint: bool,
        snapshot: bool = False,
        internal: tuple[int, ...] = (),
        kinds: tuple[str, ...] = (),
        checkpoint_kind: str = "",
    ) -> StateIO:
        """Choose the destination of this step's final state (see the module diagram), the
        snapshot block when this sampling step may verify a unit boundary, and a fresh block
        for each checkpoint written inside the forward (`internal` positions). `kinds` (one per
        internal position) and `checkpoint_kind` name why each state is kept (`StateKind`),
        the kind its page is keyed with."""
        st = self._states[request_id]
        writes = tuple(zip(internal, self.pool.allocate(len(internal)), strict=True))
        st.pending_writes = writes
        st.pending_kinds = kinds or ("",) * len(writes)
        st.pending_kind = checkpoint_kind
        if checkpoint:
            (dst,) = self.pool.allocate(1)
        else:
            if st.running is None:
                (st.running,) = self.pool.allocate(1)
            dst = st.running
        if snapshot and st.snapshot is None:
            (st.snapshot,) = self.pool.allocate(1)
        st.pending_dst, st.pending_end = dst, end
        st.pending_checkpoint, st.pending_snapshot = checkpoint, snapshot
        return StateIO(st.src, dst, st.snapshot if snapshot else None, writes)

    def commit(self, request_id: str, hashes: PrefixHashes, last_verified: int) -> None:
        """The forward has written the planned state: key it if it is a checkpoint, and make it
        the source of the next step. Record the position a decode snapshot now holds (the step
        verified states up to `last_verified`)."""
        st = self._states[request_id]
        if st.pending_dst is None:
            return
        if st.pending_snapshot:
            pos = self.bounds.decode_snapshot(st.pending_end, last_verified)
            if pos:
                st.snapshot_pos = pos
        dst, end = st.pending_dst, st.pending_end
        for (pos, block), kind in zip(st.pending_writes, st.pending_kinds, strict=True):
            # frozen at once: keyed, then left to the cache
            key = CacheKey(self.group, hashes.at(pos))
            if self.pool.add_key(block, key, pos, kind):
                st.kept.append((block, key))
            self.pool.free([block])
        st.pending_writes = st.pending_kinds = ()
        if st.src_held and st.src is not None and st.src != dst:
            self.pool.free([st.src], protect=st.protect if st.src == st.hit else 0)
            st.hit = None  # released: its block id may come back as one of our own
        if st.pending_checkpoint:
            key = CacheKey(self.group, hashes.at(end))
            if self.pool.add_key(dst, key, end, st.pending_kind):
                st.kept.append((dst, key))
            st.src, st.src_held = dst, True
        else:
            st.src, st.src_held = dst, False
        st.pending_dst = None

    def free(self, request_id: str, hashes: PrefixHashes, protect: int = 0) -> None:
        """Release the request's blocks; a committed decode snapshot is keyed first (when its
        key exists: the tokens it covers are known), so it stays cached. `protect`: those keyed
        at or below it join the protected queue (a protected path, `BlockPool.free`)."""
        st = self._states.pop(request_id, None)
        if st is None:
            return
        blocks = []
        if st.snapshot is not None:
            pos = st.snapshot_pos
            if st.pending_dst is None and pos and pos <= hashes.num_hashed_tokens:
                key = CacheKey(self.group, hashes.at(pos))
                self.pool.add_key(st.snapshot, key, pos, StateKind.SNAPSHOT)
            # speculative: only a continuation of this conversation can use it
            self.pool.free([st.snapshot], low_priority=True, protect=protect)
        if st.pending_dst is not None and st.pending_dst != st.running:
            blocks.append(st.pending_dst)
        blocks.extend(block for _, block in st.pending_writes)  # planned, never written
        if st.src_held and st.src is not None:
            blocks.append(st.src)
        if st.running is not None:
            blocks.append(st.running)
        self.pool.free(blocks, False, protect)
        self.aging.release(st.kept, protect)

    def request_ids(self) -> list[str]:
        """The requests holding state here, in the order they were admitted."""
        return list(self._states)

    def snapshot_position(self, request_id: str) -> int:
        """The position the request's decode snapshot holds (0: none written yet)."""
        st = self._states.get(request_id)
        return st.snapshot_pos if st is not None and st.snapshot is not None else 0

    def release_snapshot(self, request_id: str) -> bool:
        """Give up the request's decode snapshot page (unkeyed, back to the free queue) when it
        holds one that no step planned now writes; True if a page was released."""
        st = self._states.get(request_id)
        if st is None or st.snapshot is None:
            return False
        if st.pending_dst is not None and st.pending_snapshot:  # the planned step writes it
            return False
        self.pool.free([st.snapshot])
        st.snapshot, st.snapshot_pos = None, 0
        return True

    def state_src(self, request_id: str) -> int | None:
        return self._states[request_id].src
