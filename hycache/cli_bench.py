"""`hycache bench` (every arm side by side: CPU engine and simulated, hycache.bench) and
`hycache bench serve` (load a running completions server, hycache.loadgen): their
sub-parsers and commands."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from typing import Any

from rich.text import Text

from hycache.cli_common import (
    DEFAULT_KV_STORE_GB,
    UserError,
    add_store_args,
    check_store_args,
    int_or_range,
    positive_int,
)
from hycache.config import DEFAULT_EVICTION_ALPHA, ENGINE_SHAPES
from hycache.engine.args import add_checkpoint_flags, add_eviction_flags, positive_float
from hycache.report import (
    check_writable,
    console,
    err_console,
    progress_bar,
    progress_reporter,
    write_atomic,
)


def quick_bench(engine: Any, sim: Any) -> tuple[Any, Any]:
    """`bench --quick`: the same tables and curves at smoke-test size (seconds, not minutes):
    a small engine shape, few simulated requests, two points per curve."""
    if engine is not None:
        engine = replace(
            engine,
            block_size=64,
            prefix_match_unit=8,
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
            trace_requests=40,
            curve_output_tokens=(64, 256),
            curve_concurrency=(1, 8),
            curve_requests=16,
            concurrency=8,
        )
    return engine, sim


def cmd_eviction_curves(args: argparse.Namespace) -> int:
    """`hycache bench --eviction-curves`: hit rate and TTFT p95 over cache memory, `lru`
    against `flop-aware` (hycache.bench_eviction); writes out/eviction.json and .png unless
    `--json` / `--plot` name other files."""
    from hycache.bench_eviction import (
        EvictionBench,
        curves_table,
        eviction_curves,
        plot_eviction,
        quick,
    )

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
        doc = eviction_curves(b, progress, workers=args.jobs)
    console.print(curves_table(doc))
    g = doc["goal"]
    console.print(
        f"goal at {g['fraction']:g} of the memory (flop-aware >= 1.2x lru hit rate and <= 0.85x "
        f"TTFT p95 on two workloads, hit rate never below 0.98x): "
        f"{'met' if g['met'] else 'not met'}; wall time {doc['wall_s']:.1f} s"
    )
    if json_path:
        write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if plot_path:
        plot_eviction(plot_path, doc)
        console.print(f"wrote {plot_path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from hycache.bench import EngineBench, SimBench, bench
    from hycache.report import curves_table, plot_bench, policy_table

    if args.eviction_curves:
        return cmd_eviction_curves(args)
    if args.validate:
        from hycache.cli_calibrate import cmd_validate

        if args.json == BENCH_JSON:
            args.json = "out/validate.json"
        return cmd_validate(args)
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    check_store_args(args)
    if args.kv_store is not None and args.skip_engine:
        raise UserError("--kv-store: a second tier is for the engine part; drop --skip-engine")
    ev = {
        "eviction": args.eviction,
        "eviction_alpha": args.eviction_alpha,
        "internal_checkpoints": args.internal_checkpoints,
    }
    engine = None if args.skip_engine else EngineBench(**ev)
    sim = None if args.skip_simulated else SimBench(**ev)
    if args.quick:
        engine, sim = quick_bench(engine, sim)
    if engine is not None and args.engine_shape != "system":
        engine = replace(engine, shape=args.engine_shape)
    if engine is not None and args.engine_requests:
        engine = replace(engine, num_requests=args.engine_requests)
    if engine is not None and args.engine_repeats:
        engine = replace(engine, repeats=args.engine_repeats)
    if engine is not None and args.kv_store is not None:
        engine = replace(engine, kv_store=args.kv_store, kv_store_gb=args.kv_store_gb)
    if sim is not None and args.trace_requests:
        sim = replace(sim, trace_requests=args.trace_requests)
    if engine is not None and args.engine_profile:
        from hycache.sim.presets import load_gpu

        # the engine part runs on the torch threads the profile was calibrated on
        cal = (load_gpu(args.engine_profile).calibration or {}).get("calibration", {})
        engine = replace(engine, threads=int(cal.get("threads") or 1))
    with progress_reporter("benchmarking") as progress:
        doc = bench(engine, sim, progress, curves=not args.skip_curves, workers=args.jobs)
    if "engine" in doc:
        e = doc["engine"]["inputs"]
        shared = f"{e['shared_prefix_tokens']:,} shared"
        if e.get("shape") == "family":
            shared = f"{e['families']} families sharing up to {e['shared_prefix_tokens']:,}"
        title = (
            f"CPU engine, tiny + EAGLE (k={e['num_speculative_tokens']}): "
            f"{e['num_requests']} requests, {shared} + "
            f"{e['suffix_tokens']} tokens, B={e['block_size']}, u={e['prefix_match_unit']}, "
            f"concurrency {e['concurrency']}; median of {e['repeats']} alternating repeats"
        )
        if e.get("kv_store"):
            title += f"; second tier {e['kv_store']} ({e['kv_store_gb']:g} GiB per arm)"
        console.print(policy_table(title, doc["engine"]["policies"]))
        if args.engine_profile:
            from hycache.cli_calibrate import engine_prediction_table
            from hycache.validate import predict_engine_bench

            assert engine is not None
            predicted = predict_engine_bench(engine, args.engine_profile)
            doc["engine"]["predicted"] = {"profile": args.engine_profile, "policies": predicted}
            console.print(engine_prediction_table(doc["engine"]["policies"], predicted))
    for name, part in doc.get("simulated", {}).items():
        i = part["inputs"]
        title = (
            f"simulated {name} ({i['model']} on {i['gpu']}, B={i['block_size']}, "
            f"u={i['prefix_match_unit']}, k={i['num_speculative_tokens']}): "
            f"{i['num_requests']:,} requests"
        )
        if i.get("open_loop"):
            o = i["offered_load"]
            title += (
                f", open loop at {o['request_rate_per_s']:.3g} requests/s "
                f"({o['load']:.0%} of the {o['capacity_requests_per_s']:.3g}/s lookahead sustains)"
            )
        else:
            title += f", concurrency {i['concurrency']}"
        console.print(policy_table(title, part["policies"]))
    if "curves" in doc:
        console.print(curves_table(doc["curves"]))
    console.print(f"bench wall time: {doc['wall_s']:.1f} s")
    if args.json:
        write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_bench(args.plot, doc)
        console.print(f"wrote {args.plot}")
    return 0


BENCH_JSON = "out/bench.json"
BENCH_ONLY_DEFAULTS: dict[str, Any] = {
    "plot": "out/bench.png",
    "quick": False,
    "skip_engine": False,
    "skip_simulated": False,
    "skip_curves": False,
    "engine_requests": None,
    "engine_shape": "system",
    "engine_repeats": None,
    "trace_requests": None,
    "kv_store": None,
    "kv_store_gb": DEFAULT_KV_STORE_GB,
    "eviction": "lru",
    "eviction_alpha": DEFAULT_EVICTION_ALPHA,
    "internal_checkpoints": True,
    "eviction_curves": False,
    "validate": None,
    "engine_profile": None,
    "threads": 1,
    "clock": None,
}


def cmd_bench_serve(args: argparse.Namespace) -> int:
    """`hycache bench serve`: load a running completions server (hycache.loadgen)."""

    from hycache.loadgen import (
        LoadgenError,
        RunOptions,
        build_plan,
        results_table,
        run_bench,
        summarize,
    )

    given = [k for k, v in BENCH_ONLY_DEFAULTS.items() if getattr(args, k, v) != v]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag}: a flag of `hycache bench`, not of `hycache bench serve`")
    check_writable(args.json, "--json")
    if args.max_prompt_tokens is not None and args.workload != "trace":
        raise UserError("--max-prompt-tokens: only for --workload trace")
    if args.prefix_hint and args.workload == "trace":
        raise UserError("--prefix-hint: a trace names no shared prefix; use another workload")
    plan = build_plan(
        args.workload,
        seed=args.seed,
        vocab=args.vocab_size,
        prefix_hint=args.prefix_hint,
        num_requests=args.num_requests,
        shared_prefix_tokens=args.shared_prefix_tokens,
        suffix_tokens=args.suffix_tokens,
        output_tokens=args.output_tokens,
        families=args.families,
        requests_per_family=args.requests_per_family,
        sessions=args.sessions,
        turns=args.turns,
        user_tokens=args.user_tokens,
        system_prompt_tokens=args.system_prompt_tokens,
        trace=args.trace,
        trace_block_tokens=args.trace_block_tokens,
        limit=args.limit,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    if not plan.num_requests:
        raise UserError("the workload has no requests")
    replay = args.workload == "trace" and args.request_rate is None and args.concurrency is None
    opts = RunOptions(
        url=args.url,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        replay_timestamps=replay,
        api_key=args.api_key,
        model=args.model,
        prefix_hint=args.prefix_hint,
        ignore_eos=args.ignore_eos,
        timeout_s=args.timeout,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
    )
    with progress_bar(disable=args.quiet) as progress:
        task = progress.add_task(f"{plan.workload} requests", total=plan.num_requests)
        try:
            results, duration = run_bench(plan, opts, on_done=lambda _r: progress.advance(task))
        except LoadgenError as exc:  # unreachable before the run: one line, however wide
            progress.stop()
            err_console.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
            return 2
    summary = summarize(results, duration)
    if args.request_rate is not None:
        mode = f"open loop at {args.request_rate:g} {'sessions' if plan.sessions else 'requests'}/s"
        if args.concurrency:
            mode += f", at most {args.concurrency} in flight"
    elif replay:
        mode = "open loop at the trace's timestamps"
    else:
        mode = f"concurrency {args.concurrency or 8}"
    inputs = {
        "url": args.url,
        "workload": plan.workload,
        "num_requests": plan.num_requests,
        "sessions": len(plan.sessions) or None,
        "mode": mode,
        "concurrency": args.concurrency,
        "request_rate": args.request_rate,
        "prefix_hint": args.prefix_hint,
        "ignore_eos": args.ignore_eos,
        "vocab_size": args.vocab_size,
        "model": args.model,
        "request_timeout_s": args.request_timeout,
        "seed": args.seed,
    }
    failed = [r for r in results if not r.ok]
    for r in failed[:10]:
        where = f" (session {r.session}, turn {r.turn})" if r.session is not None else ""
        err_console.print(
            Text(f"request {r.index}{where} failed: {r.error}"), highlight=False, soft_wrap=True
        )
    if len(failed) > 10:
        err_console.print(f"... and {len(failed) - 10} more failed requests", highlight=False)
    if args.json:
        doc = {"inputs": inputs, "summary": summary, "requests": [r.line() for r in results]}
        write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
    if not args.quiet:
        title = f"{plan.workload}: {plan.num_requests} requests, {mode}"
        table = results_table(title, summary)
        table.caption = args.url
        console.print(table)
        if args.json:
            console.print(f"wrote {args.json}")
    return 0 if not failed else 1


def add_bench_serve_parser(bench: argparse.ArgumentParser) -> None:
    """`hycache bench serve ...`: an optional sub-command of `bench` (plain `hycache bench`
    still runs the comparison benchmark)."""
    targets = bench.add_subparsers(dest="target", required=False, metavar="{serve}")
    p = targets.add_parser(
        "serve",
        help="load a running OpenAI-style completions server (token-id prompts, streamed)",
        description="Send a workload to POST /v1/completions and report throughput, TTFT / "
        "ITL / E2E latency and cached tokens. Exit status: 0 all requests ok, 1 some failed, "
        "2 a bad command line or an unreachable server.",
    )
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--workload",
        choices=("system-prompt", "family", "multi-turn", "trace"),
        default="system-prompt",
    )
    g = p.add_argument_group(
        "workload sizes",
        "lengths take N or LO:HI; unset flags take small defaults (system-prompt: 32 requests, "
        "512 shared + 64 tokens, 32 out)",
    )
    g.add_argument("--num-requests", type=positive_int, default=None, help="system-prompt")
    g.add_argument("--shared-prefix-tokens", type=int_or_range, default=None)
    g.add_argument("--suffix-tokens", type=int_or_range, default=None)
    g.add_argument(
        "--output-tokens", type=int_or_range, default=None, help="(trace: replaces each)"
    )
    g.add_argument("--families", type=positive_int, default=None, help="family")
    g.add_argument("--requests-per-family", type=int_or_range, default=None, help="family")
    g.add_argument("--sessions", type=positive_int, default=None, help="multi-turn")
    g.add_argument("--turns", type=int_or_range, default=None, help="multi-turn")
    g.add_argument("--user-tokens", type=int_or_range, default=None, help="multi-turn")
    g.add_argument("--system-prompt-tokens", type=int, default=None, help="multi-turn")
    g.add_argument("--trace", default=None, help="Mooncake-format JSONL trace")
    g.add_argument("--trace-block-tokens", type=positive_int, default=512)
    g.add_argument("--limit", type=positive_int, default=None, help="first N trace requests")
    g.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=None,
        help="trace: cut each prompt to its first N tokens (what prompts share is kept)",
    )
    g.add_argument(
        "--vocab-size",
        type=positive_int,
        default=512,
        help="token ids are drawn below this (the server's vocabulary; tiny: 512)",
    )
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("load")
    g.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="closed loop: requests (multi-turn: sessions) in flight (default 8); with "
        "--request-rate, a cap on those in flight",
    )
    g.add_argument(
        "--request-rate",
        type=positive_float,
        default=None,
        help="open loop: seeded Poisson arrivals at R requests/s (multi-turn: sessions/s)",
    )
    g.add_argument(
        "--prefix-hint",
        action="store_true",
        help="send prefix_hints (where the shared prefix ends) with each request",
    )
    g.add_argument("--api-key", default=None, help="sent as an Authorization: Bearer header")
    g.add_argument("--model", default=None, help="the `model` field to send (default: none)")
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly the output length asked for",
    )
    g.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        help="seconds to connect, and for each read of a stream",
    )
    g.add_argument(
        "--request-timeout",
        type=positive_float,
        default=180.0,
        metavar="S",
        help="seconds a whole request may take; one that takes longer (a server streaming for "
        "ever) is cut and counted as a failure",
    )
    g.add_argument("--json", default=None, help="write inputs, summary and per-request lines")
    g.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=cmd_bench_serve)


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `bench` sub-parser, with `bench serve` under it."""
    p = sub.add_parser("bench", help="every arm side by side: CPU engine and simulated")
    p.add_argument("--json", default=BENCH_JSON, help="write results here")
    p.add_argument("--plot", default="out/bench.png", help="write a PNG plot here")
    p.add_argument("--quick", action="store_true", help="smaller workloads (a smoke test)")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-simulated", action="store_true")
    p.add_argument("--skip-curves", action="store_true", help="no ratio curves")
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes for the simulations (default: up to 2; the engine part runs alone)",
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
    add_checkpoint_flags(g)  # every arm but the `-split` ones, which turn them off
    g.add_argument(
        "--eviction-curves",
        action="store_true",
        help="instead: token hit rate and TTFT p95 over 1/8..1x of the cache memory, lru "
        "against flop-aware, on the family, multi-turn and trace workloads (writes "
        "out/eviction.json and out/eviction.png unless --json / --plot name other files)",
    )
    from hycache.cli_calibrate import add_validate_flags

    add_validate_flags(p)
    p.set_defaults(func=cmd_bench)
    add_bench_serve_parser(p)
