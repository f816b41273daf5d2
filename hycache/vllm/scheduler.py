"""`hycache.vllm.Scheduler`: hycache's `limit` policy inside vLLM 0.32-0.34 (`--scheduler-cls`).

`Scheduler` subclasses vLLM's `AsyncScheduler` (async scheduling kept), `SyncScheduler` its
`Scheduler`. Both add `limit`'s prompt-side mechanisms to vLLM's own scheduling, and nothing
else:

    lookup (vLLM's coordinator)      every-unit attention keys (`managers.UnitKeyedAttention`)
                                     make the attention hit, hence vLLM's observed junction j
                                     (`shared_prefix_boundary`), the limit floor((P-1)/u)*u
    _get_local_prefix_cache_hit  ──▶ the resume priced (`stops.resume_pays`: a mid-block hit
                                     whose forced pass does not pay is capped at the block
                                     floor, stock's point); the request's stops:
                                     `Boundaries.junction_stops(j)` (vLLM's floor(j/B)*B, j on
                                     the unit grid, the block boundary after it) and
                                     `Boundaries.hint_stops` for the prefix hints in
                                     `SamplingParams.extra_args["prefix_hints"]`; a sighting of
                                     j counted (`stops.observed_chance` prices its stops)
    _mamba_block_aligned_split   ──▶ vLLM's split, then ended at the first of those stops
                                     that pays; vLLM's tail stop priced where the chunk
                                     starts at the tail's block floor (`stops.tail_pays`, at
                                     the tails' observed use) or the plugin moved the request
    Mamba manager                    keeps the state at each stop (`managers.StopKeepingMamba`)

vLLM's in-forward export (one Mamba2 checkpoint per forward, `MambaMixer2`'s spec) stays
as it is: its position is derived on the worker from the chunk end (one unit below the prompt
end, in the final chunk), so a scheduler cannot direct it to a junction. Each stop above is a
chunk end, one forward pass each; the final chunk still exports the tail checkpoint. The
replay boundary, where hycache's own scheduler also stops, gets no stop here: vLLM's final
chunk spans it to export the tail, and the stop would cost every request two passes.

Drop mode (vLLM 0.32, which hashes an MTP drafter with the EAGLE drop, no lookahead keys): the
same mechanisms with `Boundaries(..., lookahead_keys=False)`. A lookup matching attention to n
resumes at n - u, so vLLM's observed junction is the drop's resume point and a hint stops at
`Boundaries.resume_limit(h)` = floor(h/u)*u - u; the Mamba manager keys each stop as 0.32 keys
a junction it observed with `enable_mamba_shared_prefix_checkpoint` (the flag may be on or off).

Inert (exactly vLLM's scheduler, one WARNING with the reason at startup) on a vLLM release
`hycache.vllm.compat` does not list or one missing an internal it names, and unless the model
has a Mamba group in `mamba_cache_mode="align"`, prefix caching is on, `prefix_match_unit <
block_size` with vLLM's sub-block hits, and an EAGLE/MTP drafter hashes with vLLM's lookahead
keys (0.33/0.34) or with the EAGLE drop and no multi-module re-prefill tail (0.32). vLLM is
reached only through `compat`: this module imports on any vLLM that has a `Scheduler`.
"""

from __future__ import annotations

import logging
import reprlib
from typing import TYPE_CHECKING, Any

from hycache.cache.boundaries import MAX_PREFIX_HINTS, Boundaries, StateKind, floor_to
from hycache.cache.stops import (
    PRIOR_CHANCE,
    FlatPrice,
    PassPricer,
    bounded_stops,
    observed_chance,
    observed_use,
    resume_pays,
    stop_pays,
    tail_pays,
)
from hycache.config import Policy
from hycache.vllm import compat, events, managers
from hycache.vllm.guard import HINTS_KEY
from hycache.vllm.managers import STOPS_ATTR, stops_of

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = logging.getLogger("hycache.vllm")

HINTS_ATTR = "hycache_hints"  # the parsed hints, set on each vLLM request
HIT_ATTR = "hycache_hit"  # the request's last local hit, set on each vLLM request
CAPPED_ATTR = "hycache_capped"  # the block floor a priced resume capped the request's hit at
MOVED_ATTR = "hycache_moved"  # a chunk ended at one of its sub-block stops (not only planned)
KEEP_TAIL_ATTR = "hycache_keep_tail"  # a resume priced with the tail stop it costs kept it
SIGHTINGS_ATTR = "hycache_sightings"  # requests that observed the request's junction so far
TAIL_SEEN_ATTR = "hycache_tail_seen"  # the request's lookup counted for the tails' use
TAIL_LEFT_ATTR = "hycache_tail_left"  # the request's prefill reached its tail (counted)
DROPPED_TAIL_ATTR = "hycache_dropped_tail"  # its junction: a prompt tail the plugin priced out
# how many junction prefixes the scheduler counts sightings of (the newest; a forgotten one
# starts again from one sighting, the prior)
JUNCTIONS_REMEMBERED = 1 << 16
PRICE_KEY = "hycache"  # VllmConfig.additional_config key: {"pass_cost": .., "token_cost": ..}
# A pass priced as 96 prefill tokens when the deployment names no price: what an extra pass
# adds to a 9B hybrid's prefill on an H200 in the simulator's cost model (Nemotron-H-8B,
# Bamba-9B: 2-3 ms over a 0.03 ms token when the chunk it splits is long, up to the whole
# 5-6 ms weight read when it leaves a short one; docs/vllm-plugin.md, "What a stop costs").
DEFAULT_PRICE = FlatPrice(pass_cost=96.0, token_cost=1.0)
# A step's load, averaged over about the last 1 / LOAD_WEIGHT steps (`_Limit.hycache_busy`):
# what the step a later pass adds carries beside it, where arrivals come in bursts (a closed
# loop's requests finish together) that one step's load would miss or overstate.
LOAD_WEIGHT = 0.1
LOGGED_HINTS = 4  # bad hints a warning quotes (it counts the others)
MAX_LOGGED_ID = 128  # characters of a request id a warning quotes
_REPR = reprlib.Repr()  # a bad hint's repr in the warning: a few items, 40 characters each
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 2, 40, 40, 40

AsyncBase, SyncBase = compat.scheduler_bases()


def inert_reason(sched: Any) -> str | None:
    """Why `limit` cannot apply to this vLLM scheduler, or None when it can: the vLLM
    release or a missing internal (`compat`), then the deployment."""
    why = compat.runtime_problem(sched)
    if why is not None:
        return why
    if not sched.cache_config.enable_prefix_caching:
        return "prefix caching is off"
    if not sched.need_mamba_block_aligned_split:
        return "no Mamba group in mamba_cache_mode='align'"
    if sched.hash_block_size >= sched.cache_config.block_size:
        return f"prefix_match_unit equals block_size ({sched.cache_config.block_size})"
    if not sched.mamba_partial_cache_hit:
        return "vLLM disabled sub-block prefix-cache hits for these KV cache groups"
    if not sched.num_spec_tokens:
        pass  # no drafter: keys cover [0, n), a hit needs nothing past it (the limit floor(P/u)*u)
    elif compat.has_lookahead_keys():
        lookahead = compat.num_hash_lookahead_tokens(sched)
        if lookahead != 1:
            return (
                "the drafter's keys do not cover one token past each unit "
                f"(num_hash_lookahead_tokens={lookahead})"
            )
    else:
        # drop mode (vLLM 0.32): the EAGLE drop proves a hit's draft rows, and the Mamba
        # manager keys a stop's state the way it keys a junction it observed itself
        if not sched.use_eagle_block_drop:
            return "the drafter neither hashes with lookahead keys nor drops the last unit"
        if sched.kv_cache_manager.coordinator.num_reprefillable_tokens:
            return (
                "a multi-module MTP drafter re-prefills a tail (vLLM's Mamba manager then "
                "caches no junction state)"
            )
    found = managers.hybrid_managers(sched.kv_cache_manager)
    if found is None:
        return "no attention + Mamba manager pair in vLLM's KV cache manager"
    return compat.managers_problem(*found)


def boundaries_for(sched: Any) -> Boundaries:
    """hycache's boundary arithmetic for this vLLM deployment: `limit`, with lookahead keys
    (0.33, 0.34), under the EAGLE drop (0.32's drop mode), or without a drafter."""
    interval = sched.kv_cache_config.prefix_cache_retention_interval
    retention: str | int = {0: "semantic", None: "dense"}.get(interval, interval)
    return Boundaries(
        block_size=sched.cache_config.block_size,
        unit=sched.hash_block_size,
        drafter=bool(sched.num_spec_tokens),
        policy=Policy.LIMIT,
        retention=retention,
        lookahead_keys=compat.num_hash_lookahead_tokens(sched) == 1,
    )


def pass_price(sched: Any) -> PassPricer:
    """The price of a pass and a token this deployment names in
    `--additional-config '{"hycache": {"pass_cost": P, "token_cost": T}}'` (any one unit), or
    `DEFAULT_PRICE`; `{"pass_cost": 0}` makes every stop (today's behaviour before pricing)."""
    extra = getattr(sched.vllm_config, "additional_config", None)
    conf = extra.get(PRICE_KEY) if isinstance(extra, dict) else None
    if not isinstance(conf, dict):
        return DEFAULT_PRICE
    return FlatPrice(
        float(conf.get("pass_cost", DEFAULT_PRICE.pass_cost)),
        float(conf.get("token_cost", DEFAULT_PRICE.token_cost)),
    )


def parse_hints(request: Request) -> tuple[int, ...]:
    """The request's prefix hints; a bad one (not a list of ints, negative, past the prompt)
    and any past the first `MAX_PREFIX_HINTS` are ignored with one warning for the request
    (parsed once: a preempted request is looked up again)."""
    parsed: tuple[int, ...] | None = getattr(request, HINTS_ATTR, None)
    if parsed is None:
        parsed = _parse_hints(request)
        setattr(request, HINTS_ATTR, parsed)
    return parsed


def _parse_hints(request: Request) -> tuple[int, ...]:
    """One pass over at most `MAX_PREFIX_HINTS` entries (the engine's scheduler runs this: a
    request's list may be any length, so nothing past the cap is looked at). A hint is an
    `int` by type (a bool or a float equal to a good hint is bad, the good hint kept); the
    warning gives counts and the first `LOGGED_HINTS` bad values, each repr bounded."""
    extra = request.sampling_params.extra_args if request.sampling_params else None
    raw = extra.get(HINTS_KEY) if isinstance(extra, dict) else None
    if raw is None:
        return ()
    t = request.num_prompt_tokens
    if isinstance(raw, list | tuple):
        items, over = raw[:MAX_PREFIX_HINTS], max(0, len(raw) - MAX_PREFIX_HINTS)
    else:
        items, over = (raw,), 0
    kept: set[int] = set()
    bad: list[object] = []
    num_bad = 0
    for h in items:
        if type(h) is int and 0 < h <= t:
            kept.add(h)
        else:
            num_bad += 1
            if len(bad) < LOGGED_HINTS:
                bad.append(h)
    if num_bad or over:
        logger.warning(
            "hycache.vllm: request %s: ignoring prefix hints: %d bad %s, %d past the first %d "
            "(each must be an int in [1, %d], the prompt's length)",
            str(request.request_id)[:MAX_LOGGED_ID],
            num_bad,
            "[" + ", ".join(map(_bounded_repr, bad)) + (", ...]" if num_bad > len(bad) else "]"),
            over,
            MAX_PREFIX_HINTS,
            t,
        )
    return tuple(sorted(kept))


def _bounded_repr(value: object) -> str:
    """`value`'s repr, at most about `_REPR.maxother` characters whatever it holds."""
    try:
        return _REPR.repr(value)
    except ValueError:  # an int past Python's int-to-str digit limit
        return f"<{type(value).__name__}>"


def _remember(table: dict[Any, int], key: Any, value: int) -> None:
    """Set `table[key]` as its newest entry, keeping the newest `JUNCTIONS_REMEMBERED` (a
    dict keeps insertion order: the oldest is first)."""
    table.pop(key, None)
    table[key] = value
    if len(table) > JUNCTIONS_REMEMBERED:
        del table[next(iter(table))]


class _Limit:
    """The mechanisms, over either vLLM scheduler class (see the module docstring)."""

    hycache_bounds: Boundaries | None
    hycache_inert_reason: str | None
    hycache_pricer: PassPricer  # what a pass and a token cost (`pass_price`; the harness may
    # set the simulator's cost model instead)
    hycache_vllm_base = "Scheduler"  # the vLLM class behaved as when inert (for the log line)
    hycache_load: float  # tokens a step schedules, a moving average (`hycache_busy`)
    hycache_sightings: dict[Any, int]  # junction prefix key -> requests that observed it
    hycache_tails: list[int]  # [prompt tails requests left, of them resumed from or observed]
    hycache_dropped_tails: dict[Any, int]  # tail key -> position, tail stops priced out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the KV events the deployment asked for (`hycache.vllm.events`), inert or not
        self.hycache_events = events.install(self)
        reason = inert_reason(self)
        self.hycache_inert_reason = reason
        if reason is not None:
            self.hycache_bounds = None
            logger.warning(
                "hycache.vllm.%s is inert (%s): scheduling exactly as vLLM's %s",
                type(self).__name__,
                reason,
                self.hycache_vllm_base,
            )
            return
        self.hycache_bounds = boundaries_for(self)
        self.hycache_pricer = pass_price(self)
        self.hycache_load = 0.0
        self.hycache_sightings = {}
        self.hycache_tails = [0, 0]
        self.hycache_dropped_tails = {}
        managers.install(self.kv_cache_manager)  # type: ignore[attr-defined]
        logger.info(
            "hycache.vllm.%s: limit on (vLLM %s; block_size %d, unit %d): keys on every unit, "
            "junction stops on the unit grid, prefix hints",
            type(self).__name__,
            compat.version(),
            self.hycache_bounds.block_size,
            self.hycache_bounds.unit,
        )

    def hycache_stops(self, request: Request, hit: int, junction: int) -> tuple[int, ...]:
        """Stops (kept as checkpoints) for a request resuming at `hit` that observed
        `junction`, and for its prefix hints: all from `hycache.cache.boundaries`."""
        bounds = self.hycache_bounds
        assert bounds is not None
        t = request.num_prompt_tokens
        stops = set(bounds.junction_stops(junction, hit, t))
        if bounds.drop_scheme:
            # priced together (`stops.bounded_stops`): the junction's block floor, which serves
            # only a request sharing less than the junction, is not made where it takes the
            # request past stock + 2 passes (stock's block keys observe no junction it floors
            # to; vLLM's own split still ends there: `_without_vllm_floor`)
            inside = {s for s in stops if s < t}
            droppable = (floor_to(junction, bounds.block_size),)
            stock = self._stock_junction_stops(junction, hit, t)
            stops = set(bounded_stops(inside, stock, droppable)) | (stops - inside)
        hints = parse_hints(request)
        # a hint names where sharing ends: the block floor below its stop would serve only a
        # request sharing less than it says, and unlike a junction's floor (vLLM's own stop)
        # it is a pass stock does not make
        limits = {bounds.resume_limit(h) for h in hints}
        below = {floor_to(x, bounds.block_size) for x in limits} - limits
        stops.update(s for s in bounds.hint_stops(hints, hit, t) if s not in below)
        return tuple(sorted(s for s in stops if s > hit))

    def _stock_junction_stops(self, junction: int, hit: int, t: int) -> tuple[int, ...]:
        """Drop mode: the stop stock vLLM makes for the junction whose drop resume point the
        unit keys observed at `junction` (match `junction + u`): its block keys match whole
        blocks only, so it observes the drop one block key lower and stops there with the
        junction flag, at that junction's block floor without it."""
        bounds = self.hycache_bounds
        assert bounds is not None
        b, u = bounds.block_size, bounds.unit
        seen = floor_to(junction + u, b) - u
        flag = self.kv_cache_manager.mamba_shared_prefix_checkpoint  # type: ignore[attr-defined]
        stop = seen if flag else floor_to(seen, b)
        return (stop,) if hit < stop < t else ()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self.hycache_bounds is not None:
            load = out.total_num_scheduled_tokens
            self.hycache_load += LOAD_WEIGHT * (load - self.hycache_load)
        return out

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        """vLLM's reset, and, where it succeeds, what the plugin remembers of the cache and of
        earlier requests (junction sightings, the batch's mean load, the stop states kept):
        after a reset the scheduler decides as a fresh one would."""
        done: bool = super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]
        if done and self.hycache_bounds is not None:
            self.hycache_sightings.clear()
            self.hycache_tails = [0, 0]
            self.hycache_dropped_tails.clear()
            self.hycache_load = 0.0
            managers.forget_stop_states(self.kv_cache_manager)  # type: ignore[attr-defined]
        return done

    def hycache_busy(self, request: Request) -> int:
        """The other work a step carries, in tokens, as a request deciding its resume expects
        it: the batch's recent mean load per step while other requests are in it, none when
        it is alone (its own earlier steps are no one's wait)."""
        live = self.requests  # type: ignore[attr-defined]
        others = len(live) - (request.request_id in live)
        return round(self.hycache_load) if others else 0

    def _get_local_prefix_cache_hit(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # the arguments pass through as given: vLLM 0.32 has no `max_cache_hit_length`, and an
        # inert scheduler must be exactly vLLM's there too
        out = super()._get_local_prefix_cache_hit(request, *args, **kwargs)  # type: ignore[misc]
        if self.hycache_bounds is not None:
            self._count_tail_use(request, out[1], out[2])
            out = self._priced_resume(request, out, *args, **kwargs)
            _, hit, junction, _ = out
            setattr(request, STOPS_ATTR, self.hycache_stops(request, hit, junction))
            setattr(request, HIT_ATTR, hit)
            self._sight(request, hit, junction)
        return out

    def _sight(self, request: Request, hit: int, junction: int) -> None:
        """Count `request` as one more sighting of the junction it observed (once per request:
        a preempted one looks up again), bounded to the newest `JUNCTIONS_REMEMBERED`
        prefixes; its stops there are priced with the count (`stops.observed_chance`)."""
        assert self.hycache_bounds is not None
        u = self.hycache_bounds.unit
        if junction <= hit or hasattr(request, SIGHTINGS_ATTR):
            return
        index = junction // u - 1
        if not 0 <= index < len(request.block_hashes):
            return
        key = request.block_hashes[index]
        seen = self.hycache_sightings.get(key, 0) + 1
        _remember(self.hycache_sightings, key, seen)
        setattr(request, SIGHTINGS_ATTR, seen)

    def _count_tail_use(self, request: Request, hit: int, junction: int) -> None:
        """Count `request` (once: a preempted one looks up again) as a use of a prompt's tail
        where its lookup hit one (a mid-block state no stop of ours kept: a conversation's
        next turn), or observed one the plugin priced out (its junction is that tail: the
        prompt's unit keys end there); mark the latter, whose stop is then a tail's."""
        bounds = self.hycache_bounds
        assert bounds is not None
        if not compat.has_lookahead_keys() or hasattr(request, TAIL_SEEN_ATTR):
            return
        setattr(request, TAIL_SEEN_ATTR, True)
        if junction > hit and self._at_dropped_tail(request, junction):
            setattr(request, DROPPED_TAIL_ATTR, junction)
            self.hycache_tails[1] += 1
            return
        if hit % bounds.block_size and not managers.resumes_at_a_stop_state(
            self.kv_cache_manager,  # type: ignore[attr-defined]
            request,
            hit,
        ):
            self.hycache_tails[1] += 1

    def _at_dropped_tail(self, request: Request, junction: int) -> bool:
        """Whether the junction `request` observed is where a prompt whose tail stop was
        priced out ends its unit keys: at that tail, or one unit past it where the prompt
        ends on the unit grid (its last key's lookahead is the first output token, which only
        a continuation shares)."""
        u = self.hycache_bounds.unit  # type: ignore[union-attr]
        hashes = request.block_hashes
        return any(
            0 < tail // u <= len(hashes)
            and self.hycache_dropped_tails.get(hashes[tail // u - 1]) == tail
            for tail in (junction, junction - u)
        )

    def _priced_resume(self, request: Request, out: Any, *args: Any, **kwargs: Any) -> Any:
        """The lookup `out`, or the same lookup capped at the block floor of its hit where the
        mid-block hit makes vLLM split the prefill at the next block boundary (one more pass
        than a resume at the floor: stock's point) and the tokens it saves do not pay for that
        pass and the step it adds before the first token (`stops.resume_pays`, the batch's
        load as `busy`). Never below the floor: where the capped lookup finds no state there
        (it would land lower, below where stock resumes), the hit stands. On 0.33 / 0.34
        (0.32's lookup takes no cap)."""
        _, hit, _, diverged = out
        bounds = self.hycache_bounds
        assert bounds is not None
        b, t = bounds.block_size, request.num_prompt_tokens
        floor, end = floor_to(hit, b), max(t, request.num_tokens - 1)
        setattr(request, CAPPED_ATTR, None)
        setattr(request, KEEP_TAIL_ATTR, False)
        if diverged or hit == floor or not compat.has_lookahead_keys():
            return out
        if end - floor > self.max_num_scheduled_tokens:  # type: ignore[attr-defined]
            return out  # from the floor too the first chunk ends on the block grid
        exports = compat.exports_prefill_checkpoint(self)
        if exports and bounds.vllm_export(hit, end, t):
            return out  # one forward exports the tail: vLLM makes no split
        # a hit in the prompt's last block column (vLLM makes no split) where one forward from
        # the floor would export the tail (stock keeps it, free): from the hit vLLM stops at
        # the tail, the pass the deeper resume costs, and the stop is kept
        # (`_drops_vllm_tail`): a chat's next turn resumes there on stock
        tail = bounds.tail_checkpoint(t)
        keeps_tail = (
            exports and hit < tail and end <= floor + b and bounds.vllm_export(floor, end, t)
        )
        setattr(request, KEEP_TAIL_ATTR, keeps_tail)
        busy = self.hycache_busy(request)
        split_at = tail if keeps_tail else floor + b
        if resume_pays(self.hycache_pricer, floor, hit, split_at, end, busy):
            return out
        given = kwargs.get("max_cache_hit_length", args[0] if args else None)
        cap = floor if given is None else min(given, floor)
        blocks, capped, _, diverged = super()._get_local_prefix_cache_hit(request, cap)  # type: ignore[misc]
        if capped < floor or floor + b in self.hycache_stops(request, capped, out[2]):
            # no state at the floor: the capped lookup lands lower (a chat's next turn, whose
            # hit is the previous prompt's tail checkpoint, stock's own state); or a stop of
            # our own would split the capped chunk at the boundary anyway: the pass is made
            # either way, and the hit stands (stock's resume point)
            return out
        setattr(request, CAPPED_ATTR, capped)
        setattr(request, KEEP_TAIL_ATTR, False)
        # the junction the full lookup observed (0: none past its hit), not the cap's edge
        return blocks, capped, out[2], diverged

    def _mamba_block_aligned_split(self, request: Request, *args: Any, **kwargs: Any) -> int:
        # passed through as given: an inert scheduler is exactly vLLM's, whatever it takes
        n: int = super()._mamba_block_aligned_split(request, *args, **kwargs)  # type: ignore[misc]
        bounds = self.hycache_bounds
        if bounds is None:
            return n
        # the parameters `compat` checked: (num_new_tokens, num_new_local_computed_tokens=0,
        # num_external_computed_tokens=0), positional or by name
        names = ("num_new_tokens", "num_new_local_computed_tokens", "num_external_computed_tokens")
        given = dict(zip(names, args, strict=False)) | kwargs
        start = (
            request.num_computed_tokens
            + given.get("num_new_local_computed_tokens", 0)
            + given.get("num_external_computed_tokens", 0)
        )
        n = self._without_vllm_floor(request, start, n, args, kwargs)
        if self._defers_capped(request, start, given.get("num_new_tokens", n)):
            return 0
        stops = stops_of(request)
        end = start + n
        if self._drops_vllm_tail(request, start, end, given.get("num_new_tokens", n)):
            end = start + given["num_new_tokens"]
        self._count_tail_left(request, end)
        # our stops inside vLLM's chunk, each made only where it pays for its pass (a stop
        # not made keeps no state: the next one saves from the chunk's start)
        prev, cut = start, end
        sightings = getattr(request, SIGHTINGS_ATTR, 1)
        b = bounds.block_size
        for s in (s for s in stops if start < s < end):
            if s % b == 0 and any(s - b < x < s for x in stops if x % b):
                # the block boundary after a sub-block stop is kept where vLLM re-aligns a
                # chunk that starts mid-block (no pass of ours); vLLM's chunk runs past it
                # here (that stop not made, or the chunk exports in the forward): not a cut
                continue
            if s == getattr(request, DROPPED_TAIL_ATTR, None):
                # the tail of a prompt this request continues, its stop priced out: a state
                # for a resend of that prompt, not a sibling's junction
                kind = StateKind.TAIL
            elif s % b:
                if sightings > 1 and self._realigns(request, s):
                    # a later sighting, a sibling (issue 45's bound: one pass over stock),
                    # whose junction stop costs vLLM's re-alignment after it too: not made
                    continue
                kind = StateKind.JUNCTION
            else:
                kind = StateKind.GRID
            chance = observed_chance(kind, sightings)
            if stop_pays(self.hycache_pricer, chance, prev, s, start, end):
                cut = s
                break
        # the chunk ends at a sub-block stop of ours, whoever cut it there: this loop, or
        # vLLM's own split (0.32's `enable_mamba_shared_prefix_checkpoint` ends a chunk at
        # the junction it observes, which the unit keys made ours): the request is moved
        if cut % bounds.block_size and cut < request.num_prompt_tokens and cut in stops:
            setattr(request, MOVED_ATTR, True)
        return cut - start

    def _count_tail_left(self, request: Request, end: int) -> None:
        """Count the prompt tail `request` leaves once its prefill reaches it (kept or priced
        out): the denominator of the tails' observed use (`stops.observed_use`)."""
        bounds = self.hycache_bounds
        assert bounds is not None
        t = request.num_prompt_tokens
        if not compat.has_lookahead_keys() or hasattr(request, TAIL_LEFT_ATTR):
            return
        if end >= bounds.tail_checkpoint(t) and request.num_tokens <= t:
            setattr(request, TAIL_LEFT_ATTR, True)
            self.hycache_tails[0] += 1

    def _realigns(self, request: Request, stop: int) -> bool:
        """Whether a chunk ending at the sub-block `stop` makes vLLM split the next one at the
        block boundary after it: the next chunk (up to the prompt's end, or the budget) runs
        past that boundary and does not export the prompt's checkpoint in the forward (which
        frees a chunk that starts mid-block from re-aligning). A second pass for the stop."""
        bounds = self.hycache_bounds
        assert bounds is not None
        t = request.num_prompt_tokens
        boundary = floor_to(stop, bounds.block_size) + bounds.block_size
        reach = min(t, stop + self.max_num_scheduled_tokens)  # type: ignore[attr-defined]
        return boundary < reach and not (
            reach >= t
            and compat.split_exports_prefill_checkpoint(self)
            and bounds.vllm_export(stop, t, t)
        )

    def _without_vllm_floor(
        self, request: Request, start: int, n: int, args: Any, kwargs: Any
    ) -> int:
        """vLLM's chunk `n`, or vLLM's split again without its junction stop where that stop
        is the junction's block floor (vLLM 0.32 without the junction flag floors the junction
        it is told to the block grid) and the plugin's stops priced it out (`hycache_stops`);
        every other stop of vLLM's stays."""
        bounds = self.hycache_bounds
        assert bounds is not None
        junction, end = request.shared_prefix_boundary, start + n
        if (
            not bounds.drop_scheme
            or self.kv_cache_manager.mamba_shared_prefix_checkpoint  # type: ignore[attr-defined]
            or not start < end < junction
            or end != start + floor_to(junction - start, bounds.block_size)
            or end in stops_of(request)
        ):
            return n
        request.shared_prefix_boundary = 0
        try:
            return super()._mamba_block_aligned_split(request, *args, **kwargs)  # type: ignore[misc,no-any-return]
        finally:
            request.shared_prefix_boundary = junction

    def _defers_capped(self, request: Request, start: int, num_new: int) -> bool:
        """Whether a request whose resume was capped at the block floor waits a step instead
        of starting a chunk the budget cuts (a chunk that fits beside the batch's decodes):
        the floor was taken for its one pass, and a cut chunk from a block start ends on the
        grid and then at the tail, two passes more than the one it waits for (vLLM does the
        same with a chunk shorter than a block)."""
        capped = getattr(request, CAPPED_ATTR, None)
        end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if capped is None or start != capped or start + num_new >= end:
            return False
        # only a chunk that fits beside the batch's decodes: one that never would is not held
        decodes = len(self.running) * (1 + self.num_spec_tokens)  # type: ignore[attr-defined]
        return end - start <= self.max_num_scheduled_tokens - decodes  # type: ignore[attr-defined]

    def _drops_vllm_tail(self, request: Request, start: int, end: int, num_new: int) -> bool:
        """Whether the chunk vLLM ended at the prompt's tail checkpoint (a chunk that cannot
        export it in the forward: a mid-block resume, a start in the prompt's last block
        column) runs on to the prompt's end instead, for a request the plugin moved (a
        sub-block resume, or stops of its own): the tail serves only an identical resend, a
        pass it does not pay for (`stop_pays`, `PRIOR_CHANCE`). Where the plugin changed
        nothing (or stock stops there too), the stop is stock's own, priced where the chunk
        starts at the tail's block floor (`_tail_priced_out`)."""
        bounds = self.hycache_bounds
        assert bounds is not None
        t = request.num_prompt_tokens
        tail = bounds.tail_checkpoint(t)
        if end != tail or tail % bounds.block_size == 0 or start + num_new < t:
            return False
        if request.num_tokens > t:
            return False  # a resumed request replaying outputs
        if tail in stops_of(request) and tail != getattr(request, DROPPED_TAIL_ATTR, None):
            return False  # our own stop (a previous prompt's priced-out tail is a tail here)
        if getattr(request, KEEP_TAIL_ATTR, False):
            return False  # its deeper resume paid for it (`_priced_resume`)
        # moved: a sub-block stop of its own made (a junction, a hint; one planned but priced
        # out leaves stock's grid), or a resume at a state such
        # a stop kept (a family's later sibling). A resume at a prompt's tail checkpoint (a
        # chat's next turn) is stock's own: its tail stop is priced as stock's (the next turn
        # resumes there, or at the block start below it)
        hit = getattr(request, HIT_ATTR, 0)
        own = getattr(request, MOVED_ATTR, False)
        if not own and not managers.resumes_at_a_stop_state(self.kv_cache_manager, request, hit):  # type: ignore[attr-defined]
            return self._tail_priced_out(request, start, tail)
        # on 0.33 / 0.34 only a tail stop the move made is priced: from the block floor of its
        # hit, vLLM would export the tail inside the single final forward. Where stock stops
        # there too (no export: a prompt within one block, a non-exporting spec), the stop
        # costs no pass more than stock's: priced as stock's. (0.32 exports nothing, and its
        # stock makes no such stop from a block start: priced.)
        if compat.has_lookahead_keys() and not (
            compat.exports_prefill_checkpoint(self)
            and bounds.vllm_export(floor_to(hit, bounds.block_size), t, t)
        ):
            return self._tail_priced_out(request, start, tail)
        prev = max(start, floor_to(tail, bounds.block_size))
        return not stop_pays(
            self.hycache_pricer, PRIOR_CHANCE[StateKind.TAIL], prev, tail, start, t
        )

    def _tail_priced_out(self, request: Request, start: int, tail: int) -> bool:
        """Stock's own tail stop (a request the plugin did not move, or one where stock stops
        there too), where the chunk vLLM ended there starts at the tail's block floor (a
        block-grid state, kept): made only where it pays for its pass and the step its last
        tokens then wait for (`stops.tail_pays`), at the tails' observed use (a
        conversation's turns resume from them, one-shot prompts never). Without it the next
        turn resumes at that block start, from which vLLM needs no re-alignment: as many
        passes as from the tail or fewer, but for a budget pass where its prefill from the
        block start exceeds the budget. A tail priced out is remembered (as the junctions'
        sightings are), so that the turn which observes it there prices its stop as a
        tail's, not a sibling's junction."""
        bounds = self.hycache_bounds
        assert bounds is not None
        t, b, u = request.num_prompt_tokens, bounds.block_size, bounds.unit
        if not compat.has_lookahead_keys() or start != floor_to(tail, b):
            return False
        if self.max_num_scheduled_tokens < b:  # type: ignore[attr-defined]
            # a budget below a block cuts chunks off the grid: from the floor the next turn
            # may need a budget pass more than from the tail, which the saving does not price
            return False
        chance = observed_use(self.hycache_tails[1], self.hycache_tails[0])
        busy = self.hycache_busy(request)
        if tail_pays(self.hycache_pricer, chance, start, tail, t, busy):
            return False
        index = tail // u - 1
        if 0 <= index < len(request.block_hashes):
            _remember(self.hycache_dropped_tails, request.block_hashes[index], tail)
        return True


class Scheduler(_Limit, AsyncBase):  # type: ignore[misc,valid-type]
    """vLLM's `AsyncScheduler` with hycache's `limit` (`--scheduler-cls hycache.vllm.Scheduler`)."""

    hycache_vllm_base = "AsyncScheduler"


class SyncScheduler(_Limit, SyncBase):  # type: ignore[misc,valid-type]
    """vLLM's synchronous `Scheduler` with hycache's `limit`."""
