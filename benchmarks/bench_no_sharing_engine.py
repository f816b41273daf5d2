"""What prefix caching costs on the CPU engine when nothing is shared: `limit` (the default)
beside `no-caching` (prefix caching off, the drafter on), `tiny` + EAGLE k=2, B=552, u=8, random
prompts, alternating repeats on one engine process (`hycache.bench.suite.engine_bench` with the
`none` shape, smaller than `hycache bench --engine-shape none` so that it runs in minutes).

    .venv/bin/python benchmarks/bench_no_sharing_engine.py [--requests 8] [--prompt 1024]
        [--output 32] [--repeats 3] [--threads 1] [--json out/no_sharing_engine.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hycache.bench.suite import EngineBench, engine_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="out/no_sharing_engine.json")
    args = ap.parse_args()
    b = EngineBench(
        shape="none",
        shared_prefix_tokens=args.prompt - 8,
        suffix_tokens=8,
        output_tokens=args.output,
        num_requests=args.requests,
        concurrency=args.requests,
        repeats=args.repeats,
        threads=args.threads,
    )
    doc = engine_bench(b, ("limit", "no-caching"), lambda m: print(m, flush=True))
    for name, res in doc["policies"].items():
        print(
            f"{name:12s} output tok/s {res['output_tokens_per_s']:8.2f}  "
            f"TTFT p50 {res['ttft_p50_s']:.3f} s  p95 {res['ttft_p95_s']:.3f} s"
        )
    print("limit / no-caching:", json.dumps(doc.get("caching_overhead")))
    print("per repeat (output tok/s):", json.dumps(doc["runs"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
