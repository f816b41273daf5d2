"""Every boundary formula of hycache, in one place (DESIGN §3.5–3.6, §5).

The managers, the scheduler's chunk split, the runner's decode snapshots and the store mirror
all ask this module where a request's checkpoints, keys and prefill stops lie; none of them
computes a boundary itself.

Positions are token counts: "position n" is the state after the first n tokens.

Two key schemes (`lookahead`):

    drop scheme (tail, replay, junction): key(n) covers [0, n); with a drafter a hit at n
        recomputes its last unit (resumes at n - u): drafter row n-1 pairs hidden n-1 with
        token n, which the key does not cover.
    lookahead (lookahead, limit, with a drafter): key(n) covers [0, n] (one token past the
        unit), published once token n is known; a hit proves the drafter rows valid, nothing
        is dropped. A sibling sharing P tokens can match at most floor((P-1)/u)*u: the limit.

    B = 16, u = 4, drop scheme, T = 40 (24 shared + 16 private):

    0       12  16              32    36  40
    |-------+---|---------------|-----+---|
            ^   ^                     ^   ^-- prompt end (running state, never keyed)
            |   replay boundary       tail checkpoint floor(T/u)*u - u
            block-grid resume point ((n + u) % B == 0): where a sibling that shares the
            first block resumes after the EAGLE drop

    same prompt, `limit` (lookahead keys on every unit), a sibling observing P = 24:

    0           16  20    24        32  36   40
    |-----------|---+-----|---------|---+----|
                    ^ junction stop: the limit floor((P-1)/u)*u (the key of 20 covers token 20)
                                    ^ block boundary after it; here also the replay boundary
                                      floor((T-1)/B)*B
                                        ^ tail checkpoint floor((T-1)/u)*u
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hycache.config import CacheConfig, Policy, SpeculativeConfig


def floor_to(n: int, step: int) -> int:
    return n // step * step


LOOKAHEAD_POLICIES = (Policy.LOOKAHEAD, Policy.LIMIT)


@dataclass(frozen=True)
class Boundaries:
    """Boundary arithmetic for one cache geometry and policy.

    `drafter`: a speculative drafter (EAGLE/MTP) whose rows a hit must keep valid. `policy` is
    the configured policy; `effective_policy` is what actually applies: `junction` degrades to
    `replay` without a sub-block unit or an EAGLE drop, `limit` to `lookahead` when the unit is
    the block (DESIGN §3.9).
    """

    block_size: int
    unit: int
    drafter: bool
    policy: Policy
    retention: str | int = "semantic"

    @classmethod
    def from_config(cls, cache: CacheConfig, spec: SpeculativeConfig) -> Boundaries:
        return cls(
            cache.block_size, cache.unit, bool(spec.eagle_drop), cache.policy, cache.retention
        )

    @property
    def lookahead(self) -> bool:
        """Keys cover the token after their unit (vLLM 0.33's default EAGLE hashing)."""
        return self.drafter and self.policy in LOOKAHEAD_POLICIES

    @property
    def drop(self) -> int:
        """The EAGLE drop `d` the coordinator applies once: a unit under the drop scheme with
        a drafter, else 0."""
        return self.unit if self.drafter and not self.lookahead else 0

    @property
    def effective_policy(self) -> Policy:
        if self.policy is Policy.JUNCTION and (self.drop == 0 or self.unit == self.block_size):
            return Policy.REPLAY
        if self.policy is Policy.LIMIT and self.unit == self.block_size:
            return Policy.LOOKAHEAD
        return self.policy

    @property
    def keys_every_unit(self) -> bool:
        """`limit`: attention keys on every unit (so a junction is observed exactly)."""
        return self.effective_policy is Policy.LIMIT

    # -- positions of one prompt ------------------------------------------------------------

    def replay_boundaries(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """Block-grid positions a replay of this prompt resumes from; the first is also a
        prefill stop, the others are kept whenever a chunk ends there.

        Drop scheme: `max(floor(T/B)*B - B, 0)` for a longer sibling, and
        `max(floor((T-1)/B)*B - B, 0)` for an identical resend (its lookup is capped at T - 1);
        they differ when T % B == 0 (vLLM #54713). Otherwise (no drafter, or lookahead keys):
        the last block-grid position a hit may reach, `floor((T-1)/B)*B`.
        """
        b, t = self.block_size, num_prompt_tokens
        last = floor_to(max(t - 1, 0), b)
        if self.drop:
            return tuple(dict.fromkeys((max(floor_to(t, b) - b, 0), max(last - b, 0))))
        return (last,)

    def replay_boundary(self, num_prompt_tokens: int) -> int:
        """The replay boundary the scheduler stops at (the first of `replay_boundaries`)."""
        return self.replay_boundaries(num_prompt_tokens)[0]

    def tail_checkpoint(self, num_prompt_tokens: int) -> int:
        """Where the tail SSM checkpoint goes (and where the scheduler stops for it).

        `tail`: unshifted `floor(T/u)*u`. Otherwise where an identical resend resumes:
        `floor(T/u)*u - u` under the drop, `floor((T-1)/u)*u` without (no drafter, lookahead).
        """
        u, t = self.unit, num_prompt_tokens
        if self.policy is Policy.TAIL:
            return floor_to(t, u)
        if self.drop:
            return max(floor_to(t, u) - u, 0)
        return floor_to(max(t - 1, 0), u)

    def prompt_stops(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """The prefill stops that depend on the prompt alone, ascending; each one is kept: the
        replay boundary and the tail checkpoint."""
        t = num_prompt_tokens
        return tuple(sorted(p for p in {self.replay_boundary(t), self.tail_checkpoint(t)} if p > 0))

    def attention_keys(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """Mid-block attention keys a request registers over its prompt (full blocks are keyed
        separately; under `limit` every unit is keyed instead): the unshifted prompt tail, and
        the position whose hit lands on the tail checkpoint after the drop. Without a drop
        that is the tail checkpoint itself; under the drop it is the unshifted tail again."""
        t = num_prompt_tokens
        keys = {floor_to(t, self.unit), self.tail_checkpoint(t) + self.drop}
        return tuple(sorted(k for k in keys if 0 < k <= t and k % self.block_size))

    def is_block_grid_resume_point(self, n: int) -> bool:
        """A position one unit below a block boundary: `(n + u) % B == 0`."""
        return n > 0 and (n + self.unit) % self.block_size == 0

    def lookup_limit(self, num_tokens: int) -> int:
        """How far the attention groups may match: all hashed units under the drop (the drop
        brings the hit below T), else `T - 1` floored to the unit."""
        if self.drop:
            return floor_to(num_tokens, self.unit)
        return floor_to(max(num_tokens - 1, 0), self.unit)

    def limit(self, shared_prefix: int) -> int:
        """The best resume point any engine can reach for a sibling sharing `shared_prefix`
        tokens: with a drafter, its rows are valid only below P - 1, `floor((P-1)/u)*u`
        (DESIGN §5); without one, `floor(P/u)*u`."""
        if self.drafter:
            return floor_to(max(shared_prefix - 1, 0), self.unit)
        return floor_to(shared_prefix, self.unit)

    # -- stops a request makes for what it shares ---------------------------------------------

    def junction_stops(self, junction: int, start: int, num_prompt_tokens: int) -> tuple[int, ...]:
        """The prefill stops a request makes (and keeps) for its observed junction `j`.

        Every policy keeps vLLM's stop, the junction floored to the block grid `floor(j/B)*B`
        (vLLM re-derives it per chunk, also after a mid-block resume). Inside the prompt,
        `junction` and `limit` (effective) add `j` itself (on the hash grid: where the next
        sibling resumes) and the block boundary right after it, where the chunk that starts
        mid-block stops anyway (keeping that state costs no forward pass):

            floor(j/B)*B        j      floor(j/B)*B + B
                 |--------------+-------|
                 kept by all    kept by junction / limit

        A junction past the prompt (a resumed request replaying outputs) only gets the
        block-floored stop, which is not kept (nothing is keyed past the prompt).
        """
        if junction <= start:
            return ()
        b = self.block_size
        floor = floor_to(junction, b)
        stops = {floor}
        fine = self.effective_policy in (Policy.JUNCTION, Policy.LIMIT)
        if fine and junction <= num_prompt_tokens:
            stop = floor_to(junction, self.unit)
            stops.add(stop)
            if stop % b and floor + b <= num_prompt_tokens:
                stops.add(floor + b)
        return tuple(sorted(s for s in stops if s > start))

    def hint_stops(
        self, hints: Iterable[int], start: int, num_prompt_tokens: int
    ) -> tuple[int, ...]:
        """`limit`: the stops for prefix hints (token counts where the request's shared prefix
        ends): each hint's limit, as if that junction had been observed. A hint past the
        prompt, or whose limit is 0, is ignored; other policies ignore hints."""
        if self.effective_policy is not Policy.LIMIT:
            return ()
        out: set[int] = set()
        for h in hints:
            if 0 < h <= num_prompt_tokens:
                out.update(self.junction_stops(self.limit(h), start, num_prompt_tokens))
        return tuple(sorted(out))

    # -- what the scheduler stops at, what the SSM manager keeps ----------------------------

    def prefill_stops(
        self, start: int, num_prompt_tokens: int, junction_stops: tuple[int, ...] = ()
    ) -> list[int]:
        """Mandatory chunk ends after `start`, ascending (the split also ends at the grid)."""
        stops = set(self.prompt_stops(num_prompt_tokens))
        stops.update(junction_stops)
        if start % self.block_size:
            stops.add(floor_to(start, self.block_size) + self.block_size)
        return sorted(s for s in stops if s > start)

    def should_checkpoint(
        self, end: int, num_prompt_tokens: int, junction_stops: tuple[int, ...] = ()
    ) -> bool:
        """Whether the SSM state at chunk end `end` is kept and keyed.

        Prompt only: a state past the prompt (a resumed request replaying outputs) is never
        published here (decode snapshots are separate); with lookahead keys the key of T needs
        token T, so the prompt ends at T - 1. Every mandatory stop the scheduler makes inside
        the prompt is kept, so a stop always yields a checkpoint.
        """
        t = num_prompt_tokens
        if end <= 0 or end > t - self.lookahead or end % self.unit:
            return False
        if end in junction_stops or end == self.tail_checkpoint(t):
            return True
        if end in self.replay_boundaries(t):
            return True
        if self.retention == "dense":
            return True
        if isinstance(self.retention, int) and end % self.retention == 0:
            return True
        fine = self.effective_policy in (Policy.JUNCTION, Policy.LIMIT)
        return fine and self.is_block_grid_resume_point(end)

    def decode_snapshot(self, first: int, last: int) -> int:
        """`limit`: the position a sampling step snapshots, or 0: the last unit boundary among
        the states it verified, positions `first..last` (its chunk end, then one per accepted
        draft). A finished request therefore holds `floor((L-1)/u)*u` of its L prompt + output
        tokens (the last L-1 are computed)."""
        if self.effective_policy is not Policy.LIMIT:
            return 0
        p = floor_to(last, self.unit)
        return p if p >= first and p > 0 else 0
