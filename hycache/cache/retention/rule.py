"""The admission rule: an SSM state is kept only while it is worth the page it takes.

A state written inside a forward costs no pass, but it still costs a page, and in a full pool
every page taken evicts a cached entry. So before a state page is taken (a checkpoint written
inside a chunk or at its end, a decode snapshot) the retention policy asks `Admission.admit`:

    worth(kind, n)  = chance(kind) * saved       the state about to be kept, at position n:
                                                 `saved` is n, or u for the drop scheme's
                                                 junction (`Boundaries.hit_saving`)
    displaced       = what refusing it saves
    admit  <=>  worth >= displaced              (else: one refusal in 8 per kind still admits)
               or kind is junction / replay     (unless the page is one running requests need)

* `chance(kind)` is the observed chance that an entry of that kind is hit before it is evicted
  (`BlockPool.reuse`, estimated online per kind: decode snapshots, junctions, client hints, tail
  checkpoints, replay boundaries, the unit below the tail, the drop scheme's replay
  boundaries, block-grid states, and attention blocks), so the rule follows the workload: on a
  conversation trace (no prompt contains a previous answer, no identical resends) tail
  checkpoints and snapshots are never hit and stop being kept; on a chat they are, and stay.
* `n` is what a hit saves, in tokens: a hit on a state at `n` skips the prefill of `[0, n)`.
  Every page has the same size, so the bytes cancel.

What refusing saves (`displaced`):

* nothing until the pool has evicted a cached entry once (`BlockPool.under_pressure`);
* with no cached entry left: nothing while more pages are free than `reserve`, else a page the
  running requests need next (infinite: a preemption);
* a prompt state (freed into the cache at once): the worth of the cached entry the pool
  evicts first (`BlockPool.peek_victim`, `entry_worth`);
* a decode snapshot, held until its request finishes: one page of cache for that long
  (`page_value`). The victim it would be compared with goes at the next allocation anyway,
  so refusing the snapshot rarely saves it; what it saves is a page over the snapshot's
  life, priced by the pool's ghosts (`Ghosts`, the keys of the blocks it evicted last):
  every admission whose hit the ghosts would have made deeper adds the difference
  (`record_ghost_hit`), and

      page value = ghost savings / (ghost depth * evictions)   tokens per page per eviction
                 * (free pages + evictions a snapshot saw while held, on average)

  And while no more pages are free than the running requests and those yet to join them
  still take (`reserve` = `SnapshotLedger.pages_to_come`; cached pages count as free, a held
  page would push them out), a snapshot is kept only if snapshots are hit more often than
  not (`HELD_CHANCE`): on a chat its page is the next turn's hit; where no request continues
  another (one system prompt, distinct questions) the first wave's snapshots, admitted at
  the prior, held the pages the running requests needed, evicted the prompt's cached state
  and preempted requests.

Junction and replay states (`ALWAYS_KEPT`) are kept whatever cached entry they displace (never
a page the running requests need): they are what a `-split` arm's stops keep, so `limit`
keeps everything `limit-split` does. Pricing every kind by the ghosts instead (no kind kept
unconditionally) lost on the fresh traces, whose long reuse distances the ghosts see too
little of, and so did comparing them with the victim without the exception (docs/admission.md).

Under pressure a prompt state of a kind the pool rates rare (`rare_kind`: hit less than
`DEMOTE_RATIO` times as often as attention blocks, the kinds whose released states are demoted
to the low-priority queue, `hycache.cache.retention.aging`) is refused outright, explored ones
too (`refuses_rare`; not junction and replay states, nor snapshots, which have their rules
above). Compared with the victim alone, such a state was kept whenever it lay deeper than a
cheap LRU head, and in a quarter pool (a few cached pages, a horizon of seconds) each one
pushed out the next request's hit (docs/admission.md, "Rare kinds refused under pressure").
The bar follows the attention blocks' chance, so a kind that is hit again as often as they
are is admitted again.

A refused kind is still admitted once in `explore` refusals (a per-kind counter, no
randomness; never a page the running requests need), so that its estimate keeps following
the workload. The snapshot ledger also gives a held snapshot page back
(`SnapshotLedger.make_room`) when a page is short and the snapshot is worth less than a page,
or when a running request would otherwise be preempted; a snapshot given back counts as one
never hit.

The `flop-aware` eviction score weighs each entry by the same `chance(kind)` (`BlockPool`):
recency + alpha * chance(kind) * FLOPs saved / bytes (`hycache.cache.eviction`); under LRU
the decode snapshots' low-priority queue goes first only while its head is worth no more
(chance times position) than the LRU head.

Only states whose keeping costs no stop are gated (`AdmissionPolicy.gates_prompt_states`):
with internal checkpoints under `limit`, every prompt state (no prefill stop is made for any
state), and decode snapshots. A stop the scheduler makes (`lookahead`'s vLLM split, a `-split`
arm's stops) keeps its state: a stop promises a checkpoint.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from hycache.cache.block_pool import BlockPool, ReuseStats
from hycache.cache.boundaries import ATTENTION_KIND, StateKind

ALWAYS_KEPT = frozenset({StateKind.JUNCTION, StateKind.REPLAY})
# the most prefix-hint states (`StateKind.HINT`) one request may keep, each a page per SSM
# group: a client's hints are priced by their chance like any state, and this bounds what one
# request can take before that chance has been observed (`HintBound`)
MAX_HINT_STATES = 4
# one cache salt's hint states (its live requests' and those still cached) hold at most 1/16
# of the state pool's pages (`HintBound`): a salt isolates content, this bounds capacity
HINT_POOL_FRACTION = 16
ADMIT_EXPLORE = 8  # a refused kind is still admitted once in this many refusals
HELD_CHANCE = 0.5  # a snapshot taking a page the running requests need must beat this chance
# A released state whose kind is hit less than this fraction as often as attention blocks
# (`BlockPool.reuse`) goes to the low-priority queue rather than back among the cached blocks
# (`hycache.cache.retention.aging`); under pressure admission keeps none of its kind: on a
# conversation trace, tail checkpoints and the drop scheme's extra states held a quarter of the
# pool, and LRU evicted older prefixes before them (docs/admission.md).
DEMOTE_RATIO = 0.5
GHOST_FRACTION = 16  # the ghost list remembers the last 1/16 of the pool's blocks evicted


def demote_bar(reuse: ReuseStats) -> float:
    """A released state goes to the low-priority queue when its kind's chance, weighed by what
    a hit saves per token of its prefix, is below this: `DEMOTE_RATIO` times the attention
    blocks' chance (`BlockPool.reuse`). Pure."""
    return DEMOTE_RATIO * reuse.chance(ATTENTION_KIND)


def rare_kind(reuse: ReuseStats, kind: str) -> bool:
    """Whether state `kind` is hit less often than the demotion bar (`demote_bar`): its released
    states are demoted, and under pressure admission keeps none of it. A kind never resolved
    sits at the prior: not rare. Pure."""
    return (
        kind != ATTENTION_KIND and kind in reuse.resolved and reuse.chance(kind) < demote_bar(reuse)
    )


class Admission:
    """The admission rule of one pool (see the module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        explore: int = ADMIT_EXPLORE,
        saving: Callable[[str, int], int] = lambda kind, position: position,
        ghost_depth: int | None = None,
    ) -> None:
        """`saving(kind, position)`: what a hit on a cached entry saves, in tokens
        (`Boundaries.hit_saving`; by default its position). `ghost_depth`: the evicted blocks
        the pool's ghosts remember (default 1/`GHOST_FRACTION` of the pool)."""
        if explore < 1:
            raise ValueError(f"explore: must be >= 1, got {explore}")
        self.pool = pool
        self.ghost_depth = ghost_depth or max(1, (pool.num_blocks - 1) // GHOST_FRACTION)
        self.saving = saving
        self.explore = explore
        self.refused: Counter[str] = Counter()  # per kind, refusals so far (explored ones too)
        self.admitted: Counter[str] = Counter()
        self.ghost_saved = 0  # tokens the pool's ghosts would have added to hits so far
        self.held = 0  # decode snapshots held until their request finished
        self.held_evictions = 0  # the pool's evictions while they were held, summed

    def record_ghost_hit(self, saved: int) -> None:
        """An admission's hit was `saved` tokens short of what it would have been had the
        pool still held its ghosts (`Ghosts`). Adds to the page value."""
        self.ghost_saved += saved

    def record_hold(self, evictions: int) -> None:
        """A decode snapshot's request finished; the pool evicted `evictions` entries while
        it held the page. Lengthens the life `page_value` gives a snapshot's page."""
        self.held += 1
        self.held_evictions += evictions

    def worth(self, kind: str, saved: int) -> float:
        """What keeping an entry of `kind` whose hit saves `saved` tokens is expected to
        save, in tokens."""
        return self.pool.reuse.chance(kind) * saved

    def entry_worth(self, block_id: int) -> float:
        """The worth of the pool's cached block `block_id` (its kind, its deepest key)."""
        kind = self.pool.kind[block_id]
        return self.worth(kind, self.saving(kind, self.pool.deepest(block_id)))

    def page_value(self, kind: str = "") -> float:
        """What one more page saves over the life a page of `kind` kept now would have, in
        tokens (see the module docstring)."""
        pool = self.pool
        if not pool.num_evicted:
            return 0.0
        per_eviction = self.ghost_saved / (self.ghost_depth * pool.num_evicted)
        life = float(pool.num_free)
        if kind == StateKind.SNAPSHOT and self.held:
            life += self.held_evictions / self.held
        return per_eviction * life

    def displaced(self, kind: str = "", saved: int = 0, reserve: int = 0) -> float:
        """What refusing a page of `kind` whose hit saves `saved` tokens saves (see the module
        docstring; `reserve`: the pages the running requests are about to need)."""
        pool = self.pool
        if kind == StateKind.SNAPSHOT and pool.num_free <= reserve:
            return math.nextafter(HELD_CHANCE * saved, math.inf)  # strictly more often
        if not pool.under_pressure:
            return 0.0
        victim = pool.peek_victim()
        if victim is None:  # nothing cached left to give up
            return math.inf if pool.num_free <= reserve else 0.0
        if kind == StateKind.SNAPSHOT:
            return self.page_value(kind)
        return self.entry_worth(victim)

    def refuses_rare(self, kind: str) -> bool:
        """A prompt state of a kind the pool rates rare (`rare_kind`: the kinds whose released
        states are demoted) while the pool is under pressure: refused, explored ones too (see
        the module docstring). Pure."""
        return (
            self.pool.under_pressure
            and kind not in ALWAYS_KEPT
            and kind != StateKind.SNAPSHOT
            and rare_kind(self.pool.reuse, kind)
        )

    def admit(self, kind: str, saved: int, reserve: int = 0) -> bool:
        """Whether a state of `kind` whose hit saves `saved` tokens takes a page now;
        `reserve`: the free pages the running requests are about to need (one each; for a
        decode snapshot, all they and those to join them still take: `pages_to_come`).
        Counts the decision per kind (`admitted`, `refused`: the exploration counter)."""
        if self.refuses_rare(kind):
            self.refused[kind] += 1
            return False
        displaced = self.displaced(kind, saved, reserve)
        kept = kind in ALWAYS_KEPT and displaced < math.inf
        if self.worth(kind, saved) >= displaced or kept:
            self.admitted[kind] += 1
            return True
        self.refused[kind] += 1
        if self.refused[kind] % self.explore == 0 and displaced < math.inf:
            self.admitted[kind] += 1
            return True
        return False
