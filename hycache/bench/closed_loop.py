"""The validation's client: a workload driven closed loop on a real engine, one iteration at a
time, on a clock of the loop's own.

A `ClosedLoop` keeps `concurrency` requests in flight on one `LLM` (a finished turn of a
multi-turn session queues the session's next turn, as the simulator does) and times only its
own iterations: admitting requests, `llm.step()`, reading the events. Alone, that clock is the
wall clock of the run. Two loops stepped in turn (`run_interleaved`) each still measure what
they would alone, but both see the machine in the same states, step by step:

    wall   |--A1--|--B1--|--A2--|--B2--|--A3--| ...
    A's clock  A1 + A2 + A3 ...     B's clock  B1 + B2 ...

On a machine whose speed drifts 10-25% within a minute, two runs of 8-20 s done one after the
other (the old pairing) differ by that drift; stepped in turn, the drift falls on both arms
alike and cancels in their ratio.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from hycache.bench.steps import EngineStep
from hycache.engine.outputs import LastSchedule, RequestOutput
from hycache.sim.workloads import SessionSpec, Workload

if TYPE_CHECKING:
    from hycache.engine.engine import LLM

CLOCKS: tuple[str, ...] = ("wall", "cpu")


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    """One run's figures: a closed loop's on its own clock (`ClosedLoop.metrics`), the
    medians of several loops' (`requests` is then a median of counts: x.5 over an even
    number), or the simulator's (which has no other clock: those two are None)."""

    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    token_hit_rate: float
    makespan_s: float
    other_clock_output_tokens_per_s: float | None = None
    cpu_over_wall: float | None = None
    requests: float

    def to_json(self) -> dict[str, float]:
        """The figures it has (the simulator's: without the other clock's two)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class _Item:
    key: str
    prompt: list[int]
    max_tokens: int
    session: SessionSpec | None = None
    turn: int = 0
    outputs: tuple[list[int], ...] = ()


def _items(w: Workload) -> deque[_Item]:
    """The simulator's admission order: the request stream, then each session's first turn
    (later turns join the end of the queue as the turn before them finishes)."""
    q: deque[_Item] = deque(
        _Item(str(r.request_id), r.prompt_token_ids.tolist(), r.max_tokens) for r in w.requests
    )
    for s in w.sessions:
        q.append(_Item(f"s{s.session_id}t0", s.user_messages[0].tolist(), s.output_tokens[0], s))
    return q


def _next_turn(item: _Item, output: list[int]) -> _Item | None:
    s = item.session
    if s is None or item.turn + 1 >= s.num_turns:
        return None
    outputs = (*item.outputs, output)
    t = item.turn + 1
    prompt = s.prompt_for_turn(t, [np.asarray(o) for o in outputs]).tolist()
    return _Item(f"s{s.session_id}t{t}", prompt, s.output_tokens[t], s, t, outputs)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


class ClosedLoop:
    """`w` closed loop on `llm` at `concurrency` in flight. `clock` (wall or cpu) is the one
    the metrics are on; the other is reported beside them. `steps`: each `llm.step()` is
    appended to it, its work as the simulator describes it and its time on `clock` (what
    `hycache.bench.steps.step_attribution` prices)."""

    def __init__(
        self,
        llm: LLM,
        w: Workload,
        concurrency: int,
        clock: str,
        steps: list[EngineStep] | None = None,
    ) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be wall or cpu, got {clock!r}")
        self.llm, self.concurrency, self.steps = llm, concurrency, steps
        self._i = CLOCKS.index(clock)
        self._pending = _items(w)
        self._total = w.size
        self._arrived: dict[str, tuple[float, float]] = {}
        self._first: dict[str, tuple[float, float]] = {}
        self._items: dict[str, _Item] = {}
        self._outputs: list[RequestOutput] = []
        self._elapsed = (0.0, 0.0)  # this loop's own iterations, on both clocks
        self._step = 0  # the index of the next engine step
        self._accepted: dict[str, dict[int, int]] = {}  # per request: outputs before -> drafts
        self._produced: dict[str, int] = {}
        self._span: dict[str, tuple[int, int]] = {}  # admitted before step i, first token in j
        self._seen = LastSchedule()  # the last step's `SchedulerOutput`; no cycle to the engine
        if steps is not None:
            llm.add_step_observer(self._seen)

    @property
    def done(self) -> bool:
        return len(self._outputs) >= self._total

    def advance(self) -> None:
        """One iteration: admit up to `concurrency`, one engine step, read its events."""
        from hycache.request import SamplingParams
        from hycache.sim.cluster import step_work

        start, base = _clocks(), self._elapsed

        def now() -> tuple[float, float]:
            c = _clocks()
            return base[0] + c[0] - start[0], base[1] + c[1] - start[1]

        while self._pending and len(self._arrived) - len(self._outputs) < self.concurrency:
            item = self._pending.popleft()
            sp = SamplingParams(max_tokens=item.max_tokens, ignore_eos=True)
            rid = self.llm.add_request(item.prompt, sp, request_id=item.key)
            self._arrived[rid], self._items[rid] = now(), item
            self._span[rid] = (self._step, -1)
        before = now()
        events = self.llm.step()
        after = now()
        if self.steps is not None:
            work = step_work(self._seen.last, self.llm.config.cache.block_size)
            self.steps.append(EngineStep(work, after[self._i] - before[self._i]))
        for e in events:
            rid, new = e.request_id, len(e.new_token_ids)
            if new:
                produced = self._produced.get(rid, 0)
                self._accepted.setdefault(rid, {})[produced] = new - 1
                self._produced[rid] = produced + new
                if rid not in self._first:
                    self._first[rid] = after
                    self._span[rid] = (self._span[rid][0], self._step)
            if e.output is not None:
                self._outputs.append(e.output)
                nxt = _next_turn(self._items[rid], list(e.output.token_ids))
                if nxt is not None:
                    self._pending.append(nxt)
        self._step += 1
        self._elapsed = now()

    def accepted(self) -> dict[str, dict[int, int]]:
        """The drafts the engine accepted, per request and step (keyed by the request's
        output tokens before the step): what `DryRunExecutor(accepted=...)` replays."""
        return {rid: dict(steps) for rid, steps in self._accepted.items()}

    def spans(self) -> list[tuple[int, int]]:
        """Per finished request (in finishing order): the indices of the engine steps its
        TTFT spans, the first after its admission and the one that gave its first token
        (both included; what `hycache.bench.steps.ttft_attribution` prices)."""
        return [self._span[o.request_id] for o in self._outputs]

    def metrics(self) -> RunMetrics:
        """Output tok/s, TTFT p50/p95, token hit rate and makespan on the loop's clock."""
        if not self.done:
            raise RuntimeError("the loop has requests left")
        i, out = self._i, self._outputs
        span, other = self._elapsed[i], self._elapsed[1 - i]
        tokens = sum(len(o.token_ids) for o in out)
        ttft = [self._first[o.request_id][i] - self._arrived[o.request_id][i] for o in out]
        prompt = sum(len(o.prompt_token_ids) for o in out)
        return RunMetrics(
            output_tokens_per_s=tokens / span,
            ttft_p50_s=float(np.percentile(ttft, 50)),
            ttft_p95_s=float(np.percentile(ttft, 95)),
            token_hit_rate=sum(o.hit_tokens for o in out) / prompt,
            makespan_s=span,
            other_clock_output_tokens_per_s=tokens / other,
            cpu_over_wall=self._elapsed[1] / self._elapsed[0],
            requests=len(out),
        )


def run_interleaved(loops: Sequence[ClosedLoop]) -> list[RunMetrics]:
    """The loops stepped in turn (one iteration each, in the given order, until all are
    done; one loop: alone); each one's metrics on its own clock."""
    while not all(loop.done for loop in loops):
        for loop in loops:
            if not loop.done:
                loop.advance()
    return [loop.metrics() for loop in loops]
