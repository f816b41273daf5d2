"""The `hycache` command line's entry point: the registry of sub-commands, the parser and
`main` (one line per error, exit status 2).

Each sub-command is a module of hycache.cli with `add_parser(sub)`, which defines its flags
and sets its command: explain, simulate, generate, bench (and `bench serve`), calibrate, serve,
fleet (`fleet worker`, `fleet router`), trace-gen. The registry (`COMMANDS`) names each one's
module and one-line help, so `hycache --help` lists them all without importing any; `main`
imports only the module of the sub-command it runs. The flags several commands share, and the
typed objects they become, live in hycache.cli.args; what the commands print, in
hycache.cli.tables.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A sub-command: its name, the hycache.cli module whose `add_parser` defines it, and the
    one line `hycache --help` shows (the module's own `help=`; a test keeps them equal)."""

    name: str
    module: str
    help: str

    def add_parser(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Import the module and let it define the sub-command and its flags."""
        importlib.import_module(f"hycache.cli.{self.module}").add_parser(sub)


# in the order `hycache --help` lists them
COMMANDS: tuple[Command, ...] = (
    Command("explain", "explain", "where siblings and resends resume, per policy"),
    Command("simulate", "simulate", "run a workload through the scheduler and cache"),
    Command("generate", "generate", "generate tokens with a hybrid model"),
    Command("bench", "bench", "every arm side by side: CPU engine and simulated"),
    Command(
        "calibrate",
        "calibrate",
        "time the real engine over a grid of step shapes and fit the cost model",
    ),
    Command("serve", "serve", "serve a model over HTTP (OpenAI-style completions)"),
    Command("fleet", "fleet", "a fleet of engines behind NVIDIA Dynamo (docs/fleet.md)"),
    Command("trace-gen", "trace_gen", "generate a Mooncake-like conversation trace"),
)


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


ALL = "*"  # `make_parser`'s default: every sub-command defined in full


def make_parser(only: str | None = ALL) -> argparse.ArgumentParser:
    """The parser. `only`: the sub-command defined in full (its module imported); every other
    one is its name and help alone. The default, every sub-command in full (the reference
    page, the tests); None, none (`hycache --help`)."""
    parser = argparse.ArgumentParser(
        prog="hycache",
        description="Prefix caching for hybrid attention + SSM models under speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        if only in (ALL, command.name):
            command.add_parser(sub)
        else:
            sub.add_parser(command.name, help=command.help)
    show_defaults(parser)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command `argv` names (its first word that is not an option), if it names one:
    the top-level parser has no option that takes a value."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if any(c.name == first for c in COMMANDS) else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser(command_of(argv)).parse_args(argv)
    from hycache.cli.args import UserError

    try:
        return int(args.func(args))
    except (UserError, ValueError, FileNotFoundError, IsADirectoryError) as exc:
        from rich.text import Text

        from hycache.cli.tables import err_console

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
