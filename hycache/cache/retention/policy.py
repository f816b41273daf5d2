"""The retention policy: the one object the cache manager asks which SSM states to keep.

    gates_prompt_states          whether prompt states are decided at all
    admits(req, position)        a prompt state at a checkpoint position: take a page?
    admits_snapshot(req, end, w) a decode snapshot (decided once per request)
    make_room(rid, ...)          before a step's pages are taken: give held snapshots back
    on_admit(req, hit)           a request was admitted with `hit` (ghost accounting)
    on_free(rid)                 a request let go (its snapshot hold, its hint states)

`AdmissionPolicy` is the rule of `hycache.cache.retention.rule` with its state: the hint bound
(`hints`), the pool's ghosts (`ghosts`) and the decode snapshot ledger (`ledger`).
`KeepEverything` keeps every state (`CacheKnobs.admission` False, or a second tier attached:
what the device evicts lives on in the store) and has no side effects. Release aging (where a
released request's states go in the eviction order) applies under both: each SSM manager holds
a `ReleaseAging` (`hycache.cache.retention.aging`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import BlockPool
from hycache.cache.boundaries import Boundaries, StateKind
from hycache.cache.coordinator import CacheHit
from hycache.cache.retention.ghosts import Ghosts, ghost_gain
from hycache.cache.retention.hints import HintBound
from hycache.cache.retention.ledger import SnapshotLedger
from hycache.cache.retention.rule import Admission
from hycache.cache.ssm import SSMManager
from hycache.config import Policy
from hycache.request import Request


class Retention(Protocol):
    """What the cache manager asks (see the module docstring)."""

    @property
    def gates_prompt_states(self) -> bool: ...

    def admits(self, req: Request, position: int) -> bool: ...

    def admits_snapshot(self, req: Request, end: int, num_waiting: int) -> bool: ...

    def make_room(
        self, rid: str, need: int, need_pages: int, running: bool, attention_pool: BlockPool
    ) -> None: ...

    def on_admit(self, req: Request, hit: CacheHit) -> None: ...

    def on_free(self, rid: str) -> None: ...


class KeepEverything:
    """Every state is kept: no decision, no accounting, no side effects."""

    gates_prompt_states = False

    def admits(self, req: Request, position: int) -> bool:
        return True

    def admits_snapshot(self, req: Request, end: int, num_waiting: int) -> bool:
        return True

    def make_room(
        self, rid: str, need: int, need_pages: int, running: bool, attention_pool: BlockPool
    ) -> None:
        pass

    def on_admit(self, req: Request, hit: CacheHit) -> None:
        pass

    def on_free(self, rid: str) -> None:
        pass


class AdmissionPolicy:
    """Admission (`rule.Admission`) over the state pool, with the hint bound, the ghosts and
    the snapshot ledger. `attention`, `ssm`: the cache's group managers (read only, but for
    a held snapshot given back: `SSMManager.release_snapshot`); `pool_for`: a group's pool."""

    def __init__(
        self,
        state_pool: BlockPool,
        bounds: Boundaries,
        attention: Sequence[AttentionManager],
        ssm: Sequence[SSMManager],
        pool_for: Callable[[int], BlockPool],
        max_num_seqs: int = 0,
        num_speculative_tokens: int = 0,
    ) -> None:
        self.bounds, self.attention, self.ssm, self.pool_for = bounds, attention, ssm, pool_for
        self.ghosts = Ghosts(state_pool)  # subscribes to the pool's key events
        self.rule = Admission(state_pool, saving=bounds.hit_saving, ghost_depth=self.ghosts.depth)
        groups = tuple(s.group for s in ssm)
        self.hints = HintBound(state_pool, groups) if groups else None
        self.ledger = SnapshotLedger(
            self.rule, state_pool, attention, ssm, bounds.block_size, max_num_seqs,
            num_speculative_tokens,
        )  # fmt: skip

    @property
    def gates_prompt_states(self) -> bool:
        """Admission decides on prompt states: every one is written inside a forward and no
        prefill stop promises it (internal checkpoints, any policy but `lookahead`, whose
        stops and export are vLLM's)."""
        return self.bounds.internal and self.bounds.effective_policy is not Policy.LOOKAHEAD

    def admits(self, req: Request, position: int) -> bool:
        """Whether the prompt state at `position` (a checkpoint position) takes a page now.
        Counted by the rule (`Admission.admitted` / `refused`); a hint state kept is recorded
        against its request's and its salt's bound (`HintBound`)."""
        if not self.gates_prompt_states:
            return True
        b = self.bounds
        kind = b.state_kind(
            position, req.num_prompt_tokens, req.junction_stops, req.drop_stops, req.hint_stops
        )
        hints = self.hints if kind == StateKind.HINT else None
        if hints is not None and not hints.room(req, position):
            return False  # past the request's or its salt's bound (`HintBound`)
        admitted = self.rule.admit(kind, b.hit_saving(kind, position), self.ledger.live)
        if admitted and hints is not None:
            hints.record(req, position)
        return admitted

    def admits_snapshot(self, req: Request, end: int, num_waiting: int) -> bool:
        """Whether `req`'s decode snapshot takes a page: its first sampling step decides for its
        whole decode (`SnapshotLedger.decide`; `num_waiting`: the requests queued to join)."""
        return self.ledger.decide(req, end, num_waiting)

    def make_room(
        self, rid: str, need: int, need_pages: int, running: bool, attention_pool: BlockPool
    ) -> None:
        """Give held snapshot pages back before a step of `rid` (`SnapshotLedger.make_room`)."""
        self.ledger.make_room(rid, need, need_pages, running, attention_pool)

    def on_admit(self, req: Request, hit: CacheHit) -> None:
        """`req` was admitted with `hit`: it counts among the live requests, and once the pool
        has evicted, how much deeper its hit would have been with the ghosts still cached
        adds to the page value (`Admission.record_ghost_hit`)."""
        self.ledger.admit(req)
        if self.rule.pool.num_evicted:
            gain = ghost_gain(
                req, hit, self.ghosts, self.attention, self.ssm, self.bounds, self.pool_for
            )
            if gain:
                self.rule.record_ghost_hit(gain)

    def on_free(self, rid: str) -> None:
        """`rid` let go: its snapshot hold is recorded (`SnapshotLedger.free`) and its hint
        states count for its salt only while cached (`HintBound.free`)."""
        if self.hints is not None:
            self.hints.free(rid)
        self.ledger.free(rid)


def fit_writes(writes: tuple[int, ...], junctions: Sequence[int], room: int) -> tuple[int, ...]:
    """The internal checkpoints a step can write with `room` states to spare: all of them, or
    the observed `junctions` first, then the lower positions. Pure."""
    if room >= len(writes):
        return writes
    observed = set(junctions)
    ranked = sorted(writes, key=lambda p: (p not in observed, p))
    return tuple(sorted(ranked[:room]))
