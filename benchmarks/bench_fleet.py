"""A fleet of hycache engines behind NVIDIA Dynamo, routed four ways, side by side, repeated.

    .venv/bin/python benchmarks/bench_fleet.py [--workloads family multi-turn trace]
        [--repeats 3] [--policy limit] [--arms kv exact attention round-robin kv-no-load]
        [--json out/bench_fleet.json]

Per workload and repeat, one fresh fleet per arm (`hycache.fleet.launch.Fleet`, everything on
127.0.0.1, cold caches), the arms' order rotated from one repeat (and workload) to the next:

    kv           Dynamo's KV router fed hycache's `resumable` events (blocks of the unit u)
    exact        hycache's router: the resume point of the workers its event view names
                 (`hycache fleet router --view events`), plus load
    attention    Dynamo's KV router fed vLLM-style per-group events (`full`, blocks of B):
                 Dynamo drops the SSM group, as for any vLLM hybrid today
    round-robin  Dynamo's
    kv-no-load   (on request, `--arms`) `kv` with Dynamo's load term off
                 (`--no-router-track-active-blocks`): overlap alone

The setting (4 workers, B, u, k, pool, sizes: long shared prefixes, short suffixes and outputs,
so that prefill is what TTFT measures) is `hycache.fleet.bench_setting`'s, which
`benchmarks/bench_fleet_sim.py --predict --like-bench-fleet` simulates. The requests are
`hycache bench serve`'s (`hycache.bench.loadgen`), streamed closed loop at the setting's
concurrency.

Reported per run and arm: hit tokens (`usage.prompt_tokens_details.cached_tokens`, summed),
TTFT p50 / p95, output tok/s, and per request the hit the router predicted for its choice
(Dynamo's frontend log: overlap blocks x block size; hycache's router's log) beside the hit
the engine reported: summed, and the tokens predicted beyond the hit (`overstated`, summed
over the requests that got less than predicted). Over the repeats: each figure's median with
its min-max, and each arm's per-repeat ratio to round-robin (`hycache.bench.repeats`: ranked
only when every repeat is on the same side of 1).

Ratios against round-robin are what to read: the engines share the machine's CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hycache.bench import loadgen
from hycache.bench.loadgen import RunOptions, build_plan, run_bench, summarize
from hycache.bench.repeats import arm_order, ratio_spread, spread
from hycache.fleet import bench_setting as setting
from hycache.fleet.launch import Fleet, FleetSpec, dynamo_missing, request_key
from hycache.sim.build import TraceSource, WorkloadSizes
from hycache.sim.trace_gen import generate_mooncake_like


@dataclass(frozen=True)
class Arm:
    name: str
    routing: str
    events: str
    router_block: int  # the frontend's --kv-cache-block-size
    frontend_args: tuple[str, ...] = ()


ARMS = (
    Arm("kv", "kv", "resumable", setting.UNIT),
    Arm("exact", "exact", "resumable", setting.UNIT),
    Arm("attention", "kv", "full", setting.BLOCK),
    Arm("round-robin", "round-robin", "none", setting.UNIT),
)
# on request (`--arms`): `kv` without Dynamo's load term (it counts the blocks each worker is
# computing and sends a request elsewhere when its prefix's worker is busy)
EXTRA_ARMS = (
    Arm("kv-no-load", "kv", "resumable", setting.UNIT, ("--no-router-track-active-blocks",)),
)
ARM_NAMES = tuple(a.name for a in ARMS)
ALL_ARMS = ARMS + EXTRA_ARMS

# Dynamo 1.6.1's frontend returns each chunk's token ids when asked: `nvext.extra_fields`
# `["completion_token_ids"]` puts them in the chunk's `nvext.completion_token_ids`
TOKEN_IDS = {"extra_fields": ["completion_token_ids"]}


class Responses:
    """Wraps `hycache.bench.loadgen`'s request body and chunk reader: each request asks Dynamo's
    frontend for its token ids (`TOKEN_IDS`), which become the chunk's `token_ids` (the
    multi-turn client sends them back as the next turn's prompt: token ids in, token ids out,
    no text round trip); each request's response id is kept (to find the router's decision for
    it)."""

    def __init__(self, body: Any, take: Any) -> None:
        self.body, self.take = body, take
        self.ids: dict[int, str] = {}  # by the request's index (unique in a plan)

    def make_body(self, *args: Any) -> Any:
        return {**self.body(*args), "nvext": TOKEN_IDS}

    def take_chunk(self, chunk: dict[str, Any], res: Any, st: Any) -> None:
        if chunk.get("id"):
            self.ids[res.index] = str(chunk["id"])
        ids = (chunk.get("nvext") or {}).get("completion_token_ids")
        for choice in chunk.get("choices") or []:
            if choice.get("token_ids") is None and ids is not None:
                choice["token_ids"] = [int(t) for t in ids]
        self.take(chunk, res, st)


def plan_of(workload: str, seed: int) -> loadgen.Plan:
    if workload == "trace":
        t = setting.TRACE
        return build_plan(
            "trace",
            WorkloadSizes(output_tokens=t.output_tokens),
            seed=seed,
            trace=TraceSource(records=generate_mooncake_like(t.requests, seed=seed)),
            max_prompt_tokens=t.prompt_tokens,
        )
    return build_plan(workload, WorkloadSizes(**setting.SIZES[workload]), seed=seed)


def run_arm(
    arm: Arm, workload: str, args: argparse.Namespace, workdir: Path, responses: Responses
) -> dict[str, Any]:
    spec = FleetSpec(
        workers=args.workers,
        routing=arm.routing,
        events=arm.events,
        unit=arm.router_block,
        engine_args=setting.engine_args(args.policy),
        frontend_args=arm.frontend_args,
    )
    responses.ids.clear()
    with Fleet(spec, workdir, timeout=600.0) as fleet:
        opts = RunOptions(url=fleet.url, concurrency=args.concurrency, model="tiny")
        results, duration = run_bench(plan_of(workload, args.seed), opts)
        decisions = fleet.decisions()
    summary = summarize(results, duration)
    predicted = actual = over = over_requests = matched = 0
    for r in results:
        rid = responses.ids.get(r.index)
        d = decisions.get(request_key(rid)) if rid else None
        if not r.ok or d is None or r.cached_tokens is None:
            continue
        matched += 1
        predicted += d.predicted
        actual += r.cached_tokens
        if d.predicted > r.cached_tokens:
            over += d.predicted - r.cached_tokens
            over_requests += 1
    return {
        "arm": arm.name,
        "workload": workload,
        "ok": summary["ok"],
        "failed": summary["failed"],
        "hit_tokens": sum(r.cached_tokens or 0 for r in results if r.ok),
        "prompt_tokens": summary["prompt_tokens"],
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p95_ms": summary["ttft_ms"]["p95"],
        "output_tok_s": summary["output_throughput_tok_per_s"],
        "routed": matched,  # requests with the router's decision found
        "predicted_hit_tokens": predicted,
        "routed_hit_tokens": actual,
        "overstated_hit_tokens": over,
        "overstated_requests": over_requests,
        "errors": summary["errors"],
    }


def _fmt(s: dict[str, float], pattern: str) -> str:
    return f"{pattern.format(s['median'])} ({pattern.format(s['min'])}-{pattern.format(s['max'])})"


def _ratio(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    text = f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
    return text if r["rankable"] else text + " unranked"


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, arm): medians with min-max over the repeats, ratios to round-robin per
    repeat, and the router's predictions summed over every repeat."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == w]
        rr = sorted((r for r in mine if r["arm"] == "round-robin"), key=lambda r: r["repeat"])
        for arm in (a.name for a in ALL_ARMS):
            runs = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["repeat"])
            if not runs:
                continue
            paired = len(rr) == len(runs)
            agg: dict[str, Any] = {"workload": w, "arm": arm, "repeats": len(runs)}
            for key in ("hit_tokens", "ttft_p50_ms", "ttft_p95_ms", "output_tok_s"):
                agg[key] = spread([float(r[key] or 0) for r in runs])
                if paired and arm != "round-robin":
                    agg[key + "_vs_rr"] = ratio_spread(
                        [float(r[key] or 0) for r in runs], [float(x[key] or 0) for x in rr]
                    )
            for key in ("predicted_hit_tokens", "routed_hit_tokens", "overstated_hit_tokens",
                        "overstated_requests", "routed", "failed"):  # fmt: skip
                agg[key] = sum(r[key] for r in runs)
            out.append(agg)
    return out


def tables(agg: list[dict[str, Any]]) -> str:
    """The docs' two tables: timings and hits against round-robin; predicted against got."""
    a = ["| workload | arm | hit tokens | hit vs rr | TTFT p50 ms | TTFT p50 vs rr "
         "| TTFT p95 ms | output tok/s |", "|" + "---|" * 8]  # fmt: skip
    b = ["| workload | arm | requests routed | router predicted hit | engines' hit "
         "| overstated tokens (requests) |", "|" + "---|" * 6]  # fmt: skip
    for x in agg:
        a.append(
            f"| {x['workload']} | {x['arm']} | {_fmt(x['hit_tokens'], '{:,.0f}')} "
            f"| {_ratio(x.get('hit_tokens_vs_rr'))} | {_fmt(x['ttft_p50_ms'], '{:.0f}')} "
            f"| {_ratio(x.get('ttft_p50_ms_vs_rr'))} | {_fmt(x['ttft_p95_ms'], '{:.0f}')} "
            f"| {_fmt(x['output_tok_s'], '{:.1f}')} |"
        )
        if x["arm"] != "round-robin":
            b.append(
                f"| {x['workload']} | {x['arm']} | {x['routed']} "
                f"| {x['predicted_hit_tokens']:,} | {x['routed_hit_tokens']:,} "
                f"| {x['overstated_hit_tokens']:,} ({x['overstated_requests']}) |"
            )
    return "\n".join(a) + "\n\n" + "\n".join(b)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=setting.WORKERS)
    p.add_argument("--workloads", nargs="+", default=list(setting.WORKLOADS),
                   choices=setting.WORKLOADS)  # fmt: skip
    p.add_argument("--arms", nargs="+", default=list(ARM_NAMES),
                   choices=[a.name for a in ALL_ARMS])  # fmt: skip
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policy", default="limit", help="the engines' policy (vLLM's: lookahead)")
    p.add_argument("--concurrency", type=int, default=setting.CONCURRENCY)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    why = dynamo_missing()
    if why is not None:
        print(f"bench_fleet: {why}", file=sys.stderr)
        return 2
    arms = tuple(a for a in ALL_ARMS if a.name in args.arms)
    responses = Responses(loadgen._body, loadgen._take_chunk)  # type: ignore[attr-defined]
    loadgen._body = responses.make_body  # type: ignore[attr-defined]
    loadgen._take_chunk = responses.take_chunk  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for w, workload in enumerate(args.workloads):
            for rep in range(args.repeats):
                for arm in arm_order(rep, w, arms):
                    workdir = Path(tmp) / f"{workload}-{rep}-{arm.name}"
                    row = run_arm(arm, workload, args, workdir, responses)
                    row |= {"repeat": rep, "load_average": load_average()}
                    loads.append(row["load_average"])
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    agg = aggregate(rows)
    print(f"policy {args.policy}; load average (1, 5, 15 min) after each run: {loads}")
    print(tables(agg))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {"args": vars(args), "runs": rows, "aggregate": agg}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
