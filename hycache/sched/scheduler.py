"""Continuous-batching scheduler: one token budget per step, prefill chunks and decodes together.

Each request's `num_computed_tokens` catches up with its token count. A step serves running
requests first (arrival order), then admits waiting ones (FCFS) through a cache lookup. When
blocks run out, the newest running request not yet served this step is preempted by
recompute: it returns to the front of the queue and later replays its outputs as prefill.

    schedule() -> SchedulerOutput   what to run: tokens, block tables, state slots, copies
    update(out, results)            sampled tokens and accepted drafts; publishes cache keys
    finish(request_id, status)      end a request the caller decided is done (a stop string)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hycache.cache.boundaries import StateKind
from hycache.cache.coordinator import CacheHit
from hycache.cache.manager import CacheManager, StepAllocation
from hycache.cache.stops import FREE_PASSES, PassPricer, stop_pays
from hycache.config import HycacheConfig
from hycache.request import CacheOutcome, Request, RequestStatus, SamplingParams, TokenLogprob
from hycache.sched.chunking import StepCostOracle, StepSeq, chunk_end, packing_cap
from hycache.sched.inflight import chunk_keys, promised_checkpoints, should_wait


@dataclass
class ScheduledRequest:
    request: Request
    start: int  # first position computed this step
    num_tokens: int  # known tokens computed this step (a prefill chunk, or 1 when decoding)
    draft_token_ids: list[int]  # verified in the same forward, after the known tokens
    alloc: StepAllocation
    split: bool = False  # a checkpoint stop ended this chunk before the budget or the prompt

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """The step reaches the request's last known token, so it produces a new token."""
        return self.end == self.request.num_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.request.tokens(self.start, self.end) + self.draft_token_ids


@dataclass
class SchedulerOutput:
    step: int
    scheduled: list[ScheduledRequest]
    block_copies: list[tuple[int, int]]
    preempted: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens + len(s.draft_token_ids) for s in self.scheduled)


@dataclass(frozen=True)
class StepResult:
    """The executor's answer for one scheduled request."""

    sampled_token_ids: list[int]  # accepted drafts then one new token; empty mid-prefill
    num_accepted_drafts: int = 0
    next_draft_token_ids: list[int] = field(default_factory=list)
    # one per sampled token when the request asks for `SamplingParams.logprobs`
    logprobs: list[TokenLogprob] | None = None
    # `Request.accept_tokens` of the sampled tokens, when the executor needed it already (the
    # model runner does: an SSM snapshot must lie among the kept positions); else the
    # scheduler asks it
    verdict: tuple[list[int], RequestStatus | None] | None = None


class Scheduler:
    def __init__(
        self,
        config: HycacheConfig,
        *,
        keep_finished: int = 1024,
        step_cost: StepCostOracle | None = None,
        pass_price: PassPricer | None = None,
    ) -> None:
        """`keep_finished`: how many of the most recent finished requests `finished` keeps, for
        inspection (the engine keeps none: its steps report every finish). `step_cost`: what
        the model's step cost says about packing (`chunking.packing_cap`): once per admission,
        the chunk that finishes a prefill in a step with decoding requests is cut where its
        compute would stop hiding under the step's memory time. None: never. `pass_price`:
        what a prefill stop's forward pass costs (`hycache.cache.stops`): a stop a request
        makes for its junction or its hints that does not pay for its pass is not made
        (`_paying_stops`). None: `step_cost` where it prices passes (the simulator's cost
        model), else every stop pays (`FREE_PASSES`, the engine's: its tests and benches
        measure the mechanisms on CPU, where no GPU's weight read is saved)."""
        self.config = config
        self.step_cost = step_cost
        if pass_price is None:
            pass_price = step_cost if isinstance(step_cost, PassPricer) else FREE_PASSES
        self.pass_price: PassPricer = pass_price
        self.cache = CacheManager(config.cache, config.speculative, config.scheduler.max_num_seqs)
        self.bounds = self.cache.bounds
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: deque[Request] = deque(maxlen=keep_finished)
        self.num_preemptions = 0
        self.step_count = 0
        self._arrivals = 0
        self._scheduled_ids: set[str] = set()
        self._chunk_cap = config.scheduler.max_num_batched_tokens  # this step's (`schedule`)
        self._packed: set[str] = set()  # requests whose prefill was cut for packing

    # -- requests ----------------------------------------------------------------------------

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        sampling: SamplingParams,
        **kw: Any,
    ) -> Request:
        """A request hashed with this cache's unit, seed and key scheme (`Request.new` keywords
        such as `extra_keys`, `eos_token_ids`, `prefix_hints` pass through)."""
        c = self.config.cache
        return Request.new(
            request_id,
            prompt_token_ids,
            sampling,
            unit=c.unit,
            hash_seed=c.hash_seed,
            lookahead=self.bounds.lookahead,
            **kw,
        )

    def add_request(self, req: Request) -> None:
        """Queue a request; its prefix hashes must use this cache's key scheme."""
        self.cache.check_keys(req)
        req.arrival = self._arrivals
        self._arrivals += 1
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def abort(self, request_id: str) -> bool:
        """Stop a request at any point; everything it holds is freed. False if unknown."""
        req = self._find(request_id)
        if req is not None:
            self._finish(req, RequestStatus.FINISHED_ABORTED)
        return req is not None

    def finish(self, request_id: str, status: RequestStatus) -> Request:
        """End a running or waiting request with a finished `status` (vLLM's `finish_requests`:
        e.g. a stop string its caller found in the text), freeing everything it holds as a
        finish inside `update` does; the request is returned. KeyError if no unfinished
        request has this id."""
        if not status.finished:
            raise ValueError(f"finish: {status} is not a finished status")
        req = self._find(request_id)
        if req is None:
            raise KeyError(f"finish: no unfinished request {request_id!r}")
        self._finish(req, status)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def unfinished_ids(self) -> list[str]:
        """The ids of every running, then every waiting, request."""
        return [r.request_id for r in [*self.running, *self.waiting]]

    def _find(self, request_id: str) -> Request | None:
        return next((r for r in [*self.running, *self.waiting] if r.request_id == request_id), None)

    # -- schedule ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.scheduler.max_num_batched_tokens
        k = self.config.speculative.num_speculative_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        self._scheduled_ids = set()
        self.cache.num_waiting = len(self.waiting)  # what a held snapshot page competes with
        self._chunk_cap = self._saturated_cap()
        for req in list(self.running):
            if req.status is not RequestStatus.RUNNING or budget <= 0:
                continue
            start = req.num_computed_tokens
            cap = budget
            if req.num_tokens - start > 1:
                end = self._chunk_end(req, start, budget)
                cap, end = self._pack(req, start, end, cap, scheduled)
                drafts: list[int] = []
            else:
                drafts = req.spec_token_ids[: min(k, budget - 1)]
                end = start + 1
            if end <= start:
                continue
            ahead = self._lookahead(req, end, drafts)
            alloc = self.cache.allocate(req, start, end, ahead, num_drafts=len(drafts))
            while alloc is None:
                victim = self._preempt_newest()
                preempted.append(victim.request_id)
                if victim is req:
                    break
                alloc = self.cache.allocate(req, start, end, ahead, num_drafts=len(drafts))
            if alloc is None:
                continue
            split = end < self._free_end(req, start, cap)
            scheduled.append(ScheduledRequest(req, start, end - start, drafts, alloc, split))
            self._scheduled_ids.add(req.request_id)
            budget -= end - start + len(drafts)
        if not preempted:
            budget = self._admit(scheduled, budget)
        if not scheduled and not self.running and self.waiting:
            head = self.waiting[0]
            raise RuntimeError(
                f"request {head.request_id} ({head.num_tokens} tokens) cannot be scheduled: "
                f"it needs more than the {self.cache.pool.num_free} free cache blocks"
            )
        self.step_count += 1
        return SchedulerOutput(self.step_count, scheduled, self.cache.take_copies(), preempted)

    def _admit(self, scheduled: list[ScheduledRequest], budget: int) -> int:
        """Admit waiting requests (FCFS) while budget, sequences and blocks allow. A request
        whose prefix a running request is about to publish waits (see `inflight`)."""
        max_seqs = self.config.scheduler.max_num_seqs
        wait = (
            self.config.scheduler.wait_for_inflight_prefix
            and self.cache.config.enable_prefix_caching
        )
        b = self.bounds.block_size
        in_step: set[bytes] = set()
        promised: set[bytes] = set()
        if wait and self.waiting:
            for s in scheduled:
                in_step |= chunk_keys(s.request, s.start, self._keys_end(s.request, s.end), b)
            promised = promised_checkpoints(self.running, self.bounds)
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            req = self.waiting.popleft()
            hit = self.cache.fetch(req, self.cache.lookup(req))
            if wait and should_wait(req, hit, in_step, promised, self.bounds):
                deferred.append(req)
                continue
            start = hit.resume_point
            req.junction_stops, req.drop_stops, req.hint_stops = self._extra_stops(req, hit, start)
            req.num_computed_tokens = start
            self._packed.discard(req.request_id)
            end = self._chunk_end(req, start, budget, hit.junction)
            cap, end = self._pack(req, start, end, budget, scheduled, hit.junction)
            ahead = self._lookahead(req, end, [])
            alloc = self.cache.allocate(req, start, end, ahead, hit) if end > start else None
            if alloc is None:
                req.num_computed_tokens = 0
                req.junction_stops = req.drop_stops = req.hint_stops = ()
                self.waiting.appendleft(req)
                break
            req.status = RequestStatus.RUNNING
            req.outcome = CacheOutcome(
                start, hit.junction, hit.attention_match, hit.lost_reuse, hit.store_hit_tokens
            )
            if req.first_outcome is None:
                req.first_outcome = req.outcome
            self.running.append(req)
            split = end < self._free_end(req, start, cap)
            scheduled.append(ScheduledRequest(req, start, end - start, [], alloc, split))
            self._scheduled_ids.add(req.request_id)
            budget -= end - start
            if wait:
                in_step |= chunk_keys(req, start, self._keys_end(req, end), b)
                promised |= promised_checkpoints([req], self.bounds)
        self.waiting.extendleft(reversed(deferred))
        self.cache.unstage()
        return budget

    def _keys_end(self, req: Request, end: int) -> int:
        """How far a chunk counts as computing for a waiting request (`should_wait`): a prefill
        cut for packing, to its prompt's end (the rest runs next step), so a sibling waits one
        step for the blocks instead of recomputing them."""
        return req.num_tokens if req.request_id in self._packed and end < req.num_tokens else end

    def _pack(
        self,
        req: Request,
        start: int,
        end: int,
        budget: int,
        scheduled: list[ScheduledRequest],
        junction: int | None = None,
    ) -> tuple[int, int]:
        """The chunk's budget and end after packing (`chunking.packing_cap`): a chunk that
        finishes the prefill, once per admission, beside this step's decoding requests (those
        scheduled, and the running ones still to come) and prefill chunks."""
        if (
            self.step_cost is None
            or not self.config.scheduler.step_packing
            or self.waiting  # someone waits: `saturated_chunk_tokens`' regime, not this one
            or end < req.num_tokens
            or req.request_id in self._packed
        ):
            return budget, end
        done = {s.request.request_id for s in scheduled}
        k = self.config.speculative.num_speculative_tokens
        step = [
            StepSeq(s.start, s.num_tokens + len(s.draft_token_ids), len(s.draft_token_ids),
                    s.num_tokens > 1)
            for s in scheduled
        ] + [
            StepSeq(r.num_computed_tokens, 1 + min(k, len(r.spec_token_ids)),
                    min(k, len(r.spec_token_ids)), False)
            for r in self.running
            if r.request_id not in done and r.status is RequestStatus.RUNNING
            and r.num_tokens - r.num_computed_tokens == 1
        ]  # fmt: skip
        cap = packing_cap(self.step_cost, step, start, end - start, self.cache.config.unit)
        if cap >= end - start:
            return budget, end
        self._packed.add(req.request_id)
        return cap, self._chunk_end(req, start, cap, junction)

    def _extra_stops(
        self, req: Request, hit: CacheHit, start: int
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Stops (and checkpoints) for the observed junction, the drop scheme's junction
        (`limit` with internal checkpoints) and the request's prefix hints; and, of them, the
        drop scheme's junction when it is nothing else (`StateKind.DROP_JUNCTION`), and the
        hints' stops neither junction makes (`StateKind.HINT`)."""
        t = req.num_prompt_tokens
        stops = set(self.bounds.junction_stops(hit.junction, start, t))
        drop = set(self.bounds.drop_junction_stops(hit.attention_match, start, t)) - stops
        hints: set[int] = set()
        if req.prefix_hints and self.cache.config.enable_prefix_caching:
            hints = set(self.bounds.hint_stops(req.prefix_hints, start, t)) - stops - drop
        return tuple(sorted(stops | hints | drop)), tuple(sorted(drop)), tuple(sorted(hints))

    def _lookahead(self, req: Request, end: int, drafts: list[int]) -> int:
        """Slots past `end`: the drafts verified in this step, and, when the step samples, the
        k rows the drafter writes while proposing the next drafts."""
        k = self.config.speculative.num_speculative_tokens
        return len(drafts) + (k if end == req.num_tokens else 0)

    def _saturated_cap(self) -> int:
        """This step's cap on a prefill chunk (`SchedulerConfig.saturated_chunk_tokens`): set
        while the batch is full of sequences (one slot free at most), more requests wait than
        slots are free, and the batch has decoding requests; else the whole budget. (A queue
        behind a batch that is not full waits for memory or budget, not for decodes.)"""
        cfg = self.config.scheduler
        free = cfg.max_num_seqs - len(self.running)
        if (
            cfg.saturated_chunk_tokens
            and free <= 1
            and len(self.waiting) > free
            and any(r.num_tokens - r.num_computed_tokens == 1 for r in self.running)
        ):
            return cfg.saturated_chunk_tokens
        return cfg.max_num_batched_tokens

    def _chunk_end(self, req: Request, start: int, budget: int, junction: int | None = None) -> int:
        """Where the chunk from `start` ends; `junction`: the junction observed at admission
        (default: the last admission's)."""
        budget = min(budget, self._chunk_cap)
        if not self.cache.config.enable_prefix_caching:
            return min(req.num_tokens, start + budget)  # nothing is kept: no stop to make
        reach = min(req.num_tokens, start + budget)
        j = req.outcome.junction if junction is None else junction
        t = req.num_prompt_tokens
        stops = self.bounds.prefill_stops(start, t, req.junction_stops, reach, j)
        if req.junction_stops and self.pass_price is not FREE_PASSES:
            stops = self._paying_stops(req, start, budget, stops, reach, j)
        return chunk_end(start, req.num_tokens, budget, stops, self.bounds.block_size)

    def _paying_stops(
        self, req: Request, start: int, budget: int, stops: list[int], reach: int, junction: int
    ) -> list[int]:
        """`stops` without the request's own (junction and hint stops, not otherwise
        mandatory) that split the chunk [start, end) and do not pay for their pass
        (`stops.stop_pays`: the state pool's observed chance of a hit on that kind, times
        what resuming there instead of at `start` saves, against what the split adds); a stop
        not made is dropped from the request (no state kept there, none promised)."""
        b, t = self.bounds.block_size, req.num_prompt_tokens
        mandatory = set(self.bounds.prefill_stops(start, t, (), reach, junction))
        own = [s for s in stops if s not in mandatory]
        end = chunk_end(start, req.num_tokens, budget, sorted(mandatory), b)
        reuse = self.cache.state_pool.reuse
        declined: set[int] = set()
        for s in own:
            if not start < s < end:
                continue
            kind = StateKind.GRID if s % b == 0 else StateKind.JUNCTION
            if stop_pays(self.pass_price, reuse.chance(kind), start, s, start, end):
                break
            declined.add(s)
        if not declined:
            return stops
        req.junction_stops = tuple(s for s in req.junction_stops if s not in declined)
        return [s for s in stops if s not in declined]

    def _free_end(self, req: Request, start: int, budget: int) -> int:
        """Where the chunk would end with no checkpoint stop (budget and its cap, prompt, block
        grid)."""
        budget = min(budget, self._chunk_cap)
        return chunk_end(start, req.num_tokens, budget, [], self.bounds.block_size)

    def _preempt_newest(self) -> Request:
        """Preempt the newest running request that has not been served this step."""
        for req in reversed(self.running):
            if req.request_id not in self._scheduled_ids:
                break
        self.running.remove(req)
        self.cache.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.junction_stops = req.drop_stops = req.hint_stops = ()
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        return req

    # -- update --------------------------------------------------------------------------------

    def update(self, out: SchedulerOutput, results: Mapping[str, StepResult]) -> list[Request]:
        """Apply one step's results; returns the requests that finished in it. Keys are
        published after the new tokens are appended (a lookahead key needs the next token)."""
        done: list[Request] = []
        for s in out.scheduled:
            req = s.request
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted between schedule and update
            res = results.get(req.request_id, StepResult([]))
            if req.num_tokens - s.start > 1:
                req.num_prefill_steps += 1
                req.num_checkpoint_splits += s.split
                req.prefill_tokens_computed += s.num_tokens
            accepted = min(res.num_accepted_drafts, len(s.draft_token_ids))
            req.num_computed_tokens = s.end + accepted
            status = None
            if s.samples:
                sampled = res.sampled_token_ids[: accepted + 1]
                new, status = res.verdict or req.accept_tokens(sampled)
                req.append_output(new, res.logprobs)
                req.spec_token_ids = list(res.next_draft_token_ids)
            self.cache.commit(req)
            if status is not None:
                self._finish(req, status)
                done.append(req)
        self.cache.flush_store()
        return done

    def _finish(self, req: Request, status: RequestStatus) -> None:
        self.cache.free(req)
        self._packed.discard(req.request_id)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.finished.append(req)
