"""The engine's own steps in a validation run: their kinds, their price under a cost model
(`step_attribution`: where a prediction's error comes from) and a fit on them that leaves
one workload out (`cross_fit`: no prediction sees its own run).

Why fit on engine steps at all: inside a 10-25 s engine run the same step shapes take 4-9%
longer than as isolated calibration probes (an 8,192-token chunk: 4.96 s as a probe, 5.07 s
as a run's first chunk), and the runs' mixed steps are shapes the probes have only a few of.
A workload's steps are summed per policy and kind into one sample each, so that a run of
400 decode steps weighs as much as one probe shape, not 400.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from hycache.sim.costmodel import CostModel, StepWork
from hycache.sim.fit import Sample, rms_error
from hycache.sim.presets import GpuSpec, load_model_spec

if TYPE_CHECKING:
    from hycache.bench.calibrate import Measured

STEP_KINDS: tuple[str, ...] = ("prefill", "mixed", "decode", "copies")

# per workload, per policy: each repeat's steps in order
Runs = Mapping[str, Mapping[str, Sequence[Sequence["EngineStep"]]]]


@dataclass(frozen=True)
class EngineStep:
    """One engine step of a validation run: its work and its time on the run's clock."""

    work: StepWork
    seconds: float


def step_kind(work: StepWork) -> str:
    """`prefill` (prefill chunks only), `decode` (decoding or verifying requests only),
    `mixed` (both), or `copies` (block copies and nothing else)."""
    prefill = any(s.is_prefill for s in work.seqs)
    decode = any(not s.is_prefill for s in work.seqs)
    if prefill and decode:
        return "mixed"
    return "prefill" if prefill else "decode" if decode else "copies"


def step_attribution(
    runs: Sequence[Sequence[EngineStep]], makespans: Sequence[float], cost: CostModel
) -> dict[str, Any]:
    """Where a prediction's error comes from. The cost model prices the engine's own steps
    (the same work, so a difference here is the cost model's), per step kind, as seconds per
    run (the mean over `runs`); `outside_steps_s` is the run's time between its steps (the
    client loop: admitting requests, reading events), which the simulator does not charge.
    A tok/s error the kinds do not explain is the schedule's (the simulator's own steps)."""
    n = len(runs)

    def priced(rows: Sequence[EngineStep]) -> dict[str, Any]:
        measured = sum(st.seconds for st in rows) / n
        predicted = sum(cost.step_time(st.work) for st in rows) / n
        return {"steps": len(rows) / n, "measured_s": measured, "predicted_s": predicted,
                "error": predicted / measured - 1.0 if measured else None}  # fmt: skip

    every = [st for run in runs for st in run]
    out: dict[str, Any] = {}
    for kind in STEP_KINDS:
        rows = [st for st in every if step_kind(st.work) == kind]
        if rows:
            out[kind] = priced(rows)
    out["all steps"] = priced(every)
    measured = out["all steps"]["measured_s"]
    out["outside_steps_s"] = statistics.mean(makespans) - measured if makespans else 0.0
    return out


def ttft_attribution(
    runs: Sequence[Sequence[EngineStep]],
    spans: Sequence[Sequence[tuple[int, int]]],
    cost: CostModel,
) -> dict[str, Any]:
    """TTFT p50 on the engine's own schedule: each request's TTFT as the steps it spans
    (`ClosedLoop.spans`), timed and priced by the cost model (the median over repeats).
    The schedule is the engine's, so an error here is the cost model's; where the
    simulator's TTFT p50 misses by more, its own schedule put the requests in other steps
    (a turn joining a different step, or a draft accepted elsewhere)."""
    measured, priced = [], []
    for run, run_spans in zip(runs, spans, strict=True):
        price = [cost.step_time(st.work) for st in run]
        measured.append(statistics.median(
            sum(st.seconds for st in run[a : b + 1]) for a, b in run_spans))  # fmt: skip
        priced.append(statistics.median(sum(price[a : b + 1]) for a, b in run_spans))
    m, p = statistics.median(measured), statistics.median(priced)
    return {"measured_s": m, "predicted_s": p, "error": p / m - 1.0 if m else None}


def engine_samples(
    name: str, by_policy: Mapping[str, Sequence[Sequence[EngineStep]]], k: int
) -> list[Sample]:
    """Workload `name`'s engine steps as fit samples: per policy and step kind, the steps of
    every repeat summed into one (`Sample.total`)."""
    out = []
    for policy, runs in by_policy.items():
        for kind in STEP_KINDS:
            rows = [(st.work, st.seconds) for run in runs for st in run
                    if step_kind(st.work) == kind]  # fmt: skip
            if rows:
                label = f"{name} · {policy} · {kind} (engine)"
                out.append(Sample.total(label, rows, k, repeats=len(runs)))
    return out


@dataclass(frozen=True)
class CrossFit:
    """The profile that predicts workload `held_out`: the probes and the other workloads'
    engine steps fitted (`gpu`), and how its samples fit (`doc`)."""

    held_out: str
    gpu: GpuSpec
    doc: dict[str, Any]


def cross_fit(
    probes: Measured, runs: Runs, held_out: str, model: str, k: int, profile: GpuSpec
) -> CrossFit:
    """Fit the calibration probes `probes.fitted` and every workload's engine steps but
    `held_out`'s (`runs`); the fitted values replace `profile`'s. `doc` records what it was
    fitted on, the values and the residuals: of its samples, and of `held_out`'s own engine
    steps (out of sample: what the prediction of `held_out` is priced by)."""
    others = [n for n in runs if n != held_out]
    engine = [s for n in others for s in engine_samples(n, runs[n], k)]
    spec = load_model_spec(model)
    values = probes.fit(spec, more=engine)
    own = engine_samples(held_out, runs[held_out], k) if held_out in runs else []
    fitted_rows, engine_rows, own_rows = (
        probes.residuals(ss, values, spec) for ss in (probes.fitted, engine, own)
    )
    doc = {
        "held_out": held_out,
        "fitted_on": ["calibration probes", *others],
        "values": asdict(values),
        "rms_error_probes": rms_error(fitted_rows),
        "rms_error_engine_steps": rms_error(engine_rows),
        "rms_error_own_steps": rms_error(own_rows),
        "engine_steps": engine_rows,
        "own_steps": own_rows,
    }
    gpu = replace(profile, **values.as_arguments())
    return CrossFit(held_out, gpu, doc)
