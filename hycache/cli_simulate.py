"""`hycache simulate` and `hycache trace-gen`: their sub-parsers, and the workload, cost
model and simulated second tier the simulate flags describe (the work is in hycache.sim)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hycache.cache.layout import unsized_num_blocks
from hycache.cli_common import (
    UserError,
    add_cache_flags,
    build_config,
    int_or_range,
    parse_policies,
    positive_int,
    rate_or_auto,
)
from hycache.config import POLICY_NAMES, HycacheConfig
from hycache.report import check_writable, console, jsonl, progress_bar, write_atomic

MAX_INSTANCES = 256  # each simulated instance holds a whole cache of its own
DEFAULT_ROUTING = "round-robin"


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
        pool_layout=args.pool_layout,
    )


def build_tier(args: argparse.Namespace) -> Any:
    """The simulated second tier `--kv-store-gb` / `--kv-store-link` describe (None: none)."""
    from hycache.sim.tier import STORE_LINKS, TierConfig

    if args.instances > MAX_INSTANCES:
        raise UserError(f"--instances: at most {MAX_INSTANCES}, got {args.instances}")
    if args.routing is not None and args.instances < 2:
        raise UserError("--routing: routes between instances; give --instances N (N >= 2)")
    if args.instances > 1 and args.request_rate == "auto":
        raise UserError("--request-rate auto measures one instance; give a rate with --instances")
    if args.kv_store_gb is None:
        return None
    return TierConfig(args.kv_store_gb, STORE_LINKS[args.kv_store_link])  # checks the size


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
    separate = args.pool_layout == "separate"
    if separate and (args.num_blocks is not None or args.cost_model == "none"):
        raise UserError(
            "--pool-layout separate: the pools are sized from the cost model's memory; drop "
            "--num-blocks and use --cost-model roofline"
        )
    cost = build_cost(args)
    max_len = workload.max_tokens_per_request() + args.num_speculative_tokens + 1
    sized = args.num_blocks is None and cost is not None
    num_state_pages = None
    if args.num_blocks is not None:
        num_blocks = args.num_blocks
    elif cost is not None:
        pools = cost.pool_sizes(args.block_size, max_len, layout=args.pool_layout)
        num_blocks, num_state_pages = pools.num_blocks, pools.num_state_pages
    else:
        num_blocks = unsized_num_blocks(max_len, args.block_size, args.max_num_seqs)
    config = build_config(args, policy="replay", max_model_len=max_len, num_blocks=num_blocks)
    if num_state_pages is not None:
        config = replace(config, cache=replace(config.cache, num_state_pages=num_state_pages))
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
            routing=args.routing or DEFAULT_ROUTING,
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
    if separate:  # only then, so that a shared-pool run's output stays as it was
        inputs["pool_layout"] = args.pool_layout
        inputs["num_state_pages"] = num_state_pages  # the drafter arms'; per arm in `policies`
    if scaled:  # only then, so that a plain run's output stays as it was
        inputs["kv_store_gb"] = args.kv_store_gb or 0.0
        inputs["kv_store_link"] = args.kv_store_link if tier is not None else None
        inputs["instances"] = args.instances
        inputs["routing"] = args.routing or DEFAULT_ROUTING
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
            what = f"{args.instances} instance(s), {args.routing or DEFAULT_ROUTING}"
            if tier is not None:
                what += f", {args.kv_store_gb:g} GiB {args.kv_store_link} store"
            console.print(instances_table(what, results))
    return 0


def cmd_trace_gen(args: argparse.Namespace) -> int:
    from hycache.sim.trace_gen import trace_gen

    check_writable(args.out, "--out")
    parent = Path(args.out).parent
    if not parent.is_dir():  # a folder the user did not make is never made for them
        raise UserError(f"--out: cannot write {args.out}: folder {parent} does not exist")
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


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `simulate` sub-parser."""
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
    g.add_argument(
        "--pool-layout",
        choices=("shared", "separate"),  # hycache.sim.costmodel.POOL_LAYOUTS
        default="shared",
        help="shared: one pool of max(attention block, SSM state) pages (vLLM's layout); "
        "separate: attention blocks and SSM pages in pools of their own, the memory split in "
        "the proportion one max-length request uses (the engine's default)",
    )
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
        default=None,
        help="store capacity in GiB (> 0), objects counted at their modelled size (default: no "
        "store)",
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
        help=f"simulated engines, each its own cache and clock, sharing the store (at most "
        f"{MAX_INSTANCES})",
    )
    g.add_argument(
        "--routing",
        choices=("round-robin", "prefix-aware"),
        default=None,
        help="with --instances: round-robin (the default), or prefix-aware: the instance "
        "holding the longest prefix (ties: least loaded)",
    )
    p.set_defaults(func=cmd_simulate)


def add_trace_gen_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `trace-gen` sub-parser."""
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
