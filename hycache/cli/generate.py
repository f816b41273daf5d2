"""`hycache generate`: its flags and command (the engine is hycache.engine)."""

from __future__ import annotations

import argparse
import json

from hycache.cli.args import EngineArgs, UserError, add_engine_args, add_flag, add_store_args
from hycache.cli.args import prefix_hints as parse_prefix_hints
from hycache.cli.tables import console, err_console


def parse_token_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UserError(
            f"--prompt-token-ids: expected comma-separated integers, got {text!r}"
        ) from None


def cmd_generate(args: argparse.Namespace) -> int:
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
    hints = list(parse_prefix_hints(args.prefix_hint, bare=False).tokens)
    llm = EngineArgs.from_cli_args(args).build()
    try:
        (out,) = llm.generate([prompt], params, prefix_hints=hints or None)
    finally:
        if llm.store is not None:
            llm.store.close()
    if args.json:
        fields = ("token_ids", "text", "hit_tokens", "store_hit_tokens", "finish_reason")
        print(json.dumps({f: getattr(out, f) for f in fields}))
    else:
        console.print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
        if llm.store is not None:  # stdout stays the output alone
            err_console.print(
                f"cached tokens: {out.hit_tokens} ({out.store_hit_tokens} from the "
                f"{llm.store.name} store)",
                highlight=False,
            )
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="generate tokens with a hybrid model")
    add_engine_args(p)
    add_store_args(p)
    p.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json)")
    p.add_argument("--prompt-token-ids", default=None, help="prompt as token ids: 1,2,3")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--ignore-eos", action="store_true")
    add_flag(p, "--prefix-hint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)
