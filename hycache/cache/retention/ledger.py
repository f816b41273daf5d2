"""The snapshot ledger: which live requests hold a decode snapshot page, and giving them back.

A decode snapshot is decided once per request, at its first sampling step, and its page is
held until the request finishes (`SSMManager.free` keys it then). The ledger records each
decision, the pages the running and waiting requests still take (`pages_to_come`, the
`reserve` a snapshot is admitted against), and gives held pages back when a step's pages run
short (`make_room`): a snapshot given back counts as one never hit (`ReuseStats`), and its
request keeps none.
"""

from __future__ import annotations

from collections.abc import Sequence

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import BlockPool
from hycache.cache.boundaries import StateKind
from hycache.cache.retention.rule import Admission
from hycache.cache.ssm import SSMManager
from hycache.request import Request


class SnapshotLedger:
    """The decode snapshot decisions of one cache's live requests (see the module docstring).
    `max_num_seqs`: the most requests the scheduler runs at once (0: no limit);
    `num_speculative_tokens`: the lookahead a request's last step holds; `block_size`: tokens
    per attention block."""

    def __init__(
        self,
        rule: Admission,
        pool: BlockPool,
        attention: Sequence[AttentionManager],
        ssm: Sequence[SSMManager],
        block_size: int,
        max_num_seqs: int,
        num_speculative_tokens: int,
    ) -> None:
        self.rule, self.pool = rule, pool
        self.attention, self.ssm = attention, ssm
        self.block_size, self.max_num_seqs = block_size, max_num_seqs
        self._k = num_speculative_tokens
        self._decided: dict[str, bool] = {}  # per live request that reached a sampling step
        # per held snapshot, its position and the pool's evictions then
        self._held: dict[str, tuple[int, int]] = {}
        self._final: dict[str, int] = {}  # per live request: prompt + max_tokens + k tokens

    @property
    def live(self) -> int:
        """The live requests (admitted, not yet freed)."""
        return len(self._final)

    def admit(self, req: Request) -> None:
        """`req` was admitted: its final length counts in `pages_to_come` until it is freed."""
        self._final[req.request_id] = req.num_prompt_tokens + req.sampling.max_tokens + self._k

    def decide(self, req: Request, end: int, num_waiting: int) -> bool:
        """Whether `req` holds a snapshot page: decided by the rule at its first call (a
        snapshot at `end`, against `pages_to_come`; counted there), then the same answer until
        the page is given back (`make_room`) or the request is freed. Records the hold."""
        rid = req.request_id
        if rid not in self._decided:
            admitted = self.rule.admit(StateKind.SNAPSHOT, end, self.pages_to_come(num_waiting))
            self._decided[rid] = admitted
            if admitted:
                self._held[rid] = (end, self.pool.num_evicted)
        return self._decided[rid]

    def pages_to_come(self, num_waiting: int) -> int:
        """The pages the running requests, and the `num_waiting` ones that will join them (up
        to `max_num_seqs`), still take before they finish: one each (its state page), the
        attention blocks each live one lacks to its prompt, `max_tokens` and lookahead, and
        for each one to join as many as the live ones end with on average. A page held until
        its request finishes competes with all of them. Pure."""
        if not self._final:
            return 0
        b = self.block_size
        final = {rid: -(-t // b) * len(self.attention) for rid, t in self._final.items()}
        lacking = sum(
            max(final[rid] - sum(len(m.block_table(rid)) for m in self.attention), 0)
            for rid in self._final
        )
        to_join = num_waiting
        if self.max_num_seqs:
            to_join = min(to_join, max(self.max_num_seqs - self.live, 0))
        mean = sum(final.values()) / len(final)
        return self.live + lacking + int(to_join * (mean + 1))

    def make_room(
        self, rid: str, need: int, need_pages: int, running: bool, attention_pool: BlockPool
    ) -> None:
        """Before a step of `rid` takes `need` attention and `need_pages` state pages (one
        pool: `need`): give back decode snapshot pages other live requests hold (newest first;
        never one the planned step writes). While the pages would not all come from unkeyed
        free ones, a snapshot worth less than a page (`Admission.page_value`) goes back; then,
        if `running` (a running request's step: else it waits) and the pages still do not
        fit, any held snapshot goes back rather than a request being preempted."""
        if not self._held:
            return
        shared = self.pool is attention_pool
        pool, n = self.pool, need if shared else need_pages
        if pool.unkeyed_free(n) >= n:  # the step's pages come from unkeyed free ones
            return
        chance = pool.reuse.chance(StateKind.SNAPSHOT)
        # newest request first (the one a preemption would pick)
        held = [r for r in reversed(self.ssm[0].request_ids()) if r in self._held and r != rid]
        for other in held:
            if pool.unkeyed_free(n) >= n or pool.peek_victim() is None:
                break
            position = self.ssm[0].snapshot_position(other) or self._held[other][0]
            if chance * position < self.rule.page_value(StateKind.SNAPSHOT):
                self._give_back(other)
        if running:
            for other in held:
                if n <= pool.num_free or (not shared and need > attention_pool.num_free):
                    break
                if other in self._held:
                    self._give_back(other)

    def _give_back(self, rid: str) -> None:
        """Free `rid`'s snapshot page in every SSM group (counted as never hit, once per
        group); from then on it holds none."""
        for s in self.ssm:
            if not s.release_snapshot(rid):
                return
            self.pool.reuse.record(StateKind.SNAPSHOT, hit=False)  # given up, never hit
        del self._held[rid]
        self._decided[rid] = False

    def free(self, rid: str) -> None:
        """`rid` finished or was preempted: its decision is forgotten, and a page it held
        tells the rule how many evictions a held snapshot sees (`Admission.record_hold`)."""
        self._decided.pop(rid, None)
        held = self._held.pop(rid, None)
        if held is not None:
            self.rule.record_hold(self.pool.num_evicted - held[1])
        self._final.pop(rid, None)
