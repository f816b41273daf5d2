"""A bystander stream beside hostile prefix hints through `vllm serve` with the plugin (issue 47).

    /work/main/.venv-vllm-cpu/bin/python benchmarks/bench_plugin_hints.py [--tokens 64]
        [--hints 30000 1000000] [--repeats 3] [--attack-rate 10] [--no-guard] [--json OUT]

`vllm serve` (vllm-cpu 0.32, the interpreter running this script) starts on a free 127.0.0.1
port with `--scheduler-cls hycache.vllm.Scheduler` on the tiny Nemotron-H with MTP, under the
settings of tests/vllm_engine/test_serve.py (block 32, `--prefix-match-unit 16`: the plugin is
on, so the engine's scheduler parses every request's hints), and, unless `--no-guard`, with the
front door `--middleware hycache.vllm.guard.RequestGuard` (its byte cap from
`HYCACHE_MAX_BODY_BYTES`, as the server reads it); its stdout and stderr go to one log file;
the server's process group is stopped at the end.

A bystander streams `--tokens` greedy tokens (completions, `stream=True`, `ignore_eos`) and its
longest wait for a chunk is recorded (the first chunk's, from the request's send, included:
vLLM merges the tokens of a stalled stream into one chunk); each arm runs it `--repeats` times
(3) and takes the median (one stall of the shared machine's, not the server's, is then not the
arm's figure).
Arms, side by side in one run:

- control: the bystander alone, before, between and after the attacks (the median of all
  these is the control each attack is compared with);
- hints=30000 and hints=1000000: an attacker (a process of its own, as a client would be)
  posts, one after another for the whole stream and at most `--attack-rate` a second (10; 0:
  back to back: the attacker shares the 2 cores, and one whose 7.5 MiB bodies are refused at
  once spends them on its own copying), small requests whose
  `"vllm_xargs": {"prefix_hints": [...]}` holds that many ints past the prompt (every one bad).
  The bystander starts once the attacker process's first request has been answered, so the
  attack runs all through the stream. A refusal (the guard's 400 or 413, or a 4xx of vLLM's)
  is reported as the outcome of that arm; a connection the server closed before taking the
  whole body (the guard's 413 by `Content-Length`) as "closed";
- unread=30000 and unread=1000000: the same attack with the same list under a `vllm_xargs` key
  nothing reads: what vLLM's own frontend and engine transport cost the bystander for such a
  body, plugin or not, and what the guard lets through (each hints arm is also given as a ratio
  to it).

Every attack body is encoded once, before the server starts. Printed: each arm's longest gap
and its ratio to the control, the attack requests answered (and their statuses), and the
longest line the server wrote during the arms (vLLM's own startup config line is given apart).
Exit status 1 if a hints arm's ratio to the control is over `MAX_RATIO` or a line during the
arms is over `MAX_LOG_LINE` characters.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hycache.bench.vllm.serve_cpu import serve_argv
from hycache.bench.vllm.tiny_model import write
from hycache.vllm.guard import HINTS_KEY, cap_from_env

MAX_RATIO = 2.0
MAX_LOG_LINE = 2000
BLOCK, UNIT = 32, 16
UNREAD_KEY = "unread"  # the same list under a key nothing reads: vLLM's own cost of the body
PROMPT = 64  # tokens in each request's prompt (bystander and attacker)
START_TIMEOUT_S = 900
GUARD = "hycache.vllm.guard.RequestGuard"
# an attacker's requests a second at most: the client shares the server's 2 cores here, and one
# sending 7.5 MiB bodies that are refused at once, back to back, spends them on its own copying
ATTACK_RATE = 10.0
CLOSED = 0  # the status of a connection closed before a response was read ("closed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(workdir: Path, log: Path, model: str, guard: bool) -> Iterator[str]:
    """`vllm serve` with the plugin (and the guard); yields its base URL."""
    port = free_port()
    root = str(Path(__file__).resolve().parents[1])
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = serve_argv(model, port, BLOCK, UNIT, *(["--middleware", GUARD] if guard else []))
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("vllm serve did not become healthy:\n" + log.read_text()[-4000:])
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def stream_gap(base: str, model: str, tokens: int, seed: int) -> float:
    """The bystander: streams `tokens` greedy tokens; its longest wait for a chunk (s), the
    first one's (from the request's send) included: vLLM merges the tokens a stalled frontend
    has not sent yet into one chunk, so a stream held up from its start would otherwise show
    no gap at all."""
    prompt = [(seed * 131 + 7 * i) % 1000 + 3 for i in range(PROMPT)]
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    req = urllib.request.Request(
        base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    gap = 0.0
    last = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            now = time.monotonic()
            gap, last = max(gap, now - last), now
    return gap


def attack_body(model: str, hints: int, key: str) -> bytes:
    prompt = [(5 * i) % 1000 + 3 for i in range(PROMPT)]
    bad = list(range(PROMPT + 1, PROMPT + 1 + hints))  # ints past the prompt: all bad
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "vllm_xargs": {key: bad}}  # fmt: skip
    return json.dumps(body).encode()


def post(base: str, data: bytes) -> int:
    """POST `data`; the status, or `CLOSED` when the server closed the connection before a
    response could be read (it may answer before taking the whole body)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return int(r.status)
    except (ConnectionError, http.client.HTTPException):
        return CLOSED
    finally:
        conn.close()


def attacker(base: str, data: bytes, rate: float, ready: Any, stop: Any, out: Any) -> None:
    """Post `data`, one request after another, at most `rate` a second (0: back to back),
    until `stop` is set (`ready` set once the first is answered); put the statuses on `out`."""
    statuses: list[int] = []
    start = time.monotonic()
    while not stop.is_set():
        statuses.append(post(base, data))
        ready.set()
        if rate > 0:
            stop.wait(max(0.0, start + len(statuses) / rate - time.monotonic()))
    out.put(statuses)


def gaps(base: str, model: str, tokens: int, seeds: Iterator[int], repeats: int) -> list[float]:
    """`repeats` bystander streams, one after another, each its longest gap."""
    return [stream_gap(base, model, tokens, next(seeds)) for _ in range(repeats)]


def attacked(
    base: str, model: str, tokens: int, data: bytes, hints: int, key: str, seeds: Iterator[int],
    repeats: int, rate: float,
) -> dict[str, Any]:  # fmt: skip
    """The bystander's gaps (`repeats` streams; their median is the arm's) while an attacker
    posts `data` (a list of `hints` bad hints under `vllm_xargs[key]`) at `rate`."""
    t0 = time.monotonic()
    first = post(base, data)
    first_s = time.monotonic() - t0
    ctx = mp.get_context("fork")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=attacker, args=(base, data, rate, ready, stop, out), daemon=True)
    proc.start()
    try:
        ready.wait(timeout=600)  # the attacker process is posting: the stream starts under attack
        arm_gaps = gaps(base, model, tokens, seeds, repeats)
    finally:
        stop.set()
        statuses = [first, *out.get(timeout=600)]
        proc.join()
    return {"hints": hints, "key": key, "body_mb": round(len(data) / 2**20, 2),
            "gap_s": statistics.median(arm_gaps), "gaps_s": arm_gaps,
            "first_attack_s": round(first_s, 3), "attacks": len(statuses),
            "statuses": [c or "closed" for c in sorted(set(statuses))]}  # fmt: skip


def longest_line(log: Path, start: int = 0, end: int | None = None) -> int:
    """The longest line in bytes [start, end) of the log."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read() if end is None else f.read(end - start)
    return max((len(line) for line in text.split(b"\n")), default=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hints", type=int, nargs="+", default=[30_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3, help="bystander streams per arm")
    ap.add_argument("--attack-rate", type=float, default=ATTACK_RATE,
                    help="attack requests a second at most (0: back to back)")  # fmt: skip
    ap.add_argument("--no-guard", action="store_true", help=f"serve without --middleware {GUARD}")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--log", type=Path, help="the server's log (default: a temporary file)")
    args = ap.parse_args()
    guard = not args.no_guard
    cap = cap_from_env() if guard else None
    with tempfile.TemporaryDirectory() as tmp:
        log = args.log or Path(tmp) / "serve.log"
        model = str(write(Path(tmp) / "model", mtp=True))
        keys = (HINTS_KEY, UNREAD_KEY)
        bodies = {(h, k): attack_body(model, h, k) for h in args.hints for k in keys}
        controls: list[float] = []
        arms: list[dict[str, Any]] = []
        with server(Path(tmp), log, model, guard) as base:
            stream_gap(base, model, 8, seed=0)  # warm-up
            started = log.stat().st_size
            # each bystander a fresh prompt (no arm resumes another's prefix)
            seeds = iter(range(1, 1000))
            controls += gaps(base, model, args.tokens, seeds, args.repeats)
            for i, hints in enumerate(args.hints, 1):
                for key in keys:
                    data = bodies[hints, key]
                    run = (args.tokens, data, hints, key, seeds, args.repeats, args.attack_rate)
                    arms.append(attacked(base, model, *run))
                controls += gaps(base, model, args.tokens, seeds, args.repeats)
                print(f"arm {i}/{len(args.hints)} done", file=sys.stderr, flush=True)
        line, startup_line = longest_line(log, started), longest_line(log, 0, started)
    control = statistics.median(controls)
    print(f"guard: {f'--middleware {GUARD}, cap {cap:,} bytes' if guard else 'off'}; attacker "
          f"{f'at most {args.attack_rate:g} requests/s' if args.attack_rate else 'back to back'}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"control: longest gap {control * 1e3:.1f} ms "
          f"(median of {', '.join(f'{c * 1e3:.1f}' for c in controls)} ms)")  # fmt: skip
    ok = line <= MAX_LOG_LINE
    unread = {arm["hints"]: arm["gap_s"] for arm in arms if arm["key"] == UNREAD_KEY}
    for arm in arms:
        arm["ratio"] = round(arm["gap_s"] / control, 2)
        if arm["key"] == HINTS_KEY:
            ok &= arm["ratio"] <= MAX_RATIO
            arm["ratio_to_unread"] = round(arm["gap_s"] / unread[arm["hints"]], 2)
        print(f"{arm['key']}={arm['hints']}: body {arm['body_mb']} MiB, longest gap "
              f"{arm['gap_s'] * 1e3:.1f} ms (median of "
              f"{', '.join(f'{g * 1e3:.1f}' for g in arm['gaps_s'])}), ratio {arm['ratio']:.2f}; "
              f"{arm['attacks']} attack "
              f"requests (statuses {arm['statuses']}, the first answered in "
              f"{arm['first_attack_s']} s)"
              + (f"; ratio to the same list unread {arm['ratio_to_unread']:.2f}"
                 if "ratio_to_unread" in arm else ""))  # fmt: skip
    print(f"longest server log line during the arms: {line} characters (bound {MAX_LOG_LINE}); "
          f"at startup (vLLM's own config line): {startup_line}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(
            {"tokens": args.tokens, "guard": guard, "max_body_bytes": cap,
             "attack_rate": args.attack_rate, "repeats": args.repeats,
             "load_average": os.getloadavg(), "controls_s": controls, "arms": arms,
             "longest_log_line": line, "startup_log_line": startup_line},
            indent=2))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
