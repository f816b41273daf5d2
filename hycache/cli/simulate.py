"""`hycache simulate`: its flags, the typed run they describe (`SimulateArgs`) and the command
(the workload, config, cost model and tier are built by hycache.sim.build, run by
hycache.sim.compare)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from hycache.cli.args import (
    CacheArgs,
    UserError,
    add_cache_flags,
    add_flag,
    add_sim_scheduler_flags,
    add_size_flags,
    add_trace_flags,
    check_store_gb,
    namespace_values,
    parse_policies,
    positive_int,
    prefix_hints,
    rate_or_auto,
    sizes_from_cli_args,
)
from hycache.cli.tables import console, instances_table, policy_table, progress_bar
from hycache.config import POLICY_NAMES, HycacheConfig
from hycache.files import check_writable, jsonl, write_atomic
from hycache.sim.build import (
    DEFAULT_SHAPES,
    TraceSource,
    WorkloadSpec,
    build_config,
    build_cost,
    build_tier,
    build_workload,
    open_loop,
    sim_pools,
)
from hycache.sim.cluster import ROUTINGS
from hycache.sim.costmodel import CostModel
from hycache.sim.tier import TierConfig
from hycache.sim.workloads import Workload

SIZE_FLAGS = ("--shared-prefix-tokens", "--suffix-tokens", "--output-tokens", "--num-requests",
              "--families", "--requests-per-family", "--sessions", "--turns", "--user-tokens",
              "--system-prompt-tokens")  # fmt: skip
MAX_INSTANCES = 256  # each simulated instance holds a whole cache of its own
DEFAULT_ROUTING = "round-robin"


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """The workload the flags describe; unset flags take the workload's shape defaults
    (`SystemPromptShape`, `FamilyShape`, `ChatShape` in hycache.sim.workloads)."""
    kind = args.workload or ("trace" if args.trace else "system-prompt")
    if args.trace and kind != "trace":
        raise UserError(f"--trace replays a trace; it does not go with --workload {kind}")
    hints = prefix_hints(args.prefix_hint)
    if args.closed_loop and kind != "trace":
        raise UserError(f"--closed-loop: only a trace has timestamps to ignore ({kind} is closed)")
    if args.closed_loop and args.request_rate is not None:
        raise UserError("--closed-loop and --request-rate: choose one")
    if kind == "multi-turn" and args.request_rate is not None:
        raise UserError(
            "--request-rate: multi-turn sessions are closed loop (each turn follows the last)"
        )
    if args.request_rate is not None and args.sequential:
        raise UserError("--request-rate: open-loop arrivals do not go with --sequential")
    closed = kind != "trace" or args.closed_loop
    loop = {
        "concurrency": (args.concurrency or 64) if closed else args.concurrency,
        "sequential": args.sequential and not args.closed_loop,
        "seed": args.seed,
        "hints": hints,
    }
    if kind == "trace":
        # prompts are expanded as the simulator admits each request (a 12k-request trace
        # holds 135M prompt tokens)
        trace = TraceSource(args.trace, block_tokens=args.trace_block_tokens, limit=args.limit)
        return WorkloadSpec(kind, trace=trace, **loop)
    return WorkloadSpec(kind, sizes_from_cli_args(args).applied(DEFAULT_SHAPES[kind]), **loop)


@dataclass(frozen=True)
class SimulateArgs:
    """A `simulate` run, validated: its cache, workload, arms, costs, tier and outputs."""

    cache: CacheArgs
    workload: WorkloadSpec
    closed_loop: bool
    request_rate: float | str | None
    load: float
    policies: list[str]
    cost_model: str
    model: str
    gpu: str
    pool_layout: Any
    tier: TierConfig | None
    kv_store_gb: float
    kv_store_link: str
    instances: int
    routing: str | None
    json: str | None
    plot: str | None
    quiet: bool

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> SimulateArgs:
        if not 0 < args.load <= 1.5:
            raise UserError(f"--load: must lie in (0, 1.5], got {args.load}")
        if args.instances > MAX_INSTANCES:
            raise UserError(f"--instances: at most {MAX_INSTANCES}, got {args.instances}")
        if args.routing is not None and args.instances < 2:
            raise UserError("--routing: routes between instances; give --instances N (N >= 2)")
        if args.instances > 1 and args.request_rate == "auto":
            raise UserError(
                "--request-rate auto measures one instance; give a rate with --instances"
            )
        gb = check_store_gb(args.kv_store_gb)
        tier = build_tier(gb, args.kv_store_link)
        check_writable(args.json, "--json")
        check_writable(args.plot, "--plot")
        same_names = ("closed_loop", "request_rate", "load", "cost_model", "pool_layout",
                      "kv_store_link", "instances", "routing", "json", "plot", "quiet")  # fmt: skip
        return cls(
            cache=CacheArgs.from_cli_args(args),
            policies=parse_policies(args.compare, args.policy),
            workload=workload_spec(args),
            model=args.model_config or args.model,
            gpu=args.gpu_config or args.gpu,
            tier=tier,
            kv_store_gb=gb,
            **namespace_values(args, *same_names),
        )

    @property
    def scaled(self) -> bool:
        """A second tier or several instances (their inputs and table are reported)."""
        return self.tier is not None or self.instances > 1

    def cost(self) -> CostModel | None:
        if self.cost_model == "none":
            return None
        g = self.cache.geometry
        return build_cost(
            self.model,
            self.gpu,
            num_speculative_tokens=g.num_speculative_tokens,
            block_size=g.knobs.block_size,
            pool_layout=self.pool_layout,
        )


def load_workload(a: SimulateArgs) -> Workload:
    """The workload, refused when empty; a `--closed-loop` trace without its timestamps."""
    workload = build_workload(a.workload)
    if a.closed_loop:
        from hycache.sim.load import closed_loop

        workload.requests = closed_loop(workload.requests)
    if not workload.size:
        raise UserError("the workload has no requests")
    return workload


@dataclass(frozen=True)
class Pools:
    """The drafter arms' cache: its size, and whether `compare_policies` sizes each arm's."""

    config: HycacheConfig
    num_blocks: int
    num_state_pages: int | None
    sized: bool


def size_pools(a: SimulateArgs, workload: Workload, cost: CostModel | None) -> Pools:
    g = a.cache.geometry
    max_len = workload.max_tokens_per_request() + a.cache.drafts + 1
    num_blocks, pages = a.cache.num_blocks, None
    if num_blocks is None:
        num_blocks, pages = sim_pools(
            cost,
            block_size=g.knobs.block_size,
            max_model_len=max_len,
            pool_layout=a.pool_layout,
            max_num_seqs=g.max_num_seqs,
        )
    config = build_config(
        g, policy="replay", max_model_len=max_len, num_blocks=num_blocks, num_state_pages=pages
    )
    sized = a.cache.num_blocks is None and cost is not None
    return Pools(config, num_blocks, pages, sized)


def run(a: SimulateArgs, workload: Workload, pools: Pools, cost: CostModel | None) -> Any:
    """Every arm on the workload (a progress bar on stderr); (results, offered load)."""
    from hycache.sim.compare import compare_policies

    with progress_bar(disable=a.quiet or workload.size < 50) as progress:
        offered = None
        if a.request_rate is not None:
            offered = open_loop(
                workload,
                a.request_rate,
                config=pools.config,
                cost=cost,
                load=a.load,
                seed=a.workload.seed,
                size_cache=pools.sized,
            ).as_dict()
        tasks = {
            p: progress.add_task(f"{workload.name} · {p}", total=workload.size) for p in a.policies
        }
        results = compare_policies(
            workload,
            pools.config,
            a.policies,
            cost=cost,
            seed=a.workload.seed,
            size_cache=pools.sized,
            on_finish=lambda p, _rec: progress.advance(tasks[p]),
            tier=a.tier,
            instances=a.instances,
            routing=a.routing or DEFAULT_ROUTING,
        )
    return results, offered


def run_inputs(
    a: SimulateArgs, workload: Workload, pools: Pools, offered: Any, cost: CostModel | None
) -> dict[str, Any]:
    """The `inputs` part of the JSON result."""
    g = a.cache.geometry
    inputs = {
        "workload": workload.name,
        "num_requests": workload.size,
        "block_size": g.knobs.block_size,
        "prefix_match_unit": g.knobs.prefix_match_unit,
        "eagle": a.cache.eagle,
        "num_speculative_tokens": g.num_speculative_tokens,
        "acceptance_rate": g.acceptance_rate,
        "num_blocks": pools.num_blocks,  # the drafter arms'; per arm in `policies` when sized
        "cache_sized_per_arm": pools.sized,
        "max_num_batched_tokens": g.max_num_batched_tokens,
        "max_num_seqs": g.max_num_seqs,
        "saturated_chunk_tokens": g.saturated_chunk_tokens,
        "step_packing": g.step_packing,
        "concurrency": workload.concurrency,
        "prefix_hint": a.workload.hints.summary(),
        "offered_load": offered,
        "cost_model": a.cost_model,
        "model": a.model if cost else None,
        "gpu": a.gpu if cost else None,
        "seed": a.workload.seed,
    }
    if a.pool_layout == "separate":  # only then, so that a shared-pool run's output stays
        inputs["pool_layout"] = a.pool_layout
        inputs["num_state_pages"] = pools.num_state_pages  # the drafter arms'; per arm below
    if a.scaled:  # only then, so that a plain run's output stays as it was
        inputs["kv_store_gb"] = a.kv_store_gb
        inputs["kv_store_link"] = a.kv_store_link if a.tier is not None else None
        inputs["instances"] = a.instances
        inputs["routing"] = a.routing or DEFAULT_ROUTING
    return inputs


def write_json(path: str, inputs: dict[str, Any], results: Any, summary: Any) -> None:
    """The results document (.jsonl: one line per request, then each arm's summary)."""
    from hycache.sim.compare import headline, instances_json

    if path.endswith(".jsonl"):
        rows: list[dict[str, Any]] = []
        for name, res in results.items():
            rows.extend({**r.line(), "policy": name} for r in res.records)
            rows.append({"policy": name, "summary": summary[name]})
        write_atomic(path, jsonl(rows))
        return
    doc = {
        "inputs": inputs,
        "policies": summary,
        "headline": headline(summary),
        "requests": {n: [r.line() for r in res.records] for n, res in results.items()},
    }
    if inputs.get("instances", 1) > 1:
        doc["instances"] = instances_json(results)
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


def cmd_simulate(args: argparse.Namespace) -> int:
    from hycache.bench.plots import plot_policies
    from hycache.sim.compare import policies_json

    a = SimulateArgs.from_cli_args(args)
    workload = load_workload(a)
    if a.pool_layout == "separate" and (a.cache.num_blocks is not None or a.cost_model == "none"):
        raise UserError(
            "--pool-layout separate: the pools are sized from the cost model's memory; drop "
            "--num-blocks and use --cost-model roofline"
        )
    cost = a.cost()
    pools = size_pools(a, workload, cost)
    results, offered = run(a, workload, pools, cost)
    summary = policies_json(results)
    if a.json:
        write_json(str(a.json), run_inputs(a, workload, pools, offered, cost), results, summary)
    if a.plot:
        plot_policies(a.plot, f"{workload.name} ({a.cost_model})", summary)
    if not a.quiet:
        title = f"{workload.name}: {workload.size:,} requests"
        if offered is not None:
            title += f", open loop at {offered['request_rate_per_s']:.3g} requests/s"
        console.print(policy_table(title, summary))
        if a.scaled:
            what = f"{a.instances} instance(s), {a.routing or DEFAULT_ROUTING}"
            if a.tier is not None:
                what += f", {a.kv_store_gb:g} GiB {a.kv_store_link} store"
            console.print(instances_table(what, results))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="run a workload through the scheduler and cache")
    add_cache_flags(p)
    add_sim_scheduler_flags(p)
    add_workload_flags(p)
    add_policy_flags(p)
    add_tier_flags(p)
    p.set_defaults(func=cmd_simulate)


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "workload",
        "lengths take N or an inclusive range LO:HI (drawn per use); unset flags take the "
        "workload's defaults",
    )
    add_flag(g, "--workload", None)
    add_trace_flags(g)
    g.add_argument(
        "--closed-loop",
        action="store_true",
        help="trace: ignore the timestamps; keep --concurrency (64) requests in flight",
    )
    add_size_flags(g, DEFAULT_SHAPES, SIZE_FLAGS, {})
    add_flag(g, "--prefix-hint")
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


def add_policy_flags(p: argparse.ArgumentParser) -> None:
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
    add_flag(g, "--seed")
    g.add_argument("--json", default=None, help="write results (.jsonl: per-request lines)")
    g.add_argument("--plot", default=None, help="write a PNG plot")
    g.add_argument("--quiet", action="store_true")


def add_tier_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "second tier and instances",
        "a simulated host/Mooncake store behind the device cache, shared by every instance "
        "(objects counted at their modelled size)",
    )
    add_flag(g, "--kv-store-gb", 0.0)
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
        choices=ROUTINGS,
        default=None,
        help="with --instances: round-robin (the default); prefix-aware: the instance holding "
        "the longest resumable prefix (ties: least loaded); attention-only: the deepest "
        "attention-block match, SSM states unseen (today's KV-aware routers). The scoring "
        "routers' predicted hit is reported beside the actual one",
    )
