"""What a validation reports: the measured and predicted figures side by side (`compare`:
`MetricError` per metric, `RatioError` for `limit / lookahead`; the engine's and the
simulator's figures are `RunMetrics` both), a workload's `Prediction` and `WorkloadResult`,
the run's `ValidationInputs` and the whole `ValidationReport` (its
`to_json` is `--json`'s document), and the figures outside the targets (`misses`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hycache.bench.closed_loop import RunMetrics
from hycache.bench.steps import CrossFit, Priced, StepAttribution
from hycache.bench.validate.options import METRICS, POLICIES

if TYPE_CHECKING:
    from hycache.sim.fit import Profile


@dataclass(frozen=True)
class MetricError:
    """One metric, measured beside predicted; `error`: predicted / measured - 1 (None when
    nothing was measured)."""

    measured: float
    predicted: float
    error: float | None


@dataclass(frozen=True)
class RatioError:
    """`limit / lookahead` output tok/s both ways, the error in percentage points; `paired`:
    the measured ratio is the median of each repeat's pair (`of_medians` beside it)."""

    measured: float
    predicted: float
    error_pp: float
    of_medians: float
    paired: bool


@dataclass(frozen=True)
class Comparison:
    """Per policy, per metric key (`METRICS`): measured beside predicted; and the ratio."""

    metrics: Mapping[str, Mapping[str, MetricError]]
    ratio: RatioError | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            p: {key: asdict(e) for key, e in by.items()} for p, by in self.metrics.items()
        }
        return out | ({"ratio": asdict(self.ratio)} if self.ratio is not None else {})


Metrics = Mapping[str, RunMetrics]  # per policy: measured by the engine's loop, or simulated


def metrics_json(m: Metrics) -> dict[str, dict[str, float]]:
    return {p: f.to_json() for p, f in m.items()}


@dataclass(frozen=True)
class AtRate:
    """The simulator drawing drafts at the profile's rate: its metrics and comparison."""

    predicted: Metrics
    comparison: Comparison

    def to_json(self) -> dict[str, Any]:
        return {"predicted": metrics_json(self.predicted), "comparison": self.comparison.to_json()}


@dataclass(frozen=True)
class Prediction:
    """One cost model's prediction of a workload, per policy: the simulator's metrics, the
    engine's own steps priced (`steps`) and its TTFT p50 priced on its schedule
    (`ttft_steps`), the comparison with the measured medians, and (replaying the engine's
    drafts) the prediction drawn at the profile's rate beside it."""

    predicted: Metrics
    steps: Mapping[str, StepAttribution]
    ttft_steps: Mapping[str, Priced]
    comparison: Comparison
    at_rate: AtRate | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "predicted": metrics_json(self.predicted),
            "steps": {p: a.to_json() for p, a in self.steps.items()},
            "ttft_steps": {p: asdict(v) for p, v in self.ttft_steps.items()},
            "comparison": self.comparison.to_json(),
        }
        return out | ({"at_rate": self.at_rate.to_json()} if self.at_rate is not None else {})


@dataclass(frozen=True)
class WorkloadResult:
    """One workload: the engine's medians per policy, the prediction (with cross-fitting,
    the cross-fitted one, `probes_only` beside it), and its number of requests."""

    measured: Metrics
    prediction: Prediction
    size: int
    probes_only: Prediction | None = None
    cross_fit: CrossFit | None = None

    @property
    def comparison(self) -> Comparison:
        return self.prediction.comparison

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "measured": metrics_json(self.measured),
            **self.prediction.to_json(),
        }
        if self.probes_only is not None and self.cross_fit is not None:
            out |= {"probes_only": self.probes_only.to_json(),
                    "cross_fit": self.cross_fit.to_json()}  # fmt: skip
        return out | {"size": self.size}


@dataclass(frozen=True)
class ValidationInputs:
    """What a validation ran with."""

    profile: str
    recalibrated: bool
    cross_fitted: bool
    model: str
    clock: str
    acceptance_rate: float
    acceptance: str
    drafts_accepted: Mapping[str, Mapping[str, int]]  # per workload, per policy
    threads: int
    repeats: int
    block_size: int
    prefix_match_unit: int
    num_speculative_tokens: int
    concurrency: int
    seed: int


@dataclass(frozen=True)
class ValidationReport:
    """`validate`'s result: per workload, the measured and predicted figures; the inputs;
    the run's wall time; with recalibration, the profile fitted and written (`profile`).
    :meth:`to_json` is `--json`'s document."""

    workloads: Mapping[str, WorkloadResult]
    inputs: ValidationInputs
    wall_s: float
    profile: Profile | None = None

    def misses(self, rel: float = 0.10, pp: float = 3.0) -> list[str]:
        return misses({n: w.comparison for n, w in self.workloads.items()}, rel, pp)

    def to_json(self) -> dict[str, Any]:
        return {
            "workloads": {n: w.to_json() for n, w in self.workloads.items()},
            "inputs": asdict(self.inputs),
            "wall_s": self.wall_s,
            "misses": self.misses(),
        }


def compare(
    measured: Metrics,
    predicted: Metrics,
    policies: Sequence[str] = POLICIES,
    paired: float | None = None,
) -> Comparison:
    """Per policy and metric: measured, predicted, relative error (predicted / measured - 1);
    and the `limit / lookahead` output tok/s ratio both ways with its error in percentage
    points. `paired`: the measured ratio as the median over repeats of each repeat's two
    runs (stepped in turn or back to back, so the machine's drift cancels); else (and beside it,
    `of_medians`) the ratio of the two policies' medians."""
    metrics: dict[str, dict[str, MetricError]] = {}
    for p in policies:
        metrics[p] = {}
        for _, key in METRICS:
            m, s = getattr(measured[p], key), getattr(predicted[p], key)
            metrics[p][key] = MetricError(m, s, s / m - 1.0 if m else None)
    ratio = None
    if "limit" in policies and "lookahead" in policies:
        medians = measured["limit"].output_tokens_per_s / measured["lookahead"].output_tokens_per_s
        rm = paired if paired is not None else medians
        rp = predicted["limit"].output_tokens_per_s / predicted["lookahead"].output_tokens_per_s
        ratio = RatioError(rm, rp, 100.0 * (rp - rm), medians, paired is not None)
    return Comparison(metrics, ratio)


def misses(comparisons: Mapping[str, Comparison], rel: float = 0.10, pp: float = 3.0) -> list[str]:
    """The figures outside the acceptance targets, per workload's comparison (tok/s and
    TTFT p50 within `rel`, the ratio within `pp` percentage points)."""
    out = []
    for name, c in comparisons.items():
        for p, by in c.metrics.items():
            for key in ("output_tokens_per_s", "ttft_p50_s"):
                err = by[key].error
                if err is None or abs(err) > rel + 1e-9:
                    out.append(f"{name} {p} {key}: {err:+.1%}" if err is not None else name)
        if c.ratio is not None and abs(c.ratio.error_pp) > pp + 1e-9:
            out.append(f"{name} limit/lookahead: {c.ratio.error_pp:+.1f} pp")
    return out
