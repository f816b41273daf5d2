"""The simulator: the real scheduler and cache, a dry-run executor, and a virtual clock.

Each step advances the clock by the cost model's step time (or a fixed `dry_step_s` with no
cost model). Requests arrive open loop (trace timestamps), closed loop at a concurrency, one at
a time (`sequential`), or as interleaved multi-turn sessions whose next prompt is the previous
prompt + its output + a new user message.

Besides per-request records, a run counts the SSM state pages the cache keyed (prompt
checkpoints, junction states, decode snapshots) from the block pool's events: how many were
stored over the run, how many of those were decode snapshots, and the most held at once. That
is the memory price of a policy's extra checkpoints.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hycache.cache.block_pool import BlockEvent
from hycache.config import GroupKind, HycacheConfig
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler, SchedulerOutput
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.workloads import RequestSpec, SessionSpec


@dataclass
class RequestRecord:
    id: int | str
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens_computed: int
    prefill_steps: int
    junction: int
    lost_reuse_tokens: int
    output_tokens: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    preemptions: int

    def line(self) -> dict[str, Any]:
        """The per-request JSON line of `hycache simulate`."""
        return {
            "id": self.id,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "prefill_steps": self.prefill_steps,
            "junction": self.junction,
        }


@dataclass
class SimResult:
    records: list[RequestRecord]
    makespan_s: float
    steps: int
    peak_blocks_used: int
    summary: dict[str, float] = field(default_factory=dict)
    ssm_pages_stored: int = 0  # SSM state pages keyed over the run
    ssm_pages_peak: int = 0  # most keyed SSM state pages held at once (cached or in use)
    ssm_snapshot_pages: int = 0  # of the pages stored: decode snapshots (past the prompt)

    def by_id(self) -> dict[int | str, RequestRecord]:
        return {r.id: r for r in self.records}


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def summarize(result: SimResult) -> dict[str, float]:
    recs = result.records
    out_tokens = sum(r.output_tokens for r in recs)
    prompt = sum(r.prompt_tokens for r in recs)
    hit = sum(r.hit_tokens for r in recs)
    span = result.makespan_s or 1e-12
    ttft = [r.first_token_s - r.arrival_s for r in recs]
    itl = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in recs if r.output_tokens > 1
    ]
    return {
        "requests": len(recs),
        "junctions_observed": sum(1 for r in recs if r.junction),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / span,
        "request_throughput": len(recs) / span,
        "ttft_p50_s": _percentile(ttft, 50),
        "ttft_p95_s": _percentile(ttft, 95),
        "itl_p50_s": _percentile(itl, 50),
        "itl_p95_s": _percentile(itl, 95),
        "prompt_tokens": prompt,
        "prefill_tokens_computed": sum(r.prefill_tokens_computed for r in recs),
        "hit_tokens": hit,
        "token_hit_rate": hit / prompt if prompt else 0.0,
        "lost_reuse_tokens": sum(r.lost_reuse_tokens for r in recs),
        "preemptions": sum(r.preemptions for r in recs),
        "peak_blocks_used": result.peak_blocks_used,
        "ssm_pages_stored": result.ssm_pages_stored,
        "ssm_snapshot_pages": result.ssm_snapshot_pages,
        "ssm_pages_peak": result.ssm_pages_peak,
        "makespan_s": result.makespan_s,
        "steps": result.steps,
    }


def step_work(out: SchedulerOutput) -> StepWork:
    """What the cost model needs to know about one scheduled step."""
    seqs = tuple(
        SeqWork(
            num_new_tokens=s.num_tokens + len(s.draft_token_ids),
            context_len=s.start,
            num_draft_tokens=len(s.draft_token_ids),
            is_prefill=s.num_tokens > 1,
        )
        for s in out.scheduled
    )
    return StepWork(seqs, num_block_copies=len(out.block_copies))


@dataclass
class _Item:
    """Something waiting to be admitted: a request spec, or a session's next turn."""

    key: int | str
    prompt: np.ndarray | list[int] | None  # None: read `spec.prompt_token_ids` at admission
    max_tokens: int
    arrival_s: float | None
    session: SessionSpec | None = None
    turn: int = 0
    outputs: tuple[list[int], ...] = ()
    prefix_hints: tuple[int, ...] = ()
    spec: RequestSpec | None = None


class _Pending:
    """What waits to be admitted, in order: the request stream, then sessions' turns.

    The stream is read one request ahead (its arrival decides when it is admitted) and its
    prompt only at admission, so a lazy stream (e.g. `hycache.sim.trace.TraceRequest`s)
    has the prompts of the requests in flight in memory, not the whole trace's."""

    def __init__(self, requests: Iterable[RequestSpec], turns: Iterable[_Item]) -> None:
        self._stream = iter(requests)
        self._next: _Item | None = None
        self._turns: deque[_Item] = deque(turns)
        self._advance()

    def _advance(self) -> None:
        r = next(self._stream, None)
        self._next = None
        if r is not None:
            hints = r.prefix_hints
            self._next = _Item(r.request_id, None, r.max_tokens, r.arrival_s, None, 0, (), hints, r)

    def __bool__(self) -> bool:
        return self._next is not None or bool(self._turns)

    def peek(self) -> _Item:
        return self._next if self._next is not None else self._turns[0]

    def pop(self) -> _Item:
        item = self._next
        if item is None:
            return self._turns.popleft()
        self._advance()
        return item

    def append(self, item: _Item) -> None:
        self._turns.append(item)


class Simulator:
    def __init__(
        self,
        config: HycacheConfig,
        *,
        cost: CostModel | None = None,
        dry_step_s: float = 0.01,
        seed: int = 0,
        vocab_size: int = 32000,
    ) -> None:
        self.config = config
        self.cost = cost
        self.dry_step_s = dry_step_s
        self.seed = seed
        self.vocab_size = vocab_size

    def run(
        self,
        requests: Iterable[RequestSpec] = (),
        *,
        sessions: Sequence[SessionSpec] = (),
        concurrency: int | None = None,
        sequential: bool = False,
        on_finish: Callable[[RequestRecord], None] | None = None,
    ) -> SimResult:
        """Run a workload to completion. Requests with an `arrival_s` arrive open loop;
        otherwise (and for sessions) `concurrency` requests are kept in flight."""
        cfg = self.config
        sched = Scheduler(cfg)
        spec = cfg.speculative
        ex = DryRunExecutor(
            vocab_size=self.vocab_size,
            num_speculative_tokens=spec.num_speculative_tokens,
            acceptance_rate=spec.acceptance_rate,
            seed=self.seed,
        )
        pending = _Pending(
            requests,
            (
                _Item(
                    f"s{s.session_id}t0",
                    s.user_messages[0],
                    s.output_tokens[0],
                    None,
                    s,
                    prefix_hints=s.prefix_hints,
                )
                for s in sessions
            ),
        )
        pages = _SSMPageCounter(cfg, sched)
        limit = 1 if sequential else (concurrency or 10**9)
        clock = 0.0
        in_flight: dict[str, tuple[_Item, float]] = {}
        records: list[RequestRecord] = []
        first_token: dict[str, float] = {}
        steps = peak = 0
        order: dict[int | str, int] = {}  # key -> admission index (the last one, if a key repeats)
        admitted = 0
        while pending or in_flight:
            while pending and len(in_flight) < limit:
                item = pending.peek()
                if not sequential and item.arrival_s is not None and item.arrival_s > clock:
                    break
                pending.pop()
                order[item.key] = admitted
                admitted += 1
                req = self._request(sched, item)
                in_flight[req.request_id] = (item, clock)
                sched.add_request(req)
            if not sched.has_unfinished():
                clock = max(clock, pending.peek().arrival_s or clock)
                continue
            out = sched.schedule()
            sampling = [s.request.request_id for s in out.scheduled if s.samples]
            done = sched.update(out, ex.execute(out))
            sched.finished.clear()  # nobody inspects them here; they hold whole prompts
            pages.attribute(done)
            clock += self.cost.step_time(step_work(out)) if self.cost else self.dry_step_s
            steps += 1
            peak = max(peak, sched.cache.pool.num_blocks - 1 - sched.cache.pool.num_free)
            for rid in sampling:
                first_token.setdefault(rid, clock)
            for req in done:
                item, arrived = in_flight.pop(req.request_id)
                rec = self._record(item, req, arrived, first_token.pop(req.request_id), clock)
                records.append(rec)
                if on_finish:
                    on_finish(rec)
                nxt = self._next_turn(item, req)
                if nxt is not None:
                    pending.append(nxt)
        records.sort(key=lambda r: order[r.id])
        result = SimResult(
            records, clock, steps, peak, {}, pages.stored, pages.peak, pages.snapshots
        )
        result.summary = summarize(result)
        return result

    @staticmethod
    def _request(sched: Scheduler, item: _Item) -> Request:
        sp = SamplingParams(max_tokens=item.max_tokens, ignore_eos=True)
        prompt = item.prompt
        if prompt is None:
            assert item.spec is not None
            prompt = item.spec.prompt_token_ids  # a lazy request expands its prompt here
        return sched.new_request(str(item.key), prompt, sp, prefix_hints=item.prefix_hints)

    @staticmethod
    def _record(
        item: _Item, req: Request, arrived: float, first: float, now: float
    ) -> RequestRecord:
        first_outcome = req.first_outcome
        return RequestRecord(
            id=item.key,
            prompt_tokens=req.num_prompt_tokens,
            hit_tokens=first_outcome.resume_point,
            prefill_tokens_computed=req.prefill_tokens_computed,
            prefill_steps=req.num_prefill_steps,
            junction=first_outcome.junction,
            lost_reuse_tokens=first_outcome.lost_reuse,
            output_tokens=req.num_output_tokens,
            arrival_s=arrived if item.arrival_s is None else item.arrival_s,
            first_token_s=first,
            finish_s=now,
            preemptions=req.num_preemptions,
        )

    @staticmethod
    def _next_turn(item: _Item, req: Request) -> _Item | None:
        s = item.session
        if s is None or item.turn + 1 >= s.num_turns:
            return None
        outputs = (*item.outputs, list(req.output_token_ids))
        t = item.turn + 1
        prompt = s.prompt_for_turn(t, [np.asarray(o) for o in outputs])
        return _Item(
            f"s{s.session_id}t{t}",
            prompt,
            s.output_tokens[t],
            None,
            s,
            t,
            outputs,
            prefix_hints=s.prefix_hints,
        )


class _SSMPageCounter:
    """Counts keyed SSM state pages from the block pool's events (as `hycache explain` reads
    checkpoints): one key per SSM page, so keys stored = pages stored. A page keyed in a step
    at the prompt's end or past it, under the key of a request that finished in that step, is
    that request's decode snapshot (`limit` keys it when the request lets go)."""

    def __init__(self, config: HycacheConfig, sched: Scheduler) -> None:
        self.groups = {i for i, g in enumerate(config.cache.groups) if g is GroupKind.SSM}
        self.stored = 0
        self.snapshots = 0
        self.live = 0
        self.peak = 0
        self._step: list[BlockEvent] = []  # SSM keys stored since the last `attribute`
        sched.cache.pool.subscribe(self.on_event)

    def on_event(self, event: BlockEvent) -> None:
        if event.key.group not in self.groups:
            return
        if event.kind == "stored":
            self.stored += 1
            self.live += 1
            self.peak = max(self.peak, self.live)
            self._step.append(event)
        elif event.kind == "removed":
            self.live -= 1

    def attribute(self, finished: Sequence[Request]) -> None:
        """Count the decode snapshots among this step's stored keys."""
        events, self._step = self._step, []
        if not finished:
            return
        for e in events:
            for req in finished:
                pos = e.position
                if (
                    req.num_prompt_tokens <= pos <= req.hashes.num_hashed_tokens
                    and req.hashes.at(pos) == e.key.hash
                ):
                    self.snapshots += 1
                    break
