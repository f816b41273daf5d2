"""Whether a prefill stop earns its forward pass (DESIGN §9, "a pass has a price"): one rule,
used by `hycache.vllm`'s scheduler (its own stops and vLLM's tail stops) and by hycache's
own scheduler where it splits prefill (`limit-split`).

A stop ends a chunk: one more forward pass for the request (one more step before its first
token, one more read of the weights). What it buys is a kept state at the stop, which a later
request resumes from instead of the request's last kept state below it (`prev`):

    prev            stop                 next end (where the chunk would end without it)
      |---- first ----|------- rest -------|
      a later request sharing past `stop` recomputes [prev, stop) without the stop

    the stop pays  <=>  chance * (cost([prev, end)) - cost([stop, end)))
                          >=  cost([start, stop)) + cost([stop, end)) - cost([start, end))

(each cost one pass: what resuming at `stop` instead of `prev` saves a later request whose
chunk runs on to `end`, against what the split adds to this one).

A resume has the same trade, borne by one request (`resume_pays`): inside vLLM a hit at a
mid-block state `hit` makes the chunk stop at the next block boundary (the export slot is the
block the state starts in), one more pass than a resume at the block floor, and that pass is
one more step before the request's first token, a step that carries the batch's other work
(`busy` tokens):

    floor      hit        boundary              end
      |---------|------------|------------------|
      resume at hit: [hit, boundary) + [boundary, end), two steps
      resume at floor: [floor, end), one step

    the deeper resume pays  <=>  cost([floor, end)) - cost([hit, end))
                                   >=  split at boundary + cost(busy tokens beside [boundary, end))

vLLM's own tail stop, where the chunk that reaches the prompt's tail checkpoint starts at
the tail's block floor (`tail_pays`), is priced like a resume: the next turn of a
conversation saves [floor, tail) at the tails' observed use (`observed_use`), against the
split and the step the prompt's last tokens then wait for; without it that turn resumes at
the block floor, on the grid.

A request's stops are also priced together (`bounded_stops`): each is one pass, and the
request that observes a junction pays at most `OBSERVER_EXTRA_PASSES` passes more than stock
vLLM makes for the same prompt (issue 45's bound, the upstream change's own); past it the
stops that serve least are not made (inside vLLM: the junction's block floor, which serves
only a request sharing less than the junction, where stock makes no stop there).

`chance` is the expected number of later requests that resume there (admission's per-kind
chance in hycache's own cache, a prior per kind in vLLM). The prices come from the caller (a
`PassPricer`: the simulator's cost model, or a flat price a deployment configures), since the
cache layer cannot import the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hycache.cache.boundaries import StateKind


@runtime_checkable
class PassPricer(Protocol):
    """What prefill costs, in one unit (seconds, say)."""

    def prefill_cost(self, context: int, num_tokens: int) -> float:
        """The cost of prefilling `num_tokens` tokens after `context` cached ones in one pass."""
        ...

    def split_cost(self, context: int, first: int, rest: int) -> float:
        """What running `first + rest` tokens after `context` as two passes adds over one."""
        ...


@dataclass(frozen=True)
class FlatPrice:
    """A price that ignores context and chunk sizes: `pass_cost` per extra pass, `token_cost`
    per prefill token (a deployment's `additional_config`, or a test's)."""

    pass_cost: float
    token_cost: float

    def __post_init__(self) -> None:
        if self.pass_cost < 0 or self.token_cost < 0:
            raise ValueError(f"FlatPrice: costs must be >= 0, got {self}")

    def prefill_cost(self, context: int, num_tokens: int) -> float:
        return num_tokens * self.token_cost

    def split_cost(self, context: int, first: int, rest: int) -> float:
        return self.pass_cost


# Every stop pays: the behaviour without pricing (a free pass).
FREE_PASSES = FlatPrice(0.0, 1.0)

# The chance a stop's state is used, per kind, where nothing observes it (inside vLLM): an
# observed junction or a prefix hint is shared by a sibling already (one more expected); the
# block boundary after it serves a request sharing past a block more (as likely as not); a
# tail checkpoint serves only an identical resend, which a family or a conversation trace
# rarely makes (admission observes tail checkpoints hit about never there: docs/admission.md).
PRIOR_CHANCE: dict[str, float] = {
    StateKind.JUNCTION: 1.0,
    StateKind.GRID: 0.5,
    StateKind.REPLAY: 0.5,
    StateKind.TAIL: 0.01,
}


# the most prefill passes the request that observes a junction pays over stock vLLM's for the
# same prompt (issue 45: the upstream junction change's own bound)
OBSERVER_EXTRA_PASSES = 2


def bounded_stops(
    stops: Iterable[int],
    stock: Iterable[int],
    droppable: Iterable[int],
    bound: int = OBSERVER_EXTRA_PASSES,
) -> tuple[int, ...]:
    """`stops` (chunk ends inside one request's prefill, one pass each) less those of
    `droppable`, in its order, that take the request more than `bound` passes over stock's
    `stock` stops (a stop both make costs no pass more; a stock stop not in `stops` is one
    pass less). A stock stop is never dropped."""
    kept, theirs = set(stops), set(stock)
    for s in droppable:
        if len(kept - theirs) - len(theirs - kept) <= bound:
            break
        if s not in theirs:
            kept.discard(s)
    return tuple(sorted(kept))


def observed_use(used: int, left: int) -> float:
    """The observed chance a state of one kind is resumed from: `used` requests resumed from
    (or, where the state was not kept, observed) one of the `left` states requests left, with
    one use expected before any is seen (the prior of `observed_chance`). A prompt's tail
    checkpoint inside vLLM: a conversation's next turn resumes from it, a one-shot prompt's is
    never used."""
    return (used + 1) / (left + 1)


def observed_chance(kind: str, sightings: int) -> float:
    """`PRIOR_CHANCE` scaled by what was observed: `sightings` requests (this one included)
    shared the stop's prefix without finding a state there, and as many more are expected
    (one sighting: the prior). A system prompt that many siblings reuse pays where one
    sibling's saving would not."""
    return PRIOR_CHANCE[kind] * max(sightings, 1)


def stop_pays(
    pricer: PassPricer,
    chance: float,
    prev: int,
    stop: int,
    start: int,
    end: int,
) -> bool:
    """Whether a stop at `stop` inside the chunk [start, end) pays for its pass: `chance`
    times what a later request resuming at `stop` instead of `prev` saves (its prefill of
    [prev, stop), priced inside a chunk running on to `end`), against what splitting the
    chunk there adds (see the module docstring)."""
    if not start < stop < end:
        return True  # not inside the chunk: it costs no pass
    return chance * _saved(pricer, prev, stop, end) >= pricer.split_cost(
        start, stop - start, end - stop
    )


def resume_pays(
    pricer: PassPricer, floor: int, hit: int, boundary: int, end: int, busy: int
) -> bool:
    """Whether resuming at `hit` instead of `floor` pays for the pass that splits the
    request's prefill [hit, end) at `boundary` (see the module docstring): the prefill the
    request saves, against the split plus the batch's other work (`busy` tokens) in the step
    its first token then waits for. A resume that forces no split always pays."""
    if not floor < hit < boundary < end:
        return True
    split = pricer.split_cost(hit, boundary - hit, end - boundary)
    return _saved(pricer, floor, hit, end) >= split + _wait(pricer, boundary, end, busy)


def tail_pays(
    pricer: PassPricer, chance: float, floor: int, tail: int, end: int, busy: int
) -> bool:
    """Whether the stop at a prompt's tail checkpoint `tail` pays for its pass, where the
    chunk that reaches it starts at `floor`, the tail's block floor, a block-grid state kept:
    `chance` (`observed_use`) times what a later request (a conversation's next turn)
    resuming at `tail` instead of `floor` saves, against the split and the step with the
    batch's other work (`busy` tokens) that the prompt's last tokens [tail, end) then wait
    for, before the request's first token (as `resume_pays` prices that step). Without the
    stop the next turn resumes at `floor`, on the block grid: it needs no re-alignment there."""
    if not floor < tail < end:
        return True
    split = pricer.split_cost(floor, tail - floor, end - tail)
    return chance * _saved(pricer, floor, tail, end) >= split + _wait(pricer, tail, end, busy)


def _wait(pricer: PassPricer, at: int, end: int, busy: int) -> float:
    """What `busy` tokens of other work add to the step that prefills [at, end)."""
    rest = end - at
    return max(pricer.prefill_cost(at, rest + busy) - pricer.prefill_cost(at, rest), 0.0)


def _saved(pricer: PassPricer, prev: int, stop: int, end: int) -> float:
    """What prefilling [stop, end) instead of [prev, end) saves."""
    saved = pricer.prefill_cost(prev, end - prev) - pricer.prefill_cost(stop, end - stop)
    return max(saved, 0.0)
