"""How much the machine's drift moves a measured `limit/lookahead` ratio: the two policies run
one after the other (each in a fresh process, as `--validate --no-interleave` does), and
stepped in turn in one process (`--validate`'s default, `hycache.bench.closed_loop`), each
repeat doing both, side by side.

    .venv/bin/python benchmarks/bench_interleave.py [--workload multi-turn] [--repeats 4]

Prints each repeat's output tok/s and ratio both ways, then the spread of the ratios. No
simulator and no calibration: only the engine's own measurement is compared.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from hycache.bench.validate import WORKLOADS, ValidateOptions, engine_runs, run_isolated


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=WORKLOADS, default="multi-turn")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = p.parse_args(argv)
    o = ValidateOptions(profile="unused.json")
    ratios: dict[str, list[float]] = {"one after the other": [], "in turn": []}
    for rep in range(args.repeats):
        order = ("lookahead", "limit") if rep % 2 == 0 else ("limit", "lookahead")
        alone = {
            policy: run_isolated(engine_runs, o, args.workload, (policy,), args.clock)[0].metrics
            for policy in order
        }
        both = run_isolated(engine_runs, o, args.workload, order, args.clock)
        together = {policy: run.metrics for policy, run in zip(order, both, strict=True)}
        row = []
        for mode, m in (("one after the other", alone), ("in turn", together)):
            look, lim = m["lookahead"].output_tokens_per_s, m["limit"].output_tokens_per_s
            r = lim / look
            ratios[mode].append(r)
            row.append(f"{mode}: {look:.1f} / {lim:.1f} tok/s, {r:.3f}")
        print(f"repeat {rep + 1}/{args.repeats} · " + " · ".join(row), flush=True)
    for mode, rs in ratios.items():
        spread = statistics.pstdev(rs) if len(rs) > 1 else 0.0
        print(f"{mode:>20}: ratio median {statistics.median(rs):.3f}, "
              f"range {min(rs):.3f}-{max(rs):.3f}, sd {spread:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
