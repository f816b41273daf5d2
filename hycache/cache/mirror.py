"""The store mirror: the device cache's second tier, kept in step with it.

Puts follow the device cache. The pool announces every key it stores, which happens only in
`commit`, after the forward that computed it; `flush` (end of every scheduler update) writes:

    full attention block (key at a block end)  ──▶ the block's B rows
    SSM checkpoint (replay boundary, tail, junction stop, hint, decode snapshot: the positions
                    the boundaries module chose)  ──▶ the state
    mid-block attention key at p               ──▶ rows [floor(p/B)*B, p) of its block

Under `limit` every unit carries an attention key, so a block's rows would be stored B/u times
over; there a mid-block key is stored only where an SSM checkpoint has the same key (a resume
point needs both), and each full block also gets a unit index: the keys of its units, named
by its first unit's key. A reader that diverges inside a block finds the exact junction there
(to the unit, as the device cache would) and checkpoints at the limit, though no data was
stored at those units. Device eviction leaves the store untouched.

Lookup, after the device lookup (`CacheManager.fetch` drives it):

    device hit n0 ──▶ `lookup`: one batched `exists` for the keys above n0 the pool lacks
                  ──▶ the coordinator's `find_joint_hit` over device-or-store (the EAGLE rule
                      applied once, as for any hit)
                  ──▶ one batched `get` of the store objects on that path, each checked
                  ──▶ a `StoreHit` (what to load; no pool changed yet)
                  ──▶ `load`: fresh blocks, written and keyed
                  ──▶ the device lookup now finds the deeper hit; `settle` counts it

Loaded (and path) blocks keep a staging reference until the admission adopts them (`unstage`).
A device hit's own keys are queued for the next flush too, so the store heals: what it lost (or
missed during an outage) while the device still held it is written again once it is used.
Any object that is missing, corrupt or of the wrong size makes the whole fetch a miss (counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import BlockEvent, BlockPool, CacheKey
from hycache.cache.boundaries import Boundaries, floor_to
from hycache.cache.coordinator import CacheHit, find_joint_hit, usable_match
from hycache.cache.ssm import SSMManager
from hycache.config import GroupKind
from hycache.request import Request
from hycache.store import codec
from hycache.store.base import KVStore

UNITS = "units"  # the kind of a block's unit index object
MARKER = -(1 << 40)  # virtual ids at and below this: a unit the store knows, holding no data


class BlockIO(Protocol):
    """Moves one block's bytes between the device caches and a payload."""

    def read(self, group: int, block: int, rows: int) -> bytes:
        """Attention: the first `rows` rows of `block`; SSM: the state in slot `block`."""
        ...

    def write(self, group: int, block: int, payload: bytes) -> None: ...

    def payload_bytes(self, group: int, rows: int) -> int:
        """The exact payload size `read` gives for `rows` (SSM: `rows` is ignored)."""
        ...


@dataclass
class MirrorStats:
    lookups: int = 0  # admissions that asked the store
    hits: int = 0  # admissions the store took deeper
    hit_tokens: int = 0  # tokens those admissions gained from the store
    loaded_blocks: int = 0
    failed_fetches: int = 0  # missing, corrupt or mis-sized objects: the fetch became a miss
    no_room: int = 0  # a deeper hit the free blocks could not hold
    put_objects: int = 0
    put_refused: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class _StoreView:
    """The device pools with what one `exists` round trip found laid over them, as the
    joint-hit search reads them. The search deals in block ids, so a stored object stands in
    as a negative id (``-(i + 1)``, `stored[i]`) and a key known only from a unit index (no
    data: it can reveal a junction, never be loaded) as an id at or below ``MARKER``; device
    blocks keep their own ids (>= 0)."""

    def __init__(self, device: Callable[[CacheKey], int | None], stored: list[CacheKey]) -> None:
        self.device = device
        self.stored = stored
        self._ids = {k: -(i + 1) for i, k in enumerate(stored)}
        self.markers: dict[CacheKey, int] = {}

    def data(self, key: CacheKey) -> int | None:
        """Where `key`'s data is: a device block, or a stored object's stand-in id."""
        found = self.device(key)
        return found if found is not None else self._ids.get(key)

    def seen(self, key: CacheKey) -> int | None:
        """`data`, or a unit-index marker: what a junction search may read."""
        found = self.data(key)
        return found if found is not None else self.markers.get(key)

    def stored_key(self, block_id: int) -> CacheKey | None:
        """The stored object a stand-in id names; None for a device block."""
        return self.stored[-block_id - 1] if MARKER < block_id < 0 else None


@dataclass(frozen=True)
class StoreLoad:
    """One checked store object a deeper hit needs on the device, and the pool it goes to."""

    pool: BlockPool
    key: CacheKey
    position: int
    payload: bytes


@dataclass(frozen=True)
class StoreHit:
    """`StoreMirror.lookup`'s answer: the device hit with the junction the store revealed
    (`hit`), and, for a deeper hit, the objects to load and the path's device blocks to hold
    while they are (`loads`, `held`; empty: nothing to load). `seen` is the junction search's
    hit, which `settle` applies again after the loads."""

    hit: CacheHit
    loads: tuple[StoreLoad, ...] = ()
    held: tuple[tuple[BlockPool, int], ...] = ()
    seen: CacheHit | None = None


class StoreMirror:
    def __init__(
        self,
        store: KVStore,
        fingerprint: str,
        pools: Sequence[BlockPool],
        pool_for: Callable[[int], BlockPool],
        groups: tuple[GroupKind, ...],
        bounds: Boundaries,
        io: BlockIO | None = None,
    ) -> None:
        """`pools`: the cache's distinct pools; `pool_for(group)`: the one a group uses."""
        self.store = store
        self.fingerprint = fingerprint
        self.pool_for = pool_for
        self.groups = groups
        self.bounds = bounds
        self.io = io
        self.stats = MirrorStats()
        self._attention = [g for g, k in enumerate(groups) if k is GroupKind.ATTENTION]
        self._ssm = [g for g, k in enumerate(groups) if k is GroupKind.SSM]
        self._pending: list[BlockEvent] = []
        self._staged: list[tuple[BlockPool, int]] = []
        self._loading = False
        for pool in pools:  # weakly: the pools live with the cache, the mirror with its owner
            pool.subscribe(self._on_event, weak=True)

    def _lookup(self, key: CacheKey) -> int | None:
        return self.pool_for(key.group).lookup(key)

    def name(self, key: CacheKey, position: int) -> str:
        return codec.object_name(self.fingerprint, key.group, position, key.hash)

    # -- puts ----------------------------------------------------------------------------------

    def _on_event(self, event: BlockEvent) -> None:
        if event.kind == "stored" and not self._loading:
            self._pending.append(event)

    def _rows(self, position: int) -> int:
        """Attention rows an object keyed at `position` holds: a full block at a block end."""
        b = self.bounds.block_size
        return position - floor_to(position - 1, b)

    def _wanted(self, event: BlockEvent) -> list[tuple[CacheKey, int, int]]:
        """(key, block, position) of the objects one stored key calls for."""
        key, block, pos = event.key, event.block_id, event.position
        b = self.bounds.block_size
        if self.groups[key.group] is GroupKind.SSM:
            out = [(key, block, pos)]
            if pos % b and self.bounds.keys_every_unit:  # its partner attention rows
                for g in self._attention:
                    partner = CacheKey(g, key.hash)
                    pb = self._lookup(partner)
                    if pb is not None:
                        out.append((partner, pb, pos))
            return out
        if pos % b == 0 or not self.bounds.keys_every_unit:
            return [(key, block, pos)]
        if any(self._lookup(CacheKey(g, key.hash)) is not None for g in self._ssm):
            return [(key, block, pos)]
        return []

    def flush(self) -> None:
        """Write what the last step's commits stored (see the module diagram). One batched
        `exists` first: what the store already holds (another engine's, or ours from before a
        device eviction) is not read or sent again, and what it lost (evicted, or a restarted
        master) is written anew."""
        events, self._pending = self._pending, []
        if self.io is None or not events:
            return
        wanted: dict[str, tuple[CacheKey, int, int] | bytes] = {}
        for event in events:
            if self._lookup(event.key) != event.block_id:
                continue  # evicted since (cannot happen within a step; cheap to check)
            for key, block, pos in self._wanted(event):
                wanted.setdefault(self.name(key, pos), (key, block, pos))
            index = self._unit_index(event)
            if index is not None:
                wanted.setdefault(index[0], index[1])
        if not wanted:
            return
        names = list(wanted)
        missing = [n for n, there in zip(names, self.store.exists(names), strict=True) if not there]
        items: list[tuple[str, bytes]] = []
        for name in missing:
            what = wanted[name]
            if isinstance(what, bytes):  # a unit index
                items.append((name, codec.encode(name, what)))
                continue
            key, block, pos = what
            items.append(
                (name, codec.encode(name, self.io.read(key.group, block, self._rows(pos))))
            )
        if not items:
            return
        for stored in self.store.put(items):
            if stored:
                self.stats.put_objects += 1
            else:
                self.stats.put_refused += 1

    def _unit_index(self, event: BlockEvent) -> tuple[str, bytes] | None:
        """(name, the unit keys) of a full attention block under `limit`, when it carries a
        key at every unit (a block copied mid-way holds only the later ones)."""
        b, u = self.bounds.block_size, self.bounds.unit
        key, pos = event.key, event.position
        if not self.bounds.keys_every_unit or u == b or pos % b:
            return None
        if self.groups[key.group] is not GroupKind.ATTENTION:
            return None
        start = pos - b
        units = sorted(
            (p, k.hash)
            for k, p in self.pool_for(key.group).keys[event.block_id]
            if k.group == key.group and start < p <= pos
        )
        if [p for p, _ in units] != list(range(start + u, pos + 1, u)):
            return None
        first = units[0]
        name = codec.object_name(self.fingerprint, key.group, first[0], first[1], UNITS)
        return name, b"".join(h for _, h in units)

    # -- lookup --------------------------------------------------------------------------------

    def _candidates(self, req: Request, resume: int, limit: int) -> dict[CacheKey, int]:
        """Keys above the device hit that the pool lacks, with their positions."""
        b, u = self.bounds.block_size, self.bounds.unit
        hashes = req.hashes
        hashed = hashes.num_hashed_tokens
        out: dict[CacheKey, int] = {}

        def want(group: int, pos: int) -> None:
            key = CacheKey(group, hashes.at(pos))
            if self._lookup(key) is None:
                out[key] = pos

        for g in self._attention:
            for pos in range(b, min(limit + b, hashed) + 1, b):
                want(g, pos)
            for pos in range(resume + u, limit + 1, u):
                if pos % b:
                    want(g, pos)
        for g in self._ssm:
            for pos in range(resume + u, limit + 1, u):
                want(g, pos)
        return out

    def lookup(
        self,
        req: Request,
        hit: CacheHit,
        attention: list[AttentionManager],
        ssm: list[SSMManager],
    ) -> StoreHit:
        """What the store adds to the device hit `hit`: the junction it reveals, and the
        checked objects of a deeper hit, when there is one and the pools have room for it.
        Reads the store (one batched `exists`, one batched `get`); changes no pool."""
        if self.io is None:
            return StoreHit(hit)
        self._recheck(hit, attention, ssm)
        bounds = self.bounds
        limit = bounds.lookup_limit(req.num_tokens)
        if floor_to(limit, bounds.unit) <= hit.resume_point:
            return StoreHit(hit)
        cands = self._candidates(req, hit.resume_point, limit)
        indexes = self._index_candidates(req, hit.resume_point, limit)
        if not cands and not indexes:
            return StoreHit(hit)
        self.stats.lookups += 1
        keys = list(cands)
        present = self.store.exists([self.name(k, cands[k]) for k in keys] + list(indexes))
        found_indexes = {n for n, ok in zip(indexes, present[len(keys) :], strict=True) if ok}
        view = _StoreView(self._lookup, [k for k, ok in zip(keys, present, strict=False) if ok])
        view.markers = self._markers(req, limit, view.data, indexes, found_indexes)
        # how far this prefix is shared with anything stored: the junction, to the unit
        seen = find_joint_hit(attention, ssm, req.hashes, req.num_tokens, bounds, view.seen)
        hit = self._observe(hit, seen)
        if not view.stored:
            return StoreHit(hit, seen=seen)
        deep = find_joint_hit(attention, ssm, req.hashes, req.num_tokens, bounds, view.data)
        if deep.resume_point <= hit.resume_point:
            return StoreHit(hit, seen=seen)
        # the path's blocks, each with its pool (attention blocks, then SSM pages)
        path = [
            (g.pool, x)
            for g, blocks in zip(attention, deep.attention_blocks, strict=True)
            for x in blocks
        ]
        path += [(g.pool, x) for g, x in zip(ssm, deep.ssm_blocks, strict=True) if x is not None]
        loads = [(pool, key) for pool, x in path if (key := view.stored_key(x)) is not None]
        held = sorted({(pool, x) for pool, x in path if x >= 0}, key=lambda px: px[1])
        if not self._room(loads, held):
            self.stats.no_room += 1
            return StoreHit(hit, seen=seen)
        payloads = self._fetch([k for _, k in loads], cands)
        if payloads is None:
            return StoreHit(hit, seen=seen)
        objects = tuple(
            StoreLoad(pool, key, cands[key], payload)
            for (pool, key), payload in zip(loads, payloads, strict=True)
        )
        return StoreHit(hit, objects, tuple(held), seen)

    def load(self, found: StoreHit) -> None:
        """Bring `found`'s objects onto the device: each into a fresh block, written and
        keyed (the device lookup then finds the deeper hit). The path's device blocks and
        the loaded ones keep a staging reference until `unstage`."""
        assert self.io is not None
        for pool, x in found.held:  # the path's device blocks must survive the allocation
            pool.touch([x])
        self._staged += found.held
        self._loading = True  # what is loaded is in the store already: no put
        try:
            for obj in found.loads:
                (block,) = obj.pool.allocate(1)
                self._staged.append((obj.pool, block))
                self.io.write(obj.key.group, block, obj.payload)
                obj.pool.add_key(block, obj.key, obj.position)
        finally:
            self._loading = False
        self.stats.loaded_blocks += len(found.loads)

    def settle(self, found: StoreHit, device: CacheHit) -> CacheHit:
        """The hit after `load`: the device lookup's `device`, with the store's junction and
        the tokens the store supplied."""
        new = self._observe(device, found.seen) if found.seen is not None else device
        gained = new.resume_point - found.hit.resume_point
        if gained > 0:
            self.stats.hits += 1
            self.stats.hit_tokens += gained
        return replace(new, store_hit_tokens=max(gained, 0))

    def _recheck(
        self, hit: CacheHit, attention: list[AttentionManager], ssm: list[SSMManager]
    ) -> None:
        """Queue the device hit's own keys for the next `flush`, which writes whatever of them
        the store lacks: objects it lost (LRU eviction, a restarted master) or never got (an
        outage) while the device still held them are written again once they are used."""
        if not hit.resume_point:
            return
        for g, blocks in zip(attention, hit.attention_blocks, strict=True):
            for block in blocks:
                for key, pos in g.pool.keys[block]:
                    if key.group == g.group and pos <= hit.resume_point + self.bounds.block_size:
                        self._pending.append(BlockEvent("stored", key, block, pos))
        for g, block in zip(ssm, hit.ssm_blocks, strict=True):
            if block is not None:
                for key, pos in g.pool.keys[block]:
                    self._pending.append(BlockEvent("stored", key, block, pos))

    def _observe(self, hit: CacheHit, seen: CacheHit) -> CacheHit:
        """`hit` with the junction the store revealed, when it lies further than the device's."""
        after_drop = usable_match(seen.attention_match, self.bounds)
        if after_drop <= max(hit.junction, hit.resume_point):
            return hit
        return replace(
            hit, junction=after_drop, attention_match=max(hit.attention_match, seen.attention_match)
        )

    def _index_candidates(
        self, req: Request, resume: int, limit: int
    ) -> dict[str, tuple[int, int]]:
        """Unit index names (under `limit`) of the blocks a junction above `resume` may lie in,
        with (group, block start)."""
        b, u = self.bounds.block_size, self.bounds.unit
        if not self.bounds.keys_every_unit or u == b:
            return {}
        out: dict[str, tuple[int, int]] = {}
        for g in self._attention:
            for start in range(floor_to(resume, b), limit - u + 1, b):
                first = start + u
                name = codec.object_name(self.fingerprint, g, first, req.hashes.at(first), UNITS)
                out[name] = (g, start)
        return out

    def _markers(
        self,
        req: Request,
        limit: int,
        lookup: Callable[[CacheKey], int | None],
        indexes: dict[str, tuple[int, int]],
        found: set[str],
    ) -> dict[CacheKey, int]:
        """Keys (without data) of the units this request shares with a stored block's unit
        index, in the block where its chain of full blocks breaks."""
        b, u = self.bounds.block_size, self.bounds.unit
        hashes = req.hashes
        wanted: list[tuple[str, int, int]] = []
        for name, (g, start) in indexes.items():
            if name not in found:
                continue
            end = start + b  # the chain must reach this block and break inside it
            reaches = all(
                lookup(CacheKey(g, hashes.at(p))) is not None for p in range(b, start + 1, b)
            )
            breaks = end > hashes.num_hashed_tokens or lookup(CacheKey(g, hashes.at(end))) is None
            if reaches and breaks:
                wanted.append((name, g, start))
        if not wanted:
            return {}
        out: dict[CacheKey, int] = {}
        values = self.store.get([n for n, _, _ in wanted])
        for (name, g, start), value in zip(wanted, values, strict=True):
            payload = codec.decode(name, value)
            if payload is None or len(payload) % 16:
                continue
            stored = [payload[i : i + 16] for i in range(0, len(payload), 16)]
            for i, h in enumerate(stored, start=1):
                pos = start + i * u
                if pos > limit or hashes.at(pos) != h:
                    break
                key = CacheKey(g, h)
                if lookup(key) is None:
                    out[key] = MARKER - len(out)
        return out

    @staticmethod
    def _room(loads: list[tuple[BlockPool, CacheKey]], held: list[tuple[BlockPool, int]]) -> bool:
        """Each pool has free blocks for its loads and for its held blocks now in the queue."""
        need: dict[int, int] = {}
        pools: dict[int, BlockPool] = {}
        for pool, _ in loads:
            need[id(pool)] = need.get(id(pool), 0) + 1
            pools[id(pool)] = pool
        for pool, x in held:
            if pool.ref_cnt[x] == 0:
                need[id(pool)] = need.get(id(pool), 0) + 1
                pools[id(pool)] = pool
        return all(n <= pools[p].num_free for p, n in need.items())

    def _fetch(self, loads: list[CacheKey], cands: dict[CacheKey, int]) -> list[bytes] | None:
        """The checked payloads of `loads`, or None (counted) if any is not usable."""
        assert self.io is not None
        names = [self.name(k, cands[k]) for k in loads]
        out: list[bytes] = []
        bad: list[str] = []
        for key, name, value in zip(loads, names, self.store.get(names), strict=True):
            payload = codec.decode(name, value)
            rows = self._rows(cands[key]) if self.groups[key.group] is GroupKind.ATTENTION else 0
            if payload is None or len(payload) != self.io.payload_bytes(key.group, rows):
                if value is not None:
                    bad.append(name)
                continue
            out.append(payload)
        if len(out) == len(loads):
            return out
        self.stats.failed_fetches += 1
        if bad:
            self.store.stats.corrupt += len(bad)
            self.store.stats.warn_once(
                "corrupt", f"store: {len(bad)} object(s) failed their check and were dropped"
            )
            self.store.remove(bad)
        return None

    def unstage(self) -> None:
        """Drop the staging references (the admitted requests hold their own by now)."""
        for pool, block in self._staged:
            pool.free([block])
        self._staged = []

    def __len__(self) -> int:
        return len(self._staged)
