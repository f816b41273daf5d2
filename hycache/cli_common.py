"""What several `hycache` sub-commands share: the error they raise, argparse types, the
cache flags and the config they build, and the second-tier flags (`--kv-store`, `--kv-store-gb`).

The commands themselves live in hycache.cli (explain, generate, serve, the parser),
hycache.cli_simulate (simulate, trace-gen) and hycache.cli_bench (bench, bench serve).
"""

from __future__ import annotations

import argparse

from hycache.config import (
    CacheConfig,
    GroupKind,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.engine.args import add_checkpoint_flags, add_eviction_flags


class UserError(Exception):
    """A bad command line or input file: printed as one line, exit status 2."""


def add_cache_flags(p: argparse.ArgumentParser, *, block_size: int = 4416, unit: int = 64) -> None:
    g = p.add_argument_group("cache")
    g.add_argument("--block-size", type=int, default=block_size, help="tokens per block B")
    g.add_argument(
        "--prefix-match-unit", type=int, default=unit, help="prefix-match unit u (divides B)"
    )
    g.add_argument(
        "--eagle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speculative decoding with an EAGLE drafter (the EAGLE drop)",
    )
    g.add_argument("--num-speculative-tokens", type=int, default=3, help="drafts per step k")
    g.add_argument("--acceptance-rate", type=float, default=0.7, help="per-draft acceptance")
    g.add_argument("--retention", default="semantic", help="semantic | dense | interval tokens")
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--num-blocks", type=int, default=None, help="cache blocks (default: sized)")
    g.add_argument("--hash-seed", type=int, default=0)
    add_eviction_flags(g)
    add_checkpoint_flags(g)


def build_config(
    args: argparse.Namespace, *, policy: str, max_model_len: int, num_blocks: int
) -> HycacheConfig:
    k = args.num_speculative_tokens if args.eagle else 0
    return HycacheConfig(
        CacheConfig(
            block_size=args.block_size,
            prefix_match_unit=args.prefix_match_unit,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            policy=policy,
            retention=args.retention,
            hash_seed=args.hash_seed,
            groups=(GroupKind.ATTENTION, GroupKind.SSM),
            eviction=args.eviction,
            eviction_alpha=args.eviction_alpha,
            internal_checkpoints=args.internal_checkpoints,
        ),
        SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=args.acceptance_rate),
        SchedulerConfig(args.max_num_batched_tokens, args.max_num_seqs),
    )


def parse_policies(args: argparse.Namespace) -> list[str]:
    """The arms to run: `--compare a,b,c` (policies, or `eagle-off`), else `--policy`."""
    from hycache.sim.compare import parse_arms

    flag = "--compare" if args.compare else "--policy"
    try:
        return list(parse_arms(args.compare or args.policy))
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def positive_int(text: str) -> int:
    """argparse type for a count that must be >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_or_range(text: str) -> int | tuple[int, int]:
    """argparse type for `N` or `LO:HI` (a bad value exits with status 2 and says why)."""
    from hycache.sim.workloads import parse_int_or_range

    try:
        return parse_int_or_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_or_auto(text: str) -> float | str:
    """argparse type for `--request-rate`: requests/s (> 0) or `auto`."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected requests/s (a number > 0) or 'auto', got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


# -- the second cache tier (generate, serve, bench) ------------------------------------------------

DEFAULT_KV_STORE_GB = 4.0


def add_store_args(p: argparse.ArgumentParser) -> None:
    """`--kv-store` and `--kv-store-gb`: a second cache tier behind the device pool."""
    g = p.add_argument_group("second cache tier")
    g.add_argument(
        "--kv-store",
        default=None,
        metavar="host|mooncake://HOST:PORT",
        help="a store behind the device cache: host (this process's RAM) or a Mooncake master "
        "shared with other processes (default: none)",
    )
    g.add_argument(
        "--kv-store-gb",
        type=float,
        default=DEFAULT_KV_STORE_GB,
        help="GiB of this process's memory the store gets (a number > 0)",
    )


def check_store_args(args: argparse.Namespace) -> None:
    """Refuse a bad `--kv-store` / `--kv-store-gb` before any model loads, with the messages
    `open_store` would give (a ValueError: one line, exit status 2)."""
    from hycache.store import check_store_gb

    check_store_gb(args.kv_store_gb)
    spec = args.kv_store
    if spec is None:
        return
    if spec.startswith("mooncake://"):
        from hycache.store.mooncake import parse_url

        parse_url(spec)
        return
    from hycache.store import open_store

    # `host` allocates nothing up front; anything else raises
    open_store(spec, args.kv_store_gb).close()
