"""`hycache bench serve`: load a running completions server (hycache.bench.loadgen): its flags,
the typed run they describe (`BenchServeArgs`) and the command."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from hycache.bench.loadgen import SERVE_SHAPES
from hycache.cli.args import (
    BENCH_ONLY_DEFAULTS,
    UserError,
    add_flag,
    add_size_flags,
    add_trace_flags,
    namespace_values,
    positive_float,
    positive_int,
    prefix_hints,
    sizes_from_cli_args,
)
from hycache.cli.tables import console, err_console, progress_bar, results_table
from hycache.files import check_writable, write_atomic


@dataclass(frozen=True)
class BenchServeArgs:
    """A `bench serve` run, validated: what to send (`plan`), how (`options`), and the
    inputs the results document reports."""

    plan: Any  # hycache.bench.loadgen.Plan
    options: Any  # hycache.bench.loadgen.RunOptions
    inputs: dict[str, Any]
    json: str | None
    quiet: bool

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> BenchServeArgs:
        from hycache.bench.loadgen import RunOptions, build_plan
        from hycache.sim.build import TraceSource

        given = [k for k, v in BENCH_ONLY_DEFAULTS.items() if getattr(args, k, v) != v]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UserError(f"{flag}: a flag of `hycache bench`, not of `hycache bench serve`")
        check_writable(args.json, "--json")
        if args.max_prompt_tokens is not None and args.workload != "trace":
            raise UserError("--max-prompt-tokens: only for --workload trace")
        hints = prefix_hints(args.prefix_hint)
        if hints and args.workload == "trace":
            raise UserError("--prefix-hint: a trace names no shared prefix; use another workload")
        trace = None
        if args.trace is not None:
            trace = TraceSource(args.trace, block_tokens=args.trace_block_tokens, limit=args.limit)
        plan = build_plan(
            args.workload,
            sizes_from_cli_args(args),
            seed=args.seed,
            vocab=args.vocab_size,
            hints=hints,
            trace=trace,
            max_prompt_tokens=args.max_prompt_tokens,
        )
        if not plan.num_requests:
            raise UserError("the workload has no requests")
        replay = args.workload == "trace" and args.request_rate is None and args.concurrency is None
        same_names = ("url", "concurrency", "request_rate", "api_key", "model", "ignore_eos",
                      "seed")  # fmt: skip
        opts = RunOptions(
            replay_timestamps=replay,
            prefix_hint=bool(hints),
            timeout_s=args.timeout,
            request_timeout_s=args.request_timeout,
            **namespace_values(args, *same_names),
        )
        inputs = {
            "url": args.url,
            "workload": plan.workload,
            "num_requests": plan.num_requests,
            "sessions": len(plan.sessions) or None,
            "mode": run_mode(opts, bool(plan.sessions)),
            "concurrency": args.concurrency,
            "request_rate": args.request_rate,
            "prefix_hint": hints.summary(),
            "ignore_eos": args.ignore_eos,
            "vocab_size": args.vocab_size,
            "model": args.model,
            "request_timeout_s": args.request_timeout,
            "seed": args.seed,
        }
        return cls(plan, opts, inputs, args.json, args.quiet)


def run_mode(opts: Any, sessions: bool) -> str:
    """How the load is offered, in words."""
    if opts.request_rate is not None:
        mode = f"open loop at {opts.request_rate:g} {'sessions' if sessions else 'requests'}/s"
        if opts.concurrency:
            mode += f", at most {opts.concurrency} in flight"
        return mode
    if opts.replay_timestamps:
        return "open loop at the trace's timestamps"
    return f"concurrency {opts.concurrency or 8}"


def report_failures(results: list[Any]) -> list[Any]:
    """Print the first ten failed requests on stderr; the failed ones."""
    failed = [r for r in results if not r.ok]
    for r in failed[:10]:
        where = f" (session {r.session}, turn {r.turn})" if r.session is not None else ""
        err_console.print(
            Text(f"request {r.index}{where} failed: {r.error}"), highlight=False, soft_wrap=True
        )
    if len(failed) > 10:
        err_console.print(f"... and {len(failed) - 10} more failed requests", highlight=False)
    return failed


def cmd_bench_serve(args: argparse.Namespace) -> int:
    """`hycache bench serve`: load a running completions server (hycache.bench.loadgen)."""
    from hycache.bench.loadgen import LoadgenError, run_bench, summarize

    a = BenchServeArgs.from_cli_args(args)
    plan = a.plan
    with progress_bar(disable=a.quiet) as progress:
        task = progress.add_task(f"{plan.workload} requests", total=plan.num_requests)
        try:
            results, duration = run_bench(
                plan, a.options, on_done=lambda _r: progress.advance(task)
            )
        except LoadgenError as exc:  # unreachable before the run: one line, however wide
            progress.stop()
            err_console.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
            return 2
    summary = summarize(results, duration)
    failed = report_failures(results)
    if a.json:
        doc = {"inputs": a.inputs, "summary": summary, "requests": [r.line() for r in results]}
        write_atomic(a.json, json.dumps(doc, indent=2) + "\n")
    if not a.quiet:
        title = f"{plan.workload}: {plan.num_requests} requests, {a.inputs['mode']}"
        table = results_table(title, summary)
        table.caption = a.options.url
        console.print(table)
        if a.json:
            console.print(f"wrote {a.json}")
    return 0 if not failed else 1


def add_bench_serve_parser(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hycache bench serve ...`: an optional sub-command of `bench` (plain `hycache bench`
    still runs the comparison benchmark)."""
    p = targets.add_parser(
        "serve",
        help="load a running OpenAI-style completions server (token-id prompts, streamed)",
        description="Send a workload to POST /v1/completions and report throughput, TTFT / "
        "ITL / E2E latency and cached tokens. Exit status: 0 all requests ok, 1 some failed, "
        "2 a bad command line or an unreachable server.",
    )
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    add_flag(p, "--workload", "system-prompt")
    add_sizes_flags(p)
    add_load_flags(p)
    p.set_defaults(func=cmd_bench_serve)


def add_sizes_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "workload sizes",
        "lengths take N or LO:HI; unset flags take small defaults (system-prompt: 32 requests, "
        "512 shared + 64 tokens, 32 out)",
    )
    names = ("--num-requests", "--shared-prefix-tokens", "--suffix-tokens", "--output-tokens",
             "--families", "--requests-per-family", "--sessions", "--turns", "--user-tokens",
             "--system-prompt-tokens")  # fmt: skip
    add_size_flags(g, SERVE_SHAPES, names, {"--output-tokens": "(trace: replaces each)"})
    add_trace_flags(g)
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
    add_flag(g, "--seed")


def add_load_flags(p: argparse.ArgumentParser) -> None:
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
    add_flag(g, "--prefix-hint")  # sent as each request's prefix_hints
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
