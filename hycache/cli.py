"""The `hycache` command line: explain | simulate | trace-gen | bench [serve] | calibrate |
generate | serve.

This file parses arguments and prints; the work lives in the modules it calls. It holds
`explain`, `generate`, `serve`, the parser and `main` (the engine of `generate` and `serve`
comes from `hycache.engine.build`); the rest of the command line lives in:

- hycache.cli_common: what several commands share (`UserError`, argparse types, the cache
  flags and config, the second-tier flags `add_store_args` / `check_store_args`);
- hycache.cli_simulate: `simulate` and `trace-gen`;
- hycache.cli_bench: `bench` and `bench serve`;
- hycache.cli_calibrate: `calibrate`, and the tables of `bench --validate`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.text import Text

from hycache.cli_bench import add_bench_parser
from hycache.cli_calibrate import add_calibrate_parser
from hycache.cli_common import (
    UserError,
    add_cache_flags,
    add_store_args,
    build_config,
    check_store_args,
)
from hycache.cli_simulate import add_simulate_parser, add_trace_gen_parser
from hycache.config import POLICY_NAMES
from hycache.report import console, err_console

__all__ = [
    "UserError",
    "add_store_args",
    "check_store_args",
    "main",
    "make_parser",
]


# -- explain ---------------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from hycache.explain import ExplainInputs, explain
    from hycache.report import explain_table

    inputs = ExplainInputs(
        block_size=args.block_size,
        prefix_match_unit=args.prefix_match_unit,
        eagle=args.eagle,
        prompt_tokens=args.prompt_tokens,
        shared_prefix=args.shared_prefix,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_hints=tuple(args.prefix_hint or ()),
        internal_checkpoints=args.internal_checkpoints,
    )
    policies = (args.policy,) if args.policy else POLICY_NAMES
    # validate the geometry through the config before running anything
    build_config(args, policy=policies[0], max_model_len=args.prompt_tokens + 8, num_blocks=10**6)
    if args.backend == "vllm":
        from hycache.vllm.reference import available

        if args.policy:
            raise SystemExit("hycache explain: --policy applies to --backend hycache only")
        if not available():
            raise SystemExit(
                "hycache explain --backend vllm: vllm is not installed here; `make setup` "
                "installs vLLM 0.33.0 (pip install vllm==0.33.0 --no-deps, then "
                "requirements/vllm.txt)"
            )
        from hycache.vllm.explain import explain_vllm

        result = explain_vllm(inputs)
    else:
        result = explain(inputs, tuple(policies))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(explain_table(result))
    return 0


# -- generate --------------------------------------------------------------------------------------


def parse_token_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UserError(
            f"--prompt-token-ids: expected comma-separated integers, got {text!r}"
        ) from None


def cmd_generate(args: argparse.Namespace) -> int:
    from hycache.engine import build
    from hycache.request import SamplingParams

    if (args.prompt is None) == (args.prompt_token_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-token-ids 1,2,3")
    prompt = args.prompt if args.prompt is not None else parse_token_ids(args.prompt_token_ids)
    params = SamplingParams(  # validated before the model loads
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    hints = args.prefix_hint or []
    if any(h < 0 for h in hints):
        raise UserError(f"--prefix-hint: token counts must be >= 0, got {hints}")
    check_store_args(args)
    llm = build.build_llm(args)
    try:
        (out,) = llm.generate([prompt], params, prefix_hints=hints or None)
    finally:
        if llm.store is not None:
            llm.store.close()
    if args.json:
        print(
            json.dumps(
                {
                    "token_ids": out.token_ids,
                    "text": out.text,
                    "hit_tokens": out.hit_tokens,
                    "store_hit_tokens": out.store_hit_tokens,
                    "finish_reason": out.finish_reason,
                }
            )
        )
    else:
        console.print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
        if llm.store is not None:  # stdout stays the output alone
            err_console.print(
                f"cached tokens: {out.hit_tokens} ({out.store_hit_tokens} from the "
                f"{llm.store.name} store)",
                highlight=False,
            )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the engine and serve it until interrupted; 2 if the engine cannot be built."""
    from hycache.engine import build
    from hycache.server.run import serve
    from hycache.server.settings import ServerSettings

    check_store_args(args)
    settings = ServerSettings.from_cli_args(args)
    try:
        llm = build.build_llm(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"hycache serve: {e}", file=sys.stderr)
        return 2
    return serve(llm, settings)


# -- parser ----------------------------------------------------------------------------------------


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's help names its default (sub-commands included)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                show_defaults(sub)
            continue
        default, text = action.default, action.help or ""
        if (
            action.option_strings
            and not any(default is x for x in (None, False, argparse.SUPPRESS))
            and "%(default)" not in text
        ):
            action.help = f"{text} (default: %(default)s)".strip()


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hycache",
        description="Prefix caching for hybrid attention + SSM models under speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("explain", help="where siblings and resends resume, per policy")
    add_cache_flags(p)
    p.add_argument("--prompt-tokens", type=int, required=True, help="producer prompt length T")
    p.add_argument("--shared-prefix", type=int, required=True, help="shared prefix length P")
    p.add_argument("--policy", choices=POLICY_NAMES, default=None, help="one policy (default all)")
    p.add_argument(
        "--prefix-hint",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="every request names N tokens as a shared prefix (repeatable; used by `limit`)",
    )
    p.add_argument(
        "--backend",
        choices=("hycache", "vllm"),
        default="hycache",
        help="hycache: one column per policy; vllm: vLLM 0.33's real scheduler, stock beside "
        "hycache.vllm.Scheduler (needs vllm installed)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_explain)

    add_simulate_parser(sub)

    from hycache.engine.args import add_engine_args

    p = sub.add_parser("generate", help="generate tokens with a hybrid model")
    add_engine_args(p)
    add_store_args(p)
    p.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json)")
    p.add_argument("--prompt-token-ids", default=None, help="prompt as token ids: 1,2,3")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument(
        "--prefix-hint",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="token count where a shared prefix of the prompt ends (repeatable; used by limit)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    add_bench_parser(sub)
    add_calibrate_parser(sub)

    from hycache.engine.args import add_serve_args

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-style completions)")
    add_serve_args(p)
    add_store_args(p)
    p.set_defaults(func=cmd_serve)

    add_trace_gen_parser(sub)
    show_defaults(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UserError, ValueError, FileNotFoundError, IsADirectoryError) as exc:
        # the message may hold user text (paths): never read it as rich markup
        # one line, also when piped (no wrapping at the console width)
        err_console.print(
            Text.assemble(("error:", "red"), f" {exc}"), highlight=False, soft_wrap=True
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
