"""`ServerSettings`: validated on construction, built from the command line in one place."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from hycache.cli.args import add_serve_args
from hycache.server.settings import ServerSettings


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return p.parse_args(list(argv))


def test_from_cli_args_reads_every_server_flag() -> None:
    args = parse(
        *("--host", "0.0.0.0", "--port", "0", "--model", "/ckpt/bamba/", "--api-key", "k"),
        *("--chat-template", "t.jinja", "--header-timeout", "2", "--body-timeout", "3"),
        *("--max-connections", "5"),
    )
    s = ServerSettings.from_cli_args(args)
    assert s == ServerSettings(
        host="0.0.0.0",
        port=0,
        model_name="bamba",
        model="/ckpt/bamba/",
        chat_template="t.jinja",
        api_key="k",
        header_timeout=2.0,
        body_timeout=3.0,
        max_connections=5,
    )
    defaults = ServerSettings.from_cli_args(parse())
    assert defaults == dataclasses.replace(ServerSettings(), model_name="tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("port", 70000, "port"),
        ("port", -1, "port"),
        ("host", "", "host"),
        ("model_name", "", "model_name"),
        ("header_timeout", 0.0, "header_timeout"),
        ("body_timeout", float("inf"), "body_timeout"),
        ("body_timeout", float("nan"), "body_timeout"),
        ("max_connections", 0, "max_connections"),
    ],
)
def test_bad_settings_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerSettings(**{field: value})  # type: ignore[arg-type]
