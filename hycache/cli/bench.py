"""`hycache bench`: every arm side by side, CPU engine and simulated (hycache.bench.suite), its
eviction curves (hycache.bench.eviction) and `--validate` (hycache.bench.validate): flags, the typed
run they describe (`BenchArgs`) and the command. `hycache bench serve` lives in
hycache.cli.bench_serve, `hycache bench vllm` in hycache.cli.bench_vllm."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hycache.cli.args import (
    BENCH_JSON,
    BENCH_ONLY_DEFAULTS,
    StoreArgs,
    UserError,
    add_eviction_flags,
    add_flag,
    add_store_args,
    knobs_from_cli_args,
    positive_int,
)
from hycache.cli.tables import console, curves_table, fmt, policy_table, progress_reporter
from hycache.config import ENGINE_SHAPES
from hycache.files import check_writable, write_atomic

if TYPE_CHECKING:
    from hycache.bench.results import BenchResult, EnginePart, SimTable
    from hycache.bench.suite import EngineBench, SimBench


def quick_bench(
    engine: EngineBench | None, sim: SimBench | None
) -> tuple[EngineBench | None, SimBench | None]:
    """`bench --quick`: the same tables and curves at smoke-test size (seconds, not minutes):
    a small engine shape, few simulated requests, two points per curve."""
    if engine is not None:
        engine = replace(
            engine,
            knobs=engine.knobs.replace(block_size=64, prefix_match_unit=8),
            shared_prefix_tokens=600,
            suffix_tokens=100,
            output_tokens=8,
            num_requests=6,
            concurrency=3,
            repeats=2,
            num_blocks=256,
            threads=1,  # tiny steps: a second thread only adds synchronisation
        )
    if sim is not None:
        sim = replace(
            sim,
            system_prompt=replace(sim.system_prompt, num_requests=12),
            family=replace(sim.family, families=3),
            chat=replace(sim.chat, sessions=6, turns=(2, 3)),
            no_sharing=replace(sim.no_sharing, num_requests=12, output_tokens=64),
            trace_requests=40,
            curve_output_tokens=(64, 256),
            curve_concurrency=(1, 8),
            curve_requests=16,
            concurrency=8,
        )
    return engine, sim


def jobs(args: argparse.Namespace) -> int:
    """`--jobs`, or by default up to 2 processes, one per core (the page a machine renders
    never depends on its core count)."""
    return int(args.jobs) if args.jobs else min(2, os.cpu_count() or 1)


def cmd_eviction_curves(args: argparse.Namespace) -> int:
    """`hycache bench --eviction-curves`: hit rate and TTFT p95 over cache memory, `lru`
    against `flop-aware` (hycache.bench.eviction); writes out/eviction.json and .png unless
    `--json` / `--plot` name other files."""
    from hycache.bench.eviction import EvictionBench, eviction_curves, plot_eviction, quick
    from hycache.cli.tables import eviction_table

    json_path = "out/eviction.json" if args.json == BENCH_JSON else args.json
    plot_path = "out/eviction.png" if args.plot == BENCH_ONLY_DEFAULTS["plot"] else args.plot
    check_writable(json_path, "--json")
    check_writable(plot_path, "--plot")
    b = EvictionBench(alpha=args.eviction_alpha)
    if args.quick:
        b = quick(b)
    if args.trace_requests:
        b = replace(b, sim=replace(b.sim, trace_requests=args.trace_requests))
    with progress_reporter("eviction curves") as progress:
        result = eviction_curves(b, progress, workers=jobs(args))
    doc = result.to_json()
    console.print(eviction_table(doc))
    g = result.goal
    console.print(
        f"goal at {g.fraction:g} of the memory (flop-aware >= 1.2x lru hit rate and <= 0.85x "
        f"TTFT p95 on two workloads, hit rate never below 0.98x): "
        f"{'met' if g.met else 'not met'}; wall time {result.wall_s:.1f} s"
    )
    if json_path:
        write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if plot_path:
        plot_eviction(plot_path, doc)
        console.print(f"wrote {plot_path}")
    return 0


@dataclass(frozen=True)
class BenchArgs:
    """A `hycache bench` run, validated: the engine part and the simulated part (None: skipped),
    what else to run, and where the results go."""

    engine: EngineBench | None
    sim: SimBench | None
    curves: bool
    jobs: int
    engine_profile: str | None
    json: str | None
    plot: str | None

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> BenchArgs:
        from hycache.bench.suite import EngineBench, SimBench

        check_writable(args.json, "--json")
        check_writable(args.plot, "--plot")
        store = StoreArgs.from_cli_args(args)
        if store.kind is not None and args.skip_engine:
            raise UserError("--kv-store: a second tier is for the engine part; drop --skip-engine")
        engine = sim = None
        if not args.skip_engine:
            engine = EngineBench(knobs=knobs_from_cli_args(args, EngineBench().knobs))
        if not args.skip_simulated:
            knobs = knobs_from_cli_args(args, SimBench().knobs)
            sim = SimBench(model=args.model, gpu=args.gpu, knobs=knobs)
        if args.quick:
            engine, sim = quick_bench(engine, sim)
        if engine is not None:
            engine = engine_part(engine, args, store)
        if sim is not None and args.trace_requests:
            sim = replace(sim, trace_requests=args.trace_requests)
        return cls(
            engine, sim, not args.skip_curves, jobs(args), args.engine_profile, args.json, args.plot
        )


def engine_part(engine: EngineBench, args: argparse.Namespace, store: StoreArgs) -> EngineBench:
    """The engine part with the flags that change it."""
    if args.engine_shape != "system":
        engine = replace(engine, shape=args.engine_shape)
    if args.engine_requests:
        engine = replace(engine, num_requests=args.engine_requests)
    if args.engine_repeats:
        engine = replace(engine, repeats=args.engine_repeats)
    if store.kind is not None:
        engine = replace(engine, kv_store=store.kind, kv_store_gb=store.gb)
    if args.engine_profile:
        from hycache.sim.presets import load_gpu

        # the engine part runs on the torch threads the profile was calibrated on
        cal = (load_gpu(args.engine_profile).calibration or {}).get("calibration", {})
        engine = replace(engine, threads=int(cal.get("threads") or 1))
    return engine


def print_overhead(part: EnginePart | SimTable) -> None:
    """The price of caching on a stream that shares nothing, when the table has it."""
    if (o := part.caching_overhead()) is not None:
        console.print(
            f"  caching when nothing is shared ({o['name']}): output tokens/s "
            f"{o['output_tokens_per_s']:.3f}x, TTFT p50 {o['ttft_p50_s']:.3f}x"
        )
        if o.get("output_tokens_per_cpu_s") is not None:
            console.print(
                f"  on the engine thread's CPU clock: output tokens per CPU second "
                f"{o['output_tokens_per_cpu_s']:.3f}x, TTFT p50 {o['ttft_cpu_p50_s']:.3f}x"
            )


REPEAT_LABELS = {"output_tokens_per_s": "output tok/s", "ttft_p50_s": "TTFT p50"}


def print_repeats(engine: EnginePart) -> None:
    """Each arm's repeats (median, min-max), and each arm over the reference per repeat, with
    the warning where the repeats disagree too much to rank them."""
    from hycache.bench.repeats import verdict

    n = len(next(iter(engine.runs.values())))
    console.print(f"  the {n} repeats, median (min-max):")
    for arm, figures in engine.spread.items():
        cells = [
            f"{label} {fmt(figures[k]['median'])} ({fmt(figures[k]['min'])}-"
            f"{fmt(figures[k]['max'])})"
            for k, label in REPEAT_LABELS.items()
        ]
        console.print(f"    {arm}: " + ", ".join(cells))
    ref = engine.reference
    for arm, ratios in engine.vs_reference.items():
        cells = [
            f"{label} {verdict(r)}"
            for k, label in REPEAT_LABELS.items()
            if (r := ratios.get(k)) is not None
        ]
        console.print(f"    {arm}/{ref} per repeat: " + "; ".join(cells), highlight=False)


def print_engine(a: BenchArgs, part: EnginePart) -> EnginePart:
    """The engine part's table (and the calibrated profile's prediction beside it); the part,
    with that prediction."""
    e = a.engine
    assert e is not None
    shared = f"{e.shared_prefix_tokens:,} shared"
    if e.shape == "family":
        shared = f"{e.families} families sharing up to {e.shared_prefix_tokens:,}"
    elif e.shape == "none":
        shared = f"nothing shared: {e.shared_prefix_tokens:,}"
    title = (
        f"CPU engine, tiny + EAGLE (k={e.num_speculative_tokens}): "
        f"{e.num_requests} requests, {shared} + "
        f"{e.suffix_tokens} tokens, B={e.knobs.block_size}, u={e.knobs.prefix_match_unit}, "
        f"concurrency {e.concurrency}; median of {e.repeats} alternating repeats"
    )
    if e.kv_store:
        title += f"; second tier {e.kv_store} ({e.kv_store_gb:g} GiB per arm)"
    measured = part.policies_json()
    console.print(policy_table(title, measured))
    print_repeats(part)
    print_overhead(part)
    if a.engine_profile:
        from hycache.bench.validate import predict_engine_bench
        from hycache.cli.tables import engine_prediction_table

        predicted = predict_engine_bench(e, a.engine_profile)
        doc = {p: m.to_json() for p, m in predicted.items()}
        part = replace(part, predicted={"profile": a.engine_profile, "policies": doc})
        console.print(engine_prediction_table(measured, doc))
    return part


def print_simulated(result: BenchResult) -> None:
    """One table per simulated workload, and the curves."""
    for name, part in (result.simulated or {}).items():
        i = part.inputs
        title = (
            f"simulated {name} ({i.model} on {i.gpu}, B={i.block_size}, "
            f"u={i.prefix_match_unit}, k={i.num_speculative_tokens}): "
            f"{i.num_requests:,} requests"
        )
        if (o := i.offered) is not None:
            title += (
                f", open loop at {o.request_rate_per_s:.3g} requests/s "
                f"({o.load:.0%} of the {o.capacity_requests_per_s:.3g}/s lookahead sustains)"
            )
        else:
            title += f", concurrency {i.concurrency}"
        console.print(policy_table(title, part.policies))
        print_overhead(part)
    if result.curves is not None:
        console.print(curves_table(result.curves.to_json()))


def cmd_bench(args: argparse.Namespace) -> int:
    from hycache.bench import suite
    from hycache.bench.plots import plot_bench

    if args.eviction_curves:
        return cmd_eviction_curves(args)
    if args.validate:
        from hycache.cli.calibrate import cmd_validate

        if args.json == BENCH_JSON:
            args.json = "out/validate.json"
        return cmd_validate(args)
    a = BenchArgs.from_cli_args(args)
    with progress_reporter("benchmarking") as progress:
        result = suite.bench(a.engine, a.sim, progress, curves=a.curves, workers=a.jobs)
    if result.engine is not None:
        result = replace(result, engine=print_engine(a, result.engine))
    print_simulated(result)
    console.print(f"bench wall time: {result.wall_s:.1f} s")
    doc = result.to_json()
    if a.json:
        write_atomic(a.json, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {a.json}")
    if a.plot:
        plot_bench(a.plot, doc)
        console.print(f"wrote {a.plot}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `bench` sub-parser, with `bench serve` and `bench vllm` under it."""
    p = sub.add_parser("bench", help="every arm side by side: CPU engine and simulated")
    p.add_argument("--json", default=BENCH_JSON, help="write results here")
    p.add_argument("--plot", default="out/bench.png", help="write a PNG plot here")
    p.add_argument("--quick", action="store_true", help="smaller workloads (a smoke test)")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-simulated", action="store_true")
    p.add_argument("--skip-curves", action="store_true", help="no ratio curves")
    p.add_argument(
        "--model",
        default="bamba-9b",
        help="the simulated part's model preset or config.json (e.g. qwen3-next-80b-a3b, "
        "qwen3.5-35b-a3b: Gated DeltaNet hybrids)",
    )
    p.add_argument(
        "--gpu",
        default="h200",
        help="the simulated part's GPU preset (qwen3-next-80b-a3b's bfloat16 weights, 159.5 GB, "
        "need b200)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes for the simulations (default: up to 2, one per core; the engine part "
        "runs alone)",
    )
    p.add_argument("--engine-requests", type=positive_int, default=None)
    p.add_argument(
        "--engine-shape",
        choices=ENGINE_SHAPES,
        default="system",
        help="the CPU engine arm's requests: one shared system prompt, or interleaved families "
        "with shared prefixes of random lengths",
    )
    p.add_argument(
        "--engine-repeats", type=positive_int, default=None, help="alternating repeats (3)"
    )
    p.add_argument("--trace-requests", type=positive_int, default=None)
    p.add_argument(
        "--engine-profile",
        default=None,
        metavar="PROFILE",
        help="a calibrated CPU profile (`hycache calibrate`): the simulator's prediction for "
        "the engine part, beside what the engine measured",
    )
    add_store_args(p)  # the engine part's arms: each its own store of this kind
    g = p.add_argument_group("eviction")
    add_eviction_flags(g)  # every arm of the tables, engine and simulated
    add_flag(g, "--internal-checkpoints")  # every arm but the `-split` ones, which turn them off
    add_flag(g, "--no-prefix-caching")  # every arm: the whole bench with caching off
    g.add_argument(
        "--eviction-curves",
        action="store_true",
        help="instead: token hit rate and TTFT p95 over 1/8..1x of the cache memory, lru "
        "against flop-aware, on the family, multi-turn and trace workloads (writes "
        "out/eviction.json and out/eviction.png unless --json / --plot name other files)",
    )
    from hycache.cli.bench_serve import add_bench_serve_parser
    from hycache.cli.bench_vllm import add_bench_vllm_parser
    from hycache.cli.calibrate import add_validate_flags

    add_validate_flags(p)
    p.set_defaults(func=cmd_bench)
    # optional sub-commands: plain `hycache bench` still runs the comparison benchmark
    targets = p.add_subparsers(dest="target", required=False, metavar="{serve,vllm}")
    add_bench_serve_parser(targets)
    add_bench_vllm_parser(targets)
