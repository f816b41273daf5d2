"""Admission: an SSM state is kept only while it is worth the page it takes.

A state written inside a forward costs no pass, but it still costs a page, and in a full pool
every page taken evicts a cached entry. So before a state page is taken (a checkpoint written
inside a chunk or at its end, a decode snapshot) the manager asks `Admission.admit`:

    worth(kind, n)  = chance(kind) * saved      the state about to be kept, at position n:
                                                `saved` is n, or u for the drop scheme's
                                                junction (`Boundaries.hit_saving`)
    displaced       = chance(kind_v) * n_v      the cached entry the pool evicts first: 0
                      until the pool has first evicted one (nothing is displaced yet); with
                      no cached entry left, 0 while more pages are free than the running
                      requests hold (one each: `reserve`), else infinite (the page would come
                      out of what they need next: a preemption); and 0 when a decode
                      snapshot would displace the oldest cached snapshot while snapshots are
                      hit more than half the time (`REPLACE_CHANCE`: a chat; the next turn of
                      the newer conversation is the nearer one)
    admit  <=>  worth >= displaced

* `chance(kind)` is the observed chance that an entry of that kind is hit before it is evicted
  (`BlockPool.reuse`, estimated online per kind: decode snapshots, junction or hint stops, tail
  checkpoints, replay boundaries, the unit below the tail, the drop scheme's replay
  boundaries, block-grid states, and attention blocks), so the rule follows the workload: on a
  conversation trace (no prompt contains a previous answer, no identical resends) tail
  checkpoints and snapshots are never hit and stop being kept; on a chat they are, and stay.
* `n` is what a hit saves, in tokens: a hit on a state at `n` skips the prefill of `[0, n)`
  (without the state it falls back to an earlier one), and the entry displaced, a state at
  `n_v` or an attention block ending at `n_v` (every hit through it needs it), takes the hits
  at `n_v` and above with it. Every page has the same size, so the bytes cancel.
* Observed junctions and hint stops (`JUNCTION`) and the replay boundary (`REPLAY`) are kept
  whatever cached entry they displace (never a page the running requests need): they are the
  states a `-split` arm's stops keep, so `limit` keeps everything `limit-split` does. Gating
  them lost hit rate on every trace tried: the victim a state is compared with is evicted at
  the next allocation anyway, so a refusal rarely saves it (docs/admission.md).
* A refused kind is still admitted once in `explore` refusals (a per-kind counter, no
  randomness), so that its estimate keeps following the workload.

The `flop-aware` eviction score weighs each entry by the same `chance(kind)` (`BlockPool`):
recency + alpha * chance(kind) * FLOPs saved / bytes (`hycache.cache.eviction`).

Only states whose keeping costs no stop are gated (`CacheManager`): with internal checkpoints
under `limit`, `junction`, `replay` and `tail` (no prefill stop is made for any state), and
decode snapshots. A stop the scheduler makes (`lookahead`'s vLLM split, a `-split` arm's stops)
keeps its state: a stop promises a checkpoint.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from hycache.cache.block_pool import BlockPool
from hycache.cache.boundaries import StateKind

ALWAYS_KEPT = frozenset({StateKind.JUNCTION, StateKind.REPLAY})
ADMIT_EXPLORE = 8  # a refused kind is still admitted once in this many refusals
REPLACE_CHANCE = 0.5  # decode snapshots hit more often than this replace the oldest freely


class Admission:
    """The admission rule of one pool (see the module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        explore: int = ADMIT_EXPLORE,
        saving: Callable[[str, int], int] = lambda kind, position: position,
    ) -> None:
        """`saving(kind, position)`: what a hit on a cached entry saves, in tokens
        (`Boundaries.hit_saving`; by default its position)."""
        if explore < 1:
            raise ValueError(f"explore: must be >= 1, got {explore}")
        self.pool = pool
        self.saving = saving
        self.explore = explore
        self.refused: Counter[str] = Counter()  # per kind, refusals so far (explored ones too)
        self.admitted: Counter[str] = Counter()

    def worth(self, kind: str, saved: int) -> float:
        """What keeping an entry of `kind` whose hit saves `saved` tokens is expected to
        save, in tokens."""
        return self.pool.reuse.chance(kind) * saved

    def displaced(self, kind: str = "", reserve: int = 0) -> float:
        """The worth of the entry the pool would evict for the next page of `kind` (see the
        module docstring; `reserve`: the pages the running requests are about to need)."""
        if not self.pool.under_pressure:
            return 0.0
        victim = self.pool.peek_victim()
        if victim is None:  # nothing cached left to give up
            return math.inf if self.pool.num_free <= reserve else 0.0
        if (
            kind == self.pool.kind[victim] == StateKind.SNAPSHOT
            and self.pool.reuse.chance(kind) > REPLACE_CHANCE
        ):
            return 0.0  # the oldest snapshot, when snapshots are mostly hit: a fresh one wins
        kind_v = self.pool.kind[victim]
        position = max(pos for _, pos in self.pool.keys[victim])
        return self.worth(kind_v, self.saving(kind_v, position))

    def admit(self, kind: str, saved: int, reserve: int = 0) -> bool:
        """Whether a state of `kind` whose hit saves `saved` tokens takes a page now;
        `reserve`: the free pages the running requests are about to need (one each)."""
        displaced = self.displaced(kind, reserve)
        if self.worth(kind, saved) >= displaced or (kind in ALWAYS_KEPT and displaced < math.inf):
            self.admitted[kind] += 1
            return True
        self.refused[kind] += 1
        if self.refused[kind] % self.explore == 0:
            self.admitted[kind] += 1
            return True
        return False
