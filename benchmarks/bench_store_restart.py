"""Load test of `hycache serve` on a Mooncake store whose master is killed and restarted.

    .venv/bin/python benchmarks/bench_store_restart.py [--clients 32] [--rounds 6] [--json OUT]

Starts a `mooncake_master` on a free loopback port and one `hycache serve --kv-store
mooncake://127.0.0.1:PORT` (tiny model, B=16, u=4, k=2, a small device pool so that family
prefixes are evicted and come back from the store), both always stopped at the end. Then
`--clients` closed-loop httpx clients each send `--rounds` requests, one after another:
family-shaped prompts (a few shared prefixes, a private suffix each, greedy, `max_tokens` 5).
When a quarter of the requests have finished the master is killed (SIGKILL, a crash); when
half have, a new master is started on the same port (empty: Mooncake keeps objects in memory).

Checked (exit status 1 if any fails):
- no failed request (HTTP 200 for every one);
- tokens identical to an engine without prefix caching, computed in this process afterwards;
- every device block back in the pool once the server is idle (`/v1/stats`: used 0, free =
  usable), and no request left running or waiting;
- store hits before the kill and again after the restart (none are possible in between).

Reported: requests, store hit tokens and latency per phase (before the kill, during the outage,
after the restart; a request belongs to the phase in which it was sent), the store's error
count, and the figures above. Everything is bounded: request count, a per-request timeout and
`--deadline-s` for the whole load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from hycache.store.master import MooncakeMaster, free_port

VOCAB = 512  # the tiny preset
MAX_TOKENS = 5
GEOMETRY = ["--block-size", "16", "--prefix-match-unit", "4", "--max-model-len", "256"]
RUN_CLI = "import sys; from hycache.cli.main import main; sys.exit(main())"
PHASES = ("before kill", "outage", "after restart")


@dataclass
class Result:
    client: int
    round: int
    family: int
    phase: str = ""
    status: int = 0
    error: str | None = None
    latency_s: float = 0.0
    cached_tokens: int = 0
    store_cached_tokens: int = 0
    tokens: list[int] | None = None


def make_prompts(args: argparse.Namespace) -> list[list[tuple[int, list[int]]]]:
    """Per client, per round: (family, prompt). Family prefixes are shared; suffixes private."""
    rng = random.Random(args.seed)
    heads = [[rng.randrange(1, VOCAB) for _ in range(args.shared)] for _ in range(args.families)]
    out = []
    for c in range(args.clients):
        row = []
        for r in range(args.rounds):
            f = (c + r * 3) % args.families
            row.append((f, heads[f] + [rng.randrange(1, VOCAB) for _ in range(args.private)]))
        out.append(row)
    return out


@contextlib.contextmanager
def serve(argv: list[str], log: Path) -> Iterator[str]:
    """`hycache serve ARGV` on a free loopback port; yields its URL; always stopped."""
    port = free_port()
    cmd = [sys.executable, "-c", RUN_CLI, "serve", "--port", str(port), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; see {log}")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


class Controller:
    """Kills the master after `kill_at` finished requests and restarts it after `restart_at`."""

    def __init__(self, master_port: int, log: Path, kill_at: int, restart_at: int) -> None:
        self.port = master_port
        self.log = log
        self.kill_at = kill_at
        self.restart_at = restart_at
        self.master: MooncakeMaster | None = MooncakeMaster(port=master_port, log_path=log)
        self.master.start()
        self.finished = 0
        self.phase = PHASES[0]
        self.events: list[tuple[str, float]] = []
        self.t0 = time.monotonic()

    def done(self) -> None:
        self.finished += 1
        if self.finished == self.kill_at and self.master is not None:
            self.master.kill()
            self.master = None
            self.phase = PHASES[1]
            self.events.append(("master killed", time.monotonic() - self.t0))
        elif self.finished == self.restart_at and self.master is None:
            self.master = MooncakeMaster(port=self.port, log_path=self.log).start()
            self.phase = PHASES[2]
            self.events.append(("master restarted", time.monotonic() - self.t0))

    def stop(self) -> None:
        if self.master is not None:
            self.master.stop()
            self.master = None


async def client_loop(
    http: httpx.AsyncClient,
    c: int,
    prompts: list[tuple[int, list[int]]],
    ctl: Controller,
    results: list[Result],
    deadline: float,
) -> None:
    for r, (fam, ids) in enumerate(prompts):
        if time.monotonic() > deadline:
            return
        res = Result(c, r, fam, phase=ctl.phase)
        t = time.monotonic()
        body = {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0}
        try:
            resp = await http.post("/v1/completions", json=body)
            res.status = resp.status_code
            if resp.status_code == 200:
                doc = resp.json()
                res.tokens = doc["choices"][0]["token_ids"]
                details = doc["usage"]["prompt_tokens_details"]
                res.cached_tokens = details["cached_tokens"]
                res.store_cached_tokens = details.get("store_cached_tokens", 0)
            else:
                res.error = resp.text[:200]
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}"
        res.latency_s = time.monotonic() - t
        results.append(res)
        ctl.done()


async def run_load(
    url: str, prompts: list[list[tuple[int, list[int]]]], ctl: Controller, args: argparse.Namespace
) -> list[Result]:
    results: list[Result] = []
    deadline = time.monotonic() + args.deadline_s
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as http:
        await asyncio.gather(
            *(client_loop(http, c, p, ctl, results, deadline) for c, p in enumerate(prompts))
        )
    return results


def idle_stats(url: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = httpx.get(f"{url}/v1/stats", timeout=10).json()
        if s["running"] == s["waiting"] == 0 or time.monotonic() > deadline:
            return dict(s)
        time.sleep(0.1)


def reference_tokens(prompts: list[list[int]], k: int) -> list[list[int]]:
    """What an engine without prefix caching answers (same geometry and defaults)."""
    from hycache.engine.engine import LLM
    from hycache.request import SamplingParams

    llm = LLM(
        "tiny",
        block_size=16,
        prefix_match_unit=4,
        max_model_len=256,
        num_speculative_tokens=k,
        enable_prefix_caching=False,
    )
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))]


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8, help="requests per client, one at a time")
    p.add_argument("--families", type=int, default=8)
    p.add_argument("--shared", type=int, default=101, help="family prefix tokens")
    p.add_argument("--private", type=int, default=23, help="private suffix tokens")
    p.add_argument("--num-blocks", type=int, default=96, help="the server's device pool")
    p.add_argument("--num-speculative-tokens", type=int, default=2)
    p.add_argument("--kv-store-gb", type=float, default=0.25)
    p.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    p.add_argument("--deadline-s", type=float, default=400.0, help="for the whole load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--logs", default=None, help="folder for the server and master logs")
    args = p.parse_args()

    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench-store-restart-"))
    logs.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(args)
    total = args.clients * args.rounds
    master_port = free_port()
    ctl = Controller(master_port, logs / "master.log", total // 4, total // 2)
    serve_argv = [
        *GEOMETRY,
        "--num-speculative-tokens",
        str(args.num_speculative_tokens),
        "--num-blocks",
        str(args.num_blocks),
        "--kv-store",
        f"mooncake://127.0.0.1:{master_port}",
        "--kv-store-gb",
        str(args.kv_store_gb),
    ]
    try:
        with serve(serve_argv, logs / "serve.log") as url:
            ctl.t0 = time.monotonic()
            results = asyncio.run(run_load(url, prompts, ctl, args))
            wall = time.monotonic() - ctl.t0
            stats = idle_stats(url)
    finally:
        ctl.stop()

    flat = [ids for row in prompts for _, ids in row]
    index = {(c, r): c * args.rounds + r for c in range(args.clients) for r in range(args.rounds)}
    ref = reference_tokens(flat, args.num_speculative_tokens)
    failed = [r for r in results if r.status != 200]
    mismatched = [
        r for r in results if r.tokens is not None and r.tokens != ref[index[(r.client, r.round)]]
    ]
    cache, store = stats["cache"], stats["store"] or {}
    leaked = cache["used_blocks"] != 0 or cache["free_blocks"] != cache["num_blocks"] - 1
    unfinished = len(results) < total

    phases = {}
    for ph in PHASES:
        rs = [r for r in results if r.phase == ph and r.status == 200]
        lat = [r.latency_s for r in rs]
        phases[ph] = {
            "requests": len(rs),
            "store_hit_requests": sum(1 for r in rs if r.store_cached_tokens > 0),
            "store_hit_tokens": sum(r.store_cached_tokens for r in rs),
            "cached_tokens": sum(r.cached_tokens for r in rs),
            "latency_p50_s": pct(lat, 50),
            "latency_p95_s": pct(lat, 95),
        }
    summary = {
        "requests_sent": len(results),
        "requests_planned": total,
        "failed_requests": len(failed),
        "mismatched_tokens": len(mismatched),
        "wall_s": wall,
        "events": ctl.events,
        "phases": phases,
        "store_errors": store.get("stats", {}).get("errors"),
        "store_hit_tokens_total": cache["store_hit_tokens"],
        "device_hit_tokens_total": cache["device_hit_tokens"],
        "blocks": {k: cache[k] for k in ("num_blocks", "used_blocks", "free_blocks")},
        "blocks_all_back": not leaked,
        "idle": stats["running"] == stats["waiting"] == 0,
        "store": store,
    }
    command = shlex.join([sys.executable, *sys.argv])
    print(f"command: {command}")
    print(f"server:  hycache serve {shlex.join(serve_argv)}")
    print(
        f"{args.clients} clients x {args.rounds} rounds = {total} requests, {args.families} "
        f"families ({args.shared} shared + {args.private} private tokens), {wall:.1f} s"
    )
    for what, at in ctl.events:
        print(f"  {what} at {at:.1f} s")
    head = f"{'phase':<15}{'requests':>9}{'store hits':>11}{'store tokens':>13}"
    head += f"{'cached tokens':>14}{'p50 s':>8}{'p95 s':>8}"
    print(head)
    print("-" * len(head))
    for ph, v in phases.items():
        print(
            f"{ph:<15}{v['requests']:>9}{v['store_hit_requests']:>11}{v['store_hit_tokens']:>13}"
            f"{v['cached_tokens']:>14}{v['latency_p50_s']:>8.2f}{v['latency_p95_s']:>8.2f}"
        )
    print("-" * len(head))
    print(f"failed requests:        {len(failed)}")
    print(f"mismatched tokens:      {len(mismatched)} (vs an engine without prefix caching)")
    print(f"store errors counted:   {summary['store_errors']}")
    b = summary["blocks"]
    print(
        f"device blocks at idle:  used {b['used_blocks']}, free {b['free_blocks']} of "
        f"{b['num_blocks'] - 1} usable -> {'all back' if not leaked else 'LEAKED'}"
    )
    for r in failed[:5]:
        print(f"  failed: client {r.client} round {r.round}: {r.status} {r.error}")
    if args.json:
        doc = {"inputs": vars(args), "summary": summary, "requests": [asdict(r) for r in results]}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    resumed = (
        phases[PHASES[0]]["store_hit_tokens"] > 0 and phases[PHASES[2]]["store_hit_tokens"] > 0
    )
    print(f"store hits before the kill and after the restart: {'yes' if resumed else 'NO'}")
    ok = not failed and not mismatched and not leaked and not unfinished and summary["idle"]
    ok = ok and resumed
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
