"""Load test of `hycache serve`: many concurrent streaming clients on a pool that preempts.

    .venv/bin/python benchmarks/bench_serve_load.py [--clients 200] [--rounds 3] [--json OUT]

The server runs in a child process (this script in its `_server` mode: `hycache serve`'s
`create_app` + `HycacheServer`, plus one read-only `GET /bench/engine` route for the
scheduler's preemption count) on a free 127.0.0.1 port, with a small block pool
(`--num-blocks`, `--block-size 16 --prefix-match-unit 4 --num-speculative-tokens 2`), so that
requests get preempted. It is always stopped at the end.

Each round, `--clients` httpx async clients stream `POST /v1/completions` at once (greedy,
`ignore_eos`), their prompts a few shared system prompts plus private suffixes (ids < 512). A
quarter of them hang up halfway through their stream. Checked, per round:

- no failed request: every client that stays gets HTTP 200, a finish reason, as many tokens as
  `usage.completion_tokens` says and `max_tokens`, and a final `[DONE]`;
- streamed = final: the concatenated streamed `token_ids` equal the `token_ids` of a
  non-streamed request of the same prompt sent after the round (a client that hung up: its
  tokens are a prefix of them);
- every block back in the pool once the server is idle (`/v1/stats`: used 0, free = total
  usable, i.e. `num_blocks - 1`, block 0 being the null block);
- the server's RSS (`/proc/<pid>/status` VmRSS, read once idle) flat over the rounds: from
  round 2 on (round 1 warms allocators up) it may grow by at most `--rss-tolerance-mb`.

Prints a table per round (throughput, TTFT p50/p95, preemptions, blocks, RSS), exits 1 if any
check fails, and writes every figure to `--json OUT` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VOCAB = 512  # the tiny preset
SERVER_MODE = "_server"


# ---------------------------------------------------------------------------------- server
def run_server(argv: list[str]) -> int:
    """The child process: `hycache serve` with the bench's engine route added."""
    import uvicorn

    from hycache.cli.args import add_serve_args, add_store_args, build_llm
    from hycache.server.app import create_app
    from hycache.server.run import HycacheServer

    parser = argparse.ArgumentParser(prog="bench_serve_load.py _server")
    add_serve_args(parser)
    add_store_args(parser)
    args = parser.parse_args(argv)
    llm = build_llm(args)
    app = create_app(llm, model_name="tiny")
    worker = app.state.worker

    def engine_counters(llm: Any) -> dict[str, int]:
        sched = llm.scheduler
        return {
            "num_preemptions": int(sched.num_preemptions),
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "live_requests": int(sched.cache.num_live_requests),
            "streamed_entries": len(getattr(llm, "_streamed", {})),
            "worker_channels": len(getattr(worker, "_channels", {})),
        }

    @app.get("/bench/engine")
    async def bench_engine() -> dict[str, int]:
        return await asyncio.wrap_future(worker.call(engine_counters))

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = HycacheServer(config, worker)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 if unreadable)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def child_server(serve_args: list[str], log_path: Path) -> Iterator[tuple[str, int]]:
    """Start the server child on a free port; yield (url, pid); always stop it."""
    import httpx

    port = free_port()
    cmd = [sys.executable, __file__, SERVER_MODE, *serve_args, "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; see {log_path}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# ---------------------------------------------------------------------------------- clients
@dataclass
class ClientResult:
    index: int
    prompt: list[int]
    max_tokens: int
    hang_up_at: int | None  # tokens after which the client closes its stream; None: stays
    tokens: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    latency_s: float = 0.0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    done: bool = False  # saw `[DONE]`
    hung_up: bool = False
    error: str | None = None


@dataclass
class RoundReport:
    round: int
    clients: int
    hung_up: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    preemptions: int
    failed: int
    mismatched: int
    idle_wait_s: float
    ran_on_tokens: int  # tokens of hung-up requests that finished anyway (not aborted)
    used_blocks: int
    free_blocks: int
    usable_blocks: int
    cached_blocks: int
    rss_mib: float
    leftover: dict[str, int]
    failures: list[str]


def make_prompts(
    rng: random.Random, n: int, systems: list[list[int]], suffix: tuple[int, int]
) -> list[list[int]]:
    """n prompts: one of the shared system prompts + a private random suffix."""
    return [
        systems[i % len(systems)] + [rng.randrange(VOCAB) for _ in range(rng.randint(*suffix))]
        for i in range(n)
    ]


async def stream_one(client: Any, res: ClientResult) -> None:
    body = {
        "model": "tiny",
        "prompt": res.prompt,
        "max_tokens": res.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line:
                    continue
                if not line.startswith("data: "):
                    res.error = f"not an SSE data line: {line[:100]!r}"
                    return
                data = line[len("data: ") :]
                if data == "[DONE]":
                    res.done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    res.error = f"error event: {event['error']}"
                    continue  # `[DONE]` follows
                choice = event["choices"][0]
                ids = choice.get("token_ids") or []
                if ids and res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - t0
                res.tokens.extend(ids)
                if choice.get("finish_reason") is not None:
                    res.finish_reason = choice["finish_reason"]
                    res.completion_tokens = (event.get("usage") or {}).get("completion_tokens")
                if res.hang_up_at is not None and len(res.tokens) >= res.hang_up_at:
                    if res.finish_reason is None:
                        res.hung_up = True
                    break  # leaving the block closes the (unfinished) response
    except Exception as e:  # a transport error is a failed request, not a crash of the bench
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.latency_s = time.perf_counter() - t0


async def final_tokens(client: Any, prompt: list[int], max_tokens: int) -> list[int] | str:
    """The non-streamed answer's token ids, or an error string."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    try:
        resp = await client.post("/v1/completions", json=body)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    return list(resp.json()["choices"][0]["token_ids"])


async def get_json(client: Any, path: str) -> dict[str, Any]:
    resp = await client.get(path)
    resp.raise_for_status()
    return dict(resp.json())


async def wait_idle(client: Any, timeout: float) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Poll until nothing runs or waits and the used-block count is stable; the last stats and
    engine counters, and how long it took."""
    t0 = time.perf_counter()
    last_used = -1
    while True:
        stats = await get_json(client, "/v1/stats")
        engine = await get_json(client, "/bench/engine")
        used = int(stats["cache"]["used_blocks"])
        idle = stats["running"] == 0 and stats["waiting"] == 0
        if (idle and used == last_used) or time.perf_counter() - t0 > timeout:
            return stats, engine, time.perf_counter() - t0
        last_used = used if idle else -1
        await asyncio.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_round(
    url: str, pid: int, rnd: int, args: argparse.Namespace, systems: list[list[int]]
) -> tuple[RoundReport, list[ClientResult]]:
    import httpx

    rng = random.Random(args.seed * 1000 + rnd)
    prompts = make_prompts(rng, args.clients, systems, (args.suffix_min, args.suffix_max))
    hang_every = 4  # a quarter of the clients hang up
    results = []
    for i, p in enumerate(prompts):
        mt = rng.randint(args.min_tokens, args.max_tokens)
        hang = mt // 2 if i % hang_every == hang_every - 1 else None
        results.append(ClientResult(i, p, mt, hang))
    limits = httpx.Limits(max_connections=args.clients + 16, max_keepalive_connections=0)
    timeout = httpx.Timeout(args.timeout, connect=30)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        before = await get_json(client, "/bench/engine")
        out_before = int((await get_json(client, "/v1/stats"))["engine"]["output_tokens"])
        t0 = time.perf_counter()
        await asyncio.gather(*(stream_one(client, r) for r in results))
        wall = time.perf_counter() - t0
        stats, engine, idle_wait = await wait_idle(client, args.idle_timeout)
        rss = rss_kib(pid) / 1024
        # the final answers, checked after the idle reading so they do not disturb it
        sem = asyncio.Semaphore(args.ref_concurrency)

        async def ref(r: ClientResult) -> list[int] | str:
            async with sem:
                return await final_tokens(client, r.prompt, r.max_tokens)

        refs = await asyncio.gather(*(ref(r) for r in results))
        await wait_idle(client, args.idle_timeout)

    failures: list[str] = []
    failed = mismatched = 0
    for r, final in zip(results, refs, strict=True):
        problem = None
        if r.error is not None:
            problem = r.error
        elif r.hang_up_at is None or not r.hung_up:
            if not r.done:
                problem = "stream ended without [DONE]"
            elif r.finish_reason not in ("length", "stop"):
                problem = f"finish_reason {r.finish_reason!r}"
            elif r.completion_tokens != len(r.tokens):
                problem = f"usage says {r.completion_tokens} tokens, streamed {len(r.tokens)}"
            elif len(r.tokens) != r.max_tokens:
                problem = f"{len(r.tokens)} tokens, asked for {r.max_tokens} with ignore_eos"
        if problem is not None:
            failed += 1
            failures.append(f"client {r.index}: {problem}")
            continue
        if isinstance(final, str):
            failed += 1
            failures.append(f"client {r.index}: the non-streamed request failed: {final}")
        elif (r.hung_up and final[: len(r.tokens)] != r.tokens) or (
            not r.hung_up and final != r.tokens
        ):
            mismatched += 1
            failures.append(
                f"client {r.index}: streamed {r.tokens} != final {final} "
                f"(prompt len {len(r.prompt)}, max_tokens {r.max_tokens})"
            )
    # the engine counts the output tokens of finished requests only: beyond the stayers'
    # tokens are those of hung-up requests that ran to the end instead of being aborted
    stayed = sum(len(r.tokens) for r in results if not r.hung_up)
    ran_on = int(stats["engine"]["output_tokens"]) - out_before - stayed
    cache = stats["cache"]
    usable = int(cache["num_blocks"]) - 1
    if cache["used_blocks"] != 0 or cache["free_blocks"] != usable:
        failures.append(
            f"blocks not back in the pool: used {cache['used_blocks']}, "
            f"free {cache['free_blocks']} of {usable}"
        )
    leftover = {k: v for k, v in engine.items() if k != "num_preemptions" and v}
    if leftover:
        failures.append(f"engine state left after the round: {leftover}")
    ttfts = [r.ttft_s * 1e3 for r in results if r.ttft_s is not None]
    out_tokens = sum(len(r.tokens) for r in results)
    report = RoundReport(
        round=rnd,
        clients=len(results),
        hung_up=sum(r.hung_up for r in results),
        wall_s=wall,
        output_tokens=out_tokens,
        tokens_per_s=out_tokens / wall,
        requests_per_s=len(results) / wall,
        ttft_p50_ms=pct(ttfts, 0.5),
        ttft_p95_ms=pct(ttfts, 0.95),
        preemptions=int(engine["num_preemptions"]) - int(before["num_preemptions"]),
        failed=failed,
        mismatched=mismatched,
        idle_wait_s=idle_wait,
        ran_on_tokens=ran_on,
        used_blocks=int(cache["used_blocks"]),
        free_blocks=int(cache["free_blocks"]),
        usable_blocks=usable,
        cached_blocks=int(cache["cached_blocks"]),
        rss_mib=rss,
        leftover=leftover,
        failures=failures,
    )
    return report, results


def print_table(reports: list[RoundReport], checks: dict[str, bool]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hycache serve under load")
    cols = [
        "round", "clients", "hung up", "wall s", "out tok/s", "req/s", "TTFT p50 ms",
        "TTFT p95 ms", "preempt", "failed", "mismatch", "ran on tok", "used/free blocks",
        "RSS MiB",
    ]  # fmt: skip
    for c in cols:
        table.add_column(c, justify="right")
    for r in reports:
        table.add_row(
            str(r.round),
            str(r.clients),
            str(r.hung_up),
            f"{r.wall_s:.1f}",
            f"{r.tokens_per_s:.0f}",
            f"{r.requests_per_s:.1f}",
            f"{r.ttft_p50_ms:.0f}",
            f"{r.ttft_p95_ms:.0f}",
            str(r.preemptions),
            str(r.failed),
            str(r.mismatched),
            str(r.ran_on_tokens),
            f"{r.used_blocks}/{r.free_blocks} of {r.usable_blocks}",
            f"{r.rss_mib:.1f}",
        )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    for r in reports:
        for line in r.failures[:10]:
            console.print(f"[red]round {r.round}: {line}[/red]", highlight=False)
        if len(r.failures) > 10:
            console.print(f"[red]round {r.round}: ... {len(r.failures) - 10} more[/red]")
    for name, ok in checks.items():
        console.print(f"{'[green]PASS' if ok else '[red]FAIL'}[/] {name}", highlight=False)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-tokens", type=int, default=16, help="max_tokens drawn from this..")
    p.add_argument("--max-tokens", type=int, default=32, help="..to this")
    p.add_argument("--systems", type=int, default=4, help="shared system prompts")
    p.add_argument("--system-len", type=int, default=48, help="tokens per system prompt")
    p.add_argument("--suffix-min", type=int, default=4)
    p.add_argument("--suffix-max", type=int, default=24)
    p.add_argument("--num-blocks", type=int, default=96, help="the server's block pool")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefix-match-unit", type=int, default=4)
    p.add_argument("--num-speculative-tokens", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--policy", default=None, help="the server's cache policy (default: its own)")
    p.add_argument("--ref-concurrency", type=int, default=64, help="non-streamed checks at once")
    p.add_argument("--rss-tolerance-mb", type=float, default=32.0)
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    serve_args = [
        "--model", "tiny",
        "--num-blocks", str(args.num_blocks),
        "--block-size", str(args.block_size),
        "--prefix-match-unit", str(args.prefix_match_unit),
        "--num-speculative-tokens", str(args.num_speculative_tokens),
        "--max-num-seqs", str(args.max_num_seqs),
        "--max-model-len", str(args.max_model_len),
        "--seed", str(args.seed),
    ]  # fmt: skip
    if args.policy is not None:
        serve_args += ["--policy", args.policy]
    rng = random.Random(args.seed)
    systems = [[rng.randrange(VOCAB) for _ in range(args.system_len)] for _ in range(args.systems)]
    reports: list[RoundReport] = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        try:
            with child_server(serve_args, log_path) as (url, pid):
                rss_start = rss_kib(pid) / 1024
                for rnd in range(1, args.rounds + 1):
                    report, _ = asyncio.run(run_round(url, pid, rnd, args, systems))
                    reports.append(report)
                    print(
                        f"round {rnd}: {report.wall_s:.1f}s, failed {report.failed}, "
                        f"mismatched {report.mismatched}, preemptions {report.preemptions}, "
                        f"used blocks {report.used_blocks}, RSS {report.rss_mib:.1f} MiB",
                        flush=True,
                    )
        finally:
            server_log = log_path.read_text(errors="replace") if log_path.exists() else ""
    total_s = time.perf_counter() - t_start
    rss = [r.rss_mib for r in reports]
    base = rss[1] if len(rss) >= 3 else rss[0] if rss else 0.0
    checks = {
        "every request completed (no failures)": all(r.failed == 0 for r in reports),
        "streamed tokens = final tokens": all(r.mismatched == 0 for r in reports),
        "every block back in the pool after each round": all(
            r.used_blocks == 0 and r.free_blocks == r.usable_blocks and not r.leftover
            for r in reports
        ),
        f"RSS flat (growth <= {args.rss_tolerance_mb:g} MiB from round "
        f"{2 if len(rss) >= 3 else 1})": bool(rss) and max(rss) - base <= args.rss_tolerance_mb,
        "preemption happened": any(r.preemptions > 0 for r in reports),
    }
    print_table(reports, checks)
    print(f"total {total_s:.1f}s; server RSS at start {rss_start:.1f} MiB")
    errors = [ln for ln in server_log.splitlines() if "Error" in ln or "Traceback" in ln]
    if errors:
        print(f"server log: {len(errors)} error lines, first: {errors[0][:200]}")
    if args.json is not None:
        payload = {
            "args": vars(args) | {"json": str(args.json)},
            "total_s": total_s,
            "rss_start_mib": rss_start,
            "checks": checks,
            "rounds": [asdict(r) for r in reports],
            "server_error_lines": errors[:50],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == SERVER_MODE:
        sys.exit(run_server(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
