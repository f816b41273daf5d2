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
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

from hycache.sim.costmodel import CostModel, StepWork
from hycache.sim.fit import Fit, Residual, Sample, rms_error
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


@dataclass(frozen=True)
class Priced:
    """Engine time measured beside the cost model's price of the same work: seconds, and the
    relative error (None when nothing was measured)."""

    measured_s: float
    predicted_s: float
    error: float | None

    @classmethod
    def of(cls, measured_s: float, predicted_s: float) -> Priced:
        return cls(measured_s, predicted_s, predicted_s / measured_s - 1.0 if measured_s else None)


@dataclass(frozen=True)
class StepCost(Priced):
    """One kind of step of a run, priced (`steps`: how many per run)."""

    steps: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "error": self.error}  # fmt: skip


@dataclass(frozen=True)
class StepAttribution:
    """A policy's engine steps priced per kind (`STEP_KINDS`, then ``"all steps"``) as
    seconds per run, and the run's time between its steps (`outside_steps_s`)."""

    kinds: Mapping[str, StepCost]
    outside_steps_s: float

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {kind: v.to_json() for kind, v in self.kinds.items()}
        return out | {"outside_steps_s": self.outside_steps_s}


def step_attribution(
    runs: Sequence[Sequence[EngineStep]], makespans: Sequence[float], cost: CostModel
) -> StepAttribution:
    """Where a prediction's error comes from. The cost model prices the engine's own steps
    (the same work, so a difference here is the cost model's), per step kind, as seconds per
    run (the mean over `runs`); `outside_steps_s` is the run's time between its steps (the
    client loop: admitting requests, reading events), which the simulator does not charge.
    A tok/s error the kinds do not explain is the schedule's (the simulator's own steps)."""
    n = len(runs)

    def priced(rows: Sequence[EngineStep]) -> StepCost:
        measured = sum(st.seconds for st in rows) / n
        predicted = sum(cost.step_time(st.work) for st in rows) / n
        p = Priced.of(measured, predicted)
        return StepCost(p.measured_s, p.predicted_s, p.error, steps=len(rows) / n)

    every = [st for run in runs for st in run]
    kinds: dict[str, StepCost] = {}
    for kind in STEP_KINDS:
        rows = [st for st in every if step_kind(st.work) == kind]
        if rows:
            kinds[kind] = priced(rows)
    kinds["all steps"] = priced(every)
    measured = kinds["all steps"].measured_s
    outside = statistics.mean(makespans) - measured if makespans else 0.0
    return StepAttribution(kinds, outside)


def ttft_attribution(
    runs: Sequence[Sequence[EngineStep]],
    spans: Sequence[Sequence[tuple[int, int]]],
    cost: CostModel,
) -> Priced:
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
    return Priced.of(statistics.median(measured), statistics.median(priced))


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
    engine steps (`fitted_on`) fitted (`values`; `gpu`, the profile with them), and the
    residuals of its samples and of `held_out`'s own engine steps (with their rms errors).
    :meth:`to_json`: every field but `gpu`."""

    held_out: str
    fitted_on: tuple[str, ...]
    values: Fit
    rms_error_probes: float
    rms_error_engine_steps: float
    rms_error_own_steps: float
    engine_steps: tuple[Residual, ...]
    own_steps: tuple[Residual, ...]
    gpu: GpuSpec

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "gpu"}


def _plain(v: Any) -> Any:
    """A field as JSON has it: a dataclass as its fields, a tuple as a list."""
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return asdict(v) if is_dataclass(v) and not isinstance(v, type) else v


def cross_fit(
    probes: Measured, runs: Runs, held_out: str, model: str, k: int, profile: GpuSpec
) -> CrossFit:
    """Fit the calibration probes `probes.fitted` and every workload's engine steps but
    `held_out`'s (`runs`); the fitted values replace `profile`'s. The result records what it
    was fitted on, the values and the residuals: of its samples, and of `held_out`'s own
    engine steps (out of sample: what the prediction of `held_out` is priced by)."""
    others = [n for n in runs if n != held_out]
    engine = [s for n in others for s in engine_samples(n, runs[n], k)]
    spec = load_model_spec(model)
    values = probes.fit(spec, more=engine)
    own = engine_samples(held_out, runs[held_out], k) if held_out in runs else []
    fitted_rows, engine_rows, own_rows = (
        probes.residuals(ss, values, spec) for ss in (probes.fitted, engine, own)
    )
    return CrossFit(
        held_out, ("calibration probes", *others), values, rms_error(fitted_rows),
        rms_error(engine_rows), rms_error(own_rows), tuple(engine_rows), tuple(own_rows),
        replace(profile, **values.as_arguments()),
    )  # fmt: skip
