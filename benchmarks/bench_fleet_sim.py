"""Simulated fleet curves: token hit rate, TTFT and the router's predicted hit over 1, 2, 4, 8,
16 and 64 instances, for the three routings and the pooled ideal (DESIGN §9).

    .venv/bin/python benchmarks/bench_fleet_sim.py [--json out/fleet_sim.json]
        [--plot docs/img/fleet-curves.png] [--instances 1,2,4,8,16,64]
        [--workloads family,multi-turn,system-prompt,trace] [--jobs N] [--quick] [--markdown]

The geometry is `hycache bench`'s simulated one (bamba-9b on an H200, B=4416, u=64, k=3,
policy `limit`, each instance with the pool an H200 holds). The same traffic (closed loop, 64
requests in flight over the whole fleet, as a client that does not know how many engines serve
it) is spread over more instances by

    round-robin      instance 0, 1, ..., N-1, 0, ...
    prefix-aware     the deepest joint (attention + SSM state) hit: hycache's exact router
    attention-only   the deepest attention-block match, states unseen: Dynamo's and llm-d's score
    pooled-ideal     one engine with N times the pool (the bar a router can reach)

Scaled to run in about 7 minutes of one core (see `SCALED`): the family workload has 16
families (about 130 requests) instead of 32, multi-turn 32 sessions instead of 64, the system
prompt 128 requests instead of 256, and the Mooncake-like trace 400 requests, replayed closed
loop. At one instance every routing is the one engine (tests/sim/test_fleet_routing.py), so
that point is run once.

`--predict` gives the simulator's prediction for a small real fleet instead (hycache workers
on the `tiny` model behind a router): per arm the hit tokens and hit rate predicted, the hit the
router expected, and the pooled ideal; timings only mean something with a calibrated
`--gpu-config` (`hycache calibrate`). `--predict --like-bench-fleet` is
`benchmarks/bench_fleet.py`'s run, from the one home of its setting
(`hycache.fleet.bench_setting`: 4 workers, B=64, u=16, k=2, 512 blocks each, concurrency 4,
long shared prefixes, short suffixes and outputs); `--policy lookahead` for its
`--policy lookahead` run.

    .venv/bin/python benchmarks/bench_fleet_sim.py --predict --workers 4 --workload family
        --shape '{"families": 4, "requests_per_family": 4}' --block-size 64
        --prefix-match-unit 16 --num-blocks 512 [--num-speculative-tokens 2]
        [--concurrency 4] [--gpu-config calibrated.json] [--json out/fleet_predicted.json]
    .venv/bin/python benchmarks/bench_fleet_sim.py --predict --like-bench-fleet [--policy P]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hycache.bench.suite import SimBench, sim_config, sim_cost, workload_spec
from hycache.config import CacheKnobs
from hycache.sim.build import (
    DEFAULT_SHAPES,
    SimGeometry,
    TraceSource,
    WorkloadSizes,
    WorkloadSpec,
    build_config,
    build_cost,
    build_workload,
)
from hycache.sim.cluster import ROUTINGS
from hycache.sim.compare import compare_policies, sized_cache
from hycache.sim.load import closed_loop
from hycache.sim.simulator import SimResult
from hycache.sim.trace_gen import generate_mooncake_like
from hycache.sim.workloads import Workload

POOLED = "pooled-ideal"
LINES: tuple[str, ...] = (*ROUTINGS, POOLED)
INSTANCES: tuple[int, ...] = (1, 2, 4, 8, 16, 64)
WORKLOADS: tuple[str, ...] = ("family", "multi-turn", "system-prompt", "trace")
POLICY = "limit"
METRICS = (
    "requests",
    "prompt_tokens",
    "hit_tokens",
    "token_hit_rate",
    "predicted_hit_tokens",
    "overstated_hit_tokens",
    "overstated_requests",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "makespan_s",
    "num_blocks",
)
# the bench's shapes, cut so that the whole grid runs in a few minutes on one core
SCALED = {"families": 16, "sessions": 32, "system_prompt_requests": 128, "trace_requests": 400}


def scaled_bench() -> SimBench:
    s = SimBench()
    return replace(
        s,
        family=replace(s.family, families=SCALED["families"]),
        chat=replace(s.chat, sessions=SCALED["sessions"]),
        system_prompt=replace(s.system_prompt, num_requests=SCALED["system_prompt_requests"]),
        trace_requests=SCALED["trace_requests"],
    )


def quick_bench() -> SimBench:
    """A smoke test: a handful of requests per workload."""
    s = SimBench()
    return replace(
        s,
        family=replace(s.family, families=3),
        chat=replace(s.chat, sessions=4, turns=(2, 3)),
        system_prompt=replace(s.system_prompt, num_requests=12),
        trace_requests=30,
        concurrency=8,
    )


@dataclass(frozen=True)
class Point:
    sim: SimBench
    workload: str
    instances: int
    line: str  # a routing, or POOLED


@functools.lru_cache(maxsize=8)
def fleet_workload(s: SimBench, name: str) -> Workload:
    """A bench workload, closed loop at `s.concurrency` in flight (the trace without its
    timestamps: the same traffic whatever the fleet's size)."""
    w = build_workload(workload_spec(s, name))
    w.name = name
    if name == "trace":
        w = Workload(name, closed_loop(w.requests), concurrency=s.concurrency)
    return w


def summary(res: SimResult) -> dict[str, Any]:
    return {k: res.summary.get(k) for k in METRICS}


def run_point(p: Point) -> dict[str, Any]:
    """One line at one fleet size on one workload."""
    s = p.sim
    cost = sim_cost(s)
    w = fleet_workload(s, p.workload)
    cfg = sim_config(s, w, cost)
    cache = sized_cache(cfg.cache, cost)
    instances, routing = p.instances, p.line
    if p.line == POOLED:
        pages = cache.num_state_pages
        cache = replace(
            cache,
            num_blocks=cache.num_blocks * p.instances,
            num_state_pages=None if pages is None else pages * p.instances,
        )
        instances, routing = 1, "round-robin"
    t0 = time.perf_counter()
    res = compare_policies(
        w,
        replace(cfg, cache=cache),
        [POLICY],
        cost=cost,
        seed=s.seed,
        instances=instances,
        routing=routing,
    )[POLICY]
    return {**summary(res), "wall_s": time.perf_counter() - t0}


def _run_all(points: Sequence[Point], jobs: int) -> list[dict[str, Any]]:
    def say(i: int, p: Point) -> None:
        print(f"[{i}/{len(points)}] {p.workload} · {p.instances} · {p.line}", flush=True)

    if jobs <= 1:
        out = []
        for i, p in enumerate(points, start=1):
            say(i, p)
            out.append(run_point(p))
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(run_point, points))


def fleet_curves(
    s: SimBench, workloads: Sequence[str], instances: Sequence[int], jobs: int = 1
) -> dict[str, Any]:
    """Every (workload, fleet size, line) point. One instance is run once (every line is the
    same engine there)."""
    t0 = time.perf_counter()
    points = [
        Point(s, w, n, line)
        for w in workloads
        for n in instances
        for line in (LINES if n > 1 else LINES[:1])
    ]
    results = _run_all(points, jobs)
    curves: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    for p, r in zip(points, results, strict=True):
        rows = curves[p.workload]
        if not rows or rows[-1]["instances"] != p.instances:
            rows.append({"instances": p.instances, "lines": {}})
        lines = rows[-1]["lines"]
        lines[p.line] = r
        if p.instances == 1:  # the one engine, whatever the router
            lines.update({line: r for line in LINES})
    return {
        "inputs": {
            "sim": asdict(s),
            "policy": POLICY,
            "workloads": list(workloads),
            "instances": list(instances),
            "lines": list(LINES),
            "scaled": SCALED,
            "closed_loop_concurrency": s.concurrency,
        },
        "curves": curves,
        "overstatement": overstatement(curves),
        "wall_s": time.perf_counter() - t0,
    }


def overstatement(curves: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per workload, summed over the fleet sizes > 1: what each scoring router predicted
    against the hit its requests got."""
    out: dict[str, dict[str, Any]] = {}
    for name, rows in curves.items():
        for routing in ("prefix-aware", "attention-only"):
            picked = [r["lines"][routing] for r in rows if r["instances"] > 1]
            predicted = sum(p["predicted_hit_tokens"] or 0 for p in picked)
            actual = sum(p["hit_tokens"] for p in picked)
            over = sum(p["overstated_hit_tokens"] or 0 for p in picked)
            out.setdefault(name, {})[routing] = {
                "predicted_hit_tokens": predicted,
                "hit_tokens": actual,
                "predicted_over_actual": predicted / actual if actual else None,
                "overstated_hit_tokens": over,
                "overstated_share_of_hit": over / actual if actual else None,
                "overstated_requests": sum(p["overstated_requests"] or 0 for p in picked),
                "requests": sum(p["requests"] for p in picked),
            }
    return out


def plot(path: str, doc: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = doc["curves"]
    names = list(curves)
    fig, axes = plt.subplots(3, len(names), figsize=(4.2 * len(names), 10), squeeze=False)
    style = {
        "round-robin": ("tab:gray", "o", "-"),
        "prefix-aware": ("tab:blue", "s", "-"),
        "attention-only": ("tab:orange", "^", "--"),
        POOLED: ("black", "", ":"),
    }
    for j, name in enumerate(names):
        rows = curves[name]
        xs = [r["instances"] for r in rows]
        for i, (key, label, lines) in enumerate(
            (
                ("token_hit_rate", "token hit rate", LINES),
                ("ttft_p50_s", "TTFT p50 (s)", ROUTINGS),
                ("overstated", "overstated hit tokens / actual hit", ROUTINGS[1:]),
            )
        ):
            ax = axes[i][j]
            for line in lines:
                color, marker, ls = style[line]
                if key == "overstated":  # of routed requests: from 2 instances on
                    routed = [r for r in rows if r["instances"] > 1]
                    xs_line = [r["instances"] for r in routed]
                    ys = [overstated_share(r["lines"][line]) for r in routed]
                    ax.plot(xs_line, ys, color=color, marker=marker, linestyle=ls, label=line)
                    continue
                else:
                    ys = [r["lines"][line][key] for r in rows]
                ax.plot(xs, ys, color=color, marker=marker or None, linestyle=ls, label=line)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("instances")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(name)
            if j == 0:
                ax.legend(fontsize=8)
    fig.suptitle(
        "simulated fleet: bamba-9b on H200s, B=4416, u=64, k=3, limit; 64 requests in flight"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overstated_share(point: dict[str, Any]) -> float:
    """Tokens a router predicted beyond what its requests got, over the hit they got."""
    return (point["overstated_hit_tokens"] or 0) / max(point["hit_tokens"], 1)


def markdown(doc: dict[str, Any]) -> str:
    """The docs' table: per workload and fleet size, hit rate and TTFT p50 per line, and
    attention-only's overstated hit (tokens it predicted beyond what its requests got, over
    the hit they got) and the requests it overstated."""
    head = (
        "| workload | instances | hit rate rr / prefix-aware / attention-only / pooled "
        "| TTFT p50 s rr / pa / ao | attention-only overstated hit (requests) |\n"
        "|---|---:|---|---|---:|"
    )
    out = [head]
    for name, rows in doc["curves"].items():
        for r in rows:
            li = r["lines"]
            hit = " / ".join(f"{li[x]['token_hit_rate']:.3f}" for x in LINES)
            ttft = " / ".join(f"{li[x]['ttft_p50_s']:.3f}" for x in ROUTINGS)
            ao = li["attention-only"]
            over = "-"  # one instance: nothing is routed
            if r["instances"] > 1:
                over = f"{overstated_share(ao):.1%} ({ao['overstated_requests'] or 0})"
            out.append(f"| {name} | {r['instances']} | {hit} | {ttft} | {over} |")
    return "\n".join(out)


# -- the prediction beside a real fleet ---------------------------------------------------------


@dataclass(frozen=True)
class FleetSetting:
    """A small real fleet as the simulator sees it: `workers` engines of `model`, each with
    `num_blocks` blocks of `block_size` tokens, a workload (a bench kind with its shape's
    fields in `shape`, or a Mooncake trace), closed loop at `concurrency`."""

    workers: int = 4
    workload: str = "family"
    shape: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None  # a Mooncake JSONL file (else `trace_requests` generated)
    trace_requests: int = 100
    trace_prompt_tokens: int | None = None  # cut every trace prompt to its first N tokens
    trace_output_tokens: int | None = None  # every trace request's output length
    model: str = "tiny"
    gpu: str = "h100"
    gpu_config: str | None = None  # a calibrated device profile (`hycache calibrate`)
    block_size: int = 64
    prefix_match_unit: int = 16
    num_blocks: int = 512
    num_speculative_tokens: int = 2
    concurrency: int = 4
    seed: int = 0
    policy: str = POLICY


def setting_workload(f: FleetSetting) -> Workload:
    if f.workload == "trace":
        records = None if f.trace else generate_mooncake_like(f.trace_requests, seed=f.seed)
        source = TraceSource(path=f.trace, records=records)
        w = build_workload(WorkloadSpec("trace", trace=source, seed=f.seed))
        cut, out = f.trace_prompt_tokens, f.trace_output_tokens
        reqs = [
            replace(
                r,
                prompt_token_ids=r.prompt_token_ids[:cut],
                max_tokens=r.max_tokens if out is None else out,
            )
            for r in closed_loop(w.requests)
        ]
        return Workload("trace", reqs, concurrency=f.concurrency)
    base = DEFAULT_SHAPES[f.workload]
    names = {x.name for x in fields(base)}
    unknown = set(f.shape) - names
    if unknown:
        raise ValueError(f"shape: {f.workload} has no {', '.join(sorted(unknown))}")
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in f.shape.items()}
    spec = WorkloadSpec(f.workload, replace(base, **given), seed=f.seed, concurrency=f.concurrency)
    return build_workload(spec)


def predict(f: FleetSetting) -> dict[str, Any]:
    """Per arm, the simulator's prediction for the setting: hit tokens, hit rate, the
    router's predicted hit, TTFT; the pooled ideal beside them. The arms map onto the real
    fleet's: `prefix-aware` is hycache's exact router (and Dynamo `kv` fed resumable events,
    up to the spacing of states where a request leaves a published path), `attention-only` is
    Dynamo `kv` fed vLLM-style per-group events, `round-robin` is round-robin."""
    w = setting_workload(f)
    cost = build_cost(
        f.model,
        f.gpu_config or f.gpu,
        num_speculative_tokens=f.num_speculative_tokens,
        block_size=f.block_size,
    )
    geometry = SimGeometry(
        CacheKnobs(f.block_size, f.prefix_match_unit),
        num_speculative_tokens=f.num_speculative_tokens,
        max_num_seqs=max(f.concurrency, 1),
    )
    max_len = w.max_tokens_per_request() + 2 * f.num_speculative_tokens + 8
    arms: dict[str, Any] = {}
    for line in LINES:
        pooled = line == POOLED
        cfg = build_config(
            geometry,
            policy=f.policy,
            max_model_len=max_len,
            num_blocks=f.num_blocks * (f.workers if pooled else 1),
        )
        res = compare_policies(
            w,
            cfg,
            [f.policy],
            cost=cost,
            seed=f.seed,
            instances=1 if pooled else f.workers,
            routing="round-robin" if pooled else line,
        )[f.policy]
        arms[line] = summary(res)
    return {
        "setting": asdict(f),
        "calibrated": f.gpu_config is not None,
        "workload": {"name": w.name, "requests": w.size},
        "arms": arms,
    }


# bench_fleet's arms, and the simulated routing each stands for (`kv` fed resumable events is
# the exact router up to the spacing of states where a request leaves a published path)
BENCH_FLEET_ARMS = {
    "kv": "prefix-aware",
    "exact": "prefix-aware",
    "attention": "attention-only",
    "round-robin": "round-robin",
}


def bench_fleet_settings(
    policy: str = POLICY, gpu_config: str | None = None
) -> dict[str, FleetSetting]:
    """`benchmarks/bench_fleet.py`'s fleet per workload, from the one home of its setting
    (`hycache.fleet.bench_setting`): the engines' flags, the load, the workloads as `hycache
    bench serve` builds them at the bench's sizes."""
    from hycache.bench.loadgen import SERVE_SHAPES
    from hycache.fleet import bench_setting as b

    common: dict[str, Any] = {
        "workers": b.WORKERS,
        "model": "tiny",
        "block_size": b.BLOCK,
        "prefix_match_unit": b.UNIT,
        "num_speculative_tokens": b.SPECULATIVE,
        "num_blocks": b.NUM_BLOCKS,
        "concurrency": b.CONCURRENCY,
        "trace_requests": b.TRACE.requests,
        "trace_prompt_tokens": b.TRACE.prompt_tokens,
        "trace_output_tokens": b.TRACE.output_tokens,
        "policy": policy,
        "gpu_config": gpu_config,
    }
    out = {}
    for name in b.WORKLOADS:
        sizes = WorkloadSizes(**b.SIZES[name]) if name in b.SIZES else None
        shape = asdict(sizes.applied(SERVE_SHAPES[name])) if sizes else {}
        out[name] = FleetSetting(workload=name, shape=shape, **common)
    return out


def like_bench_fleet(policy: str = POLICY, gpu_config: str | None = None) -> dict[str, Any]:
    """The simulator's prediction for `benchmarks/bench_fleet.py`'s run (its setting, its
    four arms) at the engines' `policy`."""
    out: dict[str, Any] = {"arms": BENCH_FLEET_ARMS, "policy": policy, "workloads": {}}
    for name, f in bench_fleet_settings(policy, gpu_config).items():
        out["workloads"][name] = predict(f)
    return out


def predicted_table(doc: dict[str, Any]) -> str:
    """Per workload and bench_fleet arm: the simulated hit tokens, the router's predicted hit
    and its overstated tokens (requests)."""
    lines = ["| workload | arm (simulated routing) | simulated hit tokens | router predicted "
             "| overstated (requests) |", "|" + "---|" * 5]  # fmt: skip
    for name, w in doc["workloads"].items():
        for arm, routing in doc["arms"].items():
            a = w["arms"][routing]
            pred = a["predicted_hit_tokens"]
            lines.append(
                f"| {name} | {arm} ({routing}) | {a['hit_tokens']:,} "
                f"| {'' if pred is None else f'{pred:,}'} "
                f"| {a['overstated_hit_tokens'] or 0:,} ({a['overstated_requests'] or 0}) |"
            )
    return "\n".join(lines)


def _ratio_text(r: dict[str, Any] | None) -> str:
    return "" if r is None else f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def beside_measured(doc: dict[str, Any], measured: Sequence[dict[str, Any]]) -> str:
    """Per workload and arm, the simulated hit tokens beside the measured ones
    (`benchmarks/bench_fleet.py --json`'s `aggregate` rows: medians over its repeats, min-max)
    and the measured TTFT p50 ratio to round-robin."""
    lines = ["| workload | arm | simulated hit tokens | measured hit tokens | measured / simulated "
             "| measured TTFT p50 vs rr |", "|" + "---|" * 6]  # fmt: skip
    for name, w in doc["workloads"].items():
        for arm, routing in doc["arms"].items():
            row = next((m for m in measured if m["workload"] == name and m["arm"] == arm), None)
            if row is None:
                continue
            sim = w["arms"][routing]["hit_tokens"]
            hit = row["hit_tokens"]
            measured_hit = f"{hit['median']:,.0f} ({hit['min']:,.0f}-{hit['max']:,.0f})"
            share = f"{hit['median'] / sim:.2f}" if sim else "-"
            lines.append(
                f"| {name} | {arm} | {sim:,} | {measured_hit} | {share} "
                f"| {_ratio_text(row.get('ttft_p50_ms_vs_rr'))} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default="docs/img/fleet-curves.png")
    ap.add_argument("--instances", default=",".join(map(str, INSTANCES)))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    ap.add_argument("--quick", action="store_true", help="a smoke test")
    ap.add_argument("--markdown", action="store_true", help="print the docs' table")
    p = ap.add_argument_group("--predict: the simulator beside a real fleet")
    p.add_argument("--predict", action="store_true")
    p.add_argument(
        "--like-bench-fleet",
        action="store_true",
        help="with --predict: benchmarks/bench_fleet.py's default setting, every workload",
    )
    d = FleetSetting()
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--workload", default=d.workload, choices=(*DEFAULT_SHAPES, "trace"))
    p.add_argument("--shape", type=json.loads, default={}, help="the shape's fields, JSON")
    p.add_argument("--trace", default=None, help="a Mooncake JSONL trace (--workload trace)")
    p.add_argument("--trace-requests", type=int, default=d.trace_requests)
    p.add_argument("--trace-prompt-tokens", type=int, default=None)
    p.add_argument("--trace-output-tokens", type=int, default=None)
    p.add_argument("--model", default=d.model)
    p.add_argument("--gpu", default=d.gpu)
    p.add_argument("--gpu-config", default=None)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--prefix-match-unit", type=int, default=d.prefix_match_unit)
    p.add_argument("--num-blocks", type=int, default=d.num_blocks)
    p.add_argument("--num-speculative-tokens", type=int, default=d.num_speculative_tokens)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--policy", default=d.policy, help="the engines' policy")
    p.add_argument(
        "--measured",
        nargs="+",
        default=(),
        help="with --like-bench-fleet: benchmarks/bench_fleet.py --json files, put beside",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.predict:
        keys = {f.name for f in fields(FleetSetting)}
        f = FleetSetting(**{k: v for k, v in vars(args).items() if k in keys})
        if args.like_bench_fleet:
            doc = like_bench_fleet(args.policy, args.gpu_config)
        else:
            doc = predict(f)
        text = json.dumps(doc, indent=2) + "\n"
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text)
        print(text, end="")
        if args.like_bench_fleet:
            print(predicted_table(doc))
            rows = [r for m in args.measured for r in json.loads(Path(m).read_text())["aggregate"]]
            if rows:
                print(beside_measured(doc, rows))
        return 0
    s = quick_bench() if args.quick else scaled_bench()
    instances = [int(x) for x in args.instances.split(",")]
    doc = fleet_curves(s, args.workloads.split(","), instances, args.jobs)
    out = args.json or "out/fleet_sim.json"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=2) + "\n")
    plot(args.plot, doc)
    print(markdown(doc))
    print(json.dumps(doc["overstatement"], indent=2))
    print(f"wrote {out} and {args.plot}; wall time {doc['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
