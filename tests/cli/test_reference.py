"""docs/cli.md is the command reference hycache.cli.reference renders from the parsers: a flag
that changes without the page fails here, naming the command that regenerates it."""

from __future__ import annotations

import argparse

from hycache.cli import reference
from hycache.cli.main import make_parser


def test_cli_page_is_what_the_parsers_render() -> None:
    page = reference.PAGE.read_text(encoding="utf-8")
    assert page == reference.render(), (
        f"docs/cli.md is stale: regenerate it with `{reference.REGENERATE}` (or `make cli-docs`)"
    )


def test_every_subcommand_and_flag_is_on_the_page() -> None:
    page = reference.render()
    commands = list(reference.subcommands(make_parser(), "hycache"))
    assert {c for c, _, _ in commands} >= {"hycache explain", "hycache bench serve"}
    for command, _, parser in commands:
        assert f"## `{command}`" in page
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in page, (command, option)


def test_a_changed_flag_changes_the_page(monkeypatch) -> None:
    """The check can fail: a new flag on one command renders a different page."""
    before = reference.render()

    def patched() -> argparse.ArgumentParser:
        parser = make_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["trace-gen"].add_argument("--brand-new-flag", help="added by a test")
        return parser

    monkeypatch.setattr(reference, "make_parser", patched)
    after = reference.render()
    assert after != before
    assert "| `--brand-new-flag BRAND_NEW_FLAG` | added by a test |" in after


def test_cells_escape_markdown() -> None:
    assert reference.escape("a | b * c `x*y`") == r"a \| b \* c `x*y`"
