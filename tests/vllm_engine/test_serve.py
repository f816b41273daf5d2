"""`vllm serve` (the real OpenAI server, vLLM 0.32 on CPU) with
`--scheduler-cls hycache.vllm.Scheduler`, on 127.0.0.1: the tiny Nemotron-H with MTP,
`--prefix-match-unit 16` under block size 32, so the plugin is on (its drop mode: 0.32 hashes
MTP with the EAGLE drop). Two families of completions, the second's prefix hint in `vllm_xargs`;
each response reports its cached tokens (`usage.prompt_tokens_details.cached_tokens`): the hint
moves the second family's first sibling from 0 to the drop's resume limit. The same server runs
the front door, `--middleware hycache.vllm.guard.RequestGuard` (its cap set by
`HYCACHE_MAX_BODY_BYTES`): hostile hint lists are refused (400), a body over the cap too (413,
unread), a hinted stream goes through. The server is stopped by the test.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hycache.bench.vllm.serve_cpu import serve_argv
from hycache.bench.vllm.tiny_model import write
from hycache.cache.boundaries import MAX_PREFIX_HINTS, Boundaries
from hycache.config import Policy
from hycache.vllm.guard import HINTS_KEY, MAX_BODY_ENV
from tests.helpers import raw_exchange

BLOCK = 32
UNIT = 16
SHARED = 300
CAP = 256 * 2**10  # the guard's byte cap here: above the 3x10^4-hint body (0.19 MiB)
START_TIMEOUT_S = 900  # a generous bound on a hang (a shared CPU can be slow to start it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _refused(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and error of a request the server must refuse."""
    try:
        _post(url, body)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]
    raise AssertionError("accepted")


def _guarded(base: str, model: str) -> None:
    """The guard in front of vLLM: hostile hint lists refused with vLLM's error shape, a body
    over the cap refused by its length before one byte of it is sent, a hinted stream served."""
    url = base + "/v1/completions"
    prompt = list(range(3, 67))
    for hints in (list(range(1, MAX_PREFIX_HINTS + 2)), list(range(65, 30_065)), [1, True]):
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "vllm_xargs": {HINTS_KEY: hints}}
        status, error = _refused(url, body)
        assert status == 400 and error["param"] == f"vllm_xargs.{HINTS_KEY}", error
        assert f"at most {MAX_PREFIX_HINTS}" in error["message"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "vllm_xargs": {HINTS_KEY: list(range(100))}}  # fmt: skip
    assert _refused(base + "/v1/chat/completions", chat)[0] == 400
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {CAP + 1}\r\n\r\n"
    ).encode()
    status, _, closed = raw_exchange(base, head)
    assert status == 413 and closed
    stream = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
              "ignore_eos": True, "stream": True, "vllm_xargs": {HINTS_KEY: [32]}}  # fmt: skip
    req = urllib.request.Request(
        url, json.dumps(stream).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        events = [line.strip() for line in r if line.startswith(b"data:")]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[len(b"data:") :]) for e in events[:-1]]
    assert chunks and all(c["choices"] for c in chunks), events


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError("vllm serve did not become healthy:\n" + log.read_text()[-4000:])


def test_vllm_serve_with_the_plugin_and_a_hint(tmp_path: Path) -> None:
    model = write(tmp_path / "model", mtp=True)
    port, log = _free_port(), tmp_path / "serve.log"
    root = str(Path(__file__).resolve().parents[2])
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        MAX_BODY_ENV: str(CAP),
    }
    cmd = serve_argv(
        str(model), port, BLOCK, UNIT, "--enable-prompt-tokens-details",
        "--middleware", "hycache.vllm.guard.RequestGuard",
    )  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base + "/health", log)
        rng = random.Random(21)
        cached: dict[bool, list[int]] = {}
        for hinted in (False, True):
            shared = [rng.randrange(3, 1000) for _ in range(SHARED)]
            cached[hinted] = []
            for _ in range(4):
                prompt = shared + [rng.randrange(3, 1000) for _ in range(40)]
                body = {
                    "model": str(model), "prompt": prompt, "max_tokens": 4,
                    "temperature": 0.0,
                    "vllm_xargs": {"prefix_hints": [SHARED]} if hinted else {},
                }  # fmt: skip
                resp = _post(base + "/v1/completions", body)
                assert resp["choices"][0]["finish_reason"] == "length"
                cached[hinted].append(resp["usage"]["prompt_tokens_details"]["cached_tokens"])
        _guarded(base, str(model))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # the producer computes everything; without a hint the first sibling observes the
    # junction (0) and stops there, the later ones resume at the resume limit; the hint makes
    # the producer stop there on its first pass, so the first sibling resumes there too
    limit = Boundaries(BLOCK, UNIT, True, Policy.LIMIT, lookahead_keys=False).resume_limit(SHARED)
    assert limit == 272  # floor(300/16)*16 - 16: mid-block
    assert cached[False] == [0, 0, limit, limit], cached
    assert cached[True] == [0, limit, limit, limit], cached
