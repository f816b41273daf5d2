"""The bound on client prefix hints (issue 47): what hint states one request, and one cache
salt, may hold. Admission still prices every hint state (`hycache.cache.retention.rule`); this
bounds what a tenant takes before their chance is observed, and whatever it is."""

from __future__ import annotations

from hycache.cache.block_pool import BlockPool, CacheKey
from hycache.cache.retention.rule import HINT_POOL_FRACTION, MAX_HINT_STATES
from hycache.hashing import Hash
from hycache.request import Request


class HintBound:
    """What client prefix hints may hold (issue 47): at most `MAX_HINT_STATES` hint states per
    request, and per cache salt (`PrefixHashes.extra`; unsalted requests share b"") at most
    1/`HINT_POOL_FRACTION` of the state pool's pages in hint states, counting those of its
    live requests and those still cached. Admission still prices each one (`Admission.admit`);
    this bounds what a tenant takes before their chance is observed, and whatever it is."""

    def __init__(self, pool: BlockPool, ssm_groups: tuple[int, ...]) -> None:
        self.pool = pool
        self.group = ssm_groups[0]  # a hint state is cached in every SSM group: count one
        pages = (pool.num_blocks - 1) // HINT_POOL_FRACTION
        self.per_salt = max(1, pages // len(ssm_groups))  # states (a page per SSM group each)
        self._requests: dict[str, set[int]] = {}  # live request -> its hint positions kept
        # salt -> hint state key -> the request that kept it (arrival order)
        self._salts: dict[bytes, dict[Hash, str]] = {}

    def room(self, req: Request, position: int) -> bool:
        """Whether `req` may keep a hint state at `position`: it already holds it, or both
        the request and its salt are under their bound. Only prunes the salt's count (`held`)."""
        held = self._requests.get(req.request_id, ())
        if position in held:
            return True
        return len(held) < MAX_HINT_STATES and self.held(req.hashes.extra) < self.per_salt

    def held(self, salt: bytes) -> int:
        """The hint states `salt` holds: its live requests' and those still cached (others
        are dropped from the count: the one side effect)."""
        states = self._salts.get(salt)
        if not states:
            return 0
        pool, g = self.pool, self.group
        live = {
            h: r
            for h, r in states.items()
            if r in self._requests or pool.lookup(CacheKey(g, h)) is not None
        }
        self._salts[salt] = live
        return len(live)

    def record(self, req: Request, position: int) -> None:
        """`req` keeps a hint state at `position`: it counts against the request's and its
        salt's bound."""
        self._requests.setdefault(req.request_id, set()).add(position)
        self._salts.setdefault(req.hashes.extra, {})[req.hashes.at(position)] = req.request_id

    def free(self, rid: str) -> None:
        """The request has let go: its hint states count for its salt only while cached."""
        self._requests.pop(rid, None)
