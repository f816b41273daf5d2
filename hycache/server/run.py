"""`serve(llm, settings)`: run `hycache serve` over a built engine until interrupted.

The command line builds the engine (`hycache.cli.args.EngineArgs`) and the settings
(`ServerSettings.from_cli_args`); nothing here reads flags.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from hycache.engine.engine import LLM
from hycache.server.app import create_app
from hycache.server.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from hycache.server.http import limited_protocol
from hycache.server.security import is_loopback
from hycache.server.settings import ServerSettings
from hycache.server.worker import EngineWorker


class HycacheServer(uvicorn.Server):
    """uvicorn's server that, when shutdown begins, drains the engine worker: in-flight
    requests end at once with a 503 (a stream with an error event and `[DONE]`) instead of
    running to max_tokens while uvicorn waits for their connections to close."""

    def __init__(self, config: uvicorn.Config, worker: EngineWorker | None = None) -> None:
        super().__init__(config)
        self.worker = worker

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.worker is not None:
            self.worker.drain()
        await super().shutdown(sockets)


def server_config(app: FastAPI, settings: ServerSettings) -> uvicorn.Config:
    """uvicorn's config for `app`: where to listen, and the slow-client limits
    (`hycache.server.http`)."""
    s = settings
    protocol = limited_protocol(s.header_timeout, s.body_timeout, s.max_connections)
    return uvicorn.Config(
        app, host=s.host, port=s.port, log_level="info", timeout_graceful_shutdown=5, http=protocol
    )


def chat_template(settings: ServerSettings) -> ChatTemplate | None:
    """The `--chat-template` file, else the checkpoint's own (None for a preset or a
    checkpoint without one). Raises ChatTemplateError."""
    if settings.chat_template is None and not Path(settings.model).is_dir():
        return None
    return load_chat_template(settings.model, settings.chat_template)


def serve(llm: LLM, settings: ServerSettings) -> int:
    """Serve `llm` until interrupted: 0 once the server ran, 1 if it could not start, 2 if the
    chat template is unusable."""
    try:
        template = chat_template(settings)
    except ChatTemplateError as e:
        print(f"hycache serve: {e}", file=sys.stderr)
        return 2
    app = create_app(
        llm,
        model_name=settings.model_name,
        chat_template=template,
        api_key=settings.api_key,
        loopback_only=is_loopback(settings.host),  # the default: guard against DNS rebinding
    )
    # At shutdown the worker is drained first; a handler still busy after the grace period is
    # cancelled (aborting its request), then the lifespan stops the worker thread.
    server = HycacheServer(server_config(app, settings), app.state.worker)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1
