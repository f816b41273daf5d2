"""A validation from end to end (`validate`): the engine runs and calibration rounds in order
(`_run_engines`), the pooled profile fitted and written, each workload predicted (cross-fitted
with recalibration: `_workload_result`), the report; the raw rounds and steps pickled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hycache.bench.steps import cross_fit
from hycache.bench.validate.options import Progress, ValidateOptions, build_workload
from hycache.bench.validate.predict import (
    engine_cost,
    predict_workload,
    profile_acceptance,
    profile_clock,
)
from hycache.bench.validate.report import ValidationInputs, ValidationReport, WorkloadResult
from hycache.bench.validate.runs import (
    Recorded,
    RecordedRuns,
    calibration_round,
    engine_runs,
    run_isolated,
)
from hycache.sim.presets import GpuSpec, load_gpu
from hycache.sim.workloads import Workload

if TYPE_CHECKING:
    from hycache.bench.calibrate import CalibrateOptions, Measured
    from hycache.sim.fit import Profile


def validate(
    o: ValidateOptions, progress: Progress, recalibrate: CalibrateOptions | None = None
) -> ValidationReport:
    """Every workload x policy on the engine (`o.repeats` times, the policy order alternating;
    medians) and in the simulator; the report (a `comparison` per workload). With
    `o.interleave` (the default) a repeat runs the policies' engines in one process, their
    steps in turn, each timed on its own clock (`hycache.bench.closed_loop`), so their ratio
    sees the machine in the same states; otherwise one run after the other.

    `recalibrate`: instead of reading the profile `o.profile`, measure the calibration grid
    (`hycache.bench.calibrate.measure`) before every `o.round_every`-th repeat, so that the
    calibration and the runs it predicts see the machine in the same states; pool the
    rounds, fit them and write the profile to `o.profile` before predicting. With
    `o.cross_fit` (and two workloads or more) each workload's `comparison` is then the
    prediction with the probes and the other workloads' engine steps fitted
    (`hycache.bench.steps.cross_fit`; `cross_fit` per workload), and `probes_only` the
    profile's own.

    With `o.isolate` every engine run and calibration round starts in a fresh interpreter,
    as a served engine does: none inherits the heap and caches of the runs before it (in one
    process, multi-turn ran 10-15% slower after a calibration round than before it)."""
    clock = o.clock or (
        profile_clock(load_gpu(o.profile)) if recalibrate is None else recalibrate.clock
    )
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be wall or cpu, got {clock!r}")
    if o.acceptance not in ("replay", "rate"):
        raise ValueError(f"acceptance must be replay or rate, got {o.acceptance!r}")
    if o.round_every < 1:
        raise ValueError(f"round_every must be >= 1, got {o.round_every}")
    t_start = time.perf_counter()
    workloads = {name: build_workload(name, o.seed, o.quick) for name in o.workloads}
    recorded, rounds = _run_engines(o, list(workloads), clock, recalibrate, progress)
    probes, profile = None, None
    if recalibrate is not None:
        from hycache.bench.calibrate import pool

        probes = pool(rounds)
        profile = _write_profile(o.profile, probes, recalibrate, progress)
    if o.raw:
        _write_raw(o.raw, rounds, recorded)
    gpu = load_gpu(o.profile)
    k = o.num_speculative_tokens
    accept = o.acceptance_rate if o.acceptance_rate is not None else profile_acceptance(gpu, k)
    crossed = probes is not None and o.cross_fit and len(workloads) > 1
    results = {
        name: _workload_result(
            o, name, w, recorded, gpu, accept, probes if crossed else None, progress
        )
        for name, w in workloads.items()
    }
    inputs = ValidationInputs(
        profile=o.profile,
        recalibrated=recalibrate is not None,
        cross_fitted=crossed,
        model=gpu.fitted_on or o.model,
        clock=clock,
        acceptance_rate=accept,
        acceptance=o.acceptance,
        drafts_accepted={
            name: {p: RecordedRuns(by).drafts_accepted(p) for p in by}
            for name, by in recorded.items()
        },
        threads=o.threads,
        repeats=o.repeats,
        block_size=o.run_knobs.block_size,
        prefix_match_unit=o.knobs.prefix_match_unit,
        num_speculative_tokens=k,
        concurrency=o.concurrency,
        seed=o.seed,
    )
    return ValidationReport(results, inputs, time.perf_counter() - t_start, profile)


def _run_engines(
    o: ValidateOptions,
    names: Sequence[str],
    clock: str,
    recalibrate: CalibrateOptions | None,
    progress: Progress,
) -> tuple[Recorded, list[Measured]]:
    """Every repeat of every workload's engine runs (the policy order alternating), with a
    calibration round before every `o.round_every`-th repeat when recalibrating; the runs,
    and the rounds."""
    recorded: Recorded = {name: {p: [] for p in o.policies} for name in names}
    rounds: list[Measured] = []
    where = "a fresh process" if o.isolate else "this process"
    num_rounds = -(-o.repeats // o.round_every)
    for rep in range(o.repeats):
        if recalibrate is not None and rep % o.round_every == 0:
            progress(f"calibration round {rep // o.round_every + 1}/{num_rounds} ({where})")
            rounds.append(run_isolated(calibration_round, recalibrate, isolate=o.isolate))
        for name in names:
            order = tuple(o.policies) if rep % 2 == 0 else tuple(reversed(o.policies))
            # stepped in turn in one run, or one run after the other
            batches = [order] if o.interleave else [(p,) for p in order]
            for batch in batches:
                arms = " + ".join(batch) + (" in turn" if len(batch) > 1 else "")
                progress(f"{name} · engine · {arms} · repeat {rep + 1}/{o.repeats} ({where})")
                results = run_isolated(engine_runs, o, name, batch, clock, isolate=o.isolate)
                for p, run in zip(batch, results, strict=True):
                    recorded[name][p].append(run)
    return recorded, rounds


def _workload_result(
    o: ValidateOptions, name: str, w: Workload, recorded: Recorded, gpu: GpuSpec,
    accept: float, probes: Measured | None, progress: Progress,
) -> WorkloadResult:  # fmt: skip
    """One workload's medians and prediction by `gpu`'s cost model; with `probes` (cross
    fitting), the prediction refitted on the probes and the other workloads' engine steps,
    the profile's own kept as `probes_only`."""
    k, block, model = o.num_speculative_tokens, o.run_knobs.block_size, gpu.fitted_on or o.model
    rec = RecordedRuns(recorded[name])
    own = predict_workload(o, name, w, rec, engine_cost(gpu, model, k, block), accept, progress)
    result = WorkloadResult(rec.medians(), own, w.size)
    if probes is None:
        return result
    steps = {n: {p: [r.steps for r in rs] for p, rs in by.items()} for n, by in recorded.items()}
    cf = cross_fit(probes, steps, name, model, k, gpu)
    progress(f"{name} · refitted on the probes and the other workloads' runs "
             f"(rms {cf.rms_error_own_steps:.1%} on its own steps)")  # fmt: skip
    cost = engine_cost(cf.gpu, model, k, block)
    crossed = predict_workload(o, name, w, rec, cost, accept, progress, " (cross-fitted)")
    return replace(result, prediction=crossed, probes_only=own, cross_fit=cf)


def _write_raw(path: str, rounds: Sequence[Measured], recorded: Recorded) -> None:
    """The calibration rounds and, per workload, policy and repeat, the engine runs'
    metrics, steps, TTFT spans and accepted drafts, pickled."""
    import pickle

    from hycache.files import write_atomic

    def each(field: str) -> dict[str, dict[str, list[Any]]]:
        return {n: {p: [getattr(r, field) for r in rs] for p, rs in by.items()}
                for n, by in recorded.items()}  # fmt: skip

    runs = {n: {p: [r.metrics.to_json() for r in rs] for p, rs in by.items()}
            for n, by in recorded.items()}  # fmt: skip
    blob = pickle.dumps({"rounds": list(rounds), "runs": runs, "steps": each("steps"),
                         "spans": each("spans"), "accepted": each("accepted")})  # fmt: skip
    write_atomic(path, blob)


def _write_profile(
    path: str, probes: Measured, cal: CalibrateOptions, progress: Progress
) -> Profile:
    """Fit the pooled calibration rounds `probes`, write the profile to `path`, return it."""
    import json

    from hycache.bench.calibrate import profile_from
    from hycache.files import write_atomic

    rounds = probes.conditions.extra.get("rounds", 1)
    progress(f"fitting {rounds} pooled calibration rounds")
    command = f"hycache bench --validate {path} --recalibrate (rounds between the engine runs)"
    profile = profile_from(probes, cal.model, progress, command)
    write_atomic(path, json.dumps(profile.to_json(), indent=2) + "\n")
    progress(f"wrote {path}")
    return profile
