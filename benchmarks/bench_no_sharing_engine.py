"""What prefix caching costs on the CPU engine when nothing is shared: `limit` (the default)
beside `no-caching` (prefix caching off, the drafter on), `tiny` + EAGLE k=2, B=552, u=8, random
prompts, alternating repeats on one engine process (`hycache.bench.suite.engine_bench` with the
`none` shape, smaller than `hycache bench --engine-shape none` so that it runs in minutes).

Every figure is given twice: on the wall clock, and on the engine thread's CPU clock
(`time.thread_time`; torch on one thread, so the model runs on that thread): output tokens per
CPU second, TTFT in CPU seconds of the engine loop, the run's CPU seconds. On a shared machine
the wall clock also counts the other processes; the CPU clock counts this engine's own work.
The ratios are per repeat (the two arms run back to back, order alternating), then their median.

    .venv/bin/python benchmarks/bench_no_sharing_engine.py [--requests 8] [--prompt 1024]
        [--output 32] [--repeats 3] [--threads 1] [--num-blocks N]
        [--json out/no_sharing_engine.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from hycache.bench.results import PER_REPEAT_KEYS
from hycache.bench.suite import EngineBench, engine_bench


def paired(doc: dict[str, Any]) -> dict[str, Any]:
    """`limit / no-caching` per repeat (the two runs of a repeat ran back to back), per figure,
    and the median over repeats."""
    out: dict[str, Any] = {}
    wall = doc["runs"]
    cpu = doc["per_repeat"]
    series = {
        "output_tokens_per_s": (wall["limit"], wall["no-caching"]),
        **{k: (cpu["limit"][k], cpu["no-caching"][k]) for k in PER_REPEAT_KEYS},
    }
    for key, (on, off) in series.items():
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        out[key] = {
            "per_repeat": [round(r, 3) for r in ratios],
            "median": statistics.median(ratios),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--num-blocks", type=int, default=None, help="None: the engine's 1 GiB")
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
        num_blocks=args.num_blocks,
    )
    doc = engine_bench(b, ("limit", "no-caching"), lambda m: print(m, flush=True)).to_json()
    for name, res in doc["policies"].items():
        print(
            f"{name:12s} wall: output tok/s {res['output_tokens_per_s']:8.2f}  "
            f"TTFT p50 {res['ttft_p50_s']:.3f} s  p95 {res['ttft_p95_s']:.3f} s\n"
            f"{'':12s} CPU:  output tok/CPU-s {res['output_tokens_per_cpu_s']:8.2f}  "
            f"TTFT p50 {res['ttft_cpu_p50_s']:.3f} s  p95 {res['ttft_cpu_p95_s']:.3f} s  "
            f"engine {res['engine_cpu_s']:.2f} CPU-s in {res['engine_steps']} steps"
        )
    print("limit / no-caching (of the medians):", json.dumps(doc.get("caching_overhead")))
    doc["paired"] = paired(doc)
    print("limit / no-caching per repeat, and their median:", json.dumps(doc["paired"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
