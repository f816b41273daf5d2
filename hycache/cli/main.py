"""The `hycache` command line's entry point: the registry of sub-commands, the parser and
`main` (one line per error, exit status 2).

Each sub-command is a module of hycache.cli with `add_parser(sub)`, which defines its flags
and sets its command: explain, simulate, generate, bench (and `bench serve`), calibrate, serve,
fleet (`fleet worker`, `fleet router`), trace-gen. The flags several commands share, and the
typed objects they become, live in hycache.cli.args; what the commands print, in
hycache.cli.tables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.text import Text

from hycache.cli import bench, calibrate, explain, fleet, generate, serve, simulate, trace_gen
from hycache.cli.args import UserError
from hycache.cli.tables import err_console

# in the order `hycache --help` lists them
COMMANDS = (explain, simulate, generate, bench, calibrate, serve, fleet, trace_gen)


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
    for command in COMMANDS:
        command.add_parser(sub)
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
