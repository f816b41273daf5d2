"""`hycache bench serve` (hycache.bench.loadgen) against a real server on 127.0.0.1.

The server is `tests.server.conftest`'s: the tiny model under uvicorn in a thread, stopped by the
fixture. Runs are a few requests of a few tokens each.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from hycache.bench.loadgen import RunOptions, build_plan, completions_url, run_bench
from hycache.cli.main import main
from hycache.server.app import create_app
from hycache.sim.build import PrefixHints, WorkloadSizes
from tests.helpers import HANG_S
from tests.server.conftest import make_llm, serving

SMALL = ["--shared-prefix-tokens", "128", "--suffix-tokens", "16", "--output-tokens", "4"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app(make_llm(), model_name="tiny")
    with serving(app) as (base, _, _):
        yield base


def bench(url: str, out: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    rc = main(["bench", "serve", "--url", url, "--quiet", "--json", str(out), *flags])
    return rc, json.loads(out.read_text())


def test_closed_loop_shared_prefix(url: str, tmp_path: Path) -> None:
    rc, doc = bench(url, tmp_path / "out" / "b.json", "--num-requests", "6", "--concurrency", "2",
                    *SMALL)  # fmt: skip
    assert rc == 0
    assert set(doc) == {"inputs", "summary", "requests"}
    assert doc["inputs"]["workload"] == "system-prompt"
    assert doc["inputs"]["mode"] == "concurrency 2"
    s = doc["summary"]
    assert (s["requests"], s["ok"], s["failed"], s["errors"]) == (6, 6, 0, {})
    assert s["output_tokens"] == 6 * 4 and s["prompt_tokens"] == 6 * 144
    assert s["output_throughput_tok_per_s"] > 0 and s["request_throughput_per_s"] > 0
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(s[key]) == {"mean", "p50", "p95", "p99"}
        assert 0 < s[key]["p50"] <= s[key]["p95"] <= s[key]["p99"]
    assert s["mean_cached_tokens"] > 0
    reqs = doc["requests"]
    assert [r["index"] for r in reqs] == list(range(6))
    for r in reqs:
        assert r["ok"] and r["error"] is None
        assert r["output_tokens"] == r["completion_tokens"] == 4  # streamed = final
        assert r["prompt_tokens"] == 144
        assert r["ttft_ms"] <= r["e2e_ms"]
    # the first two run together against a cold cache; later ones find the shared prefix
    assert all(r["cached_tokens"] > 0 for r in reqs[2:])


def test_open_loop_streamed_tokens_match_a_plain_request(url: str) -> None:
    sizes = WorkloadSizes(
        families=2, requests_per_family=2, shared_prefix_tokens=96, suffix_tokens=8, output_tokens=5
    )
    plan = build_plan("family", sizes, seed=3, hints=PrefixHints(shared=True))
    assert plan.requests[0].prefix_hints == (96,)
    done: list[int] = []
    opts = RunOptions(url=url, request_rate=50.0, prefix_hint=True, seed=1)
    results, duration = run_bench(plan, opts, on_done=lambda r: done.append(r.index))
    assert sorted(done) == [r.index for r in results] == [0, 1, 2, 3]
    assert duration > 0
    assert all(r.ok for r in results), [r.error for r in results]
    assert results == sorted(results, key=lambda r: r.index)
    with httpx.Client(timeout=30) as client:
        for req, res in zip(plan.requests, results, strict=True):
            body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "ignore_eos": True}
            plain = client.post(completions_url(url), json=body).json()
            assert res.token_ids == plain["choices"][0]["token_ids"]
            assert res.output_tokens == res.completion_tokens == 5
    # each family's second request resumes inside the family's prefix
    first_seen: set[tuple[int, ...]] = set()
    for req, res in zip(plan.requests, results, strict=True):
        key = tuple(req.prompt[:96])
        if key in first_seen:
            assert res.cached_tokens and res.cached_tokens > 0
        first_seen.add(key)


def test_multi_turn_sends_the_answer_back(url: str, tmp_path: Path) -> None:
    flags = ["--workload", "multi-turn", "--sessions", "2", "--turns", "2", "--user-tokens", "20"]
    flags += ["--system-prompt-tokens", "64", "--output-tokens", "3", "--request-rate", "20"]
    rc, doc = bench(url, tmp_path / "m.json", *flags)
    assert rc == 0
    assert doc["summary"]["ok"] == 4 and doc["inputs"]["sessions"] == 2
    by_turn = {(r["session"], r["turn"]): r for r in doc["requests"]}
    for session in (0, 1):
        t0, t1 = by_turn[(session, 0)], by_turn[(session, 1)]
        assert t0["prompt_tokens"] == 64 + 20
        assert t1["prompt_tokens"] == t0["prompt_tokens"] + 3 + 20
        assert t1["cached_tokens"] > 0


def test_http_errors_are_counted_per_request(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ids up to 100000 are outside the tiny model's vocabulary: every request gets a 400
    rc, doc = bench(url, tmp_path / "e.json", "--num-requests", "3", "--vocab-size", "100000",
                    *SMALL)  # fmt: skip
    assert rc == 1
    assert doc["summary"]["failed"] == 3 and doc["summary"]["ttft_ms"]["p50"] is None
    assert all(r["error"].startswith("HTTP 400:") for r in doc["requests"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("failed: HTTP 400") == 3


def test_unreachable_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    out = tmp_path / "never.json"
    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{port}", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot reach") and "\n" not in err
    assert not out.exists()


def test_bench_and_serve_flags_stay_apart(capsys: pytest.CaptureFixture[str]) -> None:
    u = "http://127.0.0.1:9"
    assert main(["bench", "--quick", "serve", "--url", u]) == 2
    assert "--quick" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "serve", "--url", u, "--skip-engine"])
    assert exc.value.code == 2
    assert main(["bench", "serve", "--url", "ftp://x"]) == 2
    assert "--url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "serve"])  # --url is required


class _FakeOpenAI(BaseHTTPRequestHandler):
    """A text-only OpenAI-style server (no `token_ids` in its chunks, usage in a last chunk
    with no choices, as vLLM sends with `stream_options.include_usage`)."""

    seen: ClassVar[list[tuple[str | None, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.headers.get("Authorization"), body))
        chunks = [{"choices": [{"index": 0, "text": w}]} for w in ("a", "b", "c")]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
        payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    def do_GET(self) -> None:
        self.send_error(405)

    def log_message(self, *args: Any) -> None:
        pass


def test_api_key_model_and_a_text_only_server() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sizes = WorkloadSizes(
            num_requests=2, shared_prefix_tokens=8, suffix_tokens=2, output_tokens=3
        )
        plan = build_plan("system-prompt", sizes, hints=PrefixHints(shared=True))
        opts = RunOptions(
            url=f"http://127.0.0.1:{server.server_port}/v1",
            concurrency=1,
            api_key="sk-test",
            model="m",
            prefix_hint=True,
        )
        results, _ = run_bench(plan, opts)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.output_tokens for r in results] == [3, 3]
    assert all(r.token_ids is None and r.cached_tokens is None for r in results)
    assert len(_FakeOpenAI.seen) == 2
    for auth, body in _FakeOpenAI.seen:
        assert auth == "Bearer sk-test"
        assert body["model"] == "m" and body["stream"] is True
        assert body["prefix_hints"] == [8] and len(body["prompt"]) == 10


class _Forever(BaseHTTPRequestHandler):
    """A server that streams a token every 50 ms and never ends (GET: 405, so it is up)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = json.dumps({"choices": [{"index": 0, "token_ids": [1], "text": "a"}]})
        try:
            while True:
                self.wfile.write(f"data: {chunk}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return

    def do_GET(self) -> None:
        self.send_error(405)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_request_that_never_ends_is_cut_counted_and_the_json_written(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forever)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "forever.json"
    try:
        t = time.monotonic()
        rc = main(["bench", "serve", "--url", f"http://127.0.0.1:{server.server_port}",
                   "--quiet", "--json", str(out), "--num-requests", "3", "--concurrency", "3",
                   "--request-timeout", "1", *SMALL])  # fmt: skip
        elapsed = time.monotonic() - t
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert rc == 1 and elapsed < HANG_S  # a hang's bound: the 1 s request timeout cut them
    doc = json.loads(out.read_text())
    assert doc["summary"]["failed"] == 3 and doc["inputs"]["request_timeout_s"] == 1
    assert all("timed out after 1 s" in r["error"] for r in doc["requests"])
