"""Who may call `hycache serve`: ASGI middleware run before any route.

- `ApiKeyMiddleware`: Bearer auth on `/v1/*`, the tokenizer routes and the API docs
  (`GUARDED_PREFIXES`); `/health` and `/metrics` stay open.
- `LoopbackGuardMiddleware`: a server listening on loopback refuses foreign `Host`s (DNS
  rebinding) and `Origin`s (`null` too); `is_loopback` / `host_of` parse the headers.
- `JsonBodyMiddleware`: every POST must be `application/json` (no simple cross-site request
  can send that).
- `StrictHttpMiddleware` (outermost): what h11 lets through and a careful server refuses, each
  answered and the connection closed: a request with both `Content-Length` and
  `Transfer-Encoding` (request smuggling: the body's framing is ambiguous), an HTTP version
  other than 1.0 or 1.1, and a `Host`, `Origin`, `Content-Length` or `Transfer-Encoding`
  header sent twice (which one counts is anyone's guess).
"""

from __future__ import annotations

import hmac
import ipaddress
import re

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from hycache.server.protocol import error_response

# what the API key guards: the OpenAI routes, vLLM's tokenizer routes and the API's own docs
GUARDED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/docs", "/redoc", "/openapi.json")


class ApiKeyMiddleware:
    """Bearer-token auth on every `/v1/*` route, `/tokenize`, `/detokenize` and the API docs
    (`/docs`, `/redoc`, `/openapi.json`) (ASGI, so request bodies and disconnects pass through
    untouched); `/health` and `/metrics` stay open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(GUARDED_PREFIXES):
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    given = value
                    break
            if not hmac.compare_digest(given, self.expected):
                response = error_response(
                    401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_api_key"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_PORT = re.compile(r"[0-9]{1,5}")  # and at most 65535 (`_port_ok`)
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")  # a DNS name or a dotted IPv4 address


def _port_ok(port: str) -> bool:
    return _PORT.fullmatch(port) is not None and int(port) <= 65535


def host_of(value: str) -> str | None:
    """The host of a Host header or an Origin's authority (`name`, `name:port`, `[v6]`,
    `[v6]:port`), or None when `value` is anything else (userinfo such as `1@evil.com`, a
    path, spaces, an empty or non-numeric port)."""
    value = value.strip().lower()
    if value.startswith("["):
        close = value.find("]")
        host, rest = value[1:close], value[close + 1 :]
        if close < 0 or (rest and not (rest[0] == ":" and _port_ok(rest[1:]))):
            return None
        try:
            return host if ipaddress.ip_address(host).version == 6 else None
        except ValueError:
            return None
    host, colon, port = value.partition(":")
    if colon and not _port_ok(port):
        return None
    return host if _NAME.fullmatch(host) else None


def is_loopback(host: str) -> bool:
    """Whether a host (with or without a port) names this machine: localhost or a loopback IP."""
    name = host_of(host)
    if name is None:
        return False
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _origin_is_loopback(origin: str) -> bool:
    """An Origin header (`scheme://authority`, nothing after it) naming this machine. The
    opaque origin `null` (sandboxed iframes, `file:` pages, redirects) is never loopback."""
    scheme, sep, authority = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return False
    return is_loopback(authority)


class LoopbackGuardMiddleware:
    """For a server listening on loopback only: refuse (403) a request whose `Host` is not a
    loopback name (DNS rebinding: a web page's own domain resolving to 127.0.0.1) or that
    carries any `Origin` but a loopback one, `null` included (a cross-site post from a browser,
    even from a sandboxed frame). Clients on this machine, which send `Host: 127.0.0.1:PORT`
    or `localhost:PORT` and no foreign Origin, pass."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k: v.decode("latin-1") for k, v in scope.get("headers", [])}
            host = headers.get(b"host", "")
            origin = headers.get(b"origin")  # sent twice: StrictHttpMiddleware refused it
            bad = None
            if not is_loopback(host):
                bad = f"Host {host!r} is not a loopback name; this server serves this machine only"
            elif origin is not None and not _origin_is_loopback(origin):
                bad = f"Origin {origin!r} is not allowed (cross-site request)"
            if bad is not None:
                await error_response(403, bad, "forbidden_host")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_json_media_type(content_type: str | None) -> bool:
    """Whether a Content-Type header says `application/json` (parameters such as a charset
    allowed)."""
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


class JsonBodyMiddleware:
    """Every POST must say `Content-Type: application/json` (415 otherwise). A browser can send
    `text/plain`, form-encoded or multipart bodies cross-site without a CORS preflight; a JSON
    body it cannot, so a page elsewhere never drives this server with a simple request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            given = next((v for k, v in scope.get("headers", []) if k == b"content-type"), None)
            if not is_json_media_type(given.decode("latin-1") if given is not None else None):
                response = error_response(
                    415, "Content-Type must be application/json", "unsupported_media_type"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


HTTP_VERSIONS = ("1.0", "1.1")
SINGLE_HEADERS = (b"host", b"origin", b"content-length", b"transfer-encoding")


def _refuse_and_close(status: int, message: str) -> JSONResponse:
    response = error_response(status, message, "bad_http_request")
    response.headers["connection"] = "close"  # h11 then closes after the answer
    return response


class StrictHttpMiddleware:
    """Refuse, and close the connection after answering, what HTTP/1.1 servers should never
    guess at (see the module docstring). Runs before every other check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            bad = self.problem(scope)
            if bad is not None:
                status, message = bad
                await _refuse_and_close(status, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def problem(scope: Scope) -> tuple[int, str] | None:
        version = str(scope.get("http_version", "1.1"))
        if version not in HTTP_VERSIONS:
            return 505, f"HTTP/{version} is not supported (HTTP/1.0 or HTTP/1.1)"
        names = [k.lower() for k, _ in scope.get("headers", [])]
        for name in SINGLE_HEADERS:
            if names.count(name) > 1:
                return 400, f"the {name.decode()} header is sent more than once"
        if b"content-length" in names and b"transfer-encoding" in names:
            return 400, "a request may not carry both Content-Length and Transfer-Encoding"
        return None
