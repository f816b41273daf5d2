"""The block pool: fixed blocks shared by every layer group, ref counts, keys, eviction.

Block 0 is the null block (never allocated, never keyed). A block is either referenced
(ref_cnt > 0) or in the free queue; a free block may still carry keys (a cached block), and
loses them only when it is reallocated (evicted).

Free blocks are reused in this order (head, next to reuse, on the left):

    [unkeyed frees ...] [low-priority keyed frees ...] [keyed frees, LRU] [protected, LRU]
     ^ freed unkeyed     ^ speculative pages (decode    ^ every other     ^ cached blocks hit
       blocks             snapshots): FIFO, evicted       cached block      `PROTECT_HITS`
                          before any other cached block                     times or more

A low-priority page that is hit and freed again joins the ordinary LRU queue. The
low-priority queue goes before the others only while its head is worth no more than theirs
(`worth`: its kind's chance times what a hit on its deepest key saves, `saving`, set by the
cache manager to `Boundaries.hit_saving`; on a chat a fresh snapshot, hit most of the time,
outlives stale states of kinds nobody hits).

Frequency (a segmented LRU, issue 47). The protected queue is evicted only once no other
cached block is left: a prefix that several requests reused outlives a flood of prompts no
one reuses (plain LRU weighs no frequency: twelve clients of one-off prompts turned a 400-page
pool over between two uses of a shared system prompt). What joins it is the owner's call: a
request that resumed from a hit frees what it holds there (`free(..., protect=...)`,
`refresh(..., protect=...)`; `PROTECT_PATHS`), its attention blocks and its states together,
since a hybrid hit needs both: the blocks keyed at or below a position (the prefix it
declared and hit, `CacheKnobs.protect_declared`), or its whole path (`PROTECT_ALL`: its new
blocks, its turn-end state, its decode snapshot; every hit, `CacheKnobs.protect_reused`).
With `protect_hits` (`protect_reused`) a keyed block freed after `PROTECT_HITS` hits since
it was keyed joins it too. The protected queue holds at most
1/`PROTECTED_FRACTION` of the pool's blocks; past that its least recently freed block goes
back to the most recently freed end of the ordinary queue, as if freed now (it must be hit
again to be protected again). A scored pool (`value`) has no protected queue: its score
already weighs the kind's chance. docs/admission.md, "Hints and floods".

`refresh` moves free cached blocks back to the most recently freed end (or re-scores them),
as if freed now, without counting a hit: an SSM checkpoint is freed to the cache the step it is
written, but the attention blocks of the same prefix only when their request lets go, often
tens of seconds later. Aged from its write, the state would be evicted first and leave those
blocks cached but unusable (a hybrid hit needs both); the SSM manager refreshes a request's
states when it lets go (`SSMManager.free`), and `demote`s to the low-priority queue those of a
kind rarely hit (a tail checkpoint on a trace with no identical resends).

With a `value` (`flop-aware` eviction, `hycache.cache.eviction`) the last queue is a heap
instead: each keyed free block gets, when it is freed, the score
`freed_at / (num_blocks - 1) + value`, with `freed_at` a counter of keyed frees and `value` the
largest `value(key, position)` over its keys times its kind's chance (`ReuseStats` below),
and the lowest score is evicted first (ties:
least recently freed, so the order is deterministic). A hit removes the entry (lazily: a stale
heap entry is skipped when it surfaces, and the heap is rebuilt when stale entries outnumber
live ones), so an eviction costs O(log n). Without a value the pool is exactly the LRU above.

A block may carry several keys: one per registered position (a full-block key and mid-block
keys). Every key is `(group_id, prefix hash)`.

Evictions are counted (`num_evicted`, and per group in `evicted`) and announced as "removed"
key events: the retention policy's ghosts follow them (`hycache.cache.retention.ghosts`).

Reuse by kind (`ReuseStats`). The first key put on a block gives it a kind (the managers name
it: "attention", or an SSM state's `StateKind` from the boundaries module). Once per keying a
block is resolved: hit (its first `touch` while keyed) or lost (evicted never hit). Per kind,
`(hit + 1) / (resolved + 2)` is the observed chance that an entry of that kind is hit before
it is evicted: what admission (`hycache.cache.retention`) and the `flop-aware` score weigh an
entry's value by.
"""

from __future__ import annotations

import heapq
import sys
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from hycache.hashing import Hash

NULL_BLOCK = 0
PROTECT_HITS = 1  # a cached block freed after this many hits joins the protected queue
PROTECTED_FRACTION = 16  # the protected queue holds at most 1/16 of the pool's blocks
# a request that resumed from a hit frees every cached block it holds (attention blocks, its
# states, its decode snapshot) into the protected queue: the path it extends stays together
PROTECT_PATHS = True
# `free` / `refresh`'s `protect` for a whole path: every keyed block, whatever its positions
PROTECT_ALL = sys.maxsize


class CacheKey(NamedTuple):
    group: int
    hash: Hash


KeyLookup = Callable[[CacheKey], int | None]  # a key -> the block holding it, or None
# a key and its position -> what keeping it is worth, in pool turnovers (`flop-aware`)
BlockValue = Callable[[CacheKey, int], float]


@dataclass(frozen=True)
class BlockEvent:
    """A key stored on or removed from a block; sent to subscribers (e.g. a store mirror)."""

    kind: str  # "stored" | "removed"
    key: CacheKey
    block_id: int
    position: int


class ReuseStats:
    """Per entry kind: keyed blocks resolved (hit, or evicted never hit) and of those hit."""

    def __init__(self) -> None:
        self.hit: Counter[str] = Counter()
        self.resolved: Counter[str] = Counter()

    def chance(self, kind: str) -> float:
        """The observed chance an entry of `kind` is hit before it is evicted (a uniform prior:
        0.5 before anything is resolved)."""
        return (self.hit[kind] + 1) / (self.resolved[kind] + 2)

    def record(self, kind: str, hit: bool) -> None:
        self.resolved[kind] += 1
        self.hit[kind] += hit


class NoFreeBlocksError(RuntimeError):
    pass


class IntegrityError(AssertionError):
    pass


class BlockPool:
    """`value`: score keyed free blocks for eviction (see the module docstring), times the
    observed chance of their kind (`ReuseStats`); None: LRU. `snapshots_first`: with a value,
    low-priority pages (decode snapshots) still go before every other cached block; False
    scores them like the rest. `protect`: the protected queue (LRU only), which blocks join
    when freed or refreshed with a `protect` depth that reaches them; `protect_hits`: and every
    block freed after `PROTECT_HITS` hits (`CacheKnobs.protect_reused`)."""

    def __init__(
        self,
        num_blocks: int,
        value: BlockValue | None = None,
        *,
        snapshots_first: bool = True,
        protect: bool = False,
        protect_hits: bool = False,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks: need at least 2 (one is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.keys: list[list[tuple[CacheKey, int]]] = [[] for _ in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._free_low: OrderedDict[int, None] = OrderedDict()
        # frequency: free cached blocks hit `PROTECT_HITS` times or more, evicted last (LRU)
        self._protected: OrderedDict[int, None] = OrderedDict()
        protect = protect or protect_hits
        self.protected_cap = max(1, (num_blocks - 1) // PROTECTED_FRACTION) if protect else 0
        self.protect_hits = protect_hits
        self._key_to_block: dict[CacheKey, int] = {}
        self._subscribers: list[Callable[[BlockEvent], None]] = []
        self.value = value
        self.snapshots_first = snapshots_first
        self._scored: dict[int, int] = {}  # keyed free block -> its heap entry's `freed_at`
        self._heap: list[tuple[float, int, int]] = []  # (score, freed_at, block)
        self._clock = 0  # keyed frees so far
        # reuse accounting (the admission analysis): hits on a block since it was last keyed,
        # and per (group, low priority, ever hit) the keyed blocks evicted
        self.hits = [0] * num_blocks
        self._low = [False] * num_blocks  # freed as low priority while keyed
        self.evicted: Counter[tuple[int, bool, bool]] = Counter()
        self.kind = [""] * num_blocks  # the entry kind of a keyed block (its first key's)
        self.reuse = ReuseStats()
        self.num_evicted = 0  # keyed blocks evicted so far
        # what a hit on an entry of a kind at a position saves, in tokens (the owner sets
        # `Boundaries.hit_saving`; by default the position)
        self.saving: Callable[[str, int], int] = lambda _kind, position: position

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._free_low) + len(self._scored) + len(self._protected)

    @property
    def num_protected(self) -> int:
        """Free cached blocks in the protected queue (at most `protected_cap`)."""
        return len(self._protected)

    @property
    def num_cached(self) -> int:
        """Blocks carrying at least one key (referenced or free)."""
        return sum(1 for k in self.keys if k)

    def lookup(self, key: CacheKey) -> int | None:
        """The block holding `key`, or None. Does not modify the pool."""
        return self._key_to_block.get(key)

    def is_free(self, block_id: int) -> bool:
        return (
            block_id in self._free
            or block_id in self._free_low
            or block_id in self._scored
            or block_id in self._protected
        )

    def peek_victim(self) -> int | None:
        """The keyed free block the pool will evict first (unkeyed free blocks are handed out
        before it), or None when no free block carries a key: what a page kept now displaces
        once the unkeyed ones are gone."""
        if self.value is not None:
            lru = self._scored_head()
        else:
            lru = next((b for b in self._free if self.keys[b]), None)
            if lru is None:
                lru = next(iter(self._protected), None)
        return next(iter(self._free_low)) if self._low_goes_first(lru) else lru

    def _scored_head(self) -> int | None:
        """The lowest-scored keyed free block of a scored pool (stale heap entries dropped)."""
        while self._heap and self._scored.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)  # stale
        return self._heap[0][2] if self._heap else None

    def unkeyed_free(self, limit: int) -> int:
        """Free blocks carrying no key (handed out before any cached one), up to `limit`."""
        n = 0
        for b in self._free:  # the unkeyed ones lead the queue
            if n >= limit or self.keys[b]:
                break
            n += 1
        return n

    def deepest(self, block_id: int) -> int:
        """The deepest position a cached block is keyed at."""
        return max(pos for _, pos in self.keys[block_id])

    def worth(self, block_id: int) -> float:
        """A cached block's expected saving: its kind's chance times what a hit on its deepest
        key saves (`saving`)."""
        kind = self.kind[block_id]
        return self.reuse.chance(kind) * self.saving(kind, self.deepest(block_id))

    def _low_goes_first(self, lru_head: int | None) -> bool:
        """Whether the low-priority queue's head is evicted before `lru_head`, the first keyed
        block of the LRU queue (None: there is none): while it is worth no more."""
        if not self._free_low:
            return False
        if lru_head is None:
            return True
        return self.worth(next(iter(self._free_low))) <= self.worth(lru_head)

    @property
    def under_pressure(self) -> bool:
        """A keyed block has been evicted: the pool has filled, so a page taken now pushes
        a cached entry out."""
        return bool(self.evicted)

    def subscribe(self, callback: Callable[[BlockEvent], None], weak: bool = False) -> None:
        """Call `callback` with every key event. `weak` (a bound method): through a weak
        reference to its object, so the pool does not keep the subscriber alive (the
        subscriber may hold the pool without a reference cycle)."""
        if weak:
            ref = weakref.WeakMethod(callback)  # type: ignore[arg-type]

            def call(event: BlockEvent) -> None:
                target = ref()
                if target is not None:
                    target(event)

            callback = call
        self._subscribers.append(callback)

    # -- allocation ----------------------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks from the head of the free queue, evicting their keys."""
        if n > self.num_free:
            raise NoFreeBlocksError(f"need {n} blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            block_id = self._pop_next()
            self._evict(block_id)
            self.ref_cnt[block_id] = 1
            out.append(block_id)
        return out

    def _pop_next(self) -> int:
        """Take the next free block off its queue, in the module diagram's order."""
        head = next(iter(self._free), None)
        if head is not None and not self.keys[head]:  # unkeyed pages go first
            return self._free.popitem(last=False)[0]
        if self.value is not None:
            head = self._scored_head()
        elif head is None:
            head = next(iter(self._protected), None)
        if self._low_goes_first(head):
            return self._free_low.popitem(last=False)[0]
        if self.value is not None:
            return self._pop_scored()
        return (self._free or self._protected).popitem(last=False)[0]

    def _pop_scored(self) -> int:
        while True:
            _, freed_at, block_id = heapq.heappop(self._heap)
            if self._scored.get(block_id) == freed_at:
                del self._scored[block_id]
                return block_id

    def _push_scored(self, block_id: int) -> None:
        assert self.value is not None
        self._clock += 1
        value = max(self.value(k, pos) for k, pos in self.keys[block_id])
        value *= self.reuse.chance(self.kind[block_id])
        score = self._clock / (self.num_blocks - 1) + value
        self._scored[block_id] = self._clock
        heapq.heappush(self._heap, (score, self._clock, block_id))
        if len(self._heap) > 2 * len(self._scored) + 64:  # drop the stale entries
            self._heap = [e for e in self._heap if self._scored.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on cached blocks (a cache hit); free ones leave the queue."""
        for b in block_ids:
            if b == NULL_BLOCK:
                continue
            if self.ref_cnt[b] == 0:
                if b in self._scored:
                    del self._scored[b]  # its heap entry is now stale
                else:
                    self._queue_of(b).pop(b)
            if self.keys[b]:
                if not self.hits[b]:
                    self.reuse.record(self.kind[b], hit=True)
                self.hits[b] += 1
            self.ref_cnt[b] += 1

    def _queue_of(self, block_id: int) -> OrderedDict[int, None]:
        """The ordered free queue holding `block_id` (not for a scored block)."""
        if block_id in self._free_low:
            return self._free_low
        return self._protected if block_id in self._protected else self._free

    def _protects(self, block_id: int, depth: int) -> bool:
        """Whether a `protect` depth takes this keyed block into the protected queue: it has
        one (LRU only) and the block carries a key at or below `depth` (0: none)."""
        keys = self.keys[block_id]
        if not (depth and self.protected_cap and keys and self.value is None):
            return False
        return depth == PROTECT_ALL or min(pos for _, pos in keys) <= depth

    def _protect(self, block_id: int) -> None:
        """Queue a free cached block hit `PROTECT_HITS` times as protected (most recent end);
        past the bound, the least recently freed protected block goes back to the ordinary
        queue's most recent end."""
        self._protected[block_id] = None
        if len(self._protected) > self.protected_cap:
            self._free[self._protected.popitem(last=False)[0]] = None

    def free(
        self, block_ids: Iterable[int], low_priority: bool = False, protect: int = 0
    ) -> None:
        """Drop one reference from each block, in the order given (pass a request's blocks tail
        first, so its tail is evicted before its head). `low_priority` cached blocks are
        evicted before every other cached block (see the module diagram); `protect`: a
        position, cached blocks keyed at or below it (`PROTECT_ALL`: every one) join the
        protected queue whatever their hits (a protected path, `PROTECT_PATHS`), and win over
        `low_priority`."""
        for b in block_ids:
            if b == NULL_BLOCK:
                continue
            if self.ref_cnt[b] <= 0:
                raise IntegrityError(f"block {b} freed with ref_cnt {self.ref_cnt[b]}")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self._protects(b, protect):
                    self._protect(b)
                    continue
                if low_priority and self.keys[b]:
                    self._low[b] = True
                    if self.value is None or self.snapshots_first:
                        self._free_low[b] = None
                        continue
                if self.value is not None and self.keys[b]:
                    self._push_scored(b)
                    continue
                if self.protect_hits and self.keys[b] and self.hits[b] >= PROTECT_HITS:
                    self._protect(b)
                    continue
                self._free[b] = None
                if not self.keys[b]:
                    self._free.move_to_end(b, last=False)

    def demote(self, block_ids: Iterable[int]) -> None:
        """Move free cached blocks of the LRU queue to the end of the low-priority queue, in
        the order given: evicted before every other cached block, as decode snapshots are. A
        scored pool (or a referenced, unkeyed or already low block) is left as it is: its
        score already weighs the block's kind."""
        for b in block_ids:
            if b in self._free and self.keys[b] and self.value is None:
                del self._free[b]
                self._free_low[b] = None

    def lru_blocks_of(self, kinds: Iterable[str]) -> list[int]:
        """The free cached blocks of the LRU queue whose kind is one of `kinds`, least recently
        freed first (a scored pool has none there: its score already weighs the kind)."""
        wanted = set(kinds)
        return [b for b in self._free if self.keys[b] and self.kind[b] in wanted]

    def refresh(self, block_ids: Iterable[int], protect: int = 0) -> None:
        """Re-queue free cached blocks as if freed now, in the order given (the first is
        evicted first); referenced, unkeyed and low-priority blocks stay where they are. Not a
        hit: no reuse is recorded. `protect`: those of the ordinary queue it reaches (as in
        `free`) join the protected one (a protected path's states, `PROTECT_PATHS`)."""
        for b in block_ids:
            if b == NULL_BLOCK or self.ref_cnt[b] or not self.keys[b]:
                continue
            if b in self._scored:
                self._push_scored(b)  # a new entry; the old one is now stale
            elif b in self._free and self._protects(b, protect):
                del self._free[b]
                self._protect(b)
            elif b in self._free:
                self._free.move_to_end(b)
            elif b in self._protected:
                self._protected.move_to_end(b)

    # -- keys ------------------------------------------------------------------------------------

    def add_key(self, block_id: int, key: CacheKey, position: int, kind: str = "") -> bool:
        """Register `key` on a referenced block; the first key gives the block its `kind` (see
        `ReuseStats`). Returns False (and changes nothing) when the key already names a block:
        the first writer wins."""
        if block_id == NULL_BLOCK or self.ref_cnt[block_id] <= 0:
            raise IntegrityError(f"key published on unreferenced block {block_id}")
        if key in self._key_to_block:
            return False
        self._key_to_block[key] = block_id
        if not self.keys[block_id]:
            self.kind[block_id] = kind
        self.keys[block_id].append((key, position))
        self._emit(BlockEvent("stored", key, block_id, position))
        return True

    def _evict(self, block_id: int) -> None:
        keys = self.keys[block_id]
        if keys:
            self.evicted[(keys[0][0].group, self._low[block_id], self.hits[block_id] > 0)] += 1
            self.num_evicted += 1
            if not self.hits[block_id]:
                self.reuse.record(self.kind[block_id], hit=False)
        for key, position in keys:
            del self._key_to_block[key]
            self._emit(BlockEvent("removed", key, block_id, position))
        self.keys[block_id] = []
        self.hits[block_id] = 0
        self._low[block_id] = False
        self.kind[block_id] = ""

    def _emit(self, event: BlockEvent) -> None:
        for cb in self._subscribers:
            cb(event)

    # -- integrity ---------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """free + referenced + null == total; keys point at live keyed blocks; no ref < 0."""
        referenced = 0
        for b in range(1, self.num_blocks):
            r = self.ref_cnt[b]
            if r < 0:
                raise IntegrityError(f"block {b} has ref_cnt {r}")
            if r > 0:
                referenced += 1
                if self.is_free(b):
                    raise IntegrityError(f"referenced block {b} is in the free queue")
            elif (b in self._free) + (b in self._free_low) + (b in self._scored) + (
                b in self._protected
            ) != 1:
                raise IntegrityError(f"block {b} has no references and is not free exactly once")
            elif (b in self._free_low or b in self._scored or b in self._protected) and not (
                self.keys[b]
            ):
                raise IntegrityError(f"unkeyed block {b} is in a keyed-only queue")
            elif self.value is not None and b in self._free and self.keys[b]:
                raise IntegrityError(f"keyed block {b} is in the unkeyed queue of a scored pool")
        if len(self._protected) > self.protected_cap:
            raise IntegrityError(f"{len(self._protected)} protected blocks past the bound")
        if self.ref_cnt[NULL_BLOCK] != 0 or self.is_free(NULL_BLOCK):
            raise IntegrityError("the null block was allocated")
        if self.num_free + referenced + 1 != self.num_blocks:
            raise IntegrityError(
                f"free {self.num_free} + referenced {referenced} + null != {self.num_blocks}"
            )
        for key, b in self._key_to_block.items():
            if all(k != key for k, _ in self.keys[b]):
                raise IntegrityError(f"key {key} maps to block {b}, which does not carry it")
        live = {(t, b) for b, t in self._scored.items()}
        if len(live & {(t, b) for _, t, b in self._heap}) != len(self._scored):
            raise IntegrityError("a scored free block has no live heap entry")
        n_keys = sum(len(k) for k in self.keys)
        if n_keys != len(self._key_to_block):
            raise IntegrityError(f"{n_keys} keys on blocks, {len(self._key_to_block)} in the map")
