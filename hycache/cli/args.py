"""The command line's flags, each defined once, and the typed objects they become.

Flags several sub-commands take are defined once in `FLAGS` (their default given per command
where commands differ: `--block-size` is 4416 for explain and simulate, 64 for the engine) and
added with :func:`add_flag`; groups of them (the cache flags of explain and simulate, the
engine's of generate and serve, the second tier, the connection limits) have one `add_*`
function each. The edge of the command line turns the parsed namespace into typed, validated
objects (`XxxArgs.from_cli_args`): nothing below hycache.cli sees an `argparse.Namespace`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from hycache.config import (
    DEFAULT_EVICTION_ALPHA,
    EVICTION_NAMES,
    POLICY_NAMES,
    CacheKnobs,
    SchedulerConfig,
)
from hycache.engine.options import EngineOptions
from hycache.server.settings import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS
from hycache.sim.build import WORKLOAD_KINDS, PrefixHints, SimGeometry, WorkloadSizes

if TYPE_CHECKING:
    from hycache.engine.engine import LLM

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")
DEFAULT_KV_STORE_GB = 4.0

# `hycache bench`'s own flags, at their defaults (`bench serve` refuses them when given)
BENCH_JSON = "out/bench.json"
BENCH_ONLY_DEFAULTS: dict[str, Any] = {
    "plot": "out/bench.png",
    "quick": False,
    "skip_engine": False,
    "skip_simulated": False,
    "skip_curves": False,
    "engine_requests": None,
    "engine_shape": "system",
    "engine_repeats": None,
    "trace_requests": None,
    "kv_store": None,
    "kv_store_gb": DEFAULT_KV_STORE_GB,
    "eviction": "lru",
    "eviction_alpha": DEFAULT_EVICTION_ALPHA,
    "internal_checkpoints": True,
    "eviction_curves": False,
    "validate": None,
    "engine_profile": None,
    "threads": 1,
    "clock": None,
}

ArgGroup = argparse._ArgumentGroup | argparse.ArgumentParser


class UserError(Exception):
    """A bad command line or input file: printed as one line, exit status 2."""


# -- argparse types ---------------------------------------------------------------------------


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type for a count that must be >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type for a count that may be 0 (0 turns the feature off)."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse type for a finite number > 0 (seconds, requests/s, ...)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
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


def int_within(lo: int, hi: int, what: str, bounds: str) -> Callable[[str], int]:
    """An argparse type for an integer in [lo, hi]; `what` names a non-integer, `bounds` one
    outside (each message ends with the value given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{bounds}, got {value}")
        return value

    return parse


port_number = int_within(0, 65535, "a port number", "a port lies in 0-65535")
connection_count = int_within(1, 65536, "an integer", "must lie in 1-65536")  # --max-connections


# -- the flags several commands share ---------------------------------------------------------

FLAGS: dict[str, dict[str, Any]] = {
    "--block-size": {"type": int, "help": "tokens per block B"},
    "--prefix-match-unit": {"type": int, "help": "prefix-match unit u (divides B)"},
    "--num-blocks": {"type": int, "default": None, "help": "cache blocks (default: sized)"},
    "--num-speculative-tokens": {"type": int, "help": "EAGLE drafts per step k"},
    "--max-num-batched-tokens": {"type": int, "default": 8192},
    "--max-num-seqs": {"type": int, "default": 64},
    "--seed": {"type": int, "default": 0},
    "--eviction": {
        "choices": EVICTION_NAMES,
        "default": "lru",
        "help": "which free cached entry goes first: lru, or flop-aware (recency + alpha * "
        "recompute FLOPs a hit saves / bytes held)",
    },
    "--eviction-alpha": {
        "type": float,
        "default": DEFAULT_EVICTION_ALPHA,
        "help": "flop-aware: pool turnovers of recency one block-prefill's worth of saved FLOPs "
        "is worth",
    },
    "--internal-checkpoints": {
        "action": argparse.BooleanOptionalAction,
        "default": True,
        "help": "write SSM checkpoints inside a forward (the scan cut there) instead of ending a "
        "prefill chunk at each (as vLLM 0.33 does for Mamba2); --no-internal-checkpoints: a "
        "Mamba layer that cannot export",
    },
    "--admission": {
        "action": argparse.BooleanOptionalAction,
        "default": True,
        "help": "keep an SSM state written inside a forward (or a decode snapshot) only while "
        "its kind's observed hit chance times what a hit saves beats what its page displaces; "
        "--no-admission: keep every one",
    },
    "--protect-declared": {
        "action": argparse.BooleanOptionalAction,
        "default": None,
        "help": "lru: what a request frees after a hit covering a prefix it declared (a prefix "
        "hint) is evicted only after every other cached block (up to 1/16 of the pool): a "
        "declared prefix, once reused, outlives a flood of one-off prompts (on by default; "
        "requests without hints are never protected)",
    },
    "--protect-reused": {
        "action": argparse.BooleanOptionalAction,
        "default": None,
        "help": "lru: the same for every hit, declared or not, and for a cached block hit at "
        "least once: an undeclared shared prefix outlives the flood too (off by default: "
        "docs/admission.md, 'Hints and floods')",
    },
    "--no-prefix-caching": {
        "action": "store_true",
        "default": False,
        "help": "prefix caching off: nothing is kept for reuse and nothing hits (the control "
        "that prices caching)",
    },
    "--prefix-hint": {
        "type": int,
        "action": "append",
        "nargs": "?",
        "const": None,
        "default": None,
        "metavar": "N",
        "help": "a prefix hint for `limit`: N, a token count where a shared prefix ends; bare, "
        "where the workload's shared prefix ends (simulate, bench serve; explain: P); "
        "repeatable",
    },
    "--workload": {"choices": WORKLOAD_KINDS},
    "--kv-store-gb": {
        "type": float,
        "help": "GiB the second tier holds (0: no store tier; a negative size is an error)",
    },
}
_REQUIRED = object()


def add_flag(g: ArgGroup, name: str, default: Any = _REQUIRED) -> None:
    """Add the one definition of `name`; `default` for a flag whose default differs per
    command (those `FLAGS` gives none)."""
    spec = dict(FLAGS[name])
    if default is not _REQUIRED:
        spec["default"] = default
    elif "default" not in spec:
        raise TypeError(f"{name}: this command must give its default")
    g.add_argument(name, **spec)


def add_eviction_flags(g: ArgGroup) -> None:
    """`--eviction`, `--eviction-alpha`, `--protect-declared` and `--protect-reused`
    (simulate, explain, generate, serve, bench)."""
    add_flag(g, "--eviction")
    add_flag(g, "--eviction-alpha")
    add_flag(g, "--protect-declared")
    add_flag(g, "--protect-reused")


def add_cache_flags(p: argparse.ArgumentParser, *, block_size: int = 4416, unit: int = 64) -> None:
    """The simulated cache's flags (explain, simulate)."""
    g = p.add_argument_group("cache")
    add_flag(g, "--block-size", block_size)
    add_flag(g, "--prefix-match-unit", unit)
    g.add_argument(
        "--eagle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speculative decoding with an EAGLE drafter (the EAGLE drop)",
    )
    add_flag(g, "--num-speculative-tokens", 3)
    g.add_argument("--acceptance-rate", type=float, default=0.7, help="per-draft acceptance")
    g.add_argument("--retention", default="semantic", help="semantic | dense | interval tokens")
    add_flag(g, "--max-num-batched-tokens")
    add_flag(g, "--max-num-seqs")
    add_flag(g, "--num-blocks")
    g.add_argument("--hash-seed", type=int, default=0)
    add_eviction_flags(g)
    add_flag(g, "--internal-checkpoints")
    add_flag(g, "--admission")
    add_flag(g, "--no-prefix-caching")


def add_sim_scheduler_flags(p: argparse.ArgumentParser) -> None:
    """The simulated scheduler's chunking flags (simulate: they act only while requests wait
    or decode beside a prefill, which explain's one-at-a-time run never has)."""
    g = p.add_argument_group("scheduler")
    g.add_argument(
        "--saturated-chunk-tokens",
        type=non_negative_int,
        metavar="N",
        default=SchedulerConfig.saturated_chunk_tokens,
        help="while the batch is full and requests wait, cap a prefill chunk at N tokens "
        "beside decoding requests (0: no cap)",
    )
    g.add_argument(
        "--step-packing",
        action=argparse.BooleanOptionalAction,
        default=SchedulerConfig.step_packing,
        help="cut a prefill's last chunk at the tokens a decode step absorbs for free (the "
        "cost model's), while nobody waits",
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags (generate, serve)."""
    p.add_argument("--model", default="tiny", help="a preset name (tiny) or a checkpoint directory")
    g = p.add_argument_group("engine")
    add_flag(g, "--block-size", 64)
    add_flag(g, "--prefix-match-unit", 16)
    add_flag(g, "--num-blocks")
    g.add_argument("--max-model-len", type=int, default=4096)
    g.add_argument("--policy", default="limit", choices=POLICY_NAMES)
    add_flag(g, "--num-speculative-tokens", 0)
    g.add_argument("--draft-model", default=None, help="EAGLE head safetensors (else random)")
    add_flag(g, "--no-prefix-caching")
    g.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    add_flag(g, "--max-num-seqs")
    add_flag(g, "--max-num-batched-tokens")
    add_flag(g, "--seed")
    add_eviction_flags(g)
    add_flag(g, "--internal-checkpoints")


def add_store_args(p: argparse.ArgumentParser) -> None:
    """`--kv-store` and `--kv-store-gb`: a second tier behind the device pool (generate, serve,
    bench)."""
    g = p.add_argument_group("second cache tier")
    g.add_argument(
        "--kv-store",
        default=None,
        metavar="host|mooncake://HOST:PORT",
        help="a store behind the device cache: host (this process's RAM) or a Mooncake master "
        "shared with other processes (default: none)",
    )
    add_flag(g, "--kv-store-gb", DEFAULT_KV_STORE_GB)


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
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up forward at --max-num-batched-tokens before listening (without "
        "it the first request's largest step runs cold: 45%% slower for 8,192 tokens on a CPU)",
    )
    add_limit_args(p)


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


def _shown(value: Any) -> str:
    return f"{value[0]}:{value[1]}" if isinstance(value, tuple) else str(value)


def _per_workload(shapes: Mapping[str, Any], field: str) -> str:
    """Each workload's default of `field`, equal ones together: `system-prompt 256, family and
    multi-turn 64:640`."""
    kinds: dict[str, list[str]] = {}
    for kind, shape in shapes.items():
        if hasattr(shape, field):
            kinds.setdefault(_shown(getattr(shape, field)), []).append(kind)
    return ", ".join(f"{' and '.join(names)} {value}" for value, names in kinds.items())


def size_flags(shapes: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The workload sizes (`hycache.sim.build.WorkloadSizes`), their help naming the defaults
    of `shapes` (simulate: the simulator's; bench serve: `SERVE_SHAPES`)."""
    sp, fam, chat = shapes["system-prompt"], shapes["family"], shapes["multi-turn"]
    helps = {
        "--shared-prefix-tokens": f"system-prompt: the shared prefix "
        f"({_shown(sp.shared_prefix_tokens)}); family: per family "
        f"({_shown(fam.shared_prefix_tokens)})",
        "--suffix-tokens": "per request after the shared prefix "
        f"({_per_workload(shapes, 'suffix_tokens')})",
        "--output-tokens": f"per request / answer ({_per_workload(shapes, 'output_tokens')})",
        "--num-requests": f"system-prompt ({sp.num_requests})",
        "--families": f"family: families ({fam.families})",
        "--requests-per-family": f"family: ({_shown(fam.requests_per_family)})",
        "--sessions": f"multi-turn: sessions ({chat.sessions})",
        "--turns": f"multi-turn: ({_shown(chat.turns)})",
        "--user-tokens": f"multi-turn: ({_shown(chat.user_tokens)})",
        "--system-prompt-tokens": "multi-turn: one system prompt shared by every session "
        f"({chat.system_prompt_tokens}; 0 for none)",
    }
    counts = ("--num-requests", "--families", "--sessions")
    types = {name: positive_int if name in counts else int_or_range for name in helps}
    types["--system-prompt-tokens"] = int
    return {n: {"type": types[n], "default": None, "help": helps[n]} for n in helps}


def add_size_flags(
    g: ArgGroup, shapes: Mapping[str, Any], names: Sequence[str], notes: Mapping[str, str]
) -> None:
    """Add the workload sizes `names` in this order; `notes` adds to a flag's help."""
    flags = size_flags(shapes)
    for name in names:
        spec = dict(flags[name])
        if name in notes:
            spec["help"] = f"{spec['help']} {notes[name]}"
        g.add_argument(name, **spec)


def add_trace_flags(g: ArgGroup) -> None:
    """`--trace`, `--trace-block-tokens`, `--limit` (simulate, bench serve)."""
    g.add_argument("--trace", default=None, help="Mooncake-format JSONL trace")
    g.add_argument(
        "--trace-block-tokens", type=positive_int, default=512, help="tokens per hash id"
    )
    g.add_argument(
        "--limit", type=positive_int, default=None, help="only the first N trace requests"
    )


# -- typed objects -----------------------------------------------------------------------------


def prefix_hints(values: list[int | None] | None, *, bare: bool = True) -> PrefixHints:
    """What `--prefix-hint` (repeatable: `N`, or bare) asks for; `bare=False` where a command
    has no workload to take a shared prefix from."""
    values = values or []
    shared = None in values
    if shared and not bare:
        raise UserError("--prefix-hint: give a token count N (there is no workload prefix here)")
    try:
        return PrefixHints(shared, tuple(v for v in values if v is not None))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def namespace_values(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags `names` as given (`--max-num-seqs` is `max_num_seqs`), as keyword arguments
    for an object whose fields are named like them."""
    return {n: getattr(args, n) for n in names}


def sizes_from_cli_args(args: argparse.Namespace) -> WorkloadSizes:
    """The workload sizes the flags set (simulate, bench serve)."""
    return WorkloadSizes(**namespace_values(args, *WorkloadSizes.__dataclass_fields__))


def check_store_gb(gb: float) -> float:
    """The one rule for `--kv-store-gb` on every command: 0, no store tier; else a store's
    size (`hycache.store.check_store_gb`: > 0 and at most `MAX_STORE_GB`)."""
    from hycache.store import check_store_gb as store_size

    if gb == 0:
        return 0.0
    try:
        return store_size(gb)
    except ValueError as exc:
        raise UserError(f"--{exc} (0: no store tier)") from None


@dataclass(frozen=True)
class StoreArgs:
    """`--kv-store` / `--kv-store-gb`, checked: `kind` None means no second tier."""

    kind: str | None
    gb: float

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> StoreArgs:
        """Refuse a bad `--kv-store` / `--kv-store-gb` before any model loads, with the
        messages `open_store` would give (one line, exit status 2)."""
        gb = check_store_gb(args.kv_store_gb)
        spec = args.kv_store
        if spec is not None and gb == 0:
            raise UserError(
                f"--kv-store-gb: must be > 0 with --kv-store {spec} (0 means no store tier)"
            )
        if spec is None:
            return cls(None, gb)
        if spec.startswith("mooncake://"):
            from hycache.store.mooncake import parse_url

            parse_url(spec)
        else:
            from hycache.store import open_store

            open_store(spec, gb).close()  # `host` allocates nothing up front; others raise
        return cls(spec, gb)


def knobs_from_cli_args(
    args: argparse.Namespace, base: CacheKnobs, *, arms: bool = False
) -> CacheKnobs:
    """The cache knobs the flags set, over `base` (the command's defaults): every
    `CacheKnobs` field the namespace has by name (`--block-size` is `block_size`, ...; None:
    not given), and `--no-prefix-caching`. With `arms`, `--policy` names the arms to run
    (simulate, explain) and is no knob. The one place any sub-command turns flags into knobs;
    the knobs check them (a ValueError: one line, exit status 2)."""
    given = {
        f.name: getattr(args, f.name)
        for f in fields(CacheKnobs)
        if getattr(args, f.name, None) is not None and not (arms and f.name == "policy")
    }
    if getattr(args, "no_prefix_caching", False):
        given["enable_prefix_caching"] = False
    return base.replace(**given)


@dataclass(frozen=True)
class EngineArgs:
    """The engine the flags describe (generate, serve): the model, its cache knobs, and
    everything else it is built with (the second tier of `--kv-store` included)."""

    model: str
    knobs: CacheKnobs
    options: EngineOptions

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        has_store = hasattr(args, "kv_store")
        store = StoreArgs.from_cli_args(args) if has_store else StoreArgs(None, 0.0)
        names = ("dtype", "num_blocks", "max_model_len", "num_speculative_tokens", "draft_model",
                 "max_num_batched_tokens", "max_num_seqs", "seed")  # fmt: skip
        options = EngineOptions(**namespace_values(args, *names))
        if store.kind is not None:
            options = replace(options, kv_store=store.kind, kv_store_gb=store.gb)
        return cls(args.model, knobs_from_cli_args(args, CacheKnobs()), options)

    def build(self, *, warmup: bool = False) -> LLM:
        """Load the model and build the engine, with its second tier when there is one
        (`warmup`: `LLM(warmup=True)`, what a server does before it listens)."""
        from hycache.engine import engine

        options = replace(self.options, warmup=warmup)
        return engine.LLM(self.model, knobs=self.knobs, options=options)


def build_llm(args: argparse.Namespace) -> LLM:
    """The engine of `args` (`EngineArgs`), with the second tier of `--kv-store` /
    `--kv-store-gb` when the namespace has them."""
    return EngineArgs.from_cli_args(args).build()


@dataclass(frozen=True)
class CacheArgs:
    """The simulated cache's flags (explain, simulate)."""

    geometry: SimGeometry
    eagle: bool
    drafts: int  # `--num-speculative-tokens` as given (the geometry's is 0 with --no-eagle)
    num_blocks: int | None

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> CacheArgs:
        geometry = SimGeometry(
            knobs_from_cli_args(args, CacheKnobs(), arms=True),
            num_speculative_tokens=args.num_speculative_tokens if args.eagle else 0,
            acceptance_rate=args.acceptance_rate,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            # simulate's flags (`add_sim_scheduler_flags`); explain has none
            saturated_chunk_tokens=getattr(
                args, "saturated_chunk_tokens", SchedulerConfig.saturated_chunk_tokens
            ),
            step_packing=getattr(args, "step_packing", SchedulerConfig.step_packing),
        )
        return cls(geometry, args.eagle, args.num_speculative_tokens, args.num_blocks)


def parse_policies(compare: str | None, policy: str) -> list[str]:
    """The arms to run: `--compare a,b,c` (policies, or `eagle-off`), else `--policy`."""
    from hycache.sim.compare import parse_arms

    flag = "--compare" if compare else "--policy"
    try:
        return list(parse_arms(compare or policy))
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None
