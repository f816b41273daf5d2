"""`ServerSettings`: everything `hycache serve` needs beyond the engine, frozen and validated.

`ServerSettings.from_cli_args` is the one place a command-line namespace becomes settings
(vLLM's `EngineArgs.from_cli_args` pattern); the server itself never sees argparse. Importing
this module is cheap (nothing but the standard library): the flag definitions take their
defaults from here.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class ServerSettings:
    """Where to listen, who may call, what to call the model and how patient to be.

    `model_name`: what responses report (never a path). `model`: the preset or checkpoint
    directory served (a directory's `tokenizer_config.json` holds the chat template);
    `chat_template`: a jinja2 file replacing that template. `api_key`: every `/v1/*` route wants
    `Authorization: Bearer KEY` (None or empty: open). The connection limits are
    `hycache.server.http`'s."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "hycache"
    model: str = "tiny"
    chat_template: str | None = None
    api_key: str | None = None
    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: a port lies in 0-65535, got {self.port}")
        if not self.model_name:
            raise ValueError("model_name: must not be empty")
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value}")
        if not 1 <= self.max_connections <= 65536:
            raise ValueError(f"max_connections: must lie in 1-65536, got {self.max_connections}")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerSettings:
        """The settings of `hycache serve`'s flags (`hycache.cli.args.add_serve_args`)."""
        model = str(args.model)
        return cls(
            host=args.host,
            port=args.port,
            model_name=served_model_name(model, args.served_model_name),
            model=model,
            chat_template=args.chat_template,
            api_key=args.api_key,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_connections=args.max_connections,
        )


def served_model_name(model: str, name: str | None = None) -> str:
    """`name` (`--served-model-name`), else the model's last path component."""
    return name or Path(model.rstrip("/")).name or model
