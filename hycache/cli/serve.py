"""`hycache serve`: its flags and command (the server is hycache.serve)."""

from __future__ import annotations

import argparse

from hycache.cli.args import StoreArgs, add_serve_args, add_store_args


def cmd_serve(args: argparse.Namespace) -> int:
    from hycache.serve import run_serve

    StoreArgs.from_cli_args(args)  # refused before any model loads
    return run_serve(args)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-style completions)")
    add_serve_args(p)
    add_store_args(p)
    p.set_defaults(func=cmd_serve)
