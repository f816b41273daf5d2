"""The simulator: the real scheduler and cache, a dry-run executor, and a virtual clock.

Each step advances the clock by the cost model's step time (or a fixed `dry_step_s` with no
cost model). Requests arrive open loop (trace timestamps), closed loop at a concurrency, one at
a time (`sequential`), or as interleaved multi-turn sessions whose next prompt is the previous
prompt + its output + a new user message.

Besides per-request records, a run counts the SSM state pages the cache keyed (prompt
checkpoints, junction states, decode snapshots) from the block pool's events: how many were
stored over the run, how many of those were decode snapshots, and the most held at once. That
is the memory price of a policy's extra checkpoints.

Several instances (`instances=N`, each its own scheduler, cache and clock; `hycache.sim.cluster`)
run side by side behind a router, and a second cache tier (`tier=`; `hycache.sim.tier`) is one
store they all share. One instance without a store is the plain simulator, step for step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from hycache.config import HycacheConfig
from hycache.request import Request, SamplingParams
from hycache.sched.scheduler import Scheduler
from hycache.sim.cluster import ROUTINGS, Instance, Router, step_work
from hycache.sim.costmodel import CostModel
from hycache.sim.tier import SimHostStore, TierConfig
from hycache.sim.workloads import RequestSpec, SessionSpec

__all__ = ["RequestRecord", "SimResult", "Simulator", "step_work", "summarize"]


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
    store_hit_tokens: int | None = None  # of hit_tokens, from the second tier (None: no store)
    checkpoint_splits: int = 0  # of prefill_steps, those a checkpoint stop ended early
    instance: int | None = None  # the instance that served it (None: a single instance)
    # the hit the router predicted when it routed the request (None: round-robin)
    predicted_hit_tokens: int | None = None

    def line(self) -> dict[str, Any]:
        """The per-request JSON line of `hycache simulate`."""
        out: dict[str, Any] = {
            "id": self.id,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "prefill_steps": self.prefill_steps,
            "checkpoint_splits": self.checkpoint_splits,
            "junction": self.junction,
        }
        if self.store_hit_tokens is not None:
            out["store_hit_tokens"] = self.store_hit_tokens
        if self.instance is not None:
            out["instance"] = self.instance
        if self.predicted_hit_tokens is not None:
            out["predicted_hit_tokens"] = self.predicted_hit_tokens
        return out


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
    store: dict[str, float] | None = None  # the second tier's totals (see `store_summary`)
    instances: list[dict[str, float]] = field(default_factory=list)  # per instance, if > 1
    # the admission analysis: per SSM page kind (`cluster.PAGE_KINDS`) the pages stored,
    # evicted, and evicted never hit; per pool entry kind ("attention", "ssm", "snapshot")
    # the keyed blocks evicted and evicted never hit
    page_kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    evictions: dict[str, dict[str, int]] = field(default_factory=dict)

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
        **(_store_keys(result) if result.store is not None else {}),
        **_prediction_keys(recs),
    }


def _prediction_keys(recs: Sequence[RequestRecord]) -> dict[str, float]:
    """What a scoring router predicted against what the requests got (empty: no
    predictions): the hit tokens it predicted, summed (beside `hit_tokens`, the actual ones);
    the tokens it predicted beyond what each request got, summed, and how many requests that
    was. A prediction can also fall short (a prefix cached after the routing, by a request
    then in flight); only the excess counts as overstated."""
    pairs = [(r.predicted_hit_tokens, r.hit_tokens) for r in recs]
    predicted = [(p, a) for p, a in pairs if p is not None]
    if not predicted:
        return {}
    return {
        "predicted_hit_tokens": sum(p for p, _ in predicted),
        "overstated_hit_tokens": sum(max(p - a, 0) for p, a in predicted),
        "overstated_requests": sum(1 for p, a in predicted if p > a),
    }


def _eviction_accounting(
    insts: Sequence[Instance],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """`SimResult.page_kinds` and `SimResult.evictions`, summed over the instances."""
    kinds: dict[str, dict[str, int]] = {}
    evictions: dict[str, dict[str, int]] = {}
    for inst in insts:
        for kind, counts in inst.pages.by_kind.items():
            mine = kinds.setdefault(kind, dict.fromkeys(counts, 0))
            for k, v in counts.items():
                mine[k] += v
        cache = inst.sched.cache
        groups = cache.config.groups
        for pool in cache.pools:
            for (group, low, hit), n in pool.evicted.items():
                kind = "snapshot" if low else str(groups[group])
                mine = evictions.setdefault(kind, {"evicted": 0, "evicted_never_hit": 0})
                mine["evicted"] += n
                if not hit:
                    mine["evicted_never_hit"] += n
    return kinds, evictions


def _store_keys(result: SimResult) -> dict[str, float]:
    recs = result.records
    prompt = sum(r.prompt_tokens for r in recs)
    store_hit = sum(r.store_hit_tokens or 0 for r in recs)
    return {
        "store_hit_tokens": store_hit,
        "store_token_hit_rate": store_hit / prompt if prompt else 0.0,
        **(result.store or {}),
    }


def store_summary(
    insts: Sequence[Instance], store: SimHostStore, makespan: float
) -> dict[str, float]:
    """The second tier over a run: what was loaded (and the time charged for it), what was
    put, and what the store holds at the end."""
    assert insts[0].link is not None
    put_bytes = store.stats.put_bytes
    return {
        "store_loaded_bytes": sum(i.io.loaded_bytes for i in insts if i.io is not None),
        "store_load_s": sum(i.load_s for i in insts),
        # lookups' round trips (charged); a step's puts check `exists` off the critical path
        "store_round_trips": sum(i.lookup_trips for i in insts),
        "store_put_bytes": put_bytes,
        "store_write_busy": put_bytes / insts[0].link.write_bandwidth / (makespan or 1e-12),
        "store_used_bytes": store.used_bytes,
        "store_objects": len(store),
        "store_evictions": store.evictions,
        "store_put_refused": store.stats.put_refused,
    }


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
    """What waits to be admitted, in order: the request stream, then sessions' turns; how
    many are released and not finished (at most `limit`), and the order they were admitted
    in (`order`: key -> admission index, the last one if a key repeats).

    The stream is read one request ahead (its arrival decides when it is admitted) and its
    prompt only at admission, so a lazy stream (e.g. `hycache.sim.trace.TraceRequest`s)
    has the prompts of the requests in flight in memory, not the whole trace's."""

    def __init__(
        self, requests: Iterable[RequestSpec], turns: Iterable[_Item], limit: int, sequential: bool
    ) -> None:
        self._stream = iter(requests)
        self._next: _Item | None = None
        self._turns: deque[_Item] = deque(turns)
        self.limit = limit
        self.sequential = sequential  # one at a time, arrival times ignored
        self.released = 0
        self.order: dict[int | str, int] = {}
        self._admitted = 0
        self._advance()

    def _advance(self) -> None:
        r = next(self._stream, None)
        self._next = None
        if r is not None:
            hints = r.prefix_hints
            self._next = _Item(r.request_id, None, r.max_tokens, r.arrival_s, None, 0, (), hints, r)

    def __bool__(self) -> bool:
        return self._next is not None or bool(self._turns)

    def _peek(self) -> _Item | None:
        """The next item, when the limit lets one more be released."""
        if not self or self.released >= self.limit:
            return None
        return self._next if self._next is not None else self._turns[0]

    def release(self, now: float) -> _Item | None:
        """The next item if it may be released at `now` (counted in flight), else None."""
        item = self._peek()
        if item is None:
            return None
        if not self.sequential and item.arrival_s is not None and item.arrival_s > now:
            return None
        if self._next is None:
            self._turns.popleft()
        else:
            self._advance()
        self.order[item.key] = self._admitted
        self._admitted += 1
        self.released += 1
        return item

    def next_arrival(self) -> float:
        """When the next item arrives (open loop), or infinity when none is waiting for it."""
        item = self._peek()
        if item is None or self.sequential or item.arrival_s is None:
            return float("inf")
        return item.arrival_s

    def finished(self, turn: _Item | None) -> None:
        """One released item finished; its session's next turn, if any, joins the queue."""
        self.released -= 1
        if turn is not None:
            self._turns.append(turn)


@dataclass
class Simulator:
    """Runs a workload through `instances` simulated engines (one by default).

    `tier`: a second cache tier (`hycache.sim.tier`), one store shared by every instance,
    each instance mirroring its own device cache into it. `routing`: how requests are spread
    over the instances (`hycache.sim.cluster.Router`)."""

    config: HycacheConfig
    _: KW_ONLY
    cost: CostModel | None = None
    dry_step_s: float = 0.01
    seed: int = 0
    vocab_size: int = 32000
    tier: TierConfig | None = None
    instances: int = 1
    routing: str = "round-robin"
    # drafts accepted, replayed (`DryRunExecutor`); None: drawn
    accepted: Mapping[str, Mapping[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances: must be >= 1, got {self.instances}")
        if self.routing not in ROUTINGS:
            raise ValueError(
                f"routing: expected one of {', '.join(ROUTINGS)}, got {self.routing!r}"
            )

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
        otherwise (and for sessions) `concurrency` requests are kept in flight (over all
        instances together: the clients do not know how many engines serve them).

        A discrete-event loop: the next event is the earliest of the next open-loop arrival
        and the instances' clocks (the end of each one's last step); at equal times arrivals
        come first, then the lowest instance. An instance's step is atomic: requests routed to
        it while it runs wait for its next step, and what finished in it is recorded (and frees
        a closed-loop slot) when the cluster's time reaches its end."""
        store = SimHostStore(self.tier.capacity_bytes) if self.tier is not None else None
        insts = self._instances(store)
        router = Router(self.routing, insts)
        turns = (self._first_turn(s) for s in sessions)
        pending = _Pending(requests, turns, 1 if sequential else (concurrency or 10**9), sequential)
        now = 0.0
        records: list[RequestRecord] = []
        while True:
            while (item := pending.release(now)) is not None:
                req = self._request(insts[0].sched, item)
                routed = router.pick(req)
                routed.instance.route(item, req, now, routed.predicted_hit)
            nxt = pending.next_arrival()
            inst = min((i for i in insts if i.busy()), key=lambda i: i.clock, default=None)
            if inst is None or nxt < inst.clock:
                if nxt == float("inf"):
                    assert not pending, "requests left that nothing will release"
                    break
                now = nxt
                continue
            now = max(now, inst.clock)
            if inst.done:
                for rec, turn in self._finished(inst, store is not None, len(insts) > 1):
                    records.append(rec)
                    if on_finish:
                        on_finish(rec)
                    pending.finished(turn)
                continue
            inst.admit()
            if inst.sched.has_unfinished():
                inst.step()
        records.sort(key=lambda r: pending.order[r.id])
        return self._result(records, insts, store)

    def _instances(self, store: SimHostStore | None) -> list[Instance]:
        link = self.tier.link if self.tier is not None else None
        return [
            Instance(
                i,
                self.config,
                cost=self.cost,
                dry_step_s=self.dry_step_s,
                seed=self.seed,
                vocab_size=self.vocab_size,
                store=store,
                link=link,
                accepted=self.accepted,
            )
            for i in range(self.instances)
        ]

    def _finished(
        self, inst: Instance, stored: bool, several: bool
    ) -> Iterator[tuple[RequestRecord, _Item | None]]:
        """The records of what finished in `inst`'s last step (at its clock), each with its
        session's next turn (None when there is none)."""
        done, inst.done = inst.done, []
        for req in done:
            item, arrived, predicted = inst.in_flight.pop(req.request_id)
            first = inst.first_token.pop(req.request_id)
            rec = self._record(item, req, arrived, first, inst.clock)
            rec.predicted_hit_tokens = predicted
            if stored:
                rec.store_hit_tokens = req.first_outcome.store_hit_tokens
            if several:
                rec.instance = inst.index
            yield rec, self._next_turn(item, req)

    @staticmethod
    def _result(
        records: list[RequestRecord], insts: list[Instance], store: SimHostStore | None
    ) -> SimResult:
        makespan = max(i.clock for i in insts)
        tier = store_summary(insts, store, makespan) if store is not None else None
        result = SimResult(
            records,
            makespan,
            sum(i.steps for i in insts),
            max(i.peak_blocks for i in insts),
            {},
            sum(i.pages.stored for i in insts),
            sum(i.pages.peak for i in insts),
            sum(i.pages.snapshots for i in insts),
            tier,
        )
        result.summary = summarize(result)
        result.page_kinds, result.evictions = _eviction_accounting(insts)
        if len(insts) > 1:
            for inst in insts:
                mine = [r for r in records if r.instance == inst.index]
                part = SimResult(
                    mine,
                    makespan,
                    inst.steps,
                    inst.peak_blocks,
                    {},
                    inst.pages.stored,
                    inst.pages.peak,
                    inst.pages.snapshots,
                    {"store_load_s": inst.load_s} if store is not None else None,
                )
                result.instances.append({"instance": inst.index, **summarize(part)})
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
            checkpoint_splits=req.num_checkpoint_splits,
            junction=first_outcome.junction,
            lost_reuse_tokens=first_outcome.lost_reuse,
            output_tokens=req.num_output_tokens,
            arrival_s=arrived if item.arrival_s is None else item.arrival_s,
            first_token_s=first,
            finish_s=now,
            preemptions=req.num_preemptions,
        )

    @staticmethod
    def _first_turn(s: SessionSpec) -> _Item:
        return _Item(
            f"s{s.session_id}t0",
            s.user_messages[0],
            s.output_tokens[0],
            None,
            s,
            prefix_hints=s.prefix_hints,
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
