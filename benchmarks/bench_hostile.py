"""Bystanders under the hostile requests of issue 34, each beside a control in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hostile.py [--tokens 150] [--json OUT]

`hycache serve --model tiny` runs in a child process on a free 127.0.0.1 port (stopped at the
end). A bystander streams `--tokens` greedy tokens; its tokens/s is taken alone (the control)
and then while each attack runs, and reported as a ratio to the control (the mean of the
bystander alone before and after the attacks; 1.0: untouched). On a small machine the
attacking clients' own CPU slows the bystander too, so attacks 3 and 4 are also given as a
ratio to the same clients hammering a cheap refusal (`{"prompt": []}`, 400):
`ratio_to_hammer` is the server-side cost alone:

1. six sampling streams beside one request with `repetition_penalty` 1e-39 (refused now; before
   it failed every live stream): the bystander's ratio and how many of the six finished;
3. four clients posting 7.8 MiB bodies of 4.1 M prompt ids, over and over (refused, 413, by
   their Content-Length: no request that fits max_model_len needs such a body);
4. an n=16 request with 2 M `stop_token_ids` (3.8 MiB), over and over (refused the same way;
   a smaller list is refused by the 256-id cap, in the handler);

and, with no server,

5. one flush of 32 Mooncake puts against a stand-in client whose transfers fail after 0.2 s
   (a dead peer), as a ratio to the same flush against a healthy stand-in (10 ms a put): the
   failed transfer ends the flush (before: one failure per object, 32 x 0.2 s).

Also printed: the slowest `/health` answer during attack 3 (bodies parsed once, large ones on a
worker thread). Exit status 1 if a bystander got under 0.5 of its control (attacks 3 and 4: of the
hammer's), if a stream beside attack 1 failed, or if the dead-peer flush took over 3 x its
control.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "hycache", "serve", "--model", "tiny", "--port", str(port),
           "--max-model-len", "1024", "--num-blocks", "400", "--no-warmup"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def bystander(url: str, tokens: int) -> float:
    """Tokens/s of one greedy stream, first token to last."""
    body = {"prompt": [5, 6, 7, 8], "max_tokens": tokens, "ignore_eos": True, "stream": True}
    first = last = None
    count = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            n = sum(len(c["token_ids"]) for c in json.loads(line[6:])["choices"])
            if n:
                now = time.monotonic()
                first = now if first is None else first
                last = now
                count += n
    assert count == tokens and first is not None and last is not None and last > first
    return (count - 1) / (last - first)


def while_attacking(
    url: str, tokens: int, attack: Callable[[threading.Event], Any]
) -> tuple[float, Any]:
    """The bystander's tokens/s while `attack(stop)` runs in threads; what the attack returns."""
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(attack, stop)
        time.sleep(0.3)
        try:
            rate = bystander(url, tokens)
        finally:
            stop.set()
        return rate, running.result()


def repeat(url: str, clients: int, raw: bytes, stop: threading.Event) -> list[int]:
    """`clients` threads posting `raw` until `stop`; the status codes seen."""
    codes: list[int] = []

    def one() -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                r = c.post(f"{url}/v1/completions", content=raw,
                           headers={"Content-Type": "application/json"})  # fmt: skip
                codes.append(r.status_code)

    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(one) for _ in range(clients)]:
            f.result()
    return codes


def nan_attack(url: str, stop: threading.Event) -> dict[str, Any]:
    def stream(seed: int) -> bool:
        body = {"prompt": [9, 10, seed], "max_tokens": 60, "temperature": 1.0, "seed": seed,
                "ignore_eos": True, "stream": True}  # fmt: skip
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        return r.status_code == 200 and '"error"' not in r.text and "[DONE]" in r.text

    with ThreadPoolExecutor(7) as pool:
        streams = [pool.submit(stream, s) for s in range(6)]
        time.sleep(0.2)
        bad = {"prompt": [1, 2, 3, 4, 5], "max_tokens": 3, "temperature": 1,
               "repetition_penalty": 1e-39}  # fmt: skip
        status = httpx.post(f"{url}/v1/completions", json=bad, timeout=60).status_code
        ok = sum(f.result() for f in streams)
    return {"nan_request_status": status, "streams_finished": ok, "streams": 6}


def health_worst(url: str, stop: threading.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        t = time.monotonic()
        httpx.get(f"{url}/health", timeout=60)
        worst = max(worst, time.monotonic() - t)
        time.sleep(0.02)
    return worst


class _Client:
    def __init__(self, rc: int, delay: float) -> None:
        self.rc, self.delay, self.calls = rc, delay, 0

    def put(self, key: str, value: bytes) -> int:
        self.calls += 1
        time.sleep(self.delay)
        return self.rc

    def close(self) -> None:
        pass


def flush_seconds(rc: int, delay: float) -> tuple[float, int]:
    from hycache.store.mooncake import MooncakeStore

    store = MooncakeStore(f"mooncake://127.0.0.1:{free_port()}", 1 << 20)  # no master there
    client = _Client(rc, delay)
    store._client, store._retry_at, store._suspect = client, 0.0, False
    items = [(f"k{i}", b"x" * 1024) for i in range(32)]
    t = time.monotonic()
    store.put(items)
    elapsed = time.monotonic() - t
    store.close()
    return elapsed, client.calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"tokens": args.tokens}
    with server() as url:
        bystander(url, 8)  # warm up
        first = bystander(url, args.tokens)
        out["control_tokens_per_s"] = first
        rate, nan = while_attacking(url, args.tokens, lambda s: nan_attack(url, s))
        out["1_nan"] = {"ratio": rate, **nan}
        ids = json.dumps(
            {"prompt": [1] * 4_100_000, "max_tokens": 1}, separators=(",", ":")
        ).encode()
        health: list[float] = []

        def huge(stop: threading.Event) -> list[int]:
            watcher = threading.Thread(target=lambda: health.append(health_worst(url, stop)))
            watcher.start()
            codes = repeat(url, 4, ids, stop)
            watcher.join()
            return codes

        rate, codes = while_attacking(url, args.tokens, huge)
        out["3_huge_prompts"] = {"ratio": rate, "body_mib": len(ids) / 2**20,
                                 "requests": len(codes), "statuses": sorted(set(codes)),
                                 "health_worst_s": health[0] if health else None}  # fmt: skip
        stops = json.dumps(
            {"prompt": [1, 2], "n": 16, "stop_token_ids": [1] * 2_000_000}, separators=(",", ":")
        )
        rate, codes = while_attacking(url, args.tokens, lambda s: repeat(url, 1, stops.encode(), s))
        out["4_stop_ids"] = {"ratio": rate, "requests": len(codes),
                             "statuses": sorted(set(codes))}  # fmt: skip
        # the attackers' own CPU on this machine: the same clients hammering a cheap refusal
        small = json.dumps({"prompt": [], "max_tokens": 1}).encode()
        hammer4, codes4 = while_attacking(url, args.tokens, lambda s: repeat(url, 4, small, s))
        hammer1, codes1 = while_attacking(url, args.tokens, lambda s: repeat(url, 1, small, s))
        out["3_huge_prompts"]["ratio_to_hammer"] = out["3_huge_prompts"]["ratio"] / hammer4
        out["4_stop_ids"]["ratio_to_hammer"] = out["4_stop_ids"]["ratio"] / hammer1
        out["hammer"] = {"4_clients_tokens_per_s": hammer4, "1_client_tokens_per_s": hammer1,
                         "requests": [len(codes4), len(codes1)]}  # fmt: skip
        last = bystander(url, args.tokens)  # the control again: the machine's drift
        control = (first + last) / 2
        out["control_tokens_per_s"] = {"before": first, "after": last, "mean": control}
        for key in ("1_nan", "3_huge_prompts", "4_stop_ids"):
            out[key]["ratio"] /= control
    healthy, _ = flush_seconds(0, 0.01)
    dead, calls = flush_seconds(-800, 0.2)
    out["5_dead_peer_flush"] = {"ratio": dead / healthy, "dead_s": dead, "healthy_s": healthy,
                                "dead_calls": calls, "objects": 32}  # fmt: skip
    print(f"control bystander: {control:.1f} tokens/s ({args.tokens} tokens)")
    for key in ("1_nan", "3_huge_prompts", "4_stop_ids", "5_dead_peer_flush", "hammer"):
        print(f"{key:18s} {json.dumps(out[key])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    bad = (
        out["1_nan"]["ratio"] < 0.5
        or min(out[k]["ratio_to_hammer"] for k in ("3_huge_prompts", "4_stop_ids")) < 0.5
        or out["1_nan"]["streams_finished"] != 6
        or out["5_dead_peer_flush"]["ratio"] > 3
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
