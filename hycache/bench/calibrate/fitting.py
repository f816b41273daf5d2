"""The fitting phase: rounds of measurement pooled into one (`pool`), the fit and the device
profile it writes (`profile_from`: residuals of both grids and the ablation), and `calibrate`,
measure then fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from hycache.bench.calibrate.measure import Measured, measure
from hycache.bench.calibrate.options import CalibrateOptions, Progress
from hycache.sim.fit import Profile, Sample, ablation
from hycache.sim.presets import load_model_spec


def pool(rounds: Sequence[Measured]) -> Measured:
    """Rounds of `measure` taken at different times (between the runs of a validation) as
    one measurement: per shape, the median of the rounds' medians (the spread beside it is
    across rounds); the device's peaks and the drafter's acceptance, their medians too."""
    if not rounds:
        raise ValueError("pool: no rounds")

    def samples(lists: Sequence[Sequence[Sample]]) -> list[Sample]:
        by_label: dict[str, list[Sample]] = {}
        for group in lists:
            for s in group:
                by_label.setdefault(s.label, []).append(s)
        out = []
        for ss in by_label.values():
            walls = [s.wall_s for s in ss]
            med = statistics.median(walls)
            out.append(
                replace(
                    ss[0],
                    wall_s=med,
                    cpu_s=statistics.median(s.cpu_s for s in ss),
                    repeats=sum(s.repeats for s in ss),
                    spread=(max(walls) - min(walls)) / med,
                    load=statistics.mean(s.load for s in ss),
                )
            )
        return out

    first, last = rounds[0].conditions, rounds[-1].conditions
    rates: dict[str, list[float]] = {}
    for m in rounds:
        for k, v in m.conditions.extra.get("acceptance_rate", {}).items():
            rates.setdefault(k, []).append(v)
    conditions = replace(
        first,
        load_after=last.load_after,
        cpu_over_wall=statistics.mean(m.conditions.cpu_over_wall for m in rounds),
        wall_s=sum(m.conditions.wall_s for m in rounds),
        extra={
            **first.extra,
            "rounds": len(rounds),
            "repeats": sum(int(m.conditions.extra.get("repeats", 0)) for m in rounds),
            "acceptance_rate": {k: statistics.median(v) for k, v in rates.items()},
        },
    )
    gpu = replace(
        rounds[0].gpu,
        peak_flops=statistics.median(m.gpu.peak_flops for m in rounds),
        hbm_bandwidth=statistics.median(m.gpu.hbm_bandwidth for m in rounds),
    )
    fitted = samples([m.fitted for m in rounds])
    held = samples([m.held_out for m in rounds])
    return Measured(gpu, fitted, held, conditions)


def calibrate(o: CalibrateOptions, progress: Progress, command: str = "") -> Profile:
    """Measure (`measure`), fit on the fitted grid, and return the device profile
    (`hycache.sim.fit.Profile`; its file is `Profile.to_json()`)."""
    m = measure(o, progress)
    return profile_from(m, o.model, progress, command)


def profile_from(m: Measured, model_name: str, progress: Progress, command: str) -> Profile:
    """Fit `m.fitted` and build the profile, residuals of both grids and the ablation
    included."""
    model = load_model_spec(model_name)
    values = m.fit(model)
    progress("fitted; the ablation")
    rows, held_rows = m.residuals(m.fitted, values, model), m.residuals(m.held_out, values, model)
    why = ablation(m.fitted, model, m.gpu, block_size=m.block_size, clock=m.clock, padded=True)
    return Profile(m.gpu, values, model_name, tuple(rows), tuple(held_rows), m.conditions,
                   command, why)  # fmt: skip
