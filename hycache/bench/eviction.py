"""Eviction under memory pressure: token hit rate and TTFT p95 over cache memory, `lru`
against `flop-aware`, behind `hycache bench --eviction-curves` and
`benchmarks/bench_eviction.py`.

The geometry is `hycache bench`'s simulated one (bamba-9b on an H200, B=4416, u=64, k=3,
concurrency 64). Each point runs one arm on one workload with the cache cut to a fraction of
the pool the GPU's memory holds (`CostModel.pool_sizes`; both pools with `separate`). The trace
is replayed open loop at the rate `hycache bench` uses (75% of what `lookahead` sustains with
the whole pool), the same rate at every fraction, so that less memory shows as more queueing.

Besides the summaries, every point reports the admission analysis: per SSM page kind
(decode snapshot, junction or hint stop, tail checkpoint, replay boundary, other) how many
pages were keyed, evicted, and evicted without ever having been hit, and per pool entry kind
the same for every evicted block.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from hycache.bench.suite import SimBench, sim_config, sim_cost, timed_workload
from hycache.config import DEFAULT_EVICTION_ALPHA
from hycache.sim.compare import compare_policies
from hycache.sim.costmodel import CostModel
from hycache.sim.workloads import Workload

Progress = Callable[[str], None]

WORKLOADS: tuple[str, ...] = ("family", "multi-turn", "trace")
FRACTIONS: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)
# (policy, eviction) per curve: `limit` both ways, `lookahead` (vLLM's default) for reference
ARMS: tuple[tuple[str, str], ...] = (
    ("limit", "lru"),
    ("limit", "flop-aware"),
    ("lookahead", "lru"),
    ("lookahead", "flop-aware"),
)
GOAL_FRACTION = 0.25
METRICS = (
    "token_hit_rate",
    "ttft_p50_s",
    "ttft_p95_s",
    "output_tokens_per_s",
    "hit_tokens",
    "lost_reuse_tokens",
    "preemptions",
    "ssm_pages_stored",
    "makespan_s",
)


@dataclass(frozen=True)
class EvictionBench:
    sim: SimBench = field(default_factory=SimBench)
    workloads: tuple[str, ...] = WORKLOADS
    fractions: tuple[float, ...] = FRACTIONS
    arms: tuple[tuple[str, str], ...] = ARMS
    alpha: float = DEFAULT_EVICTION_ALPHA
    pool_layout: str = "shared"


def quick(b: EvictionBench) -> EvictionBench:
    """Smoke-test size: few requests, two fractions."""
    s = b.sim
    sim = replace(
        s,
        family=replace(s.family, families=4),
        chat=replace(s.chat, sessions=8, turns=(2, 3)),
        trace_requests=40,
        concurrency=8,
    )
    return replace(b, sim=sim, fractions=(0.25, 1.0))


def _cost(b: EvictionBench) -> CostModel:
    return sim_cost(b.sim, b.pool_layout)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=8)
def _workload(b: EvictionBench, name: str) -> Workload:
    """The workload, the trace with its open-loop arrivals (measured once per process)."""
    return timed_workload(b.sim, name, _cost(b))[0]


@dataclass(frozen=True)
class Point:
    bench: EvictionBench
    workload: str
    fraction: float
    policy: str
    eviction: str


@dataclass(frozen=True)
class ArmResult:
    """One arm on one workload at one fraction of the pool: the simulator's figures
    (`METRICS`, None where it has none), the pools it ran with, its wall time and the admission
    analysis (per SSM page kind, and per evicted block's entry kind)."""

    figures: dict[str, float | None]
    num_blocks: int
    num_state_pages: int | None
    wall_s: float
    page_kinds: dict[str, dict[str, int]]
    evictions: dict[str, dict[str, int]]

    def to_json(self) -> dict[str, Any]:
        """The figures first, then the rest in field order."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "figures"}
        return {**self.figures, **rest}


def run_point(p: Point) -> ArmResult:
    """One arm on one workload at one fraction of the pool."""
    b, s = p.bench, p.bench.sim
    cost = _cost(b)
    w = _workload(b, p.workload)
    cfg = sim_config(s, w, cost)
    pools = cost.pool_sizes(s.knobs.block_size, cfg.cache.max_model_len, layout=cost.pool_layout)
    blocks = max(int(pools.num_blocks * p.fraction), cfg.cache.min_blocks() + 1)
    pages = pools.num_state_pages
    if pages is not None:
        pages = max(int(pages * p.fraction), cfg.cache.min_state_pages() + 1)
    cache = replace(
        cfg.cache.with_knobs(eviction=p.eviction, eviction_alpha=b.alpha),
        num_blocks=blocks,
        num_state_pages=pages,
    )
    cfg = replace(cfg, cache=cache)
    t0 = time.perf_counter()
    res = compare_policies(w, cfg, [p.policy], cost=cost, seed=s.seed)[p.policy]
    figures = {k: res.summary.get(k) for k in METRICS}
    wall = time.perf_counter() - t0
    return ArmResult(figures, blocks, pages, wall, res.page_kinds, res.evictions)


def _run_all(points: Sequence[Point], workers: int, progress: Progress) -> list[ArmResult]:
    if workers <= 1:
        out = []
        for i, p in enumerate(points):
            progress(f"eviction {i + 1}/{len(points)} · {_label(p)}")
            out.append(run_point(p))
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[ArmResult | None] = [None] * len(points)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(run_point, p): i for i, p in enumerate(points)}
        for done, fut in enumerate(as_completed(futures), start=1):
            i = futures[fut]
            results[i] = fut.result()
            progress(f"eviction {done}/{len(points)} · {_label(points[i])}")
    return [r for r in results if r is not None]


def _label(p: Point) -> str:
    return f"{p.workload} · {p.fraction:g} · {p.policy} {p.eviction}"


def arm_name(policy: str, eviction: str) -> str:
    return f"{policy} {eviction}"


@dataclass(frozen=True)
class FractionRow:
    """Every arm of one workload at one fraction of the pool, and `limit`'s `flop-aware / lru`
    ratios there."""

    fraction: float
    arms: dict[str, ArmResult]

    @property
    def ratios(self) -> dict[str, float | None]:
        return ratios(self.arms)

    def to_json(self) -> dict[str, Any]:
        arms = {name: a.to_json() for name, a in self.arms.items()}
        return {"fraction": self.fraction, "arms": arms, "ratios": self.ratios}


@dataclass(frozen=True)
class WorkloadGoal:
    """The goal on one workload: `limit`'s flop-aware / lru hit rate and TTFT p95 ratios,
    whether they win (>= 1.2x hit rate, <= 0.85x TTFT p95) and whether the hit rate is not
    worse (>= 0.98x)."""

    hit_rate_ratio: float | None
    ttft_p95_ratio: float | None
    wins: bool
    not_worse: bool


@dataclass(frozen=True)
class Goal:
    """The issue's goal at `fraction` of the memory, per workload, and whether it is met."""

    fraction: float
    workloads: dict[str, WorkloadGoal]
    met: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EvictionCurves:
    """`eviction_curves`'s result: per workload, a row per fraction (in the order run); the
    goal check; the wall time. `to_json()` is the document `--eviction-curves` writes."""

    bench: EvictionBench
    curves: dict[str, list[FractionRow]]
    goal: Goal
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        b = self.bench
        return {
            "inputs": {
                "sim": asdict(b.sim),
                "workloads": list(b.workloads),
                "fractions": list(b.fractions),
                "arms": [arm_name(*a) for a in b.arms],
                "alpha": b.alpha,
                "pool_layout": b.pool_layout,
            },
            "curves": {n: [r.to_json() for r in rows] for n, rows in self.curves.items()},
            "goal": self.goal.to_json(),
            "wall_s": self.wall_s,
        }


def eviction_curves(
    b: EvictionBench, progress: Progress = lambda _m: None, *, workers: int = 1
) -> EvictionCurves:
    """Every (workload, fraction, arm) point; the ratios `flop-aware / lru` of `limit` per
    point; and the goal check at a quarter of the memory."""
    t0 = time.perf_counter()
    points = [
        Point(b, w, f, pol, ev) for w in b.workloads for f in b.fractions for pol, ev in b.arms
    ]
    # the trace points are the longest: start them first
    order = sorted(range(len(points)), key=lambda i: points[i].workload != "trace")
    results = _run_all([points[i] for i in order], workers, progress)
    by_point = {order[j]: r for j, r in enumerate(results)}
    curves: dict[str, list[FractionRow]] = {}
    for i, p in enumerate(points):
        rows = curves.setdefault(p.workload, [])
        row = next((r for r in rows if r.fraction == p.fraction), None)
        if row is None:
            row = FractionRow(p.fraction, {})
            rows.append(row)
        row.arms[arm_name(p.policy, p.eviction)] = by_point[i]
    return EvictionCurves(b, curves, goal(curves), time.perf_counter() - t0)


def ratios(arms: Mapping[str, ArmResult], policy: str = "limit") -> dict[str, float | None]:
    """`flop-aware / lru` of one policy at one point: token hit rate, TTFT p95 and p50,
    output tokens/s (None where either is missing, or the denominator is 0)."""
    fa, lru = arms.get(arm_name(policy, "flop-aware")), arms.get(arm_name(policy, "lru"))
    out: dict[str, float | None] = {}
    for key in ("token_hit_rate", "ttft_p95_s", "ttft_p50_s", "output_tokens_per_s"):
        a = fa.figures.get(key) if fa is not None else None
        d = lru.figures.get(key) if lru is not None else None
        numbers = isinstance(a, int | float) and isinstance(d, int | float)
        out[key] = a / d if numbers and d else None  # type: ignore[operator]
    return out


def goal(curves: Mapping[str, Sequence[FractionRow]]) -> Goal:
    """The issue's goal at a quarter of the memory: flop-aware >= 1.2x LRU's token hit rate and
    >= 15% lower TTFT p95 on at least two workloads, and never below 0.98x (hit rate) on any."""
    per: dict[str, WorkloadGoal] = {}
    for name, rows in curves.items():
        row = next((r for r in rows if r.fraction == GOAL_FRACTION), None)
        if row is None:
            continue
        r = row.ratios
        hit, p95 = r["token_hit_rate"], r["ttft_p95_s"]
        wins = hit is not None and hit >= 1.2 and p95 is not None and p95 <= 0.85
        per[name] = WorkloadGoal(hit, p95, wins, hit is None or hit >= 0.98)
    met = sum(1 for v in per.values() if v.wins) >= 2 and all(v.not_worse for v in per.values())
    return Goal(GOAL_FRACTION, per, met)


def plot_eviction(path: str, doc: Mapping[str, Any]) -> None:
    """One column per workload: token hit rate (top) and TTFT p95 (bottom) over the fraction
    of the default pool, one line per arm; `doc` is the document `--eviction-curves` writes
    (`EvictionCurves.to_json()`, or the file read back)."""
    from hycache.bench.plots import pyplot

    plt = pyplot()
    names = list(doc["curves"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7), squeeze=False)
    styles = {"lru": "--", "flop-aware": "-"}
    for k, name in enumerate(names):
        rows = sorted(doc["curves"][name], key=lambda r: r["fraction"])
        xs = [r["fraction"] for r in rows]
        for arm in doc["inputs"]["arms"]:
            policy, eviction = arm.split(" ", 1)
            style = styles.get(eviction, "-")
            color = "C0" if policy == "limit" else "C1"
            for ax, key in ((axes[0][k], "token_hit_rate"), (axes[1][k], "ttft_p95_s")):
                ys = [r["arms"][arm][key] for r in rows]
                ax.plot(xs, ys, style, color=color, marker="o", ms=3, label=arm)
        for ax, label in ((axes[0][k], "token hit rate"), (axes[1][k], "TTFT p95 (s)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.set_xlabel("fraction of the default pool")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[1][k].set_yscale("log")
        axes[0][k].set_title(name)
        if k == 0:
            axes[0][k].legend(fontsize=7)
    fig.suptitle(f"eviction under memory pressure (alpha {doc['inputs']['alpha']:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
