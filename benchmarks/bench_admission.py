"""The default against the split arms, with admission: `limit`, `limit-split` and
`lookahead-split` (and `limit --no-admission`) side by side on `hycache bench`'s simulated
workloads (bamba-9b on an H200, B=4416, u=64, k=3, concurrency 64), at the whole pool and at
fractions of it. Token hit rate, output tokens/s, TTFT p50/p95 per arm, and whether `limit` is
at least every split arm on each (docs/admission.md).

    .venv/bin/python benchmarks/bench_admission.py [--workloads system-prompt,family,multi-turn]
        [--fractions 1,0.25] [--json out/admission.json]

The trace rows come from `hycache simulate --trace ...` (see docs/admission.md): the bench's
own trace is replayed at 75% of a measured capacity, which costs a run of its own.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hycache.bench.suite import SimBench, bench_workload, sim_config, sim_cost
from hycache.sim.compare import compare_policies, policies_json

ARMS = ("limit", "limit-split", "lookahead-split")
KEYS = ("token_hit_rate", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s")
HIGHER = {"token_hit_rate": True, "output_tokens_per_s": True}


def run(workload: str, fraction: float, admission: bool, s: SimBench) -> dict[str, Any]:
    s = replace(s, knobs=s.knobs.replace(admission=admission))
    cost = sim_cost(s)
    w = bench_workload(s, workload)
    cfg = sim_config(s, w, cost)
    sized = fraction == 1.0
    if not sized:
        pools = cost.pool_sizes(
            s.knobs.block_size, cfg.cache.max_model_len, layout=cost.pool_layout
        )
        blocks = max(int(pools.num_blocks * fraction), cfg.cache.min_blocks() + 1)
        cfg = replace(cfg, cache=replace(cfg.cache, num_blocks=blocks))
    arms = ARMS if admission else ("limit",)
    res = compare_policies(w, cfg, arms, cost=cost, seed=s.seed, size_cache=sized)
    return policies_json(res)


def verdict(row: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Per metric: `limit` at least as good as every split arm (ties within 0.5%)."""
    out = {}
    for k in KEYS:
        a = row["limit"][k]
        others = [row[n][k] for n in ARMS[1:]]
        if HIGHER.get(k):
            out[k] = all(a >= 0.995 * o for o in others)
        else:
            out[k] = all(a <= 1.005 * o for o in others)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="system-prompt,family,multi-turn")
    ap.add_argument("--fractions", default="1,0.25")
    ap.add_argument("--json", default="out/admission.json")
    args = ap.parse_args()
    s = SimBench()
    doc: dict[str, Any] = {"rows": []}
    t0 = time.perf_counter()
    for name in args.workloads.split(","):
        for f in (float(x) for x in args.fractions.split(",")):
            row = run(name, f, True, s)
            row["limit --no-admission"] = run(name, f, False, s)["limit"]
            v = verdict(row)
            doc["rows"].append({"workload": name, "fraction": f, "arms": row, "limit_best": v})
            print(f"\n{name} at {f:g} of the pool  (limit >= every split arm: {v})")
            print("arm".ljust(22) + "".join(k.rjust(22) for k in KEYS))
            for arm, summary in row.items():
                print(arm.ljust(22) + "".join(f"{summary[k]:22.4g}" for k in KEYS))
    doc["wall_s"] = time.perf_counter() - t0
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.json}; wall time {doc['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
