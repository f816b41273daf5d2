"""vLLM 0.34's cache-aware admission beside 0.33, stock and with `hycache.vllm.SyncScheduler`.

Run with `PYTHONPATH=$PWD /work/main/.venv/bin/python benchmarks/bench_vllm_admission.py`
(or `.venv/bin/python ...`): it measures the vLLM installed in the venv (0.33.0) and, in a
child process with `.vllm-0.34` first on `PYTHONPATH`, vLLM 0.34.0 (`make setup` installs
both), and prints one table.

vLLM's real scheduler (`hycache.bench.vllm.reference.ReferenceScheduler.run_concurrent`, no model)
gets 8 families x 4 siblings (B=64, u=16, MTP k=1; 640 shared + 83 private tokens, 8 output
tokens each) arriving together, in two orders (`grouped`: family by family; `interleaved`:
the first of every family, then the second, ...) and two pools (`roomy`: nothing evicted;
`tight`: 96 blocks of 64, about six requests' attention and Mamba blocks). Arms on each version:

    stock            vLLM's scheduler, arrival order (0.34's default: the window is 0)
    plugin           `hycache.vllm.SyncScheduler` (`limit`)
    hinted           the plugin, every request hinting the shared prefix (`prefix_hints`)
    ...+admission    0.34 only: each of those with `cache_aware_admission_window=32`,
                     threshold 0 (reorder on every step)

Columns: hit tokens (summed over the 32 requests, each at its first scheduling), prompt
tokens computed (recomputes after preemption included), forward passes (steps that
scheduled a token), preemptions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES, SIBLINGS = 8, 4
SHARED, PRIVATE, OUTPUT = 640, 83, 8
POOLS = {"roomy": 0, "tight": 96}  # 0: enough for everything (the harness's 4096 blocks)
PLUGIN = "hycache.vllm.SyncScheduler"


def families(order: str, hint: bool = False, seed: int = 0) -> list[Any]:
    from hycache.bench.vllm.scenario import Turn

    rng = random.Random(seed)
    fams = []
    for _ in range(FAMILIES):
        prefix = [rng.randrange(32000) for _ in range(SHARED)]
        fams.append(
            [
                Turn(
                    prefix + [rng.randrange(32000) for _ in range(PRIVATE)],
                    [rng.randrange(32000) for _ in range(OUTPUT)],
                    prefix_hints=(SHARED,) if hint else (),
                )
                for _ in range(SIBLINGS)
            ]
        )
    if order == "grouped":
        return [t for fam in fams for t in fam]
    return [fam[i] for i in range(SIBLINGS) for fam in fams]


def measure() -> list[dict[str, Any]]:
    """Every arm this vLLM has, on every order and pool."""
    import vllm

    from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup
    from hycache.config import CacheKnobs
    from hycache.vllm import compat

    admission = compat.has_cache_aware_admission()
    arms = {"stock": (None, 0, False), "plugin": (PLUGIN, 0, False), "hinted": (PLUGIN, 0, True)}
    if admission:
        arms |= {f"{arm}+admission": (cls, 32, hint) for arm, (cls, _, hint) in arms.items()}
    rows = []
    base = VllmSetup(CacheKnobs(64, 16), 2048, num_speculative_tokens=1, cache_aware_threshold=0.0)
    for order in ("grouped", "interleaved"):
        for pool, blocks in POOLS.items():
            for arm, (cls, window, hint) in arms.items():
                turns = families(order, hint)
                setup = replace(
                    base, scheduler_cls=cls, cache_aware_window=window, num_blocks=blocks
                )
                got = ReferenceScheduler(setup).run_concurrent(turns)
                rows.append(
                    {
                        "vllm": vllm.__version__,
                        "order": order,
                        "pool": pool,
                        "arm": arm,
                        "hit_tokens": got.hit_tokens,
                        "prefill_tokens": got.prefill_tokens,
                        "passes": got.passes,
                        "preemptions": got.preemptions,
                        "hits": [t.hit for t in got.traces],
                    }
                )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help="measure this process's vLLM only")
    p.add_argument("--vllm-034", type=Path, default=ROOT / ".vllm-0.34")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.child:
        print("ROWS " + json.dumps(measure()))
        return 0
    rows = measure()
    if args.vllm_034.is_dir():
        path = os.pathsep.join([str(ROOT), str(args.vllm_034), os.environ.get("PYTHONPATH", "")])
        out = subprocess.run(
            [sys.executable, __file__, "--child"],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows += json.loads(next(ln for ln in out.splitlines() if ln.startswith("ROWS "))[5:])
    else:
        print(f"no {args.vllm_034}: vLLM 0.34 not measured (make setup installs it)")
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{FAMILIES} families x {SIBLINGS} siblings arriving together")
    for col in ("vLLM", "order", "pool", "arm", "hit tokens", "prompt computed", "passes"):
        table.add_column(
            col, justify="left" if col in ("vLLM", "order", "pool", "arm") else "right"
        )
    table.add_column("preempt", justify="right")
    for r in sorted(rows, key=lambda r: (r["order"], r["pool"], r["vllm"])):
        table.add_row(
            r["vllm"],
            r["order"],
            r["pool"],
            r["arm"],
            f"{r['hit_tokens']:,}",
            f"{r['prefill_tokens']:,}",
            str(r["passes"]),
            str(r["preemptions"]),
        )
    Console(width=140).print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
