"""The simulator, validated, in one command: calibrate the cost model on the CPU engine, then
run the engine and the simulator side by side on the validation workloads.

    .venv/bin/python benchmarks/bench_validate.py [--clock wall|cpu] [--repeats 5] \
        [--engine-repeats 3] [--threads 1] [--out-dir out]

It is `hycache calibrate --out OUT/cpu-profile.json` followed by `hycache bench --validate
OUT/cpu-profile.json --json OUT/validate.json`, with the same clock and torch threads for
both (seeded: the same shapes, prompts and policy order in every run). On a quiet machine use
`--clock wall`; on one shared with other work `--clock cpu` (process CPU time) is steadier.
About 2.5 minutes for the calibration and 1.5 minutes per engine repeat on one core.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hycache.cli.main import main as hycache


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--repeats", type=int, default=5, help="calibration repeats per shape")
    p.add_argument("--engine-repeats", type=int, default=3, help="validation repeats")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both parts)")
    p.add_argument("--out-dir", default="out")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profile = str(out / "cpu-profile.json")
    common = ["--clock", args.clock, "--threads", str(args.threads)]
    rc = hycache(["calibrate", "--out", profile, "--repeats", str(args.repeats), *common])
    if rc:
        return rc
    return hycache(
        ["bench", "--validate", profile, "--engine-repeats", str(args.engine_repeats),
         "--json", str(out / "validate.json"), *common]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
