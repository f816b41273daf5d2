"""`hycache bench vllm`: the vLLM plugin priced on vLLM's real pass structure
(hycache.bench.vllm.priced): its flags, the run they describe and the command."""

from __future__ import annotations

import argparse
import json
import math

from hycache.cli.args import UserError, add_flag, positive_float, positive_int
from hycache.cli.tables import console, progress_reporter, vllm_draws_table, vllm_priced_table
from hycache.files import check_writable, write_atomic


def bench_from_cli_args(args: argparse.Namespace) -> object:
    """The `PricedBench` the flags describe (validated)."""
    from hycache.bench.vllm.priced import WORKLOADS, PricedBench, quick

    workloads = tuple(args.workload) if args.workload else WORKLOADS
    bench = PricedBench(
        model=args.model,
        gpu=args.gpu,
        block_size=args.block_size,
        unit=args.prefix_match_unit,
        num_speculative_tokens=args.num_speculative_tokens,
        acceptance_rate=args.acceptance_rate,
        budget=args.max_num_batched_tokens,
        workloads=workloads,
        seed=args.seed,
        price=args.price,
        only_arms=tuple(args.arm or ()),
        request_rate=args.request_rate or math.inf,
    )
    if args.quick:
        bench = quick(bench)
    if args.concurrency:
        from dataclasses import replace

        bench = replace(bench, concurrency=tuple(args.concurrency))
    if bench.b % bench.unit:
        raise UserError(f"--prefix-match-unit {bench.unit} must divide the block size {bench.b}")
    return bench


def cmd_bench_vllm(args: argparse.Namespace) -> int:
    from hycache.bench.vllm.reference import available

    if not available():
        raise UserError("hycache bench vllm: vllm is not installed here; `make setup` installs it")
    from hycache.bench.vllm.priced import PricedBench, run, run_draws

    check_writable(args.json, "--json")
    bench = bench_from_cli_args(args)
    assert isinstance(bench, PricedBench)
    many = args.draws > 1
    with progress_reporter("vllm priced") as progress:
        doc = run_draws(bench, args.draws, progress) if many else run(bench, progress)
    console.print(vllm_draws_table(doc) if many else vllm_priced_table(doc))
    if args.json:
        write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def add_bench_vllm_parser(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hycache bench vllm ...`: a sub-command of `bench`."""
    from hycache.bench.vllm.priced import ARMS, CONCURRENCY, MODELS, WORKLOADS

    p = targets.add_parser(
        "vllm",
        help="the vLLM plugin priced: vLLM's real scheduler, each step costed by the simulator",
        description="Drive vLLM's real scheduler (the installed 0.33 or 0.34) closed-loop on the "
        "bench workloads, one arm at a time (stock vLLM, stock with its junction flag, "
        "hycache.vllm.Scheduler), and cost every step it schedules with the simulator's cost "
        "model: output tok/s, TTFT p50/p95, prefill passes per request, prefill tokens. The "
        "workloads are the simulator's shapes with fewer requests (a few minutes per model on "
        "two cores).",
    )
    p.add_argument("--model", choices=tuple(MODELS), default="nemotron-h-8b",
                   help="the cost preset; vLLM's KV cache config and block size follow it")
    p.add_argument("--gpu", default=None,
                   help="GPU preset (default: h200; b200 for qwen3-next-80b-a3b, whose weights "
                   "do not fit an h200)")
    add_flag(p, "--block-size", None)
    add_flag(p, "--prefix-match-unit", 64)
    add_flag(p, "--num-speculative-tokens", 1)
    p.add_argument("--acceptance-rate", type=float, default=0.7,
                   help="drafts that verify, on average")
    add_flag(p, "--max-num-batched-tokens")
    p.add_argument("--concurrency", type=positive_int, nargs="+", default=None,
                   help=f"closed-loop concurrencies (default: {' '.join(map(str, CONCURRENCY))})")
    p.add_argument("--request-rate", type=positive_float, default=None,
                   help="the first requests (a chat's sessions) arrive at this Poisson rate per "
                   "second, admitted while fewer than the concurrency are in flight, TTFT "
                   "counted from admission, as `vllm bench serve --request-rate R "
                   "--max-concurrency C` (default: all at once)")
    p.add_argument("--workload", choices=WORKLOADS, action="append", default=None,
                   help="repeat for several (default: all three)")
    p.add_argument("--arm", choices=ARMS, action="append", default=None,
                   help="repeat for several (default: every arm; stock+flag needs a drafter); "
                   "the ratios need stock and plugin")
    add_flag(p, "--seed")
    p.add_argument("--draws", type=positive_int, default=1,
                   help="run the workload draws --seed, --seed + 1, ... (this many) and print, "
                   "per cell, plugin / stock as the median (min-max) over them and how many "
                   "meet the bar (>= 0.99x output tok/s, <= 1.01x TTFT p50)")
    p.add_argument("--price", choices=("model", "default"), default="model",
                   help="what prices the plugin's stops: the cost model the steps are priced "
                   "with (a deployment's --additional-config price), or its default (a pass = "
                   "96 prefill tokens)")
    p.add_argument("--quick", action="store_true",
                   help="small workloads, concurrency 1 and 4 (a smoke test)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_vllm)  # fmt: skip
