"""Eviction under memory pressure: token hit rate and TTFT p95 over 1/8, 1/4, 1/2 and 1x of the
default cache memory, `lru` against `flop-aware`, for `limit` (and `lookahead` for reference),
on the family, multi-turn and trace workloads of `hycache bench` (bamba-9b on an H200, B=4416,
u=64, k=3, concurrency 64). Writes a JSON and a PNG; the same as `hycache bench
--eviction-curves`.

    .venv/bin/python benchmarks/bench_eviction.py [--json out/eviction.json]
        [--plot out/eviction.png] [--alpha A] [--jobs N] [--quick] [--pool-layout separate]
        [--workloads family,trace] [--arms limit:lru,limit:flop-aware] [--no-admission]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from hycache.bench.eviction import EvictionBench, eviction_curves, plot_eviction, quick
from hycache.cli.tables import console, eviction_table
from hycache.config import DEFAULT_EVICTION_ALPHA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="out/eviction.json")
    ap.add_argument("--plot", default="out/eviction.png")
    ap.add_argument("--alpha", type=float, default=DEFAULT_EVICTION_ALPHA)
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    ap.add_argument("--quick", action="store_true", help="a smoke test")
    ap.add_argument("--pool-layout", choices=("shared", "separate"), default="shared")
    ap.add_argument("--workloads", default=None, help="comma-separated subset")
    ap.add_argument(
        "--arms",
        default=None,
        help="comma-separated POLICY:EVICTION pairs (default: limit and lookahead, both ways)",
    )
    ap.add_argument(
        "--no-admission", action="store_true", help="keep every state (CacheConfig.admission)"
    )
    args = ap.parse_args()
    b = EvictionBench(alpha=args.alpha, pool_layout=args.pool_layout)
    if args.quick:
        b = quick(b)
    if args.workloads:
        b = replace(b, workloads=tuple(args.workloads.split(",")))
    if args.arms:
        arms = tuple(tuple(a.split(":", 1)) for a in args.arms.split(","))
        b = replace(b, arms=arms)  # type: ignore[arg-type]
    if args.no_admission:
        b = replace(b, sim=replace(b.sim, admission=False))
    result = eviction_curves(b, lambda m: console.print(m, highlight=False), workers=args.jobs)
    doc = result.to_json()
    console.print(eviction_table(doc))
    console.print(json.dumps(doc["goal"], indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    plot_eviction(args.plot, doc)
    console.print(f"wrote {args.json} and {args.plot}; wall time {doc['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
