"""What the server tests share: the tiny model they serve, a real uvicorn server on a free
127.0.0.1 port (`serving`), the chat template and tokenizer, and readers of the answers
(server-sent events, `/v1/stats`, `/metrics`).

Every server a test starts is stopped by the fixture or context manager that started it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from hycache.engine.engine import LLM
from hycache.server.run import HycacheServer
from tests.helpers import HANG_S

LLM_KW: dict[str, Any] = {
    "block_size": 64,
    "prefix_match_unit": 16,
    "num_blocks": 400,
    "max_model_len": 1024,
}
VOCAB = 512  # the tiny preset


def make_llm() -> LLM:
    return LLM("tiny", **LLM_KW)


def limit_llm(num_blocks: int) -> LLM:
    """A small-block `limit` engine with two drafts, for resume-point checks."""
    return LLM(
        "tiny",
        policy="limit",
        num_speculative_tokens=2,
        block_size=16,
        prefix_match_unit=4,
        num_blocks=num_blocks,
        max_model_len=256,
    )


def prompt(seed: int, n: int) -> list[int]:
    """A deterministic prompt of n in-vocabulary ids, distinct per seed."""
    return [(seed * 7919 + i * 31 + 1) % VOCAB for i in range(n)]


@contextlib.contextmanager
def serving(app: Any, **config: Any) -> Iterator[tuple[str, uvicorn.Server, threading.Thread]]:
    """Run `app` (from `create_app`) under uvicorn in a thread on a free 127.0.0.1 port;
    always stop it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(app, log_level="warning", lifespan="on", **config)
    server = HycacheServer(config, app.state.worker)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            with contextlib.suppress(httpx.TransportError):
                if server.started and httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            assert thread.is_alive(), "server thread died during startup"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        yield url, server, thread
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        assert not thread.is_alive(), "server thread did not stop"


@pytest.fixture(scope="module")
def reference() -> LLM:
    """A fresh LLM identical to the served one, for greedy reference outputs."""
    return make_llm()


@pytest.fixture
def client(server: tuple[str, LLM]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[0], timeout=60) as c:
        yield c


def sse_events(lines: Iterator[str]) -> list[Any]:
    """Parse `data: ...` lines; `[DONE]` comes back as the string itself."""
    events: list[Any] = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def first_line(lines: Iterator[str]) -> str:
    """The first non-empty line, leaving `lines` open (a generator expression over it would
    close the response, and so the connection, when it is dropped)."""
    for line in lines:
        if line:
            return line
    raise AssertionError("stream ended before its first event")


def stats(client: httpx.Client) -> dict[str, Any]:
    r = client.get("/v1/stats")
    assert r.status_code == 200
    return r.json()


def wait_idle(client: httpx.Client, timeout: float = HANG_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = stats(client)
        if s["running"] == 0 and s["waiting"] == 0:
            return s
        assert time.monotonic() < deadline, f"engine still busy: {s}"
        time.sleep(0.02)


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
API_KEY = "sk-hycache-test"


def chat_tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocabulary: `w0`..`w499` and the template's
    special tokens (ids 500-504)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 12)}
    vocab.update({t: VOCAB - 12 + i for i, t in enumerate(SPECIAL)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIAL)
    return tok


def words(seed: int, n: int) -> str:
    return " ".join(f"w{i % (VOCAB - 12)}" for i in prompt(seed, n))


def scrape(client: httpx.Client) -> dict[str, float]:
    """`/metrics` parsed by prometheus_client: sample name -> value (labels dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name.endswith("_bucket"):
                continue
            assert s.labels.get("model_name") == "tiny", s
            samples[s.name] = s.value
    return samples
