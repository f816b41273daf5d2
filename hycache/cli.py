"""The `hycache` command line: explain | simulate | trace-gen | bench [serve] | generate | serve.

This file parses arguments and prints; the work lives in the modules it calls.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rich.text import Text

from hycache.config import (
    POLICY_NAMES,
    CacheConfig,
    GroupKind,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.report import (
    check_writable,
    console,
    err_console,
    jsonl,
    progress_bar,
    progress_reporter,
    write_atomic,
)


class UserError(Exception):
    """A bad command line or input file: printed as one line, exit status 2."""


def add_cache_flags(p: argparse.ArgumentParser, *, block_size: int = 4416, unit: int = 64) -> None:
    g = p.add_argument_group("cache")
    g.add_argument("--block-size", type=int, default=block_size, help="tokens per block B")
    g.add_argument(
        "--prefix-match-unit", type=int, default=unit, help="prefix-match unit u (divides B)"
    )
    g.add_argument(
        "--eagle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speculative decoding with an EAGLE drafter (the EAGLE drop)",
    )
    g.add_argument("--num-speculative-tokens", type=int, default=3, help="drafts per step k")
    g.add_argument("--acceptance-rate", type=float, default=0.7, help="per-draft acceptance")
    g.add_argument("--retention", default="semantic", help="semantic | dense | interval tokens")
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--num-blocks", type=int, default=None, help="cache blocks (default: sized)")
    g.add_argument("--hash-seed", type=int, default=0)


def build_config(
    args: argparse.Namespace, *, policy: str, max_model_len: int, num_blocks: int
) -> HycacheConfig:
    k = args.num_speculative_tokens if args.eagle else 0
    return HycacheConfig(
        CacheConfig(
            block_size=args.block_size,
            prefix_match_unit=args.prefix_match_unit,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            policy=policy,
            retention=args.retention,
            hash_seed=args.hash_seed,
            groups=(GroupKind.ATTENTION, GroupKind.SSM),
        ),
        SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=args.acceptance_rate),
        SchedulerConfig(args.max_num_batched_tokens, args.max_num_seqs),
    )


def parse_policies(args: argparse.Namespace) -> list[str]:
    """The arms to run: `--compare a,b,c` (policies, or `eagle-off`), else `--policy`."""
    from hycache.sim.compare import parse_arms

    flag = "--compare" if args.compare else "--policy"
    try:
        return list(parse_arms(args.compare or args.policy))
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def positive_int(text: str) -> int:
    """argparse type for a count that must be >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_or_range(text: str) -> int | tuple[int, int]:
    """argparse type for `N` or `LO:HI` (a bad value exits with status 2 and says why)."""
    from hycache.sim.workloads import parse_int_or_range

    try:
        return parse_int_or_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_or_auto(text: str) -> float | str:
    """argparse type for `--request-rate`: requests/s (> 0) or `auto`."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected requests/s (a number > 0) or 'auto', got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


# -- explain ---------------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from hycache.explain import ExplainInputs, explain
    from hycache.report import explain_table

    inputs = ExplainInputs(
        block_size=args.block_size,
        prefix_match_unit=args.prefix_match_unit,
        eagle=args.eagle,
        prompt_tokens=args.prompt_tokens,
        shared_prefix=args.shared_prefix,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_hints=tuple(args.prefix_hint or ()),
    )
    policies = (args.policy,) if args.policy else POLICY_NAMES
    # validate the geometry through the config before running anything
    build_config(args, policy=policies[0], max_model_len=args.prompt_tokens + 8, num_blocks=10**6)
    result = explain(inputs, tuple(policies))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(explain_table(result))
    return 0


# -- simulate --------------------------------------------------------------------------------------


def _fixed(value: Any, flag: str) -> int:
    if isinstance(value, tuple):
        raise UserError(f"{flag}: the system-prompt workload needs one length, not a range")
    return int(value)


def build_workload(args: argparse.Namespace) -> Any:
    """The workload the flags describe; unset flags take the workload's shape defaults
    (`SystemPromptShape`, `FamilyShape`, `ChatShape` in hycache.sim.workloads)."""
    from hycache.sim.compare import Workload
    from hycache.sim.trace import lazy_mooncake_trace
    from hycache.sim.workloads import ChatShape, FamilyShape, SystemPromptShape

    kind = args.workload or ("trace" if args.trace else "system-prompt")
    if args.trace and kind != "trace":
        raise UserError(f"--trace replays a trace; it does not go with --workload {kind}")
    if args.prefix_hint and kind == "trace":
        raise UserError("--prefix-hint: a trace names no shared prefix; use another workload")
    if args.closed_loop and kind != "trace":
        raise UserError(f"--closed-loop: only a trace has timestamps to ignore ({kind} is closed)")

    if kind == "trace":
        if not args.trace:
            raise UserError("--workload trace needs --trace FILE.jsonl")
        # prompts are expanded as the simulator admits each request (a 12k-request trace
        # holds 135M prompt tokens)
        reqs = lazy_mooncake_trace(
            args.trace, args.trace_block_tokens, seed=args.seed, limit=args.limit
        )
        if args.closed_loop:
            from hycache.sim.load import closed_loop

            if args.request_rate is not None:
                raise UserError("--closed-loop and --request-rate: choose one")
            return Workload("trace", closed_loop(reqs), concurrency=args.concurrency or 64)
        return Workload("trace", reqs, concurrency=args.concurrency, sequential=args.sequential)
    closed = {"concurrency": args.concurrency or 64, "sequential": args.sequential}
    if kind == "system-prompt":
        shape = _shape(args, SystemPromptShape(), "num_requests", "suffix_tokens", "output_tokens")
        if args.shared_prefix_tokens is not None:
            p = _fixed(args.shared_prefix_tokens, "--shared-prefix-tokens")
            shape = replace(shape, shared_prefix_tokens=p)
        return Workload(kind, shape.build(args.seed, args.prefix_hint), **closed)
    if kind == "family":
        fields = ("families", "requests_per_family", "shared_prefix_tokens", "suffix_tokens")
        shape = _shape(args, FamilyShape(), *fields, "output_tokens")
        return Workload(kind, shape.build(args.seed, args.prefix_hint), **closed)
    if args.request_rate is not None:
        raise UserError(
            "--request-rate: multi-turn sessions are closed loop (each turn follows the last)"
        )
    fields = ("sessions", "turns", "user_tokens", "output_tokens", "system_prompt_tokens")
    shape = _shape(args, ChatShape(), *fields)
    return Workload(kind, sessions=shape.build(args.seed, args.prefix_hint), **closed)


def _shape(args: argparse.Namespace, shape: Any, *fields: str) -> Any:
    """`shape` with the fields the flags set (unset flags keep the shape's defaults)."""
    return replace(shape, **{f: getattr(args, f) for f in fields if getattr(args, f) is not None})


def apply_request_rate(
    args: argparse.Namespace, workload: Any, config: HycacheConfig, cost: Any, sized: bool
) -> dict[str, Any] | None:
    """Open-loop arrivals for `--request-rate`: a rate, or `auto` (`--load` times what the
    `lookahead` arm sustains closed loop on this stream). Returns what was applied."""
    from hycache.sim.load import OfferedLoad, at_rate, sustainable_arrivals

    if args.request_rate is None:
        return None
    if args.sequential:
        raise UserError("--request-rate: open-loop arrivals do not go with --sequential")
    if args.request_rate == "auto":
        reqs, offered = sustainable_arrivals(
            workload.requests, config, cost, load=args.load, seed=args.seed, size_cache=sized
        )
    else:
        reqs, scale = at_rate(workload.requests, float(args.request_rate), seed=args.seed)
        offered = OfferedLoad(None, None, float(args.request_rate), scale)
    workload.requests = reqs
    workload.concurrency = None
    return offered.as_dict()


def build_cost(args: argparse.Namespace) -> Any:
    if args.cost_model == "none":
        return None
    from hycache.sim.costmodel import CostModel
    from hycache.sim.presets import load_gpu, load_model_spec

    model = load_model_spec(args.model_config or args.model)
    gpu = load_gpu(args.gpu_config or args.gpu)
    k = args.num_speculative_tokens if args.eagle else 0
    return CostModel(
        model,
        gpu,
        speculative=k > 0,
        num_speculative_tokens=k,
        block_size=args.block_size,
    )


def build_tier(args: argparse.Namespace) -> Any:
    """The simulated second tier `--kv-store-gb` / `--kv-store-link` describe (None: none)."""
    from hycache.sim.tier import STORE_LINKS, TierConfig

    if not 0 <= args.kv_store_gb < math.inf:
        raise UserError(f"--kv-store-gb: must be a finite number >= 0, got {args.kv_store_gb}")
    if args.instances > 1 and args.request_rate == "auto":
        raise UserError("--request-rate auto measures one instance; give a rate with --instances")
    if not args.kv_store_gb:
        return None
    return TierConfig(args.kv_store_gb, STORE_LINKS[args.kv_store_link])


def cmd_simulate(args: argparse.Namespace) -> int:
    from hycache.report import plot_policies, policy_table
    from hycache.sim.compare import (
        compare_policies,
        headline,
        instances_json,
        instances_table,
        policies_json,
    )

    if not 0 < args.load <= 1.5:
        raise UserError(f"--load: must lie in (0, 1.5], got {args.load}")
    tier = build_tier(args)
    scaled = tier is not None or args.instances > 1
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    policies = parse_policies(args)
    workload = build_workload(args)
    if not workload.size:
        raise UserError("the workload has no requests")
    cost = build_cost(args)
    max_len = workload.max_tokens_per_request() + args.num_speculative_tokens + 1
    sized = args.num_blocks is None and cost is not None
    if args.num_blocks is not None:
        num_blocks = args.num_blocks
    elif cost is not None:
        num_blocks = cost.num_blocks(args.block_size)
    else:
        per_req = -(-max_len // args.block_size) + 4
        num_blocks = max(args.max_num_seqs, 1) * per_req * 2 + 16
    config = build_config(args, policy="replay", max_model_len=max_len, num_blocks=num_blocks)
    with progress_bar(disable=args.quiet or workload.size < 50) as progress:
        offered = apply_request_rate(args, workload, config, cost, sized)
        tasks = {
            p: progress.add_task(f"{workload.name} · {p}", total=workload.size) for p in policies
        }
        results = compare_policies(
            workload,
            config,
            policies,
            cost=cost,
            seed=args.seed,
            size_cache=sized,
            on_finish=lambda p, _rec: progress.advance(tasks[p]),
            tier=tier,
            instances=args.instances,
            routing=args.routing,
        )
    summary = policies_json(results)
    inputs = {
        "workload": workload.name,
        "num_requests": workload.size,
        "block_size": args.block_size,
        "prefix_match_unit": args.prefix_match_unit,
        "eagle": args.eagle,
        "num_speculative_tokens": args.num_speculative_tokens if args.eagle else 0,
        "acceptance_rate": args.acceptance_rate,
        "num_blocks": num_blocks,  # the drafter arms'; per arm in `policies` when sized
        "cache_sized_per_arm": sized,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "concurrency": workload.concurrency,
        "prefix_hint": args.prefix_hint,
        "offered_load": offered,
        "cost_model": args.cost_model,
        "model": args.model_config or args.model if cost else None,
        "gpu": args.gpu_config or args.gpu if cost else None,
        "seed": args.seed,
    }
    if scaled:  # only then, so that a plain run's output stays as it was
        inputs["kv_store_gb"] = args.kv_store_gb
        inputs["kv_store_link"] = args.kv_store_link if tier is not None else None
        inputs["instances"] = args.instances
        inputs["routing"] = args.routing
    if args.json:
        if str(args.json).endswith(".jsonl"):
            rows: list[dict[str, Any]] = []
            for name, res in results.items():
                rows.extend({**r.line(), "policy": name} for r in res.records)
                rows.append({"policy": name, "summary": summary[name]})
            write_atomic(args.json, jsonl(rows))
        else:
            doc = {
                "inputs": inputs,
                "policies": summary,
                "headline": headline(summary),
                "requests": {n: [r.line() for r in res.records] for n, res in results.items()},
            }
            if args.instances > 1:
                doc["instances"] = instances_json(results)
            write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
    if args.plot:
        plot_policies(args.plot, f"{workload.name} ({args.cost_model})", summary)
    if not args.quiet:
        title = f"{workload.name}: {workload.size:,} requests"
        if offered is not None:
            title += f", open loop at {offered['request_rate_per_s']:.3g} requests/s"
        console.print(policy_table(title, summary))
        if scaled:
            what = f"{args.instances} instance(s), {args.routing}"
            if tier is not None:
                what += f", {args.kv_store_gb:g} GiB {args.kv_store_link} store"
            console.print(instances_table(what, results))
    return 0


def cmd_trace_gen(args: argparse.Namespace) -> int:
    from hycache.sim.trace import trace_gen

    check_writable(args.out, "--out")
    if args.turn_gap_s is not None and not args.turn_gap_s > 0:
        raise UserError(f"--turn-gap-s: must be > 0, got {args.turn_gap_s}")
    if args.system_prompts < 0:
        raise UserError(f"--system-prompts: must be >= 0, got {args.system_prompts}")
    stats = trace_gen(
        args.out,
        args.num_requests,
        args.seed,
        args.block_tokens,
        args.turn_gap_s,
        args.system_prompts,
    )
    print(json.dumps(stats, indent=2))
    return 0


# -- the second cache tier (generate, serve, bench) ------------------------------------------------

DEFAULT_KV_STORE_GB = 4.0


def add_store_args(p: argparse.ArgumentParser) -> None:
    """`--kv-store` and `--kv-store-gb`: a second cache tier behind the device pool."""
    g = p.add_argument_group("second cache tier")
    g.add_argument(
        "--kv-store",
        default=None,
        metavar="host|mooncake://HOST:PORT",
        help="a store behind the device cache: host (this process's RAM) or a Mooncake master "
        "shared with other processes (default: none)",
    )
    g.add_argument(
        "--kv-store-gb",
        type=float,
        default=DEFAULT_KV_STORE_GB,
        help="GiB of this process's memory the store gets (a number > 0)",
    )


def check_store_args(args: argparse.Namespace) -> None:
    """Refuse a bad `--kv-store` / `--kv-store-gb` before any model loads, with the messages
    `open_store` would give (a ValueError: one line, exit status 2)."""
    gb = args.kv_store_gb
    if not 0 < gb < float("inf"):
        raise ValueError(f"kv-store-gb: must be a finite number > 0, got {gb:g}")
    spec = args.kv_store
    if spec is None:
        return
    if spec.startswith("mooncake://"):
        from hycache.store.mooncake import parse_url

        parse_url(spec)
        return
    from hycache.store import open_store

    open_store(spec, gb).close()  # `host` allocates nothing up front; anything else raises


def build_llm(args: argparse.Namespace) -> Any:
    """The engine the flags describe (`hycache.engine.args.llm_from_args`, which attaches the
    second tier of `--kv-store` / `--kv-store-gb` when the namespace has them)."""
    from hycache.engine import args as engine_args

    return engine_args.llm_from_args(args)


# -- generate --------------------------------------------------------------------------------------


def parse_token_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UserError(
            f"--prompt-token-ids: expected comma-separated integers, got {text!r}"
        ) from None


def cmd_generate(args: argparse.Namespace) -> int:
    from hycache.request import SamplingParams

    if (args.prompt is None) == (args.prompt_token_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-token-ids 1,2,3")
    prompt = args.prompt if args.prompt is not None else parse_token_ids(args.prompt_token_ids)
    params = SamplingParams(  # validated before the model loads
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    hints = args.prefix_hint or []
    if any(h < 0 for h in hints):
        raise UserError(f"--prefix-hint: token counts must be >= 0, got {hints}")
    check_store_args(args)
    llm = build_llm(args)
    try:
        (out,) = llm.generate([prompt], params, prefix_hints=hints or None)
    finally:
        if llm.store is not None:
            llm.store.close()
    if args.json:
        print(
            json.dumps(
                {
                    "token_ids": out.token_ids,
                    "text": out.text,
                    "hit_tokens": out.hit_tokens,
                    "store_hit_tokens": out.store_hit_tokens,
                    "finish_reason": out.finish_reason,
                }
            )
        )
    else:
        console.print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
        if llm.store is not None:  # stdout stays the output alone
            err_console.print(
                f"cached tokens: {out.hit_tokens} ({out.store_hit_tokens} from the "
                f"{llm.store.name} store)",
                highlight=False,
            )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from hycache.serve import run_serve

    check_store_args(args)
    return run_serve(args)


# -- bench -----------------------------------------------------------------------------------------


def quick_bench(engine: Any, sim: Any) -> tuple[Any, Any]:
    """`bench --quick`: the same tables and curves at smoke-test size (seconds, not minutes):
    a small engine shape, few simulated requests, two points per curve."""
    from dataclasses import replace

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


def cmd_bench(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from hycache.bench import EngineBench, SimBench, bench
    from hycache.report import curves_table, plot_bench, policy_table

    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    check_store_args(args)
    if args.kv_store is not None and args.skip_engine:
        raise UserError("--kv-store: a second tier is for the engine part; drop --skip-engine")
    engine = None if args.skip_engine else EngineBench()
    sim = None if args.skip_simulated else SimBench()
    if args.quick:
        engine, sim = quick_bench(engine, sim)
    if engine is not None and args.engine_requests:
        engine = replace(engine, num_requests=args.engine_requests)
    if engine is not None and args.engine_repeats:
        engine = replace(engine, repeats=args.engine_repeats)
    if engine is not None and args.kv_store is not None:
        engine = replace(engine, kv_store=args.kv_store, kv_store_gb=args.kv_store_gb)
    if sim is not None and args.trace_requests:
        sim = replace(sim, trace_requests=args.trace_requests)
    with progress_reporter("benchmarking") as progress:
        doc = bench(engine, sim, progress, curves=not args.skip_curves, workers=args.jobs)
    if "engine" in doc:
        e = doc["engine"]["inputs"]
        title = (
            f"CPU engine, tiny + EAGLE (k={e['num_speculative_tokens']}): "
            f"{e['num_requests']} requests, {e['shared_prefix_tokens']:,} shared + "
            f"{e['suffix_tokens']} tokens, B={e['block_size']}, u={e['prefix_match_unit']}, "
            f"concurrency {e['concurrency']}; median of {e['repeats']} alternating repeats"
        )
        if e.get("kv_store"):
            title += f"; second tier {e['kv_store']} ({e['kv_store_gb']:g} GiB per arm)"
        console.print(policy_table(title, doc["engine"]["policies"]))
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


BENCH_ONLY_DEFAULTS: dict[str, Any] = {
    "plot": "out/bench.png",
    "quick": False,
    "skip_engine": False,
    "skip_simulated": False,
    "skip_curves": False,
    "engine_requests": None,
    "engine_repeats": None,
    "trace_requests": None,
    "kv_store": None,
    "kv_store_gb": DEFAULT_KV_STORE_GB,
}


def positive_float(text: str) -> float:
    """argparse type for a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


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
    g.add_argument("--timeout", type=positive_float, default=300.0, help="per request, seconds")
    g.add_argument("--json", default=None, help="write inputs, summary and per-request lines")
    g.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=cmd_bench_serve)


# -- parser ----------------------------------------------------------------------------------------


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's help names its default (sub-commands included)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                show_defaults(sub)
            continue
        default, text = action.default, action.help or ""
        if (
            action.option_strings
            and not any(default is x for x in (None, False, argparse.SUPPRESS))
            and "%(default)" not in text
        ):
            action.help = f"{text} (default: %(default)s)".strip()


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hycache",
        description="Prefix caching for hybrid attention + SSM models under speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("explain", help="where siblings and resends resume, per policy")
    add_cache_flags(p)
    p.add_argument("--prompt-tokens", type=int, required=True, help="producer prompt length T")
    p.add_argument("--shared-prefix", type=int, required=True, help="shared prefix length P")
    p.add_argument("--policy", choices=POLICY_NAMES, default=None, help="one policy (default all)")
    p.add_argument(
        "--prefix-hint",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="every request names N tokens as a shared prefix (repeatable; used by `limit`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("simulate", help="run a workload through the scheduler and cache")
    add_cache_flags(p)
    g = p.add_argument_group(
        "workload",
        "lengths take N or an inclusive range LO:HI (drawn per use); unset flags take the "
        "workload's defaults",
    )
    g.add_argument(
        "--workload", choices=("system-prompt", "family", "multi-turn", "trace"), default=None
    )
    g.add_argument("--trace", help="Mooncake-format JSONL trace")
    g.add_argument("--trace-block-tokens", type=int, default=512, help="tokens per hash id")
    g.add_argument(
        "--limit", type=positive_int, default=None, help="only the first N trace requests"
    )
    g.add_argument(
        "--closed-loop",
        action="store_true",
        help="trace: ignore the timestamps; keep --concurrency (64) requests in flight",
    )
    g.add_argument(
        "--shared-prefix-tokens",
        type=int_or_range,
        default=None,
        help="system-prompt: the shared prefix (57600); family: per family (2000:40000)",
    )
    g.add_argument(
        "--suffix-tokens",
        type=int_or_range,
        default=None,
        help="per request after the shared prefix (system-prompt 6416, family 128:2048)",
    )
    g.add_argument(
        "--output-tokens",
        type=int_or_range,
        default=None,
        help="per request / answer (system-prompt 256, family and multi-turn 64:640)",
    )
    g.add_argument("--num-requests", type=positive_int, default=None, help="system-prompt (256)")
    g.add_argument("--families", type=positive_int, default=None, help="family: families (32)")
    g.add_argument("--requests-per-family", type=int_or_range, default=None, help="family: (4:12)")
    g.add_argument("--sessions", type=positive_int, default=None, help="multi-turn: sessions (64)")
    g.add_argument("--turns", type=int_or_range, default=None, help="multi-turn: (2:10)")
    g.add_argument("--user-tokens", type=int_or_range, default=None, help="multi-turn: (32:1024)")
    g.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=None,
        help="multi-turn: one system prompt shared by every session (3000; 0 for none)",
    )
    g.add_argument(
        "--prefix-hint",
        action="store_true",
        help="requests name where their shared prefix ends (system prompt, family prefix); "
        "used by `limit`",
    )
    g.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="requests in flight (closed loop; default 64, or the trace's own arrival times)",
    )
    g.add_argument("--sequential", action="store_true", help="one request at a time")
    g.add_argument(
        "--request-rate",
        type=rate_or_auto,
        default=None,
        metavar="R|auto",
        help="open loop at R requests/s (a trace keeps its relative spacing, other workloads "
        "get Poisson arrivals); auto: --load times what `lookahead` sustains closed loop",
    )
    g.add_argument(
        "--load",
        type=float,
        default=0.75,
        help="with --request-rate auto: offered load as a fraction of capacity (0.75)",
    )
    g = p.add_argument_group("policies and costs")
    g.add_argument("--policy", default="limit", help=f"one of eagle-off, {', '.join(POLICY_NAMES)}")
    g.add_argument(
        "--compare",
        default=None,
        help="arms side by side, e.g. eagle-off,replay,junction,lookahead,limit (ratios are "
        "taken against lookahead when it is there)",
    )
    g.add_argument("--cost-model", choices=("roofline", "none"), default="roofline")
    g.add_argument("--model", default="bamba-9b", help="model preset")
    g.add_argument("--model-config", default=None, help="model preset file (JSON)")
    g.add_argument("--gpu", default="h200", help="GPU preset")
    g.add_argument("--gpu-config", default=None, help="GPU preset file (JSON)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", default=None, help="write results (.jsonl: per-request lines)")
    g.add_argument("--plot", default=None, help="write a PNG plot")
    g.add_argument("--quiet", action="store_true")
    g = p.add_argument_group(
        "second tier and instances",
        "a simulated host/Mooncake store behind the device cache, shared by every instance",
    )
    g.add_argument(
        "--kv-store-gb",
        type=float,
        default=0.0,
        help="store capacity in GiB, objects counted at their modelled size (0: no store)",
    )
    g.add_argument(
        "--kv-store-link",
        choices=("host", "rdma"),
        default="host",
        help="load bandwidth and latency: host DRAM over PCIe, or Mooncake over RDMA",
    )
    g.add_argument(
        "--instances",
        type=positive_int,
        default=1,
        help="simulated engines, each its own cache and clock, sharing the store",
    )
    g.add_argument(
        "--routing",
        choices=("round-robin", "prefix-aware"),
        default="round-robin",
        help="prefix-aware: the instance holding the longest prefix (ties: least loaded)",
    )
    p.set_defaults(func=cmd_simulate)

    from hycache.engine.args import add_engine_args

    p = sub.add_parser("generate", help="generate tokens with a hybrid model")
    add_engine_args(p)
    add_store_args(p)
    p.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json)")
    p.add_argument("--prompt-token-ids", default=None, help="prompt as token ids: 1,2,3")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument(
        "--prefix-hint",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="token count where a shared prefix of the prompt ends (repeatable; used by limit)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="every arm side by side: CPU engine and simulated")
    p.add_argument("--json", default="out/bench.json", help="write results here")
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
        "--engine-repeats", type=positive_int, default=None, help="alternating repeats (3)"
    )
    p.add_argument("--trace-requests", type=positive_int, default=None)
    add_store_args(p)  # the engine part's arms: each its own store of this kind
    p.set_defaults(func=cmd_bench)
    add_bench_serve_parser(p)

    from hycache.engine.args import add_serve_args

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-style completions)")
    add_serve_args(p)
    add_store_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("trace-gen", help="generate a Mooncake-like conversation trace")
    p.add_argument("--out", required=True)
    p.add_argument("--num-requests", type=positive_int, default=12_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-tokens", type=int, default=512)
    p.add_argument(
        "--turn-gap-s",
        type=float,
        default=None,
        help="median seconds between a conversation's turns (Mooncake's trace: ~120; "
        "default: no gap, a turn may follow at once)",
    )
    p.add_argument(
        "--system-prompts",
        type=int,
        default=64,
        help="shared system prompts new conversations start behind (0: sharing only within "
        "conversations)",
    )
    p.set_defaults(func=cmd_trace_gen)
    show_defaults(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UserError, ValueError, FileNotFoundError, IsADirectoryError) as exc:
        # the message may hold user text (paths): never read it as rich markup
        # one line, also when piped (no wrapping at the console width)
        err_console.print(
            Text.assemble(("error:", "red"), f" {exc}"), highlight=False, soft_wrap=True
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
