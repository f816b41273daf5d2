"""The front door `vllm serve` loads for the plugin: `--middleware hycache.vllm.guard.RequestGuard`.

A pure ASGI middleware (vLLM adds it with `app.add_middleware(cls)`; it is then the outermost
of vLLM's own middleware, so it answers before the API key check). Per HTTP request:

- a body over `max_body_bytes` is refused (413, `Connection: close`) before it is read: by its
  `Content-Length` when the client gives one, else as soon as the bytes received pass the cap.
  The cap is `HYCACHE_MAX_BODY_BYTES` from the environment, else `DEFAULT_MAX_BODY_BYTES`;
- a body FastAPI would read as JSON (no `Content-Type`, `application/json` or
  `application/*+json`: any route, so `/v1/completions`, `/v1/chat/completions`,
  `/v1/responses` and `/v1/messages` alike) whose `vllm_xargs.prefix_hints` is not a list of
  at most `MAX_PREFIX_HINTS` ints >= 0 (the rule `hycache serve` applies to its own
  `prefix_hints`) is refused (400, vLLM's error shape) before vLLM decodes and validates it:
  vLLM's frontend takes ~0.4 s of every stream to take in a 7.5 MiB list, whatever the
  scheduler then reads (docs/vllm-plugin.md, "Hostile hint lists through `vllm serve`");
- anything else reaches vLLM unchanged: the buffered body replayed as one message, then the
  client's own `receive` (disconnects reach a streaming response as before); responses are
  not touched. Non-HTTP scopes (lifespan, websockets) pass straight through.

The body is read once by `msgspec` (a vLLM dependency), which skips every field but
`vllm_xargs.prefix_hints` and keeps that one as raw JSON: a list of k ints has k - 1 commas, so
one with `MAX_PREFIX_HINTS` commas or more is refused without decoding it. A body `msgspec`
cannot read (NaN, a lone surrogate escape, UTF-16: what Python's `json`, vLLM's reader,
accepts beyond RFC 8259) is read again with `json`; one neither reads goes on to vLLM, which
refuses it in its own words. Nothing is logged (uvicorn's access line records the status);
no body is ever logged. Nothing here imports vLLM: it loads on any vLLM release.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from hycache.cache.boundaries import MAX_PREFIX_HINTS, PREFIX_HINTS_RULE, prefix_hints_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# the hints' key in SamplingParams.extra_args (`"vllm_xargs"` in a request body): checked here,
# read by the scheduler (`hycache.vllm.scheduler.parse_hints`)
HINTS_KEY = "prefix_hints"
MAX_BODY_ENV = "HYCACHE_MAX_BODY_BYTES"
# a 128k-token prompt as JSON token ids is about 1 MB, as text about 0.5 MB; multimodal
# bodies (base64 images, audio) can need more: raise it with HYCACHE_MAX_BODY_BYTES
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
HINTS_PARAM = f"vllm_xargs.{HINTS_KEY}"
HINTS_RULE = (
    f"{HINTS_PARAM} must be {PREFIX_HINTS_RULE} (token counts where the prompt's shared "
    "prefixes end)"
)


class _Xargs(msgspec.Struct, rename={"hints": HINTS_KEY}):
    hints: msgspec.Raw = msgspec.Raw(b"")  # empty: absent


class _Body(msgspec.Struct):
    vllm_xargs: _Xargs | None = None


def cap_from_env() -> int:
    """The byte cap: `HYCACHE_MAX_BODY_BYTES` (a positive int) or `DEFAULT_MAX_BODY_BYTES`."""
    raw = os.environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    if not (raw.isascii() and raw.isdigit()) or int(raw) <= 0:
        raise ValueError(f"{MAX_BODY_ENV}: a positive number of bytes, got {raw!r}")
    return int(raw)


def hints_refusal(hints: object) -> str | None:
    """Why a decoded `prefix_hints` value breaks `HINTS_RULE`, or None when it keeps it."""
    problem = prefix_hints_problem(hints)
    return None if problem is None else f"{HINTS_RULE}; {problem}"


def _raw_hints_refusal(raw: bytes) -> str | None:
    """`hints_refusal` of the raw JSON of a `prefix_hints` value; one with `MAX_PREFIX_HINTS`
    commas or more cannot be a list of that many ints, and is refused undecoded."""
    if raw.count(b",") >= MAX_PREFIX_HINTS:
        return f"{HINTS_RULE}; got more entries, or entries that are not ints"
    try:
        return hints_refusal(msgspec.json.decode(raw))
    except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth: not a list of ints
        return f"{HINTS_RULE}; got a value nested too deep"


def body_refusal(body: bytes) -> str | None:
    """Why a JSON request body is refused (its hints), or None to let vLLM have it."""
    try:
        xargs = msgspec.json.decode(body, type=_Body).vllm_xargs
    except msgspec.ValidationError:  # not an object, or vllm_xargs not one: vLLM says so
        return None
    except (msgspec.DecodeError, RecursionError):
        return _python_json_refusal(body)
    if xargs is None or not bytes(xargs.hints):
        return None
    return _raw_hints_refusal(bytes(xargs.hints))


def _python_json_refusal(body: bytes) -> str | None:
    """`body_refusal` for a body only Python's `json` reads (NaN, lone surrogates, UTF-16)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # vLLM cannot read it either: it answers
        return None
    xargs = doc.get("vllm_xargs") if isinstance(doc, dict) else None
    if not isinstance(xargs, dict) or HINTS_KEY not in xargs:
        return None
    return hints_refusal(xargs[HINTS_KEY])


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI reads this request's body as JSON (no content type, `application/json`,
    `application/*+json`)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind in (b"", b"application/json") or (
                kind.startswith(b"application/") and kind.endswith(b"+json")
            )
    return True


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _error(send: Send, status: int, kind: str, message: str, close: bool) -> None:
    """vLLM's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    param = HINTS_PARAM if status == 400 else None
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:  # the rest of the body is never read
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """See the module docstring; `max_body_bytes` overrides the environment's cap."""

    def __init__(self, app: ASGIApp, max_body_bytes: int | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes if max_body_bytes is not None else cap_from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.max_body_bytes
        length = _content_length(scope)
        if length is not None and length > cap:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # gone before the body ended
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and _is_json(scope) and (why := body_refusal(body)) is not None:
            await _error(send, 400, "BadRequestError", why, close=False)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        message = f"request body over {self.max_body_bytes:,} bytes (the cap, {MAX_BODY_ENV})"
        await _error(send, 413, "RequestTooLargeError", message, close=True)
