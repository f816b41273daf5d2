"""Fitting the cost model's free parameters to measured step times (torch-free).

This module owns the arithmetic of `hycache calibrate` once the timings exist: what one
measured step shape is (:class:`Sample`), the cost model's free parameters (:class:`Fit`), the
least-squares fit (:func:`fit`), the residuals per shape (:func:`residuals`) and the device
profile document (:func:`profile_dict`, the GPU preset schema plus the calibration fields).
The engine side (running the real engine over a grid of shapes) is `hycache.bench.calibrate`.

The model fitted is `CostModel.step_time` itself: per phase, a roofline
``max(F / (peak * compute_eff), B / (bandwidth * bw_eff))``, plus the fixed overheads. For a
given pair of efficiencies the overheads enter linearly, so they are solved exactly
(non-negative least squares); the efficiencies are found by a deterministic log-grid search,
refined around the best point. The objective is the sum of squared *relative* errors, so a
2 ms decode step counts as much as a 2 s prefill chunk.

The free parameters are the terms of `hycache.sim.terms.TERMS` marked `free` (each a
`CostModel` argument and a `GpuSpec` field; their meanings and fallbacks are declared there,
and why the CPU engine needs each is in docs/cost-model.md). The copy and state-copy
efficiencies are fitted first, each on its own probes (block copies, state writes timed
alone), then held fixed in the step fit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from hycache.sim.costmodel import CostModel, StepWork
from hycache.sim.model_spec import ModelSpec
from hycache.sim.presets import PRESET_FIELDS, GpuSpec
from hycache.sim.terms import FREE_PARAMETERS, TERMS, CostTerms

__all__ = [
    "FREE_PARAMETERS",
    "Fit",
    "Profile",
    "Residual",
    "Sample",
    "fit",
    "predict",
    "profile_dict",
    "residuals",
]

SAMPLE_KINDS = ("step", "copies", "state_writes")


@dataclass(frozen=True)
class Sample:
    """One measured step shape: the work (as the simulator describes it), the drafter
    setting it ran with, and the median of its repeats.

    ``"step"`` samples fit the step model; ``"copies"`` and ``"state_writes"`` samples fit
    the copy and state-copy efficiencies (`fit_copies`), which the step fit then holds fixed.

    ``kind`` is ``"step"`` for a whole engine step (every phase and overhead of
    `CostModel.step_time`), ``"copies"`` for ``work.num_block_copies`` block copies timed
    alone (the `block_copies` phase: no step or request overhead) or ``"state_writes"`` for
    as many SSM state copies timed alone (each reads and writes one state,
    `ModelSpec.ssm_state_bytes`; inside a step the cost model prices the target phase's
    state traffic at the same efficiency).
    """

    label: str
    work: StepWork
    num_speculative_tokens: int  # 0: no drafter
    wall_s: float  # median over `repeats`
    cpu_s: float = 0.0  # median process CPU time over the same repeats
    repeats: int = 1
    spread: float = 0.0  # (max - min) / median of the repeats' wall times
    load: float = 0.0  # 1-minute load average while it ran
    kind: str = "step"
    # more whole steps summed into this sample (`total`): `wall_s` and `cpu_s` are then the
    # time of `work` and all of these together (the steps of one kind in an engine run)
    more: tuple[StepWork, ...] = ()

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"{self.label}: wall_s must be > 0, got {self.wall_s}")
        if self.cpu_s < 0:
            raise ValueError(f"{self.label}: cpu_s must be >= 0, got {self.cpu_s}")
        if self.kind not in SAMPLE_KINDS:
            raise ValueError(f"{self.label}: kind must be one of {SAMPLE_KINDS}, got {self.kind!r}")
        if self.more and self.kind != "step":
            raise ValueError(f"{self.label}: only whole steps are summed, not {self.kind!r}")

    @property
    def works(self) -> tuple[StepWork, ...]:
        """Every step this sample times: `work`, then `more`."""
        return (self.work, *self.more)

    @classmethod
    def total(
        cls, label: str, steps: Sequence[tuple[StepWork, float]], k: int, repeats: int = 1
    ) -> Sample:
        """The steps `(work, seconds)` as one sample: their summed time on both clocks."""
        if not steps:
            raise ValueError(f"{label}: no steps")
        seconds = sum(t for _, t in steps)
        works = [w for w, _ in steps]
        return cls(label, works[0], k, seconds, seconds, repeats=repeats, more=tuple(works[1:]))

    def measured(self, clock: str) -> float:
        """The median on `clock`: ``"wall"``, or ``"cpu"`` (process CPU time: what a quiet
        machine's wall clock shows for a one-thread engine sharing its cores with others)."""
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        return self.cpu_s if clock == "cpu" and self.cpu_s > 0 else self.wall_s


CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Fit(CostTerms):
    """Fitted values of :data:`FREE_PARAMETERS`, and the form of the model they belong to
    (`phase_overlap`: a roofline, or compute + memory; `padded_decode_attention`: the
    engine's attention layout). A term not given takes its `Term.unfitted` value (no
    overhead, one pass over each K/V byte), or stays unset and falls back; the two
    efficiencies must be given."""

    def __post_init__(self) -> None:
        for t in TERMS:
            if getattr(self, t.name) is not None:
                continue
            if t.name in ("compute_efficiency", "bandwidth_efficiency"):
                raise TypeError(f"Fit: {t.name} is required")
            object.__setattr__(self, t.name, t.unfitted)

    def as_arguments(self) -> dict[str, Any]:
        """Every term by name: each is a `CostModel` argument and a `GpuSpec` field."""
        return self.terms()

    def cost_model(
        self, model: ModelSpec, gpu: GpuSpec, k: int, *, block_size: int | None = None
    ) -> CostModel:
        """The cost model these values describe (separate pools: the engine's layout)."""
        return CostModel(
            model,
            gpu,
            **self.as_arguments(),
            speculative=k > 0,
            num_speculative_tokens=k,
            block_size=block_size,
            pool_layout="separate",
        )


@dataclass(frozen=True)
class _Features:
    """A sample's terms at peak rates (efficiencies 1), per phase: compute, memory other
    than attention K/V, the K/V of prefill chunks, of decoding (verifying) requests' own
    context and of their shared context (warm: another request read it first); its
    overhead counts; the time of its copies at the copy efficiencies already fitted
    (`fixed_s`: not a free term of the step fit); and the time one decode state rewrite per
    decoded token adds at the fitted state-copy efficiency (`rewrite_s`, 0 when there is
    none)."""

    compute_s: tuple[float, ...]
    memory_s: tuple[float, ...]
    kv_s: tuple[float, ...]
    decode_kv_s: tuple[float, ...]
    warm_kv_s: tuple[float, ...]
    counts: tuple[float, float, float]  # steps, drafter passes, requests
    fixed_s: tuple[float, ...]
    rewrite_s: float = 0.0


@dataclass(frozen=True)
class CopyFit:
    """The copy efficiencies `fit_copies` found (None: no probes of that kind; the cost
    model then prices those bytes at `bandwidth_efficiency`)."""

    copy_efficiency: float | None = None
    state_copy_efficiency: float | None = None


def _phase_terms(s: Sample, cost: CostModel) -> list[tuple[float, float]]:
    phases = [p for p in cost.phases(s.work) if p.name != "step_overhead"]
    if s.kind == "copies":
        phases = [p for p in phases if p.name == "block_copies"]
    return [(p.compute_s, p.memory_s) for p in phases]


def _state_write_s(s: Sample, model: ModelSpec, gpu: GpuSpec) -> float:
    """A ``state_writes`` sample's bytes (each copy reads and writes one state) at peak."""
    return 2.0 * s.work.num_block_copies * model.ssm_state_bytes / gpu.hbm_bandwidth


def _features(
    s: Sample,
    model: ModelSpec,
    gpu: GpuSpec,
    block_size: int | None,
    padded: bool = False,
    copies: CopyFit = CopyFit(),
) -> _Features:
    if s.more:  # summed steps: each term added up over them (one phase: the linear form's)
        each = [
            _features(replace(s, work=w, more=()), model, gpu, block_size, padded, copies)
            for w in s.works
        ]

        def total(name: str) -> tuple[float]:
            return (sum(sum(getattr(f, name)) for f in each),)

        counts = tuple(sum(f.counts[i] for f in each) for i in range(3))
        return _Features(
            *(total(n) for n in ("compute_s", "memory_s", "kv_s", "decode_kv_s", "warm_kv_s")),
            counts, total("fixed_s"), sum(f.rewrite_s for f in each),  # type: ignore[arg-type]
        )  # fmt: skip
    k = s.num_speculative_tokens
    unit = Fit(
        1.0, 1.0, padded_decode_attention=padded, decode_kv_bytes_factor=1.0,
        warm_kv_bytes_factor=1.0,
    )  # fmt: skip

    def memory(**change: float) -> list[float]:
        cost = replace(unit, **change).cost_model(model, gpu, k, block_size=block_size)
        return [m for _, m in _phase_terms(s, cost)]

    one = _phase_terms(s, unit.cost_model(model, gpu, k, block_size=block_size))
    base = [m for _, m in one]
    # each term's share of the memory time at peak: what doubling its price adds
    kv, dkv, wkv, copy, state = (
        [m2 - m1 for m1, m2 in zip(base, memory(**{name: v}), strict=True)]
        for name, v in (("kv_bytes_factor", 2.0), ("decode_kv_bytes_factor", 2.0),
                        ("warm_kv_bytes_factor", 2.0), ("copy_efficiency", 0.5),
                        ("state_copy_efficiency", 0.5))
    )  # fmt: skip
    rewrite = sum(memory(decode_state_rewrites=1.0)) - sum(base)  # at peak bandwidth
    rewrite_s = rewrite / copies.state_copy_efficiency if copies.state_copy_efficiency else 0.0
    other = [m - sum(t) for m, *t in zip(base, kv, dkv, wkv, copy, state, strict=True)]
    fixed = [0.0] * len(one)
    for term, eff in ((copy, copies.copy_efficiency), (state, copies.state_copy_efficiency)):
        for i, t in enumerate(term):
            if eff is None:  # priced at the fitted bandwidth_efficiency
                other[i] += t
            else:
                fixed[i] += t / eff
    if s.kind == "copies":
        counts = (0.0, 0.0, 0.0)
    else:
        drafts = sum(1 for p in Fit(1.0, 1.0).cost_model(model, gpu, k).phases(s.work)
                     if p.name.startswith("draft_"))  # fmt: skip
        counts = (1.0, float(drafts), float(len(s.work.seqs)))
    return _Features(
        tuple(c for c, _ in one), tuple(other), tuple(kv), tuple(dkv), tuple(wkv), counts,
        tuple(fixed), rewrite_s,
    )  # fmt: skip


def fit_copies(
    samples: Sequence[Sample],
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    block_size: int | None = None,
    clock: str = "wall",
) -> CopyFit:
    """Each copy efficiency from its own probes: the ``copies`` samples' block copies and
    the ``state_writes`` samples' state copies, timed alone (bytes at peak / seconds,
    least squares on the relative error; at most 1)."""

    def one(kind: str, seconds_at_peak: Any) -> float | None:
        rows = [(seconds_at_peak(s), s.measured(clock)) for s in samples if s.kind == kind]
        rows = [(a, y) for a, y in rows if a > 0]
        if not rows:
            return None
        r = np.array([a / y for a, y in rows])  # time = a / eff: relative error 1 - r / eff
        inv = float(np.sum(r) / np.sum(r * r))
        return min(1.0, 1.0 / inv)

    def block_copies_s(s: Sample) -> float:
        cost = Fit(1.0, 1.0).cost_model(model, gpu, s.num_speculative_tokens, block_size=block_size)
        return sum(p.memory_s for p in cost.phases(s.work) if p.name == "block_copies")

    return CopyFit(
        copy_efficiency=one("copies", block_copies_s),
        state_copy_efficiency=one("state_writes", lambda s: _state_write_s(s, model, gpu)),
    )


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0, exactly: every subset of free columns (a handful here)."""
    n = a.shape[1]
    best, best_x = float("inf"), np.zeros(n)
    for mask in itertools.product((True, False), repeat=n):
        cols = [i for i in range(n) if mask[i]]
        x = np.zeros(n)
        if cols:
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (sol < 0).any():
                continue
            x[cols] = sol
        err = float(np.sum((a @ x - b) ** 2))
        if err < best - 1e-15:
            best, best_x = err, x
    return best_x


def _linear_fit(
    feats: Sequence[_Features], y: np.ndarray, free: Sequence[bool]
) -> tuple[Fit, float]:
    """Compute + memory (no overlap) is linear in 1/ce, 1/be, each K/V factor / be and the
    overheads: one exact non-negative least squares on the relative errors. Unknowns are
    kept at their physical bounds (1/ce >= 1, 1/be >= 1, K/V factors >= 1) by solving for
    the excess over the bound. `free`: the drafter pass, per-request, K/V, decode K/V,
    decode state rewrite and warm K/V terms (a warm factor not free is the decode factor, a
    decode factor not free the K/V factor)."""
    comp = np.array([sum(f.compute_s) for f in feats])
    mem = np.array([sum(f.memory_s) for f in feats])
    kv = np.array([sum(f.kv_s) for f in feats])
    dkv = np.array([sum(f.decode_kv_s) for f in feats])
    wkv = np.array([sum(f.warm_kv_s) for f in feats])
    counts = np.array([f.counts for f in feats])
    fixed = np.array([sum(f.fixed_s) for f in feats])
    rewrite = np.array([f.rewrite_s for f in feats])
    decode_free, warm_free = free[4], free[4] and free[6]
    if not warm_free:
        dkv, wkv = dkv + wkv, np.zeros_like(wkv)
    if not decode_free:
        kv, dkv = kv + dkv, np.zeros_like(dkv)
    # time = comp*(1 + a) + mem*(1 + b) + kv*(1 + b + c) + dkv*(1 + b + d) + wkv*(1 + b + e)
    #        + counts @ theta + rewrite * r + fixed
    base = comp + mem + kv + dkv + wkv + fixed
    cols = [comp, mem + kv + dkv + wkv, kv, dkv, wkv, counts[:, 0], counts[:, 1], counts[:, 2],
            rewrite]  # fmt: skip
    use = [True, True, free[3], decode_free, warm_free and wkv.any(), True, free[1], free[2],
           free[5] and rewrite.any()]  # fmt: skip
    a = np.stack([c if u else np.zeros_like(c) for c, u in zip(cols, use, strict=True)], 1)
    x = _nnls(a / y[:, None], (y - base) / y)
    inv_ce, inv_be = 1.0 + x[0], 1.0 + x[1]
    pred = base + a @ x
    values = Fit(
        compute_efficiency=float(1.0 / inv_ce),
        bandwidth_efficiency=float(1.0 / inv_be),
        step_overhead_s=float(x[5]),
        draft_pass_overhead_s=float(x[6]),
        seq_overhead_s=float(x[7]),
        kv_bytes_factor=float((inv_be + x[2]) / inv_be),
        phase_overlap=False,
        decode_kv_bytes_factor=float((inv_be + x[3]) / inv_be) if decode_free else None,
        warm_kv_bytes_factor=float((inv_be + x[4]) / inv_be) if use[4] else None,
        decode_state_rewrites=float(x[8]) if use[8] else None,
    )
    return values, float(np.sum(((pred - y) / y) ** 2))


def _roofline(f: _Features, ce: float, be: float, kvf: float) -> float:
    """The roofline's time at (ce, be, kvf): one K/V factor for every request."""
    return sum(
        max(c / ce, (m + kvf * (kv + dkv + wkv)) / be + fx)
        for c, m, kv, dkv, wkv, fx in zip(
            f.compute_s, f.memory_s, f.kv_s, f.decode_kv_s, f.warm_kv_s, f.fixed_s, strict=True
        )
    )


def _solve(
    feats: Sequence[_Features], y: np.ndarray, ce: float, be: float, kvf: float, free: np.ndarray
) -> tuple[np.ndarray, float]:
    """Best overheads for (ce, be, kvf) under the roofline, and the squared relative error."""
    roof = np.array([_roofline(f, ce, be, kvf) for f in feats])
    counts = np.array([f.counts for f in feats]) * free[None, :]
    theta = _nnls(counts / y[:, None], (y - roof) / y)
    pred = roof + counts @ theta
    return theta, float(np.sum(((pred - y) / y) ** 2))


def _roofline_fit(
    feats: Sequence[_Features], y: np.ndarray, free: Sequence[bool]
) -> tuple[Fit, float]:
    """The roofline (max of compute and memory per phase): the overheads are linear for
    given efficiencies, so a log grid over (ce, be) is searched, then refined. Decode K/V
    shares the K/V factor here (the form of a GPU's paged kernels)."""
    counts_free = np.array(free[:3], dtype=float)
    kvfs = (1.0, 2.0, 4.0, 8.0) if free[3] else (1.0,)

    def score(ce: float, be: float, kvf: float) -> float:
        return _solve(feats, y, ce, be, kvf, counts_free)[1]

    grid = np.geomspace(1e-3, 1.0, 16)
    best = min(
        ((score(c, b, v), c, b, v) for c in grid for b in grid for v in kvfs), key=lambda t: t[0]
    )
    step = float(grid[1] / grid[0])
    for _ in range(6):
        step = math.sqrt(step)
        _, c0, b0, v0 = best
        pts = [
            (min(c0 * step**i, 1.0), min(b0 * step**j, 1.0), v0)
            for i in range(-2, 3)
            for j in range(-2, 3)
        ]
        best = min([best, *((score(*p), *p) for p in pts)], key=lambda t: t[0])
    err, ce, be, kvf = best
    theta, _ = _solve(feats, y, ce, be, kvf, counts_free)
    values = Fit(float(ce), float(be), *(float(t) for t in theta), kv_bytes_factor=kvf)
    return values, float(err)


def fit(
    samples: Sequence[Sample],
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    block_size: int | None = None,
    overlap: bool = False,
    seq_overhead: bool = True,
    kv_factor: bool = True,
    clock: str = "wall",
    padded: bool = False,
    copies: bool = True,
    decode_kv: bool = True,
    state_rewrites: bool = True,
    warm_kv: bool = True,
) -> Fit:
    """The free parameters that minimise the squared relative error over `samples`.

    `overlap`: fit the GPU roofline (each phase the larger of compute and memory) instead of
    compute + memory. `seq_overhead=False` pins `seq_overhead_s` at 0 and `kv_factor=False`
    the K/V factor at 1 (a GPU's paged kernels read each cached byte once). `padded`: the
    engine pads decode attention to the step's longest context (`CostModel`'s
    `padded_decode_attention`; a fact about the engine, not a fitted number).
    `copies=False` prices copies and state traffic at `bandwidth_efficiency` (no copy
    efficiencies fitted); `decode_kv=False` charges decoding requests' K/V at the K/V factor
    (no `decode_kv_bytes_factor` of their own; always so for the roofline form);
    `state_rewrites=False` fits no `decode_state_rewrites` (it needs the state-copy
    efficiency, so it is fitted only with the copy probes, and never for the roofline);
    `warm_kv=False` charges a decoding request's shared context at its decode K/V factor."""
    opts = (
        overlap, seq_overhead, kv_factor, clock, padded, copies, decode_kv, state_rewrites,
        warm_kv,
    )  # fmt: skip
    return _fit(samples, model, gpu, block_size, *opts)[0]


def _fit(
    samples: Sequence[Sample],
    model: ModelSpec,
    gpu: GpuSpec,
    block_size: int | None,
    overlap: bool,
    seq_overhead: bool,
    kv_factor: bool,
    clock: str = "wall",
    padded: bool = False,
    copies: bool = True,
    decode_kv: bool = True,
    state_rewrites: bool = True,
    warm_kv: bool = True,
) -> tuple[Fit, float]:
    if overlap and any(s.more for s in samples):
        raise ValueError("fit: summed steps fit the linear form only (a roofline is per step)")
    cf = fit_copies(samples, model, gpu, block_size=block_size, clock=clock) if copies else None
    samples = [s for s in samples if s.kind == "step"]
    if not samples:
        raise ValueError("fit: no whole-step samples")
    feats = [_features(s, model, gpu, block_size, padded, cf or CopyFit()) for s in samples]
    y = np.array([s.measured(clock) for s in samples])
    drafter = any(s.num_speculative_tokens for s in samples)
    free = [
        True, drafter, seq_overhead, kv_factor, decode_kv and not overlap,
        state_rewrites and not overlap, warm_kv and not overlap,
    ]  # fmt: skip
    values, err = (_roofline_fit if overlap else _linear_fit)(feats, y, free)
    values = replace(values, padded_decode_attention=padded)
    if cf is not None:
        values = replace(
            values,
            copy_efficiency=cf.copy_efficiency,
            state_copy_efficiency=cf.state_copy_efficiency,
        )
    elif values.decode_state_rewrites is not None:  # pragma: no cover - needs the copy fit
        raise AssertionError("decode_state_rewrites fitted without a state-copy efficiency")
    return values, math.sqrt(err / len(samples))


ABLATIONS: dict[str, dict[str, bool]] = {
    "fitted form": {},
    "without seq_overhead_s": {"seq_overhead": False},
    "without kv_bytes_factor": {"kv_factor": False},
    "without decode_kv_bytes_factor": {"decode_kv": False},
    "without warm_kv_bytes_factor": {"warm_kv": False},
    "without decode_state_rewrites": {"state_rewrites": False},
    "roofline (max), all terms": {"overlap": True},
    "roofline (max), GPU terms only": {"overlap": True, "seq_overhead": False, "kv_factor": False},
    "without copy efficiencies": {"copies": False},
}


def ablation(
    samples: Sequence[Sample],
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    block_size: int | None = None,
    clock: str = "wall",
    padded: bool = False,
) -> dict[str, float]:
    """The fit's relative rms error with each added term taken away (why each is there)."""
    base = {
        "overlap": False, "seq_overhead": True, "kv_factor": True, "clock": clock,
        "padded": padded, "copies": True, "decode_kv": True, "state_rewrites": True,
        "warm_kv": True,
    }  # fmt: skip
    out = {}
    for name, change in ABLATIONS.items():
        opts = {**base, **change}
        out[name] = _fit(samples, model, gpu, block_size, **opts)[1]
    return out


def predict(
    s: Sample, values: Fit, model: ModelSpec, gpu: GpuSpec, block_size: int | None = None
) -> float:
    """The step time `values` predict for `s`: `CostModel.step_time`, or for a ``copies``
    sample its `block_copies` phase alone, or for ``state_writes`` its state copies."""
    cost = values.cost_model(model, gpu, s.num_speculative_tokens, block_size=block_size)
    if s.kind == "state_writes":
        return _state_write_s(s, model, gpu) / cost.state_copy_efficiency
    if s.kind == "copies":
        return sum(p.time_s for p in cost.phases(s.work) if p.name == "block_copies")
    return sum(cost.step_time(w) for w in s.works)


@dataclass(frozen=True)
class Residual:
    """One shape priced by a fit: measured on the fit's clock (wall and CPU beside, the
    repeats, their spread, the load average), predicted, and the relative error; a row of a
    profile's `residuals` and `held_out`."""

    shape: str
    kind: str
    num_speculative_tokens: int
    steps: int
    requests: int
    tokens: int
    block_copies: int
    measured_s: float
    wall_s: float
    cpu_s: float
    repeats: int
    spread: float
    load: float
    predicted_s: float
    error: float


def residuals(
    samples: Sequence[Sample],
    values: Fit,
    model: ModelSpec,
    gpu: GpuSpec,
    block_size: int | None = None,
    clock: str = "wall",
) -> list[Residual]:
    """Per shape: measured (on `clock`; wall and CPU beside), predicted, relative error."""
    out = []
    for s in samples:
        pred = predict(s, values, model, gpu, block_size)
        measured = s.measured(clock)
        works = s.works
        counts = (len(works), sum(len(w.seqs) for w in works), sum(w.num_tokens for w in works),
                  sum(w.num_block_copies for w in works))  # fmt: skip
        out.append(Residual(s.label, s.kind, s.num_speculative_tokens, *counts, measured,
                            s.wall_s, s.cpu_s, s.repeats, s.spread, s.load, pred,
                            pred / measured - 1.0))  # fmt: skip
    return out


def max_abs_error(rows: Sequence[Residual], kind: str = "step") -> float:
    """The largest |error| over the rows of `kind` (whole steps: what the fit is for)."""
    return max((abs(r.error) for r in rows if r.kind == kind), default=0.0)


def rms_error(rows: Sequence[Residual], kind: str = "step") -> float:
    errs = [r.error for r in rows if r.kind == kind]
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


@dataclass(frozen=True)
class Conditions:
    """Where the timings were taken (recorded in the profile, never used by the fit)."""

    device: str
    threads: int
    dtype: str
    torch_version: str
    load_before: float
    load_after: float
    cpu_over_wall: float  # process CPU time / wall time over every timed step
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    """A device profile: the measured device (`gpu`: its peaks), the fitted `values`, the
    model preset they were fitted on, the fitted shapes' `residuals`, the `held_out` shapes
    (not fitted), where it was measured, the command, and the fit's rms error without each
    added term (`ablation`). :meth:`to_json` is the profile file: the GPU preset fields with
    the fitted terms, then `model`, `residuals`, `held_out` and `calibration`."""

    gpu: GpuSpec
    values: Fit
    model: str
    residuals: tuple[Residual, ...]
    held_out: tuple[Residual, ...]
    conditions: Conditions
    command: str
    ablation: Mapping[str, float] = field(default_factory=dict)

    @property
    def spec(self) -> GpuSpec:
        """The device with the fitted terms: what `load_gpu` reads back from the file."""
        return replace(self.gpu, **self.values.as_arguments(), fitted_on=self.model)

    @property
    def clock(self) -> str:
        return str(self.conditions.extra.get("clock", "wall"))

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        doc = {k: getattr(spec, k) for k in PRESET_FIELDS if getattr(spec, k) not in (None, "")}
        doc["model"] = self.model
        doc["residuals"] = [asdict(r) for r in self.residuals]
        doc["held_out"] = [asdict(r) for r in self.held_out]
        doc["calibration"] = {
            "command": self.command,
            "max_abs_error_fitted": max_abs_error(self.residuals),
            "max_abs_error_held_out": max_abs_error(self.held_out),
            "rms_error_fitted": rms_error(self.residuals),
            "rms_error_held_out": rms_error(self.held_out),
            "ablation_rms_error": dict(self.ablation),
            **asdict(self.conditions),
        }
        return doc


def profile_dict(
    gpu: GpuSpec,
    values: Fit,
    *,
    model: str,
    fitted: Sequence[Residual],
    held_out: Sequence[Residual],
    conditions: Conditions,
    command: str,
    ablation: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The profile file of these (:meth:`Profile.to_json`)."""
    profile = Profile(gpu, values, model, tuple(fitted), tuple(held_out), conditions, command,
                      dict(ablation or {}))  # fmt: skip
    return profile.to_json()
