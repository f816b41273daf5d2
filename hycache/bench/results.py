"""`hycache bench`'s results, typed: an engine arm's run (`EngineRow`) and the engine part
(`EnginePart`), a simulated table (`SimTable`, its `SimInputs`), a curve point (`CurvePoint`)
and the curves (`Curves`), and the whole run (`BenchResult`).

Each has `to_json()`, the document `hycache bench --json` writes (its shape is the one every
earlier release wrote: `{"engine": {...}, "simulated": {...}, "curves": {...}, ...}`, every
table `{"inputs", "policies", "headline"}`); nothing here runs anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from hycache.sim.compare import BASELINE, HEADLINE, caching_overhead, headline
from hycache.sim.workloads import OfferedLoad

Json = dict[str, Any]  # a JSON object as `json.dumps` takes it

SPREAD_KEYS = ("output_tokens_per_s", "ttft_p50_s", "output_tokens_per_cpu_s", "ttft_cpu_p50_s")
"""The engine figures whose spread over the repeats is reported (`spread`, and per repeat
against the reference arm, `vs_reference`: whether the repeats rank the arms)."""

PER_REPEAT_KEYS = ("ttft_p50_s", "output_tokens_per_cpu_s", "ttft_cpu_p50_s", "engine_cpu_s")
"""What the engine part reports per repeat besides output tokens/s (`per_repeat`): the arms'
runs of one repeat ran back to back, so their ratios are the side-by-side figures."""


@dataclass(frozen=True)
class EngineRow:
    """One arm's closed-loop run on the CPU engine (or, `median_row`, the medians of its
    repeats). Seconds are wall-clock unless named `cpu` (the engine thread's CPU clock)."""

    output_tokens_per_s: float
    request_throughput: float
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float
    itl_p95_s: float
    prefill_tokens_computed: int
    hit_tokens: int
    store_hit_tokens: int
    token_hit_rate: float
    lost_reuse_tokens: int
    junctions_observed: int
    # against the reference arm, per request with the same hit at a junction: the most
    # prefill steps more (None until the part compares the arms)
    extra_prefill_steps_max: int | None
    peak_blocks_used: int
    preemptions: int
    wall_s: float
    engine_cpu_s: float
    engine_steps: int
    output_tokens_per_cpu_s: float
    ttft_cpu_p50_s: float
    ttft_cpu_p95_s: float
    resume_points: tuple[int, ...]
    # per request: (hit tokens, junction, checkpoint splits); compared across arms, not written
    steps: Mapping[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)

    def figure(self, key: str) -> float:
        """The figure named `key` (one of `SPREAD_KEYS`, `PER_REPEAT_KEYS`)."""
        return float(getattr(self, key))

    def to_json(self) -> Json:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        return out | {"resume_points": list(self.resume_points)}


R = TypeVar("R")


def median_row(rows: Sequence[R]) -> R:
    """Per numeric field of the dataclass rows, the median over `rows` (all ints: the lower
    median, still an int); every other value from the first row (in the engine part the
    scheduling, hence hits and steps, is the same in every repeat: only the clock differs)."""
    first, changes = rows[0], {}
    for f in fields(first):  # type: ignore[arg-type]
        values = [getattr(r, f.name) for r in rows]
        if isinstance(values[0], bool) or not isinstance(values[0], int | float):
            continue
        if all(isinstance(v, int) for v in values):
            changes[f.name] = statistics.median_low(values)
        else:
            changes[f.name] = statistics.median(values)
    return replace(first, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class EnginePart:
    """The engine part: per arm, every repeat's run (`runs`, in repeat order) and their
    medians (`policies`); the spreads, each arm against `reference` per repeat, the inputs
    (the bench's and the repeats' `orders`), the part's wall time, and the calibrated
    profile's prediction when one was asked for (`predicted`, as written)."""

    inputs: Json
    policies: dict[str, EngineRow]
    runs: dict[str, list[EngineRow]]
    reference: str
    spread: dict[str, dict[str, dict[str, float]]]
    vs_reference: dict[str, dict[str, Json | None]]
    wall_s: float | None = None
    predicted: Json | None = None

    def policies_json(self) -> dict[str, Json]:
        return {p: row.to_json() for p, row in self.policies.items()}

    def caching_overhead(self) -> Json | None:
        """`limit / no-caching`, when both arms ran (`hycache.sim.compare.caching_overhead`)."""
        return caching_overhead(self.policies_json())

    def to_json(self) -> Json:
        pol = self.policies_json()
        head = headline(pol)
        if head is not None and HEADLINE in self.vs_reference:
            head = {**head, "repeats": self.vs_reference[HEADLINE]}
        wall = {} if self.wall_s is None else {"wall_s": self.wall_s}
        out: Json = {
            "inputs": self.inputs | wall,
            "policies": pol,
            "runs": {p: [r.output_tokens_per_s for r in rs] for p, rs in self.runs.items()},
            "per_repeat": {
                p: {k: [r.figure(k) for r in rs] for k in PER_REPEAT_KEYS}
                for p, rs in self.runs.items()
            },
            "spread": self.spread,
            "vs_reference": {"reference": self.reference, "arms": self.vs_reference},
            "headline": head,
        }
        if (o := caching_overhead(pol)) is not None:
            out["caching_overhead"] = o
        return out | ({"predicted": self.predicted} if self.predicted is not None else {})


@dataclass(frozen=True)
class SimInputs:
    """What one simulated table ran: the geometry, the workload (its `shape`, as built) and,
    for the trace, the open-loop load it was replayed at (`offered`)."""

    model: str
    gpu: str
    block_size: int
    prefix_match_unit: int
    num_speculative_tokens: int
    acceptance_rate: float
    concurrency: int | None  # the workload's (None: open loop)
    max_num_seqs: int
    workload: str
    num_requests: int
    seed: int
    shape: Json
    offered: OfferedLoad | None = None

    def to_json(self) -> Json:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "offered"}
        if self.offered is not None:
            out |= {"offered_load": self.offered.as_dict(), "open_loop": True}
        return out


@dataclass(frozen=True)
class SimTable:
    """One simulated table: its inputs and every arm's summary (`hycache.sim.compare.
    policies_json`, the simulator's own figures)."""

    inputs: SimInputs
    policies: dict[str, Json]

    def caching_overhead(self) -> Json | None:
        return caching_overhead(self.policies)

    def to_json(self) -> Json:
        out: Json = {
            "inputs": self.inputs.to_json(),
            "policies": self.policies,
            "headline": headline(self.policies),
        }
        if (o := self.caching_overhead()) is not None:
            out["caching_overhead"] = o
        return out


@dataclass(frozen=True)
class CurvePoint:
    """One point of a curve: `x` (output tokens or concurrency), its requests, and the
    baseline's and the headline arm's output tokens/s and TTFT p50."""

    x: int
    num_requests: int
    baseline_output_tokens_per_s: float
    headline_output_tokens_per_s: float
    baseline_ttft_p50_s: float
    headline_ttft_p50_s: float

    @property
    def ratio(self) -> float:
        """`limit / lookahead` output tokens/s."""
        return self.headline_output_tokens_per_s / self.baseline_output_tokens_per_s

    def to_json(self) -> Json:
        return {
            "x": self.x,
            "num_requests": self.num_requests,
            f"{BASELINE}_output_tokens_per_s": self.baseline_output_tokens_per_s,
            f"{HEADLINE}_output_tokens_per_s": self.headline_output_tokens_per_s,
            "ratio": self.ratio,
            f"{BASELINE}_ttft_p50_s": self.baseline_ttft_p50_s,
            f"{HEADLINE}_ttft_p50_s": self.headline_ttft_p50_s,
        }


CURVE_AXES = ("output_tokens", "concurrency")


@dataclass(frozen=True)
class Curves:
    """`limit / lookahead` over each axis (`CURVE_AXES`), per workload, point by point; and
    what the points share (`inputs`: requests per point, the fixed concurrency and output
    lengths)."""

    points: dict[str, dict[str, list[CurvePoint]]]  # axis -> workload -> points, in x order
    inputs: Json

    def to_json(self) -> Json:
        out: Json = {
            axis: {name: [p.to_json() for p in pts] for name, pts in self.points[axis].items()}
            for axis in CURVE_AXES
        }
        return out | {"inputs": self.inputs}


@dataclass(frozen=True)
class BenchResult:
    """A `hycache bench` run: the engine part and the simulated tables (None: skipped), the
    curves (None: skipped), and the wall times."""

    engine: EnginePart | None
    simulated: dict[str, SimTable] | None
    curves: Curves | None
    simulated_wall_s: float | None
    wall_s: float

    def to_json(self) -> Json:
        out: Json = {}
        if self.engine is not None:
            out["engine"] = self.engine.to_json()
        if self.simulated is not None:
            out["simulated"] = {name: t.to_json() for name, t in self.simulated.items()}
            if self.curves is not None:
                out["curves"] = self.curves.to_json()
            out["simulated_wall_s"] = self.simulated_wall_s
        return out | {"wall_s": self.wall_s}
