"""Every boundary formula of hycache, in one place (DESIGN §3.5–3.6).

The managers, the scheduler's chunk split and the store mirror all ask this module where a
request's checkpoints and prefill stops lie; none of them computes a boundary itself.

Positions are token counts: "position n" is the state after the first n tokens.

    B = 16, u = 4, EAGLE on, T = 40 (24 shared + 16 private):

    0       12  16              32    36  40
    |-------+---|---------------|-----+---|
            ^   ^                     ^   ^-- prompt end (running state, never keyed)
            |   replay boundary       tail checkpoint floor(T/u)*u - u
            block-grid resume point ((n + u) % B == 0): where a sibling that shares the
            first block resumes after the EAGLE drop
"""

from __future__ import annotations

from dataclasses import dataclass

from hycache.config import CacheConfig, Policy, SpeculativeConfig


def floor_to(n: int, step: int) -> int:
    return n // step * step


@dataclass(frozen=True)
class Boundaries:
    """Boundary arithmetic for one cache geometry and policy.

    `policy` is the configured policy; `effective_policy` is what actually applies: `junction`
    degrades to `replay` when there is no sub-block unit or no EAGLE drop (DESIGN §3.9).
    """

    block_size: int
    unit: int
    drop: int
    policy: Policy
    retention: str | int = "semantic"

    @classmethod
    def from_config(cls, cache: CacheConfig, spec: SpeculativeConfig) -> Boundaries:
        return cls(cache.block_size, cache.unit, spec.drop(cache), cache.policy, cache.retention)

    @property
    def effective_policy(self) -> Policy:
        if self.policy is Policy.JUNCTION and (self.drop == 0 or self.unit == self.block_size):
            return Policy.REPLAY
        return self.policy

    # -- positions of one prompt ------------------------------------------------------------

    def replay_boundary(self, num_prompt_tokens: int) -> int:
        """The block-grid position a replay of this prompt resumes from.

        Under EAGLE: one block below the last full block, `max(floor(T/B)*B - B, 0)`. Without
        a drafter: the last block-grid position a hit may reach, `floor((T-1)/B)*B` (the
        resume point is at most T - 1).
        """
        b, t = self.block_size, num_prompt_tokens
        if self.drop:
            return max(floor_to(t, b) - b, 0)
        return floor_to(max(t - 1, 0), b)

    def tail_checkpoint(self, num_prompt_tokens: int) -> int:
        """Where the tail SSM checkpoint goes (and where the scheduler stops for it).

        `tail`: unshifted `floor(T/u)*u`. `replay`/`junction`: where an identical resend
        resumes, `floor(T/u)*u - u` under EAGLE, `floor((T-1)/u)*u` without.
        """
        u, t = self.unit, num_prompt_tokens
        if self.policy is Policy.TAIL:
            return floor_to(t, u)
        if self.drop:
            return max(floor_to(t, u) - u, 0)
        return floor_to(max(t - 1, 0), u)

    def attention_tail_key(self, num_prompt_tokens: int) -> int:
        """The one mid-block attention key a request registers: its unshifted prompt tail."""
        return floor_to(num_prompt_tokens, self.unit)

    def is_block_grid_resume_point(self, n: int) -> bool:
        """A position one unit below a block boundary: `(n + u) % B == 0`."""
        return n > 0 and (n + self.unit) % self.block_size == 0

    def lookup_limit(self, num_tokens: int) -> int:
        """How far the attention groups may match: all hashed units under a drafter (the drop
        brings the hit below T), else `T - 1` floored to the unit."""
        if self.drop:
            return floor_to(num_tokens, self.unit)
        return floor_to(max(num_tokens - 1, 0), self.unit)

    def junction_stops(self, junction: int, start: int, num_prompt_tokens: int) -> tuple[int, ...]:
        """The prefill stops a request makes (and keeps) for its observed junction `j`.

        `junction` (effective), junction inside the prompt: `j` floored to the hash grid, one
        unit below the block boundary where a sibling's attention match ends, exactly where the
        next sibling resumes; plus the block boundary right after it, where the chunk that
        starts mid-block stops anyway (keeping that state costs no forward pass, and it is what
        a request sharing a shorter prefix would have found under `replay`). Otherwise (other
        policies, or a junction past the prompt of a resumed request): block-floored from where
        the request starts, `start + floor((j - start)/B)*B`.
        """
        if junction <= start:
            return ()
        if self.effective_policy is Policy.JUNCTION and junction <= num_prompt_tokens:
            stop = floor_to(junction, self.unit)
            after = floor_to(stop, self.block_size) + self.block_size
            if stop % self.block_size and after <= num_prompt_tokens:
                return (stop, after) if stop > start else ()
        else:
            stop = start + floor_to(junction - start, self.block_size)
        return (stop,) if stop > start else ()

    # -- what the scheduler stops at, what the SSM manager keeps ----------------------------

    def prefill_stops(
        self, start: int, num_prompt_tokens: int, junction_stops: tuple[int, ...] = ()
    ) -> list[int]:
        """Mandatory chunk ends after `start`, ascending (the split also ends at the grid)."""
        stops = {
            self.replay_boundary(num_prompt_tokens),
            self.tail_checkpoint(num_prompt_tokens),
        }
        stops.update(junction_stops)
        if start % self.block_size:
            stops.add(floor_to(start, self.block_size) + self.block_size)
        return sorted(s for s in stops if s > start)

    def should_checkpoint(
        self, end: int, num_prompt_tokens: int, junction_stops: tuple[int, ...] = ()
    ) -> bool:
        """Whether the SSM state at chunk end `end` is kept and keyed.

        Prompt only: a state past the prompt (a resumed request replaying outputs) is never
        published. Every mandatory stop the scheduler makes inside the prompt is kept, so a
        stop always yields a checkpoint.
        """
        t = num_prompt_tokens
        if end <= 0 or end > t or end % self.unit:
            return False
        if end in junction_stops or end in (self.tail_checkpoint(t), self.replay_boundary(t)):
            return True
        if self.retention == "dense":
            return True
        if isinstance(self.retention, int) and end % self.retention == 0:
            return True
        return self.effective_policy is Policy.JUNCTION and self.is_block_grid_resume_point(end)

    def limit(self, shared_prefix: int) -> int:
        """The best resume point any engine can reach for a sibling sharing `shared_prefix`
        tokens: drafter rows are valid only below P - 1 (DESIGN §5)."""
        return floor_to(max(shared_prefix - 1, 0), self.unit)
