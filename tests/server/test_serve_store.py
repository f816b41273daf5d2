"""`hycache serve` and `hycache generate` on a second cache tier (`--kv-store`).

The servers are real `hycache serve` processes on free 127.0.0.1 ports (the Mooncake ones on a
`mooncake_master` this module starts on loopback ports); every process is stopped at the end,
and a server must exit cleanly (status 0) after closing its store. Expected resume points and
tokens are computed in this process with `LLM` of the same geometry: the big-pool device cache
for resume points, an engine without prefix caching for tokens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hycache.cli.main import main
from hycache.engine.engine import LLM
from hycache.store.master import MooncakeMaster, free_port
from tests.helpers import GEOMETRY, SP, family, noise

KW: dict[str, Any] = {**GEOMETRY, "num_speculative_tokens": 2}
SERVE_ARGS = [
    "--block-size",
    str(GEOMETRY["block_size"]),
    "--prefix-match-unit",
    str(GEOMETRY["prefix_match_unit"]),
    "--max-model-len",
    str(GEOMETRY["max_model_len"]),
    "--num-speculative-tokens",
    "2",
]
SMALL_POOL = ["--num-blocks", "40"]  # the noise evicts a family's prefix from it
HOST_SEED = 31  # the family (a) replays
SHARED_SEED = 32  # the family (b) and (c) replay
RUN_CLI = "import sys; from hycache.cli.main import main; sys.exit(main())"


class ServeProcess:
    """One `hycache serve` child on a free loopback port, its output in `log`."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-c", RUN_CLI, "serve", "--port", str(self.port), *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def ready(self, timeout: float = 120.0) -> str:
        """Wait until it answers /health; its URL."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self.url
            assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"server did not start:\n{self.log.read_text()}"
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM (a graceful shutdown: the worker stops, then the store closes)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)


@contextlib.contextmanager
def serving(tmp: Path, *argvs: list[str]) -> Iterator[list[ServeProcess]]:
    """Start one server per argument list at once and yield them while they boot (a test
    computes its expectations meanwhile, then calls `ready`); stop them all and check that each
    shut down cleanly (its lifespan ended: worker stopped, store closed)."""
    procs: list[ServeProcess] = []
    try:
        for i, argv in enumerate(argvs):
            procs.append(ServeProcess([*SERVE_ARGS, *argv], tmp / f"serve-{i}.log"))
        yield procs
    finally:
        codes = [p.stop() for p in procs]
    for p, code in zip(procs, codes, strict=True):
        log = p.log.read_text()
        # uvicorn re-raises the SIGTERM it handled once the shutdown is complete
        assert code in (0, -15) and "Traceback" not in log, log
        assert "Application shutdown complete" in log, log


def complete(url: str, ids: list[int]) -> dict[str, Any]:
    body = {"prompt": ids, "max_tokens": SP.max_tokens, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(resp: dict[str, Any]) -> list[int]:
    return list(resp["choices"][0]["token_ids"])


def idle_stats(url: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = httpx.get(f"{url}/v1/stats", timeout=10).json()
        if s["running"] == s["waiting"] == 0 or time.monotonic() > deadline:
            return s


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
        if not s.name.endswith("_bucket")
    }


@pytest.fixture(scope="module")
def uncached() -> LLM:
    return LLM("tiny", enable_prefix_caching=False, **KW)


def device_resume(seed: int) -> int:
    """Where fam[2] resumes on a device pool big enough to keep fam[0] and fam[1]."""
    llm = LLM("tiny", **KW)
    fam = family(seed)
    llm.generate(fam[:2], SP)
    return llm.generate([fam[2]], SP)[0].hit_tokens


@pytest.fixture(scope="module")
def master() -> Iterator[MooncakeMaster]:
    pytest.importorskip("mooncake.store", reason="mooncake-transfer-engine not installed")
    try:
        m = MooncakeMaster().start()
    except RuntimeError as e:  # e.g. libibverbs missing: `make setup` installs it
        pytest.skip(f"mooncake_master cannot start here: {e}")
    try:
        yield m
    finally:
        m.stop()


# -- (a) host ------------------------------------------------------------------------------------


def test_serve_host_store_resumes_an_evicted_prefix(tmp_path: Path, uncached: LLM) -> None:
    """fam[0], fam[1], noise that evicts them from a 40-block pool, then fam[2]: it resumes
    where a big device pool would have, the gain shown in usage, /v1/stats and /metrics; every
    response's tokens are those of an engine without caching."""
    fam = family(HOST_SEED)
    prompts = [fam[0], fam[1], *noise(), fam[2]]
    argv = [*SMALL_POOL, "--kv-store", "host", "--kv-store-gb", "0.25"]
    with serving(tmp_path, argv) as (server,):
        want = [o.token_ids for o in uncached.generate(prompts, SP)]
        device = device_resume(HOST_SEED)
        url = server.ready()
        got = [complete(url, p) for p in prompts]
        stats = idle_stats(url)
        metrics = scrape(url)
    assert [tokens(r) for r in got] == want
    details = got[-1]["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == device > 0
    assert 0 < details["store_cached_tokens"] <= device
    assert all("store_cached_tokens" in r["usage"]["prompt_tokens_details"] for r in got)
    cache, store = stats["cache"], stats["store"]
    assert cache["store_hit_tokens"] == details["store_cached_tokens"]
    assert cache["device_hit_tokens"] + cache["store_hit_tokens"] == cache["hit_tokens"]
    assert store["backend"] == "host"
    assert 0 < store["used_bytes"] <= store["capacity_bytes"] == int(0.25 * 2**30)
    assert store["mirror"]["hits"] == 1 and store["mirror"]["put_objects"] > 0
    assert store["mirror"]["hit_tokens"] == details["store_cached_tokens"]
    assert store["stats"]["errors"] == store["stats"]["corrupt"] == 0
    assert cache["used_blocks"] == 0 and cache["free_blocks"] == cache["num_blocks"] - 1
    assert metrics["hycache:store_hit_tokens_total"] == details["store_cached_tokens"]
    assert metrics["hycache:store_put_objects_total"] == store["mirror"]["put_objects"]
    assert metrics["hycache:store_errors_total"] == metrics["hycache:store_corrupt_total"] == 0


def test_without_a_store_nothing_store_shaped_appears(uncached: LLM) -> None:
    from fastapi.testclient import TestClient

    from hycache.server.app import create_app

    with TestClient(create_app(uncached, model_name="tiny")) as client:
        r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        stats = client.get("/v1/stats").json()
        assert stats["store"] is None and stats["cache"]["store_hit_tokens"] == 0
        assert "hycache:store_" not in client.get("/metrics").text


# -- (b), (c) mooncake ---------------------------------------------------------------------------


def test_mooncake_two_serve_processes_share_one_master(
    tmp_path: Path, master: MooncakeMaster, uncached: LLM
) -> None:
    """fam[0] and fam[1] to server A, then fam[2] to server B (a fresh device pool): B resumes
    from what A stored, where one device cache would have resumed, tokens as without caching."""
    fam = family(SHARED_SEED)
    argv = ["--kv-store", master.url, "--kv-store-gb", "0.0625"]
    with serving(tmp_path, argv, argv) as (server_a, server_b):
        want = uncached.generate([fam[2]], SP)[0].token_ids
        expected = device_resume(SHARED_SEED)
        a, b = server_a.ready(), server_b.ready()
        complete(a, fam[0])
        complete(a, fam[1])
        resp = complete(b, fam[2])
        stats = idle_stats(b)
    details = resp["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == details["store_cached_tokens"] == expected > 0
    assert tokens(resp) == want
    assert stats["store"]["backend"] == "mooncake"
    assert stats["cache"]["store_hit_tokens"] == expected
    assert stats["cache"]["device_hit_tokens"] == 0


def test_mooncake_unreachable_master_serves_on_and_counts_errors(
    tmp_path: Path, uncached: LLM
) -> None:
    """No master on the port: every request succeeds with the device cache alone (fam[2]
    resumes where the device pool gives), and the failures are counted."""
    pytest.importorskip("mooncake.store", reason="mooncake-transfer-engine not installed")
    fam = family(SHARED_SEED)
    argv = ["--kv-store", f"mooncake://127.0.0.1:{free_port()}"]
    with serving(tmp_path, argv) as (server,):
        want = [o.token_ids for o in uncached.generate(fam, SP)]
        expected = device_resume(SHARED_SEED)
        url = server.ready()
        got = [complete(url, p) for p in fam]
        stats = idle_stats(url)
        metrics = scrape(url)
    assert [tokens(r) for r in got] == want
    details = got[-1]["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == expected and details["store_cached_tokens"] == 0
    assert stats["store"]["backend"] == "mooncake"
    assert stats["store"]["stats"]["errors"] >= 1
    assert stats["cache"]["store_hit_tokens"] == 0
    assert metrics["hycache:store_errors_total"] == stats["store"]["stats"]["errors"]


# -- (d) the command line ------------------------------------------------------------------------


def test_generate_json_reports_store_hit_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = ["generate", "--prompt-token-ids", "1,2,3,4,5", "--max-tokens", "3", "--json"]
    argv += ["--max-model-len", "256", "--num-blocks", "64", "--kv-store", "host"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["store_hit_tokens"] == out["hit_tokens"] == 0 and len(out["token_ids"]) == 3
    assert main([a for a in argv if a != "--json"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split()) == 3  # stdout: the output alone
    assert "0 from the host store" in captured.err


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--kv-store", "disk"], "expected 'host' or 'mooncake://HOST:PORT', got 'disk'"),
        (["--kv-store", "host", "--kv-store-gb", "0"], "kv-store-gb: must be"),
        (["--kv-store-gb", "-1"], "kv-store-gb: must be"),
        (["--kv-store", "mooncake://127.0.0.1"], "needs a port"),
        (["--kv-store", "mooncake://127.0.0.1:1/x"], "expected mooncake://HOST:PORT"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_bad_store_flags_are_one_line_errors(
    command: str,
    flags: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused before any model loads or any work starts, on one line, exit status 2."""
    import hycache.bench.suite
    import hycache.engine.engine

    def nothing(*_: object, **__: object) -> None:
        raise AssertionError("work started before the store flags were checked")

    monkeypatch.setattr(hycache.engine.engine, "LLM", nothing)
    monkeypatch.setattr(hycache.bench.suite, "bench", nothing)
    argv = {
        "generate": ["generate", "--prompt-token-ids", "1,2,3"],
        "serve": ["serve", "--port", "0"],
        "bench": [
            "bench",
            "--quick",
            "--json",
            str(tmp_path / "b.json"),
            "--plot",
            str(tmp_path / "b.png"),
        ],
    }[command]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
