"""`hycache serve`: its flags and command (the server is `hycache.server`)."""

from __future__ import annotations

import argparse
import sys

from hycache.cli.args import EngineArgs, add_serve_args, add_store_args


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the engine and serve it until interrupted; 2 if the engine cannot be built."""
    from hycache.server.run import serve
    from hycache.server.settings import ServerSettings

    engine = EngineArgs.from_cli_args(args)  # the store flags are refused before any model loads
    settings = ServerSettings.from_cli_args(args)
    try:
        llm = engine.build(warmup=not args.no_warmup)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"hycache serve: {e}", file=sys.stderr)
        return 2
    return serve(llm, settings)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-style completions)")
    add_serve_args(p)
    add_store_args(p)
    p.set_defaults(func=cmd_serve)
