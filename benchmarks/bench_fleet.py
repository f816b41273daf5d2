"""A fleet of hycache engines behind NVIDIA Dynamo, routed four ways, side by side.

    .venv/bin/python benchmarks/bench_fleet.py [--workers 4] [--workloads family multi-turn trace]
        [--concurrency 4] [--json out/bench_fleet.json]

Per workload, one fresh fleet per arm (`hycache.fleet.launch.Fleet`, everything on 127.0.0.1,
cold caches), the arms' order rotated from one workload to the next:

    kv           Dynamo's KV router fed hycache's `resumable` events (blocks of the unit u)
    exact        hycache's router: every worker's own resume point, plus load
    attention    Dynamo's KV router fed vLLM-style per-group events (`full`, blocks of B):
                 Dynamo drops the SSM group, as for any vLLM hybrid today
    round-robin  Dynamo's

The requests are `hycache bench serve`'s (`hycache.bench.loadgen`: the simulator's workload
builder at a small model's size; the trace is `generate_mooncake_like`'s, prompts cut to
`--trace-prompt-tokens`), streamed closed loop at `--concurrency`. Reported per arm: the hit
tokens (`usage.prompt_tokens_details.cached_tokens`, summed), TTFT p50 / p95, output tok/s,
and the hit the router predicted for its choices (summed; from the frontend's log, overlap
blocks x block size, or hycache's router's log) beside the hit the engines reported.

Ratios against round-robin are what to read: the engines share two CPU cores here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hycache.bench import loadgen
from hycache.bench.loadgen import RunOptions, build_plan, run_bench, summarize
from hycache.fleet.card import token_name
from hycache.fleet.launch import Fleet, FleetSpec, dynamo_missing
from hycache.sim.build import TraceSource, WorkloadSizes
from hycache.sim.trace_gen import generate_mooncake_like

UNIT, BLOCK = 16, 64


@dataclass(frozen=True)
class Arm:
    name: str
    routing: str
    events: str
    router_block: int  # the frontend's --kv-cache-block-size


ARMS = (
    Arm("kv", "kv", "resumable", UNIT),
    Arm("exact", "exact", "none", UNIT),
    Arm("attention", "kv", "full", BLOCK),
    Arm("round-robin", "round-robin", "none", UNIT),
)

_TOKEN = re.compile(r"<t(\d+)>")


def _with_token_ids(take: Any) -> Any:
    """Dynamo's frontend streams text only; the preset card's tokenizer spells token i as
    `<ti>` (`hycache.fleet.card.token_name`), so the ids come back exactly from the text
    (multi-turn sends them back as the next turn's prompt)."""
    assert token_name(7) == "<t7>"

    def take_chunk(chunk: dict[str, Any], res: Any, st: Any) -> None:
        for choice in chunk.get("choices") or []:
            if choice.get("token_ids") is None and choice.get("text") is not None:
                choice["token_ids"] = [int(t) for t in _TOKEN.findall(choice["text"])]
        take(chunk, res, st)

    return take_chunk


def plan_of(workload: str, args: argparse.Namespace) -> loadgen.Plan:
    if workload == "trace":
        records = generate_mooncake_like(args.trace_requests, seed=args.seed)
        return build_plan(
            "trace",
            WorkloadSizes(output_tokens=16),
            seed=args.seed,
            trace=TraceSource(records=records),
            max_prompt_tokens=args.trace_prompt_tokens,
        )
    return build_plan(workload, seed=args.seed)


def run_arm(arm: Arm, workload: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    engine = ("--model", "tiny", "--block-size", str(BLOCK), "--prefix-match-unit", str(UNIT),
              "--num-speculative-tokens", "2", "--num-blocks", str(args.num_blocks),
              "--max-model-len", "2048")  # fmt: skip
    spec = FleetSpec(
        workers=args.workers,
        routing=arm.routing,
        events=arm.events,
        unit=arm.router_block,
        engine_args=engine,
    )
    with Fleet(spec, workdir / f"{workload}-{arm.name}", timeout=600.0) as fleet:
        opts = RunOptions(url=fleet.url, concurrency=args.concurrency, model="tiny")
        results, duration = run_bench(plan_of(workload, args), opts)
        decisions = fleet.decisions()
    summary = summarize(results, duration)
    hit = sum(r.cached_tokens or 0 for r in results if r.ok)
    return {
        "arm": arm.name,
        "workload": workload,
        "ok": summary["ok"],
        "failed": summary["failed"],
        "hit_tokens": hit,
        "prompt_tokens": summary["prompt_tokens"],
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p95_ms": summary["ttft_ms"]["p95"],
        "output_tok_s": summary["output_throughput_tok_per_s"],
        "predicted_hit_tokens": sum(d.predicted for d in decisions.values()),
        "routed": len(decisions),
        "errors": summary["errors"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| workload | arm | hit tokens | vs round-robin | TTFT p50 ms | vs rr | TTFT p95 ms "
            "| output tok/s | router predicted hit | engines' hit |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        rr = next(x for x in rows if x["workload"] == r["workload"] and x["arm"] == "round-robin")
        hit_x = r["hit_tokens"] / rr["hit_tokens"] if rr["hit_tokens"] else float("inf")
        ttft_x = (r["ttft_p50_ms"] or 0) / (rr["ttft_p50_ms"] or 1)
        pred = "" if r["arm"] == "round-robin" else f"{r['predicted_hit_tokens']:,}"
        lines.append(
            f"| {r['workload']} | {r['arm']} | {r['hit_tokens']:,} | {hit_x:.2f}x "
            f"| {r['ttft_p50_ms']:.1f} | {ttft_x:.2f}x | {r['ttft_p95_ms']:.1f} "
            f"| {r['output_tok_s']:.1f} | {pred} | {r['hit_tokens']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--workloads", nargs="+", default=["family", "multi-turn", "trace"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-blocks", type=int, default=256, help="each worker's attention blocks")
    p.add_argument("--trace-requests", type=int, default=48)
    p.add_argument("--trace-prompt-tokens", type=int, default=768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    why = dynamo_missing()
    if why is not None:
        print(f"bench_fleet: {why}", file=sys.stderr)
        return 2
    loadgen._take_chunk = _with_token_ids(loadgen._take_chunk)  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for w, workload in enumerate(args.workloads):
            order = ARMS[w % len(ARMS) :] + ARMS[: w % len(ARMS)]  # rotated per workload
            for arm in order:
                row = run_arm(arm, workload, args, Path(tmp))
                print(json.dumps(row), flush=True)
                rows.append(row)
    rows.sort(
        key=lambda r: (args.workloads.index(r["workload"]), [a.name for a in ARMS].index(r["arm"]))
    )
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
