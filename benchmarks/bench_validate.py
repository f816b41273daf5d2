"""The simulator, validated, in one command: calibrate the cost model on the CPU engine in
rounds between the engine's runs, then predict those runs with it.

    .venv/bin/python benchmarks/bench_validate.py [--clock wall|cpu] [--repeats 3] \
        [--engine-repeats 3] [--round-every 1] [--threads 1] [--out-dir out]

It is `hycache bench --validate OUT/cpu-profile.json --recalibrate --engine-repeats N
--round-every R --json OUT/validate.json --raw OUT/validate-raw.pkl`: before every R-th
engine repeat a calibration round (`hycache calibrate`'s grid, `--repeats` per shape, four
times that per decode shape) is measured, so that the calibration and the runs it predicts
see the machine in the same states; the rounds are pooled (per shape, the median of the
rounds), fitted and written to OUT/cpu-profile.json. Each workload is then predicted twice:
with the probes' fit alone, and with the probes and the other workloads' engine steps fitted
(never its own). Each repeat runs the two policies' engines in one process, one step each
in turn, each timed on its own clock (`hycache.bench.closed_loop`), so the measured ratio
sees the machine in the same states. Seeded: the same shapes, prompts and policy order in
every run. `--clock cpu` times the process CPU time instead of the wall clock (for a
machine that takes time from the process; here CPU time moved with the wall clock, the
drift is the machine's speed). About 4 minutes per round and 1.2 minutes per engine repeat
on one core (`--engine-repeats 8 --round-every 2`: about 24 minutes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hycache.cli.main import main as hycache


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--repeats", type=int, default=3, help="calibration repeats per shape a round")
    p.add_argument("--engine-repeats", type=int, default=3, help="engine repeats")
    p.add_argument(
        "--round-every", type=int, default=1, help="a calibration round every N engine repeats"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (both parts)")
    p.add_argument("--out-dir", default="out")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return hycache(
        ["bench", "--validate", str(out / "cpu-profile.json"), "--recalibrate",
         "--calibration-repeats", str(args.repeats), "--engine-repeats", str(args.engine_repeats),
         "--round-every", str(args.round_every),
         "--json", str(out / "validate.json"), "--clock", args.clock, "--threads",
         str(args.threads), "--raw", str(out / "validate-raw.pkl")]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
