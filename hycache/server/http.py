"""The HTTP connection limits of `hycache serve`: slow clients are timed out, connections capped.

uvicorn times out idle keep-alive connections but never a client that sends its request
slowly: a connection that sends half its headers, or a body at one byte a second, is held for
ever, and enough of them exhaust the server's sockets. `limited_protocol` builds uvicorn's h11
protocol with three limits:

- `header_timeout`: a request's headers must be complete this many seconds after the
  connection opened, or after the first byte of the next request on a kept-alive connection;
- `body_timeout`: its body must be complete this many seconds after its headers;
- `max_connections`: connections beyond this many are closed at once, unanswered.

A connection over a deadline is closed; the handler of a request whose body never came sees a
disconnect. Once a request is read whole no deadline applies: a long stream is never cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hycache.server.settings import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body deadlines and a connection cap (set on a
    subclass by `limited_protocol`)."""

    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: object = None  # the h11 client state the deadline is for

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.transport.close()
            return
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _watch(self) -> None:
        """Arm the deadline of the client's current phase (headers or body), once per phase;
        none while the request is read whole or between kept-alive requests (uvicorn's own
        keep-alive timeout covers that)."""
        state = self.conn.their_state
        if state is h11.IDLE and self.cycle is not None and self.cycle.response_complete:
            idle = not self.conn.trailing_data[0]  # nothing of a next request yet
            if idle:
                self._disarm()
                return
        if state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()
            return
        if state is self._phase and self._deadline is not None:
            return
        self._disarm()
        timeout = self.header_timeout if state is h11.IDLE else self.body_timeout
        self._phase = state
        self._deadline = self.loop.call_later(timeout, self._expire, state)

    def _expire(self, state: object) -> None:
        self._deadline = None
        if self.conn.their_state is state and not self.transport.is_closing():
            self.logger.info("closing a connection that sent its request too slowly")
            self.transport.close()


def limited_protocol(
    header_timeout: float = HEADER_TIMEOUT_S,
    body_timeout: float = BODY_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> type[LimitedH11Protocol]:
    """A `LimitedH11Protocol` subclass with these limits, for `uvicorn.Config(http=...)`."""
    return type(
        "LimitedH11Protocol",
        (LimitedH11Protocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        },
    )
