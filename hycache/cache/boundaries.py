"""Every boundary formula of hycache, in one place (docs/architecture.md §4.5–4.6).

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
from enum import StrEnum

from hycache.config import CacheConfig, Policy, SpeculativeConfig


def floor_to(n: int, step: int) -> int:
    return n // step * step


LOOKAHEAD_POLICIES = (Policy.LOOKAHEAD, Policy.LIMIT)
# the most prefix hints one request may give: `hycache serve` refuses more (400), the vLLM
# plugin reads no more than these (a prompt has few shared-prefix boundaries worth keeping)
MAX_PREFIX_HINTS = 16
PREFIX_HINTS_RULE = f"a list of at most {MAX_PREFIX_HINTS} ints >= 0"


def prefix_hints_problem(hints: object) -> str | None:
    """What breaks the prefix-hints rule (`PREFIX_HINTS_RULE`: a list of at most
    `MAX_PREFIX_HINTS` ints >= 0, a bool being no int) in a decoded value, or None when it
    keeps it: the one rule `hycache serve`'s bodies and the vLLM plugin's front door apply."""
    if not isinstance(hints, list):
        return f"got a {type(hints).__name__}"
    if len(hints) > MAX_PREFIX_HINTS:
        return f"got {len(hints)} entries"
    for i, h in enumerate(hints):
        if type(h) is not int:
            return f"entry {i} is a {type(h).__name__}"
        if h < 0:
            return f"entry {i} is negative"
    return None


class StateKind(StrEnum):
    """Why an SSM state is kept (`Boundaries.state_kind`): admission estimates each kind's
    chance of being hit on its own (`hycache.cache.retention`)."""

    SNAPSHOT = "snapshot"  # a decode snapshot: where the next chat turn resumes
    JUNCTION = "junction"  # an observed junction's stop (and the block after it)
    # a prefix hint's stop (and the block after it) that no observed junction makes: a client
    # names it, so it is priced by its own chance like any state (never kept unconditionally)
    HINT = "hint"
    TAIL = "tail"  # the tail checkpoint: an identical resend
    REPLAY = "replay"  # the replay boundary: a longer sibling
    BELOW_TAIL = "below-tail"  # `limit`: the unit below the tail (a prompt that is a prefix)
    DROP_REPLAY = "drop-replay"  # `limit`: the drop scheme's replay boundary, a block below
    DROP_JUNCTION = "drop-junction"  # `limit`: the drop scheme's junction, a unit above ours
    GRID = "grid"  # anything else: a block-grid resume point, a retention interval


ATTENTION_KIND = "attention"  # the kind of an attention block (`BlockPool.kind`)


@dataclass(frozen=True)
class Boundaries:
    """Boundary arithmetic for one cache geometry and policy.

    `drafter`: a speculative drafter (EAGLE/MTP) whose rows a hit must keep valid. `policy` is
    the configured policy; `effective_policy` is what actually applies: `junction` degrades to
    `replay` without a sub-block unit or an EAGLE drop, `limit` to `lookahead` when the unit is
    the block (architecture §4.9).
    """

    block_size: int
    unit: int
    drafter: bool
    policy: Policy
    retention: str | int = "semantic"
    internal: bool = False  # SSM checkpoints may be written inside a forward (`internal_writes`)
    # `limit` hashes with lookahead keys (vLLM 0.33's default); False: `limit`'s unit keys under
    # the EAGLE-drop scheme (vLLM 0.32, which has no lookahead keys: `hycache.vllm`'s drop mode)
    lookahead_keys: bool = True

    @classmethod
    def from_config(cls, cache: CacheConfig, spec: SpeculativeConfig) -> Boundaries:
        return cls(
            cache.block_size,
            cache.unit,
            bool(spec.eagle_drop),
            cache.policy,
            cache.retention,
            cache.internal_checkpoints,
        )

    @property
    def lookahead(self) -> bool:
        """Keys cover the token after their unit (vLLM 0.33's default EAGLE hashing)."""
        return self.drafter and self.policy in LOOKAHEAD_POLICIES and self.lookahead_keys

    @property
    def drop(self) -> int:
        """The EAGLE drop `d` the coordinator applies once: a unit under the drop scheme with
        a drafter, else 0."""
        return self.unit if self.drafter and not self.lookahead else 0

    @property
    def drop_scheme(self) -> bool:
        """Whether keys follow the EAGLE-drop scheme (vLLM 0.32's drop mode): for callers that
        schedule differently under it; the drop itself is applied by the coordinator alone."""
        return self.drop > 0

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
        """The prefill stops that depend on the prompt alone, ascending; each one is kept.

        The replay boundary and the tail checkpoint. With internal checkpoints, under `limit`
        with a drafter, also where the drop scheme resumes requests that share less (written
        inside the forward: a state page each, no pass; split at, they cost more than they
        saved on the trace workload):

        - the drop's replay boundaries, a block below lookahead's: a first sibling whose shared
          prefix ends inside the last full block (it has observed no junction yet);
        - the unit below the tail: a later prompt that is a prefix of this one ending at the
          tail's unit (the drop's tail `T - u` serves it).

            T = 64,016, B = 4416, u = 64: replay 61,824, drop replay 57,408, tail 64,000,
            below it 63,936
        """
        t, b = num_prompt_tokens, self.block_size
        stops = {self.replay_boundary(t), self.tail_checkpoint(t)}
        if self.internal and self.keys_every_unit and self.drafter:
            stops.update((floor_to(t, b) - b, floor_to(max(t - 1, 0), b) - b))
            stops.add(self.tail_checkpoint(t) - self.unit)
        return tuple(sorted(p for p in stops if p > 0))

    def attention_keys(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """Mid-block attention keys a request registers over its prompt (full blocks are keyed
        separately; under `limit` every unit is keyed instead): the unshifted prompt tail, and
        the position whose hit lands on the tail checkpoint after the drop. Without a drop
        that is the tail checkpoint itself; under the drop it is the unshifted tail again."""
        t = num_prompt_tokens
        keys = {floor_to(t, self.unit), self.tail_checkpoint(t) + self.drop}
        return tuple(sorted(k for k in keys if 0 < k <= t and k % self.block_size))

    def last_prompt_state(self, num_prompt_tokens: int) -> int:
        """The last position whose prompt state can be kept and keyed: `T`, or `T - 1` with
        lookahead keys (the key of `n` covers token `n`)."""
        return num_prompt_tokens - self.lookahead

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
        (architecture §4.5, the limit); without one, `floor(P/u)*u`."""
        if self.drafter:
            return floor_to(max(shared_prefix - 1, 0), self.unit)
        return floor_to(shared_prefix, self.unit)

    def resume_limit(self, shared_prefix: int) -> int:
        """The best resume point for a sibling sharing `shared_prefix` tokens under this key
        scheme, when attention is keyed on every unit: `limit(P)` with lookahead keys or no
        drafter; under the EAGLE drop, the match `floor(P/u)*u` less the dropped unit,
        `floor(P/u)*u - u` (one unit under the limit, or the limit itself when P is on the
        unit grid).

            u = 16: P = 2000 -> 1984 (the limit); P = 2010 -> 1984 (limit 2000)
        """
        if not self.drop:
            return self.limit(shared_prefix)
        return max(floor_to(shared_prefix, self.unit) - self.unit, 0)

    # -- stops a request makes for what it shares ---------------------------------------------

    def junction_stops(self, junction: int, start: int, num_prompt_tokens: int) -> tuple[int, ...]:
        """The prefill stops a request makes (and keeps) for its observed junction `j`.

        Every policy keeps vLLM's stop, the junction floored to the block grid `floor(j/B)*B`
        (vLLM re-derives it per chunk, also after a mid-block resume). Inside the prompt,
        `junction` and `limit` (effective) add `j` itself (on the hash grid: where the next
        sibling resumes) and the block boundary right after it, where the chunk that starts
        mid-block stops anyway (keeping that state costs no forward pass), when a prompt state
        is kept there (`last_prompt_state`: not at a block-grid prompt end under lookahead
        keys: a junction stop never checkpointed):

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
            # only where a prompt state is kept: with lookahead keys a prompt ending on the
            # block grid keeps no state at its end (the key of T needs token T)
            if stop % b and floor + b <= self.last_prompt_state(num_prompt_tokens):
                stops.add(floor + b)
        return tuple(sorted(s for s in stops if s > start))

    def drop_junction_stops(
        self, attention_match: int, start: int, num_prompt_tokens: int
    ) -> tuple[int, ...]:
        """`limit` with internal checkpoints (a state page written inside the forward, no
        pass): where the EAGLE-drop scheme would observe this request's junction.

        An attention match `a` below the lookup limit means the prompt stops being shared
        with what is cached right after it: lookahead keys (over [0, n]) match
        `a = floor((P-1)/u)*u`, the drop scheme's keys (over [0, n)) `floor(P/u)*u`, which is
        `a + u` when the shared prefix P ends on the unit grid. vLLM's drop setup stops there
        (with or without its junction flag) and keeps the state, which a later request sharing
        more than `a + u` with this one resumes from; `limit` keeps it too. It is this
        request's own state, valid whatever P was.

            B = 16, u = 4: owner = S8 + a4, f1 = S8 + b53, g1 = S8 + b8 + c40. f1 matches
            a = 4 and keeps 8; g1 (sharing 16 with f1, matching 12) resumes at 8, as vLLM's
            drop setup does.
        """
        t, u = num_prompt_tokens, self.unit
        if not (self.internal and self.keys_every_unit and self.lookahead):
            return ()
        if not 0 < attention_match < self.lookup_limit(t):
            return ()
        stop = floor_to(attention_match, u) + u
        # a kept prompt state: its key needs the token after it
        return (stop,) if start < stop < t else ()

    def hint_stops(
        self, hints: Iterable[int], start: int, num_prompt_tokens: int
    ) -> tuple[int, ...]:
        """`limit`: the stops for prefix hints (token counts where the request's shared prefix
        ends): each hint's resume limit (`resume_limit`: the limit, or the drop scheme's resume
        point), as if that junction had been observed. A hint past the prompt, or whose limit
        is 0, is ignored; other policies ignore hints."""
        if self.effective_policy is not Policy.LIMIT:
            return ()
        out: set[int] = set()
        for h in hints:
            if 0 < h <= num_prompt_tokens:
                out.update(self.junction_stops(self.resume_limit(h), start, num_prompt_tokens))
        return tuple(sorted(out))

    def declared_reach(self, hints: Iterable[int], resume: int, num_prompt_tokens: int) -> int:
        """The deepest prefix a request declared that a hit resuming at `resume` covers: the
        largest prefix hint's resume limit (where `hint_stops` keeps its state) at or below
        `resume`; 0: none. `limit` only, as hints are."""
        if self.effective_policy is not Policy.LIMIT:
            return 0
        reach = (self.resume_limit(h) for h in hints if 0 < h <= num_prompt_tokens)
        return max((r for r in reach if r <= resume), default=0)

    # -- what the scheduler stops at, what the SSM manager keeps ----------------------------

    def prefill_stops(
        self,
        start: int,
        num_prompt_tokens: int,
        junction_stops: tuple[int, ...] = (),
        reach: int | None = None,
        junction: int = 0,
    ) -> list[int]:
        """Mandatory chunk ends after `start`, ascending (the split also ends at the grid).

        `reach`: how far the chunk could run (the budget and the known tokens allow), for
        internal checkpoints. With them, `lookahead` splits as vLLM 0.33 does for Mamba2: a
        chunk that can finish the prompt and export the tail checkpoint (`vllm_export`) stops
        only at the observed `junction`, floored to the block grid from the chunk's own start
        (vLLM's `start + floor((j - start)/B)*B`: without a block-boundary stop first, a
        mid-block start shifts it); any other chunk as without. The other policies make no
        stop: every position they keep inside a chunk is written there (`internal_writes`).
        """
        t = num_prompt_tokens
        if self.internal and self.effective_policy is not Policy.LOOKAHEAD:
            return []
        if self.internal and reach is not None and self.vllm_export(start, reach, t):
            stops = (
                {start + floor_to(junction - start, self.block_size)} if junction > start else set()
            )
        else:
            stops = {*self.prompt_stops(t), *junction_stops}
            if start % self.block_size:
                stops.add(floor_to(start, self.block_size) + self.block_size)
        return sorted(s for s in stops if s > start)

    def vllm_export(self, start: int, end: int, num_prompt_tokens: int) -> int:
        """vLLM 0.33's one in-forward Mamba2 checkpoint (`is_mamba_prefill_checkpoint_valid`
        with alignment 1): the tail checkpoint `cp`, exported by the chunk [start, end) when it
        reaches the prompt's end, starts on the unit grid at least a unit below `cp`, and `cp`
        lies in a later block column than the state it starts from; else 0."""
        t, b, u = num_prompt_tokens, self.block_size, self.unit
        cp = self.tail_checkpoint(t)
        ok = (
            end >= t
            and start % u == 0
            and -(-end // b) - 2 > (start - 1) // b
            and start + u <= cp
            and start < cp < end
        )
        return cp if ok else 0

    def internal_writes(
        self, start: int, end: int, num_prompt_tokens: int, junction_stops: tuple[int, ...] = ()
    ) -> tuple[int, ...]:
        """The checkpoints written inside the forward of chunk [start, end), ascending (the
        chunk end's own state is `should_checkpoint`'s): with internal checkpoints, `lookahead`
        exports vLLM's one, every other policy each stop it would otherwise have split at.

            start        p1        p2            end
              |----------+---------+-------------|   one forward and one scan; the states
                         ^ state   ^ state           at p1, p2 read out of it to fresh pages
        """
        if not self.internal:
            return ()
        t = num_prompt_tokens
        if self.effective_policy is Policy.LOOKAHEAD:
            # vLLM's export, and the block boundary a chunk that starts mid-block re-aligns
            # at (its partial-hit slot), which a non-exporting chunk would have stopped at
            cp = self.vllm_export(start, end, t)
            if not cp:
                return ()
            nb = floor_to(start, self.block_size) + self.block_size
            realign = (
                start % self.block_size
                and nb < cp
                and self.should_checkpoint(nb, t, junction_stops)
            )
            return (nb, cp) if realign else (cp,)
        wanted = {*self.prompt_stops(t), *junction_stops}
        if start % self.block_size:
            wanted.add(floor_to(start, self.block_size) + self.block_size)
        return tuple(
            sorted(
                p
                for p in wanted
                if start < p < end and self.should_checkpoint(p, t, junction_stops)
            )
        )

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
        if end <= 0 or end > self.last_prompt_state(t) or end % self.unit:
            return False
        if end in junction_stops or end == self.tail_checkpoint(t):
            return True
        if self.internal and end in self.prompt_stops(t):
            return True
        if end in self.replay_boundaries(t):
            return True
        if self.retention == "dense":
            return True
        if isinstance(self.retention, int) and end % self.retention == 0:
            return True
        fine = self.effective_policy in (Policy.JUNCTION, Policy.LIMIT)
        return fine and self.is_block_grid_resume_point(end)

    def hit_saving(self, kind: str, position: int) -> int:
        """Tokens a hit on the state at `position` saves over what the hitting request would
        resume from without it: `position` itself (the prefill of [0, position)), except for
        the drop scheme's junction, kept a unit above the request's own junction state (a
        stop too), whose consumers would otherwise resume there: `u`."""
        return self.unit if kind == StateKind.DROP_JUNCTION else position

    def state_kind(
        self,
        position: int,
        num_prompt_tokens: int,
        junction_stops: tuple[int, ...] = (),
        drop_stops: tuple[int, ...] = (),
        hint_stops: tuple[int, ...] = (),
    ) -> StateKind:
        """Why the prompt state at `position` is kept (a decode snapshot is named by its
        caller); the first reason that applies, in `StateKind`'s order. `drop_stops`,
        `hint_stops`: of `junction_stops`, those only `drop_junction_stops`, only
        `hint_stops` make."""
        t = num_prompt_tokens
        if position in junction_stops:
            if position in drop_stops:
                return StateKind.DROP_JUNCTION
            return StateKind.HINT if position in hint_stops else StateKind.JUNCTION
        tail = self.tail_checkpoint(t)
        if position == tail:
            return StateKind.TAIL
        if position in self.replay_boundaries(t):
            return StateKind.REPLAY
        if self.internal and self.keys_every_unit and self.drafter:
            if position == tail - self.unit:
                return StateKind.BELOW_TAIL
            b = self.block_size
            if position in (floor_to(t, b) - b, floor_to(max(t - 1, 0), b) - b):
                return StateKind.DROP_REPLAY
        return StateKind.GRID

    def decode_snapshot(self, first: int, last: int) -> int:
        """`limit`: the position a sampling step snapshots, or 0: the last unit boundary among
        the states it verified, positions `first..last` (its chunk end, then one per accepted
        draft). A finished request therefore holds `floor((L-1)/u)*u` of its L prompt + output
        tokens (the last L-1 are computed)."""
        if self.effective_policy is not Policy.LIMIT:
            return 0
        p = floor_to(last, self.unit)
        return p if p >= first and p > 0 else 0
