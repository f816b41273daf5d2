"""`hycache bench serve` against a hostile server (issue 34): a reachability probe whose body
never ends, a stream line that never ends, a huge error body. Each run ends on its own with
its `--json` written, holding a bounded amount of what the server sent. The servers listen on
127.0.0.1 and are stopped by the test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hycache.bench import loadgen
from hycache.cli.main import main

SMALL = ["--shared-prefix-tokens", "128", "--suffix-tokens", "16", "--output-tokens", "4"]
HANG_BOUND_S = 60  # generous: the run hangs for ever without the fix


class _Hostile(BaseHTTPRequestHandler):
    """GET: 200 and a body that never ends. POST: `mode` decides (an endless stream line, or
    an endless error body)."""

    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "line"
    sent: ClassVar[list[int]] = [0]

    def _endless(self, piece: bytes) -> None:
        try:
            while True:
                self.wfile.write(piece)
                self.sent[0] += len(piece)
                time.sleep(0.001)
        except OSError:
            return

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()  # no length, no chunking: the body runs until the socket closes
        self._endless(b"x" * 65536)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200 if self.mode == "line" else 500)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self._endless(b"z" * 65536 if self.mode == "line" else b"y" * 65536)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def hostile(mode: str) -> Iterator[str]:
    _Hostile.mode = mode
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run(url: str, out: Path) -> tuple[int, dict[str, Any]]:
    """The CLI in a thread, bounded by HANG_BOUND_S (a hang fails the test, never the suite)."""
    result: list[int] = []
    argv = ["bench", "serve", "--url", url, "--quiet", "--json", str(out), "--num-requests",
            "2", "--concurrency", "2", "--request-timeout", "30", *SMALL]  # fmt: skip
    t = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    t.start()
    t.join(HANG_BOUND_S)
    assert not t.is_alive(), "bench serve hung"
    return result[0], json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["line", "error"])
def test_endless_bodies_end_each_request_and_the_run(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's endless body is never read; an endless stream line fails its request at
    the line cap; an endless error body is read up to its cap."""
    monkeypatch.setattr(loadgen, "MAX_LINE_BYTES", 1 << 20)
    with hostile(mode) as url:
        rc, doc = run(url, tmp_path / "out.json")
    assert rc == 1 and doc["summary"]["failed"] == 2
    errors = [r["error"] for r in doc["requests"]]
    if mode == "line":
        assert all("stream line over" in e for e in errors), errors
    else:
        assert all(e.startswith("HTTP 500: yyyy") and len(e) <= 200 for e in errors), errors


def test_a_probe_that_never_answers_is_one_deadline(tmp_path: Path) -> None:
    """A server that accepts the connection and never sends a status line: the probe's total
    deadline ends the run with one line."""
    import asyncio
    import socket

    import httpx

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:

        async def probe() -> None:
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
                await loadgen.check_reachable(client, url, timeout=0.5)

        with pytest.raises(loadgen.LoadgenError, match=r"no answer within 0\.5 s"):
            asyncio.run(asyncio.wait_for(probe(), HANG_BOUND_S))
    finally:
        sock.close()
