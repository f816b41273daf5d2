"""`hycache.vllm.guard.RequestGuard` around a tiny Starlette app (added as vLLM adds it,
`app.add_middleware`) under a real uvicorn on 127.0.0.1, started and stopped here: bodies over
the cap refused (413) before they are read, hostile hint lists refused (400) before the app
sees them, everything else delivered byte for byte, streams untouched; the hint rule itself
as a property against a plain reading of it. (`tests/vllm_engine/test_serve.py` runs it in
front of `vllm serve`.)"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hycache.cache.boundaries import MAX_PREFIX_HINTS
from hycache.vllm.guard import (
    DEFAULT_MAX_BODY_BYTES,
    HINTS_KEY,
    MAX_BODY_ENV,
    RequestGuard,
    body_refusal,
    cap_from_env,
)
from tests.helpers import HANG_S, raw_exchange

CAP = 256 * 2**10  # above the 3x10^4-hint body (0.19 MiB)
CHUNKS = 5


def make_app(seen: list[bytes]) -> Starlette:
    """Records every body it is given; `?stream=1` answers in `CHUNKS` chunks."""

    async def completions(request: Request) -> Response:
        body = await request.body()
        seen.append(body)
        if request.query_params.get("stream"):

            async def chunks() -> AsyncIterator[bytes]:
                for i in range(CHUNKS):
                    yield f"data: {i}\n\n".encode()

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse({"bytes": len(body)})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(
        routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/health", health)]
    )
    app.add_middleware(RequestGuard, max_body_bytes=CAP)
    return app


@contextlib.contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """`app` under uvicorn in a thread on a free 127.0.0.1 port; always stopped."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + HANG_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=HANG_S)
        sock.close()
        assert not thread.is_alive(), "server thread did not stop"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, list[bytes]]]:
    seen: list[bytes] = []
    with serving(make_app(seen)) as url:
        yield url, seen


def body(hints: object, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [1, 2, 3], "vllm_xargs": {HINTS_KEY: hints}, **extra}


def test_a_body_over_the_cap_is_refused_by_its_length_unread(
    served: tuple[str, list[bytes]],
) -> None:
    url, seen = served
    before = len(seen)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {CAP + 1}\r\n\r\n"
    ).encode()
    status, headers, closed = raw_exchange(url, head)  # not one byte of the body sent
    assert status == 413 and closed
    assert b"connection: close" in headers
    assert len(seen) == before


def test_a_chunked_body_is_refused_once_it_passes_the_cap(served: tuple[str, list[bytes]]) -> None:
    url, seen = served
    before = len(seen)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (CAP + 1, b" " * (CAP + 1))  # the body never ends
    status, _, closed = raw_exchange(url, head, chunk)
    assert status == 413 and closed
    assert len(seen) == before
    # at the cap exactly: delivered
    ok = json.dumps(body([1])).encode()
    ok += b" " * (CAP - len(ok))
    r = httpx.post(url + "/v1/completions", content=iter([ok]), timeout=HANG_S)
    assert r.status_code == 200 and seen[-1] == ok


@pytest.mark.parametrize(
    "hints",
    [
        list(range(1, MAX_PREFIX_HINTS + 2)),
        list(range(30_000)),
        [1, True],
        [1.0],
        [-1],
        "1,2",
        5,
        None,
        [[1]],
    ],
    ids=["bound+1", "3e4", "bool", "float", "negative", "str", "int", "null", "nested"],
)
def test_a_hostile_hint_list_is_refused_before_the_app(
    served: tuple[str, list[bytes]], hints: object
) -> None:
    url, seen = served
    before = len(seen)
    r = httpx.post(url + "/v1/completions", json=body(hints), timeout=HANG_S)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["param"] == f"vllm_xargs.{HINTS_KEY}"
    assert f"at most {MAX_PREFIX_HINTS}" in error["message"]
    assert len(error["message"]) < 300
    assert len(seen) == before
    # the same list under a key nothing reads, or in a body not read as JSON: delivered as is
    other = json.dumps({"vllm_xargs": {"unread": hints}}).encode()
    assert httpx.post(url + "/v1/completions", content=other, timeout=HANG_S).status_code == 200
    plain = json.dumps(body(hints)).encode()
    r = httpx.post(
        url + "/v1/completions", content=plain, headers={"content-type": "text/plain"},
        timeout=HANG_S,
    )  # fmt: skip
    assert r.status_code == 200 and seen[-2:] == [other, plain]


def test_good_bodies_arrive_byte_for_byte(served: tuple[str, list[bytes]]) -> None:
    url, seen = served
    sent = [
        json.dumps(body(list(range(1, MAX_PREFIX_HINTS + 1)), note="é\u2028")).encode(),
        b'  {"vllm_xargs": {"prefix_hints": [3,\n 1 ]} , "prompt": "x"}  ',
        json.dumps(body([7], temperature=float("nan"))).encode(),  # Python's json reads NaN
        b'{"prompt": "\\ud800"}',  # a lone surrogate escape: Python's json reads it too
        b"[1, 2]",  # vLLM refuses these itself
        b"{not json",
    ]
    for data in sent:
        r = httpx.post(
            url + "/v1/completions", content=data, headers={"content-type": "application/json"},
            timeout=HANG_S,
        )  # fmt: skip
        assert r.status_code == 200, (data, r.text)
        assert seen[-1] == data
    assert httpx.get(url + "/health", timeout=HANG_S).status_code == 200


def test_nan_does_not_smuggle_a_long_list_past_the_guard(served: tuple[str, list[bytes]]) -> None:
    url, _ = served
    data = json.dumps(body([float("nan"), *range(100)])).encode()
    r = httpx.post(
        url + "/v1/completions", content=data, headers={"content-type": "application/json"},
        timeout=HANG_S,
    )  # fmt: skip
    assert r.status_code == 400


def test_a_stream_passes_untouched(served: tuple[str, list[bytes]]) -> None:
    url, _ = served
    with httpx.stream(
        "POST", url + "/v1/completions?stream=1", json=body([2], stream=True), timeout=HANG_S
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = b"".join(r.iter_bytes()).decode()
    assert text == "".join(f"data: {i}\n\n" for i in range(CHUNKS))


def test_the_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_BODY_ENV, raising=False)
    assert cap_from_env() == DEFAULT_MAX_BODY_BYTES
    monkeypatch.setenv(MAX_BODY_ENV, "12345")
    assert cap_from_env() == 12345
    assert RequestGuard(make_app([])).max_body_bytes == 12345
    for bad in ("0", "-1", "1e6", "lots", "²"):
        monkeypatch.setenv(MAX_BODY_ENV, bad)
        with pytest.raises(ValueError, match=MAX_BODY_ENV):
            cap_from_env()


def test_importing_the_guard_imports_no_vllm() -> None:
    import subprocess

    code = "import sys, hycache.vllm.guard; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def keeps_the_rule(hints: object) -> bool:
    """`hycache serve`'s `prefix_hints` rule, read plainly: a list of at most
    `MAX_PREFIX_HINTS` ints (not bools) >= 0."""
    return (
        isinstance(hints, list)
        and len(hints) <= MAX_PREFIX_HINTS
        and all(type(h) is int and h >= 0 for h in hints)
    )


ITEM = st.one_of(
    st.integers(-3, 2**70), st.booleans(), st.floats(allow_nan=False), st.text(",[] 0", max_size=4),
    st.none(), st.lists(st.integers(0, 9), max_size=2),
)  # fmt: skip
HINTS = st.one_of(
    st.lists(ITEM, max_size=3 * MAX_PREFIX_HINTS),
    st.lists(st.integers(0, 10**9), min_size=MAX_PREFIX_HINTS - 2, max_size=MAX_PREFIX_HINTS + 2),
    ITEM,
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(hints=HINTS, indent=st.sampled_from([None, 0, 2]), nan=st.booleans())
def test_the_hint_rule_is_hycache_serves(hints: object, indent: int | None, nan: bool) -> None:
    """Refused exactly when the rule is broken, whatever the layout, and on the path a body
    only Python's `json` reads (a NaN elsewhere in it) alike."""
    doc = body(hints, temperature=float("nan") if nan else 0.5)
    data = json.dumps(doc, indent=indent, allow_nan=True).encode()
    assert (body_refusal(data) is None) == keeps_the_rule(hints)
    assert body_refusal(json.dumps({"vllm_xargs": {"other": hints}}).encode()) is None
