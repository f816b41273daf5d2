"""The engine's command-line flags (shared by `generate` and `serve`; `hycache.engine.build`
turns them into an `LLM`).

Importing this module is cheap (no torch): the command line builds its parser from it.
"""

from __future__ import annotations

import argparse

from hycache.config import DEFAULT_EVICTION_ALPHA, EVICTION_NAMES, POLICY_NAMES
from hycache.server.settings import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="a preset name (tiny) or a checkpoint directory")
    g = p.add_argument_group("engine")
    g.add_argument("--block-size", type=int, default=64, help="tokens per block B")
    g.add_argument(
        "--prefix-match-unit", type=int, default=16, help="prefix-match unit u (divides B)"
    )
    g.add_argument("--num-blocks", type=int, default=None, help="cache blocks (default: sized)")
    g.add_argument("--max-model-len", type=int, default=4096)
    g.add_argument("--policy", default="limit", choices=POLICY_NAMES)
    g.add_argument("--num-speculative-tokens", type=int, default=0, help="EAGLE drafts per step")
    g.add_argument("--draft-model", default=None, help="EAGLE head safetensors (else random)")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    g.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=8192)
    g.add_argument("--seed", type=int, default=0)
    add_eviction_flags(g)
    add_checkpoint_flags(g)


def add_eviction_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """`--eviction` and `--eviction-alpha`: their one definition, used by every command with
    cache flags (simulate, explain, generate, serve) and by `bench` for its eviction curves."""
    g.add_argument(
        "--eviction",
        choices=EVICTION_NAMES,
        default="lru",
        help="which free cached entry goes first: lru, or flop-aware (recency + alpha * "
        "recompute FLOPs a hit saves / bytes held)",
    )
    g.add_argument(
        "--eviction-alpha",
        type=float,
        default=DEFAULT_EVICTION_ALPHA,
        help="flop-aware: pool turnovers of recency one block-prefill's worth of saved FLOPs is "
        "worth",
    )


def add_checkpoint_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """`--internal-checkpoints / --no-internal-checkpoints`: its one definition (generate, serve,
    simulate, explain, bench)."""
    g.add_argument(
        "--internal-checkpoints",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write SSM checkpoints inside a forward (the scan cut there) instead of ending a "
        "prefill chunk at each (as vLLM 0.33 does for Mamba2); --no-internal-checkpoints: a "
        "Mamba layer that cannot export",
    )


def port_number(text: str) -> int:
    """argparse type for a TCP port, 0-65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port lies in 0-65535, got {value}")
    return value


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The flags of `hycache serve`: the engine's, plus where to listen."""
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0: any free one)")
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name responses report (default: the model's last path component)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a jinja2 chat template for /v1/chat/completions (default: the checkpoint's "
        "tokenizer_config.json chat_template)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every /v1/* route, /tokenize, /detokenize "
        "and the API docs (/health, /metrics stay open)",
    )
    add_limit_args(p)


def positive_float(text: str) -> float:
    """argparse type for a finite number > 0 (seconds, requests/s, ...)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def connection_count(text: str) -> int:
    """argparse type for `--max-connections`: 1 to 65536."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 65536:
        raise argparse.ArgumentTypeError(f"must lie in 1-65536, got {value}")
    return value


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """Slow-client limits (`hycache.server.http`)."""
    g = p.add_argument_group("connection limits")
    g.add_argument(
        "--header-timeout",
        type=positive_float,
        default=HEADER_TIMEOUT_S,
        metavar="S",
        help="close a connection whose request headers are not complete S seconds after it "
        "opened (or after the next request's first byte)",
    )
    g.add_argument(
        "--body-timeout",
        type=positive_float,
        default=BODY_TIMEOUT_S,
        metavar="S",
        help="close a connection whose request body is not complete S seconds after its headers",
    )
    g.add_argument(
        "--max-connections",
        type=connection_count,
        default=MAX_CONNECTIONS,
        metavar="N",
        help="close connections beyond N open at once, unanswered",
    )
