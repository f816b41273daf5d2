"""`hycache bench serve`: a load generator for an OpenAI-style completions server.

In the manner of `vllm bench serve`: it sends token-id prompts to `POST /v1/completions`
with `"stream": true` (so it can time the first token and the gaps between tokens), either
open loop (`request_rate`: seeded Poisson arrivals, or a trace's own timestamps) or closed loop
(`concurrency` requests in flight), and reports requests ok/failed, request and output
throughput, TTFT / inter-token / end-to-end latency percentiles and the mean
`usage.prompt_tokens_details.cached_tokens`.

Workloads are built by the simulator's one builder (:func:`hycache.sim.build.build_workload`)
from its shapes scaled down so that prompts fit a small model (`SERVE_SHAPES`), with token ids
drawn below `vocab`:

* `system-prompt` and `family`: independent requests behind shared prefixes;
* `multi-turn`: sessions whose turn k + 1 is turn k's prompt + the answer's token ids (as
  streamed back in `choices[].token_ids`, a hycache extension that vLLM also offers) + a new
  user message; a session's turns run one after another, sessions side by side;
* `trace`: a Mooncake-format trace (:class:`hycache.sim.build.TraceSource`).

Failures (connection refused, timeouts, HTTP errors, error events in a stream, a stream
whose token count disagrees with its `usage`) are counted per request and never raised;
only a server that cannot be reached before the run starts raises :class:`LoadgenError`.

Nothing a server sends is buffered without bound: the reachability probe reads the status
line and headers only, under one total deadline (`PROBE_TIMEOUT_S`); an error body is read up
to `MAX_ERROR_BODY_BYTES`; a stream line longer than `MAX_LINE_BYTES` fails its request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hycache.sim.build import (
    WORKLOAD_KINDS,
    PrefixHints,
    TraceSource,
    WorkloadSizes,
    WorkloadSpec,
    build_workload,
)
from hycache.sim.workloads import (
    ChatShape,
    FamilyShape,
    SessionSpec,
    SystemPromptShape,
    poisson_times,
)

if TYPE_CHECKING:
    import httpx

PROBE_TIMEOUT_S = 10.0  # the reachability probe, connect to headers, in all
MAX_ERROR_BODY_BYTES = 64 << 10  # of an error answer's body, the part read
MAX_LINE_BYTES = 4 << 20  # one server-sent event line (a chunk with logprobs is ~kilobytes)

__all__ = [
    "SERVE_SHAPES",
    "WORKLOADS",
    "BenchRequest",
    "LoadgenError",
    "Plan",
    "RequestResult",
    "RunOptions",
    "build_plan",
    "completions_url",
    "run_bench",
    "summarize",
]

WORKLOADS = WORKLOAD_KINDS
DEFAULT_VOCAB = 512  # the tiny preset's vocabulary
DEFAULT_CONCURRENCY = 8

# The simulator's shapes at a size a small model serves in seconds (max_model_len 1024 fits).
SERVE_SHAPES: dict[str, Any] = {
    "system-prompt": SystemPromptShape(
        num_requests=32, shared_prefix_tokens=512, suffix_tokens=64, output_tokens=32
    ),
    "family": FamilyShape(
        families=4,
        requests_per_family=(2, 4),
        shared_prefix_tokens=(128, 512),
        suffix_tokens=(16, 64),
        output_tokens=(16, 32),
    ),
    "multi-turn": ChatShape(
        sessions=8,
        turns=(2, 4),
        system_prompt_tokens=256,
        user_tokens=(16, 64),
        output_tokens=(16, 32),
    ),
}


class LoadgenError(ValueError):
    """The run cannot start (bad URL, unreachable server, missing httpx): one line."""


# ---------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class BenchRequest:
    """One single-shot request of the plan."""

    index: int
    prompt: list[int]
    max_tokens: int
    prefix_hints: tuple[int, ...] = ()


@dataclass
class Plan:
    """What to send: independent `requests`, or multi-turn `sessions` (one job each), and
    for open loop the start time of each job in seconds (None: closed loop)."""

    workload: str
    requests: list[BenchRequest] = field(default_factory=list)
    sessions: list[SessionSpec] = field(default_factory=list)
    arrivals_s: list[float] | None = None

    @property
    def num_jobs(self) -> int:
        return len(self.sessions) if self.sessions else len(self.requests)

    @property
    def num_requests(self) -> int:
        if self.sessions:
            return sum(s.num_turns for s in self.sessions)
        return len(self.requests)


def build_plan(
    workload: str,
    sizes: WorkloadSizes | None = None,
    *,
    seed: int = 0,
    vocab: int = DEFAULT_VOCAB,
    hints: PrefixHints | None = None,
    trace: TraceSource | None = None,
    max_prompt_tokens: int | None = None,
) -> Plan:
    """The requests of `workload` (`hycache.sim.build.build_workload`); unset sizes take
    `SERVE_SHAPES`' values (a trace keeps its own lengths unless `sizes.output_tokens` replaces
    every output length and `max_prompt_tokens` cuts every prompt to its first tokens, which
    keeps what prompts share). Arrivals are not set here (see `RunOptions`); a trace's own
    timestamps are kept in `arrivals_s`."""
    sizes = sizes or WorkloadSizes()
    if workload not in WORKLOADS:
        raise LoadgenError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")
    if workload != "trace" and trace is not None:
        raise LoadgenError(f"--trace replays a trace; it does not go with --workload {workload}")
    shape = sizes.applied(SERVE_SHAPES[workload]) if workload != "trace" else None
    spec = WorkloadSpec(workload, shape, trace, seed, vocab, hints or PrefixHints())
    if workload == "trace":
        if trace is None:
            raise LoadgenError("--workload trace needs --trace FILE.jsonl")
        out = sizes.output_tokens
        if isinstance(out, tuple):
            raise LoadgenError("--output-tokens: a trace takes one length, not a range")
        specs = build_workload(spec).requests
        cut = max_prompt_tokens
        reqs = [
            BenchRequest(i, s.prompt_token_ids[:cut].tolist(), s.max_tokens if out is None else out)
            for i, s in enumerate(specs)
        ]
        t0 = (specs[0].arrival_s or 0.0) if specs else 0.0
        return Plan(workload, reqs, arrivals_s=[(s.arrival_s or 0.0) - t0 for s in specs])
    built = build_workload(spec)
    if workload == "multi-turn":
        return Plan(workload, sessions=list(built.sessions))
    reqs = [
        BenchRequest(i, s.prompt_token_ids.tolist(), s.max_tokens, s.prefix_hints)
        for i, s in enumerate(built.requests)
    ]
    return Plan(workload, reqs)


# ---------------------------------------------------------------------------------- results
@dataclass
class RequestResult:
    """One request's outcome; times in seconds, `start_s` from the run's start."""

    index: int
    ok: bool = False
    error: str | None = None
    session: int | None = None
    turn: int | None = None
    start_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0  # streamed
    completion_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # from usage
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between token-bearing chunks
    token_ids: list[int] | None = None  # streamed ids (None: the server sent text only)

    def line(self) -> dict[str, Any]:
        """The JSON line of this request (without its token ids)."""
        return {
            "index": self.index,
            "session": self.session,
            "turn": self.turn,
            "ok": self.ok,
            "error": self.error,
            "start_s": round(self.start_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1e3, 3),
            "e2e_ms": None if self.e2e_s is None else round(self.e2e_s * 1e3, 3),
            "itl_ms": [round(x * 1e3, 3) for x in self.itl_s],
        }


@dataclass(frozen=True)
class RunOptions:
    """How to send: where, how fast, and which optional fields."""

    url: str
    concurrency: int | None = None  # closed loop (or, with request_rate, a cap in flight)
    request_rate: float | None = None  # open loop, Poisson arrivals (jobs/s)
    replay_timestamps: bool = False  # open loop at the plan's own arrivals (a trace)
    api_key: str | None = None
    model: str | None = None
    prefix_hint: bool = False
    ignore_eos: bool = True
    timeout_s: float = 300.0  # httpx's: connect, and each read of the stream
    request_timeout_s: float = 180.0  # the whole request, first byte to `[DONE]`
    seed: int = 0


def completions_url(url: str) -> str:
    """`url` as the completions endpoint: a base (`http://h:p`), `.../v1` or the endpoint."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise LoadgenError(f"--url: expected http://HOST:PORT, got {url!r}")
    if u.endswith("/v1/completions"):
        return u
    if u.endswith("/v1"):
        return u + "/completions"
    return u + "/v1/completions"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _http_error(status: int, raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        message = doc["error"]["message"] if isinstance(doc.get("error"), dict) else doc["error"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", errors="replace")
    return _one_line(f"HTTP {status}: {message}")


@dataclass
class _Stream:
    """What a streamed response has shown so far."""

    start: float
    last: float | None = None
    ids: list[int] | None = field(default_factory=list)  # None: the server sent text only
    done: bool = False


def _take_chunk(chunk: dict[str, Any], res: RequestResult, st: _Stream) -> None:
    """Count a chunk's tokens (timing the first and the gaps) and read its usage."""
    now = time.perf_counter()
    new = 0
    for choice in chunk.get("choices") or []:
        tok = choice.get("token_ids")
        if tok is not None:
            new += len(tok)
            if st.ids is not None:
                st.ids.extend(int(t) for t in tok)
        elif choice.get("text"):
            new += 1  # a text-only server: count a chunk as one token
            st.ids = None
    if new:
        if st.last is None:
            res.ttft_s = now - st.start
        else:
            res.itl_s.append(now - st.last)
        st.last = now
        res.output_tokens += new
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        res.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens", usage.get("cached_tokens"))
        res.cached_tokens = None if cached is None else int(cached)


class StreamLineTooLong(ValueError):
    """A server-sent event line exceeded `MAX_LINE_BYTES`."""


async def _lines(resp: httpx.Response, limit: int = MAX_LINE_BYTES) -> AsyncIterator[str]:
    """The response's lines (`\n`, `\r\n` or `\r` ends one), never holding more than
    `limit` bytes of one line (StreamLineTooLong past it)."""
    pending = b""
    async for chunk in resp.aiter_bytes():
        pending += chunk
        *whole, pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for line in whole:
            if len(line) > limit:
                raise StreamLineTooLong(f"a stream line over {limit:,} bytes")
            yield line.decode("utf-8", errors="replace")
        if len(pending) > limit:
            raise StreamLineTooLong(f"a stream line over {limit:,} bytes")
    if pending:
        yield pending.decode("utf-8", errors="replace")


async def _read_capped(resp: httpx.Response, limit: int = MAX_ERROR_BODY_BYTES) -> bytes:
    """At most the first `limit` bytes of the body (the rest is never read)."""
    out = b""
    async for chunk in resp.aiter_bytes():
        out += chunk
        if len(out) >= limit:
            return out[:limit]
    return out


async def _read_stream(resp: httpx.Response, res: RequestResult, st: _Stream) -> None:
    """Read server-sent events up to `[DONE]`; an error event ends up in `res.error`."""
    async for line in _lines(resp):
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            st.done = True
            return
        chunk = json.loads(data)
        if chunk.get("error"):
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            res.error = _one_line(f"stream error: {message}")
            return
        _take_chunk(chunk, res, st)


def _body(opts: RunOptions, prompt: list[int], max_tokens: int, hints: Sequence[int]) -> Any:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": opts.ignore_eos,
    }
    if opts.model:
        body["model"] = opts.model
    if opts.prefix_hint and hints:
        body["prefix_hints"] = list(hints)
    return body


async def send_one(
    client: httpx.AsyncClient,
    endpoint: str,
    opts: RunOptions,
    index: int,
    prompt: list[int],
    max_tokens: int,
    prefix_hints: Sequence[int],
    t0: float,
) -> RequestResult:
    """Send one streaming request and time it; every failure ends up in the result."""
    import httpx

    body = _body(opts, prompt, max_tokens, prefix_hints)
    res = RequestResult(index, prompt_tokens=len(prompt))
    st = _Stream(time.perf_counter())
    res.start_s = st.start - t0
    try:
        async with (
            asyncio.timeout(opts.request_timeout_s),
            client.stream("POST", endpoint, json=body) as resp,
        ):
            if resp.status_code != 200:
                res.error = _http_error(resp.status_code, await _read_capped(resp))
                return res
            await _read_stream(resp, res, st)
            if res.error is not None:
                return res
    except TimeoutError:
        res.error = f"timed out after {opts.request_timeout_s:g} s (--request-timeout)"
        return res
    except httpx.HTTPError as exc:
        res.error = _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return res
    except (ValueError, TypeError, AttributeError) as exc:
        res.error = _one_line(f"bad response: {exc}")
        return res
    res.e2e_s = time.perf_counter() - st.start
    res.token_ids = st.ids
    if not st.done:
        res.error = "stream ended before [DONE]"
    elif res.completion_tokens is not None and res.completion_tokens != res.output_tokens:
        res.error = f"streamed {res.output_tokens} tokens but usage says {res.completion_tokens}"
    else:
        res.ok = True
    return res


async def check_reachable(
    client: httpx.AsyncClient, endpoint: str, timeout: float = PROBE_TIMEOUT_S
) -> None:
    """Raise LoadgenError when nothing answers at `endpoint` within `timeout` seconds in all
    (any HTTP status line will do: the body is never read)."""
    import httpx

    try:
        async with asyncio.timeout(timeout), client.stream("GET", endpoint, timeout=timeout):
            pass  # the status line and headers have come: someone answers
    except TimeoutError:
        raise LoadgenError(f"cannot reach {endpoint}: no answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise LoadgenError(f"cannot reach {endpoint}: {_one_line(reason)}") from None


@dataclass
class _Jobs:
    """The plan's jobs against one client: a request, or a whole session, each."""

    plan: Plan
    client: httpx.AsyncClient
    endpoint: str
    opts: RunOptions
    on_done: Callable[[RequestResult], None]
    t0: float = 0.0
    results: list[RequestResult] = field(default_factory=list)

    def finish(self, res: RequestResult) -> None:
        self.results.append(res)
        self.on_done(res)

    async def send(
        self, index: int, prompt: list[int], max_tokens: int, hints: Sequence[int]
    ) -> RequestResult:
        return await send_one(
            self.client, self.endpoint, self.opts, index, prompt, max_tokens, hints, self.t0
        )

    async def run_session(self, job: int) -> None:
        s = self.plan.sessions[job]
        base = sum(x.num_turns for x in self.plan.sessions[:job])
        outputs: list[np.ndarray] = []
        for turn in range(s.num_turns):
            if len(outputs) < turn:  # an earlier turn failed or gave no token ids
                res = RequestResult(base + turn, session=job, turn=turn)
                res.error = "not sent: an earlier turn of the session failed"
                self.finish(res)
                continue
            prompt = s.prompt_for_turn(turn, outputs).tolist()
            res = await self.send(base + turn, prompt, s.output_tokens[turn], s.prefix_hints)
            res.session, res.turn = job, turn
            if res.ok and res.token_ids is None:
                res.ok = False
                res.error = "multi-turn needs token_ids in the stream (text only came back)"
            if res.ok:
                outputs.append(np.asarray(res.token_ids, dtype=np.int64))
            self.finish(res)

    async def job(self, i: int) -> None:
        if self.plan.sessions:
            await self.run_session(i)
            return
        req = self.plan.requests[i]
        self.finish(await self.send(req.index, req.prompt, req.max_tokens, req.prefix_hints))

    async def open_loop(self) -> None:
        """Start each job at its arrival (Poisson, or the plan's own); `concurrency` caps
        those in flight."""
        opts, n = self.opts, self.plan.num_jobs
        if opts.request_rate is not None:
            times = poisson_times(n, opts.request_rate, opts.seed).tolist()
        else:
            times = list(self.plan.arrivals_s or [0.0] * n)
        gate = asyncio.Semaphore(opts.concurrency) if opts.concurrency else None

        async def gated(i: int) -> None:
            if gate is None:
                await self.job(i)
                return
            async with gate:
                await self.job(i)

        tasks: list[asyncio.Task[None]] = []
        for i, at in enumerate(times):
            delay = self.t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(gated(i)))
        await asyncio.gather(*tasks)

    async def closed_loop(self) -> None:
        """`concurrency` workers, each taking the next job when its last one is done."""
        pending = iter(range(self.plan.num_jobs))

        async def worker() -> None:
            for i in pending:
                await self.job(i)

        n = min(self.opts.concurrency or DEFAULT_CONCURRENCY, max(self.plan.num_jobs, 1))
        await asyncio.gather(*(worker() for _ in range(n)))


async def _run_async(
    plan: Plan, opts: RunOptions, on_done: Callable[[RequestResult], None]
) -> tuple[list[RequestResult], float]:
    import httpx

    endpoint = completions_url(opts.url)
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(
        max_connections=opts.concurrency or max(plan.num_jobs, 1), max_keepalive_connections=64
    )
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
        await check_reachable(client, endpoint)
        jobs = _Jobs(plan, client, endpoint, opts, on_done, t0=time.perf_counter())
        if opts.request_rate is not None or opts.replay_timestamps:
            await jobs.open_loop()
        else:
            await jobs.closed_loop()
        duration = time.perf_counter() - jobs.t0
    jobs.results.sort(key=lambda r: r.index)
    return jobs.results, duration


def run_bench(
    plan: Plan, opts: RunOptions, on_done: Callable[[RequestResult], None] | None = None
) -> tuple[list[RequestResult], float]:
    """Run the plan against the server; the results (by index) and the run's wall time."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise LoadgenError("hycache bench serve needs httpx: pip install httpx") from None
    completions_url(opts.url)  # a bad URL fails before anything else
    return asyncio.run(_run_async(plan, opts, on_done or (lambda _r: None)))


# ---------------------------------------------------------------------------------- summary
def _dist(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and p50 / p95 / p99 of `values` (seconds) in milliseconds; None when empty."""
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    a = np.asarray(values, dtype=float) * 1e3
    p50, p95, p99 = np.percentile(a, [50, 95, 99]).tolist()
    return {"mean": float(a.mean()), "p50": p50, "p95": p95, "p99": p99}


def summarize(results: Sequence[RequestResult], duration_s: float) -> dict[str, Any]:
    """The run's figures: counts, throughputs, latency distributions, cached tokens."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    dur = max(duration_s, 1e-9)
    return {
        "requests": len(results),
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "request_throughput_per_s": len(ok) / dur,
        "output_throughput_tok_per_s": out_tokens / dur,
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "mean_cached_tokens": float(np.mean(cached)) if cached else None,
        "cached_token_ratio": sum(cached) / prompt_tokens if cached and prompt_tokens else None,
        "ttft_ms": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": _dist([x for r in ok for x in r.itl_s]),
        "e2e_ms": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "errors": dict(Counter(r.error for r in results if r.error).most_common()),
    }
