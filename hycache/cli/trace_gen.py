"""`hycache trace-gen`: its flags and command (the generator is hycache.sim.trace_gen)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hycache.cli.args import UserError, add_flag, positive_int
from hycache.files import check_writable


def cmd_trace_gen(args: argparse.Namespace) -> int:
    from hycache.sim.trace_gen import trace_gen

    check_writable(args.out, "--out")
    parent = Path(args.out).parent
    if not parent.is_dir():  # a folder the user did not make is never made for them
        raise UserError(f"--out: cannot write {args.out}: folder {parent} does not exist")
    if args.turn_gap_s is not None and not args.turn_gap_s > 0:
        raise UserError(f"--turn-gap-s: must be > 0, got {args.turn_gap_s}")
    if args.system_prompts < 0:
        raise UserError(f"--system-prompts: must be >= 0, got {args.system_prompts}")
    stats = trace_gen(
        args.out,
        args.num_requests,
        args.seed,
        args.block_tokens,
        args.turn_gap_s,
        args.system_prompts,
    )
    print(json.dumps(stats, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trace-gen", help="generate a Mooncake-like conversation trace")
    p.add_argument("--out", required=True)
    p.add_argument("--num-requests", type=positive_int, default=12_000)
    add_flag(p, "--seed")
    p.add_argument("--block-tokens", type=int, default=512)
    p.add_argument(
        "--turn-gap-s",
        type=float,
        default=None,
        help="median seconds between a conversation's turns (Mooncake's trace: ~120; "
        "default: no gap, a turn may follow at once)",
    )
    p.add_argument(
        "--system-prompts",
        type=int,
        default=64,
        help="shared system prompts new conversations start behind (0: sharing only within "
        "conversations)",
    )
    p.set_defaults(func=cmd_trace_gen)
