"""The validation's client (hycache.bench.closed_loop): loops stepped in turn do exactly what
they do alone, and each one's clock holds only its own iterations."""

from __future__ import annotations

from typing import Any

import pytest

from hycache.bench import closed_loop
from hycache.bench.closed_loop import ClosedLoop, RunMetrics, run_interleaved
from hycache.bench.steps import EngineStep
from hycache.bench.validate import ValidateOptions, build_workload
from hycache.bench.validate.runs import arm_engine
from hycache.config import CacheKnobs

POLICIES = ("lookahead", "limit")


def _llm(policy: str, name: str) -> Any:
    o = ValidateOptions(profile="unused.json", quick=True)
    w = build_workload(name, o.seed, quick=True)
    return arm_engine(o, policy, w.max_tokens_per_request() + 2 * o.num_speculative_tokens + 16)


def _work(steps: list[EngineStep]) -> list[Any]:
    return [s.work for s in steps]


@pytest.mark.parametrize("name", ["family", "multi-turn"])
def test_loops_in_turn_do_what_each_does_alone(name: str) -> None:
    """Stepped in turn, each engine schedules the same steps (the same work, in order),
    returns the same tokens and hits the cache as much as alone: interleaving changes the
    clock each one is timed on, nothing it does."""
    w = build_workload(name, 0, quick=True)
    alone: dict[str, tuple[RunMetrics, list[EngineStep]]] = {}
    for p in POLICIES:
        steps: list[EngineStep] = []
        alone[p] = run_interleaved([ClosedLoop(_llm(p, name), w, 8, "wall", steps)])[0], steps
    steps_in_turn: list[list[EngineStep]] = [[], []]
    loops = [
        ClosedLoop(_llm(p, name), w, 8, "wall", s)
        for p, s in zip(POLICIES, steps_in_turn, strict=True)
    ]
    got = run_interleaved(loops)
    for p, m, s in zip(POLICIES, got, steps_in_turn, strict=True):
        solo, solo_steps = alone[p]
        assert _work(s) == _work(solo_steps)
        assert m.requests == solo.requests == w.size
        assert m.token_hit_rate == solo.token_hit_rate
    # the two policies differ (else the test proves little): limit resumes deeper
    assert got[1].token_hit_rate >= got[0].token_hit_rate
    assert _work(steps_in_turn[0]) != _work(steps_in_turn[1])


class FakeClocks:
    """The loops' wall and CPU clocks, advanced only by what the test charges: each engine step
    and each admitted request costs a set amount (never the machine's load)."""

    STEP_S, ADD_S = 0.010, 0.0001

    def __init__(self) -> None:
        self.now = 0.0
        self.charged: dict[int, float] = {}  # per engine: its steps and admissions

    def __call__(self) -> tuple[float, float]:
        return self.now, self.now

    def charge(self, llm: Any, name: str, seconds: float) -> None:
        inner = getattr(llm, name)

        def charged(*args: Any, **kw: Any) -> Any:
            out = inner(*args, **kw)
            self.now += seconds
            self.charged[id(llm)] = self.charged.get(id(llm), 0.0) + seconds
            return out

        setattr(llm, name, charged)


def test_each_loop_keeps_its_own_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two loops stepped in turn: each one's makespan is exactly its own steps plus its own
    client work (on clocks the test advances: the machine's load cannot move them), and the
    two makespans add up to the whole interleaved run (the other loop's steps are on neither
    clock twice)."""
    w = build_workload("family", 0, quick=True)
    clocks = FakeClocks()
    monkeypatch.setattr(closed_loop, "_clocks", clocks)
    steps: list[list[EngineStep]] = [[], []]
    loops = [
        ClosedLoop(_llm(p, "family"), w, 8, "wall", s) for p, s in zip(POLICIES, steps, strict=True)
    ]
    for loop in loops:
        clocks.charge(loop.llm, "step", FakeClocks.STEP_S)
        clocks.charge(loop.llm, "add_request", FakeClocks.ADD_S)
    a, b = run_interleaved(loops)
    assert a.makespan_s + b.makespan_s == pytest.approx(clocks.now)
    for m, s, loop in ((a, steps[0], loops[0]), (b, steps[1], loops[1])):
        assert m.makespan_s == pytest.approx(clocks.charged[id(loop.llm)])
        assert [x.seconds for x in s] == pytest.approx([FakeClocks.STEP_S] * len(s))
        assert m.output_tokens_per_s == pytest.approx(
            sum(r.max_tokens for r in w.requests) / m.makespan_s
        )
        # TTFTs are on the loop's own clock: none exceeds its makespan
        assert 0 < m.ttft_p50_s <= m.ttft_p95_s <= m.makespan_s
    for loop, s, m in zip(loops, steps, (a, b), strict=True):
        # each request's TTFT spans the steps from its admission to its first token: those
        # steps are most of it (the rest is the client's work between them)
        spans = loop.spans()
        assert len(spans) == w.size and all(0 <= i <= j < len(s) for i, j in spans)
        in_spans = sorted(sum(x.seconds for x in s[i : j + 1]) for i, j in spans)
        p50 = (in_spans[(len(spans) - 1) // 2] + in_spans[len(spans) // 2]) / 2
        assert 0.7 * m.ttft_p50_s <= p50 <= m.ttft_p50_s


def test_a_loop_refuses_an_unknown_clock_and_early_metrics() -> None:
    w = build_workload("family", 0, quick=True)
    with pytest.raises(ValueError, match="clock"):
        ClosedLoop(None, w, 8, "tsc")
    loop = ClosedLoop(_llm("limit", "family"), w, 8, "cpu")
    loop.advance()
    with pytest.raises(RuntimeError, match="left"):
        loop.metrics()


def test_validate_steps_the_policies_in_turn_unless_told_not_to(tmp_path: Any) -> None:
    """By default each repeat runs both policies' engines in one run, their steps in turn
    (the first policy alternating between repeats); `interleave=False` runs them one after
    the other. Both measure every request of every arm."""
    from hycache.bench.calibrate import CalibrateOptions, DecodeProbe, Grid, PrefillProbe
    from hycache.bench.validate import validate

    grid = Grid(prefill=(PrefillProbe(64, (0,)),), decode=(DecodeProbe(64, 2, (1,)),),
                copies=(), state_writes=())  # fmt: skip
    empty = Grid(prefill=(), decode=(), copies=(), state_writes=())
    cal = CalibrateOptions(repeats=1, decode_repeats=1, knobs=CacheKnobs(64, 8), grid=grid,
                           held_out=empty, cache_memory_gb=0.05)  # fmt: skip
    for interleave, expected in (
        (True, ["lookahead + limit in turn", "limit + lookahead in turn"]),
        (False, ["lookahead", "limit", "limit", "lookahead"]),
    ):
        opts = ValidateOptions(
            profile=str(tmp_path / "p.json"), quick=True, repeats=2, workloads=("family",),
            isolate=False, interleave=interleave,
        )  # fmt: skip
        messages: list[str] = []
        doc = validate(opts, messages.append, recalibrate=cal)
        runs = [m.split(" · ")[2] for m in messages if " · engine · " in m]
        assert runs == expected
        part = doc.workloads["family"]
        for p in POLICIES:
            assert part.measured[p].requests == part.size
        ratio = part.comparison.ratio
        assert ratio is not None and ratio.paired is True


def _shape(works: list[Any]) -> list[tuple[Any, ...]]:
    """A step's work as both sides describe it (shared context aside: only a cost model
    that prices it has the simulator count it)."""
    return [
        (w.num_block_copies, tuple((s.num_new_tokens, s.context_len, s.num_draft_tokens,
                                    s.is_prefill) for s in w.seqs))
        for w in works
    ]  # fmt: skip


class _Recording:
    """A cost model that keeps every step's work the simulator prices."""

    def __init__(self, cost: Any) -> None:
        self.cost, self.works = cost, []

    def step_time(self, work: Any) -> float:
        self.works.append(work)
        return float(self.cost.step_time(work))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cost, name)


def test_replayed_drafts_make_the_simulators_steps_the_engines() -> None:
    """An engine that accepts drafts (an oracle drafter accepting 2, 0, 1 ... in turn): its
    loop records how many each step accepted, and the simulator replaying them schedules
    the engine's steps, one for one; drawing them at a rate instead, it does not."""
    from dataclasses import replace

    from hycache.bench.validate import simulate
    from hycache.engine.engine import LLM
    from hycache.sim.costmodel import CostModel
    from hycache.sim.presets import load_gpu, load_model_spec
    from hycache.sim.simulator import Simulator
    from tests.helpers import OracleDrafter, oracle_schedule

    o = ValidateOptions(profile="unused.json", quick=True)
    w = build_workload("family", 0, quick=True)
    max_len = w.max_tokens_per_request() + 2 * o.num_speculative_tokens + 16
    llm = arm_engine(o, "limit", max_len)
    plain = LLM(o.model, block_size=64, max_model_len=max_len, num_speculative_tokens=0,
                seed=o.seed, enable_prefix_caching=False)  # fmt: skip
    oracle = OracleDrafter(llm, oracle_schedule(o.num_speculative_tokens), 512)
    oracle.learn(plain, [r.prompt_token_ids.tolist() for r in w.requests],
                 max(r.max_tokens for r in w.requests))  # fmt: skip
    steps: list[EngineStep] = []
    loop = ClosedLoop(llm, w, 8, "wall", steps)
    while not loop.done:
        loop.advance()
    accepted = loop.accepted()
    assert sum(sum(a.values()) for a in accepted.values()) > 0
    assert set(accepted) == {str(r.request_id) for r in w.requests}

    cost = CostModel(load_model_spec("tiny"), load_gpu("h200"), speculative=True,
                     num_speculative_tokens=o.num_speculative_tokens, block_size=64)  # fmt: skip
    shapes = {}
    for mode, record in (("replay", accepted), ("rate", None)):
        cfg = replace(llm.config, speculative=replace(llm.config.speculative, acceptance_rate=0.3))
        rec = _Recording(cost)
        Simulator(cfg, cost=rec, seed=0, vocab_size=512, accepted=record).run(  # type: ignore[arg-type]
            w.requests, concurrency=8
        )
        shapes[mode] = _shape(rec.works)
    assert shapes["replay"] == _shape([s.work for s in steps])
    assert shapes["rate"] != shapes["replay"]
    # the validation's own entry point passes the record through
    got = simulate(llm.config, w, cost, 8, 0, accepted)
    assert got.requests == w.size


def test_a_finished_loop_and_its_engine_are_freed_without_the_cycle_collector() -> None:
    """Neither a loop that records steps nor a calibration timer holds its engine in a
    reference cycle: dropping them frees the engine's tensors at once. (Each observer used to
    be a bound method of an object holding the `LLM`; a test module of validation runs then
    held 8 engines, 6 GB, until the cyclic collector happened to run.)"""
    import gc
    import weakref

    from hycache.bench.calibrate.probes import _Timer

    gc.collect()
    gc.disable()
    try:
        w = build_workload("family", 0, quick=True)
        llm = _llm("limit", "family")
        ref = weakref.ref(llm)
        run_interleaved([ClosedLoop(llm, w, 8, "wall", [])])
        timer = _Timer(llm)
        timer.step()
        del llm, timer
        assert ref() is None, "something still holds the engine (a reference cycle?)"
    finally:
        gc.enable()
