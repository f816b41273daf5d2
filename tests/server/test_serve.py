"""`hycache serve`: the HTTP API over a real uvicorn server bound to 127.0.0.1.

Every server a test starts is stopped by the fixture or context manager that started it, and
the engine worker thread is checked to have ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from hycache.cli.args import add_serve_args
from hycache.engine.engine import LLM
from hycache.request import SamplingParams
from hycache.server.app import create_app
from hycache.server.worker import EngineWorker
from tests.helpers import HANG_S
from tests.server.conftest import (
    API_KEY,
    CHAT_TEMPLATE,
    VOCAB,
    chat_tokenizer,
    first_line,
    limit_llm,
    make_llm,
    prompt,
    scrape,
    serving,
    sse_events,
    stats,
    wait_idle,
    words,
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, LLM]]:
    llm = make_llm()
    app = create_app(llm, model_name="tiny")
    with serving(app) as (url, _, _):
        yield url, llm
    worker: EngineWorker = app.state.worker
    assert worker.thread is not None and not worker.thread.is_alive()
    assert not llm.scheduler.has_unfinished()


def expected(reference: LLM, ids: list[int], max_tokens: int) -> list[int]:
    return reference.generate([ids], SamplingParams(max_tokens=max_tokens))[0].token_ids


# ---------------------------------------------------------------------------------- tests
def test_health(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_completion_matches_generate(client: httpx.Client, reference: LLM) -> None:
    ids = prompt(1, 100)
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["model"] == "tiny"
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["token_ids"] == expected(reference, ids, 12)
    assert choice["text"] is None  # the tiny preset has no tokenizer
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 100
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["cached_tokens"] == 0
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_streaming_yields_same_tokens_then_done(client: httpx.Client, reference: LLM) -> None:
    ids = prompt(2, 70)
    payload = {"prompt": ids, "max_tokens": 10, "stream": True}
    with client.stream("POST", "/v1/completions", json=payload) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2  # tokens arrive incrementally, not in one piece
    tokens = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert tokens == expected(reference, ids, 10)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert len({c["id"] for c in chunks}) == 1


def test_concurrent_requests_all_complete(
    server: tuple[str, LLM], client: httpx.Client, reference: LLM
) -> None:
    prompts = [prompt(10 + i, 40 + 13 * i) for i in range(4)]
    steps_before = stats(client)["engine"]["steps"]

    def one(ids: list[int]) -> list[int]:
        with httpx.Client(base_url=server[0], timeout=30) as c:
            r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 16})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(one, prompts))
    for ids, tokens in zip(prompts, got, strict=True):
        assert tokens == expected(reference, ids, 16)
    # Run one by one, 4 requests of 16 tokens need >= 64 steps; batching shares steps.
    assert stats(client)["engine"]["steps"] - steps_before < 4 * 17


def test_repeated_prompt_reports_cached_tokens(client: httpx.Client) -> None:
    ids = prompt(3, 200)
    first = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4}).json()
    second = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4}).json()
    assert first["usage"]["cached_tokens"] == 0
    assert 0 < second["usage"]["cached_tokens"] < 200
    usage = second["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["cached_tokens"]
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]


def test_prefix_hints_never_change_the_tokens(client: httpx.Client, reference: LLM) -> None:
    """Hints (also 0 and past the prompt, which are ignored) change what is cached, never the
    tokens."""
    ids = prompt(12, 60)
    body = {"prompt": ids, "max_tokens": 5, "prefix_hints": [40, 0, 1000]}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == expected(reference, ids, 5)


def test_prefix_hint_lets_the_first_sibling_resume_at_the_limit() -> None:
    """`limit` with an EAGLE drafter (k = 2, B = 16, u = 4): two prompts share a P = 45 token
    system prompt. With `prefix_hints: [45]` the producer checkpoints at the limit
    floor((P-1)/u)*u = 44 on its first pass, so the *first* sibling's response already reports
    44 cached tokens; without hints, a first sibling of the same shape does not get there."""
    shared, limit = 45, 44
    llm = limit_llm(200)
    app = create_app(llm)

    def family(seed: int) -> list[list[int]]:
        system = prompt(seed, shared)
        producer, sibling = system + prompt(seed + 1, 9), system + prompt(seed + 2, 13)
        assert producer[shared] != sibling[shared]  # they share exactly P tokens
        return [producer, sibling]

    def cached(c: httpx.Client, ids: list[int], hints: list[int] | None) -> int:
        body: dict[str, Any] = {"prompt": ids, "max_tokens": 3}
        if hints is not None:
            body["prefix_hints"] = hints
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=30) as c:
        hinted = [cached(c, ids, [shared]) for ids in family(30)]
        plain = [cached(c, ids, None) for ids in family(40)]
    assert hinted == [0, limit]
    assert plain[0] == 0 and plain[1] < limit


BAD_BODIES: list[tuple[str, Any]] = [
    ("text prompt, no tokenizer", {"prompt": "hello"}),
    ("n over the cap", {"prompt": [1, 2], "n": 17}),
    ("n zero", {"prompt": [1, 2], "n": 0}),
    ("best_of other than n", {"prompt": [1, 2], "n": 2, "best_of": 3}),
    ("logprobs over 20", {"prompt": [1, 2], "logprobs": 21}),
    ("stop strings without a tokenizer", {"prompt": [1, 2], "stop": ["\n"]}),
    ("five stop strings", {"prompt": [1, 2], "stop": ["a", "b", "c", "d", "e"]}),
    ("echo (unsupported)", {"prompt": [1, 2], "echo": True}),
    ("empty prompt", {"prompt": []}),
    ("id above vocab", {"prompt": [1, 2, VOCAB]}),
    ("negative id", {"prompt": [-1, 2]}),
    ("prompt too long", {"prompt": [1] * 1020, "max_tokens": 8}),
    ("max_tokens 0", {"prompt": [1, 2], "max_tokens": 0}),
    ("max_tokens string", {"prompt": [1, 2], "max_tokens": "3"}),
    ("max_tokens float", {"prompt": [1, 2], "max_tokens": 1.5}),
    ("prompt wrong type", {"prompt": 5}),
    ("prompt ids not ints", {"prompt": ["a", "b"]}),
    ("no prompt", {"max_tokens": 3}),
    ("temperature negative", {"prompt": [1], "temperature": -1}),
    ("temperature tiny", {"prompt": [1], "temperature": 1e-320}),
    ("top_p zero", {"prompt": [1], "top_p": 0}),
    ("seed too large", {"prompt": [1], "seed": 2**70}),
    ("stream not bool", {"prompt": [1], "stream": "yes"}),
    ("prefix hint negative", {"prompt": [1, 2], "prefix_hints": [-1]}),
    ("prefix hint not an int", {"prompt": [1, 2], "prefix_hints": ["2"]}),
    ("prefix hint float", {"prompt": [1, 2], "prefix_hints": [1.0]}),
    ("prefix hint bool", {"prompt": [1, 2], "prefix_hints": [True]}),
    ("prefix hints not a list", {"prompt": [1, 2], "prefix_hints": 2}),
    ("too many prefix hints", {"prompt": [1, 2], "prefix_hints": list(range(17))}),
    ("body not an object", [1, 2, 3]),
]


@pytest.mark.parametrize(("what", "body"), BAD_BODIES, ids=[w for w, _ in BAD_BODIES])
def test_bad_input_is_400(client: httpx.Client, what: str, body: Any) -> None:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, (what, r.text)
    message = r.json()["error"]["message"]
    assert isinstance(message, str) and message


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": [1], "temperature": NaN}'])
def test_invalid_json_is_400(client: httpx.Client, raw: bytes) -> None:
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_bad_input_does_not_disturb_running_request(
    client: httpx.Client, reference: LLM, server: tuple[str, LLM]
) -> None:
    ids = prompt(4, 50)
    payload = {"prompt": ids, "max_tokens": 24, "stream": True}
    with (
        httpx.Client(base_url=server[0], timeout=30) as other,
        other.stream("POST", "/v1/completions", json=payload) as r,
    ):
        lines = r.iter_lines()
        first = first_line(lines)  # the request is now in flight
        for _, body in BAD_BODIES[:6]:
            assert client.post("/v1/completions", json=body).status_code == 400
        events = sse_events(iter([first, *lines]))
    assert events[-1] == "[DONE]"
    tokens = [t for c in events[:-1] for t in c["choices"][0]["token_ids"]]
    assert tokens == expected(reference, ids, 24)
    # and the next request is served normally
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 3})
    assert r.status_code == 200
    assert r.json()["choices"][0]["token_ids"] == tokens[:3]


def test_unknown_route_uses_error_shape(client: httpx.Client) -> None:
    r = client.get("/v1/nope")
    assert r.status_code == 404
    assert r.json()["error"]["message"]


def test_stats_report_sensible_numbers(client: httpx.Client) -> None:
    ids = prompt(5, 150)
    for _ in range(2):
        assert client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}).is_success
    s = wait_idle(client)
    assert s["model"] == "tiny"
    assert s["running"] == 0 and s["waiting"] == 0
    cache = s["cache"]
    assert cache["num_blocks"] == 400
    assert cache["used_blocks"] == 0  # nothing running holds a block
    assert cache["free_blocks"] + cache["used_blocks"] == cache["num_blocks"] - 1  # null block
    assert cache["cached_blocks"] > 0
    assert cache["admissions"] >= 2
    assert 0 < cache["hit_tokens"] <= cache["query_tokens"]
    assert cache["token_hit_rate"] == pytest.approx(cache["hit_tokens"] / cache["query_tokens"])
    eng = s["engine"]
    assert eng["steps"] > 0
    assert eng["prompt_tokens"] >= 300
    assert eng["output_tokens"] >= 4
    assert 0 < eng["hit_tokens"] <= eng["prompt_tokens"]


def test_stream_disconnect_aborts_request(server: tuple[str, LLM], client: httpx.Client) -> None:
    before = wait_idle(client)
    payload = {"prompt": prompt(6, 16), "max_tokens": 1000, "stream": True}
    with (
        httpx.Client(base_url=server[0], timeout=30) as c,
        c.stream("POST", "/v1/completions", json=payload) as r,
    ):
        lines = r.iter_lines()  # held open: dropping it would hang up early
        assert first_line(lines).startswith("data: {")
        s = stats(client)
        assert s["running"] == 1, s
    # the client hung up after one chunk: the engine drops the request (a finished one would
    # count its 1000 tokens); the wait is a hang's bound, not a latency
    after = wait_idle(client, timeout=HANG_S)
    assert after["engine"]["output_tokens"] == before["engine"]["output_tokens"]  # never finished
    assert after["cache"]["used_blocks"] == 0


def test_non_streaming_disconnect_aborts_request(
    server: tuple[str, LLM], client: httpx.Client
) -> None:
    before = wait_idle(client)
    payload = {"prompt": prompt(11, 16), "max_tokens": 1000}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
        httpx.post(f"{server[0]}/v1/completions", json=payload, timeout=0.5)
    after = wait_idle(client, timeout=HANG_S)
    assert after["engine"]["output_tokens"] == before["engine"]["output_tokens"]
    assert after["cache"]["used_blocks"] == 0


def test_text_prompt_with_tokenizer() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    llm, ref = make_llm(), make_llm()
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    llm.tokenizer = ref.tokenizer = tok
    app = create_app(llm)
    text = " ".join(f"w{i}" for i in prompt(7, 30))
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": text, "max_tokens": 6})
        assert r.status_code == 200, r.text
        want = ref.generate([text], SamplingParams(max_tokens=6))[0]
        assert r.json()["choices"][0]["token_ids"] == want.token_ids
        assert r.json()["choices"][0]["text"] == want.text
        payload = {"prompt": text, "max_tokens": 6, "stream": True}
        with c.stream("POST", "/v1/completions", json=payload) as s:
            events = sse_events(s.iter_lines())
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == want.text
        assert c.post("/v1/completions", json={"prompt": ""}).status_code == 400


def test_shutdown_ends_in_flight_stream_and_thread() -> None:
    llm = make_llm()
    app = create_app(llm)
    worker: EngineWorker = app.state.worker
    payload = {"prompt": prompt(8, 16), "max_tokens": 1000, "stream": True}
    with serving(app) as (url, server, thread):
        assert worker.thread is not None and worker.thread.is_alive()
        with (
            httpx.Client(base_url=url, timeout=30) as c,
            c.stream("POST", "/v1/completions", json=payload) as r,
        ):
            lines = r.iter_lines()  # held open: the stream is in flight at shutdown
            assert first_line(lines).startswith("data: {")
            server.should_exit = True  # shut down with the stream still running
            rest = sse_events(lines)  # the server ends the stream itself
        assert rest[-1] == "[DONE]"
        assert rest[-2]["error"]["code"] == 503
        assert "shutting down" in rest[-2]["error"]["message"]
        thread.join(timeout=HANG_S)
        assert not thread.is_alive()
        # did not wait for 1000 tokens: the stream ended short of them, nothing finished
        assert len(rest) < 1000
    assert not worker.thread.is_alive()
    assert not llm.scheduler.has_unfinished()
    assert llm.stats.output_tokens == 0  # aborted, not run to its end
    assert llm.scheduler.cache.stats().used_blocks == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=1)


def test_worker_stop_fails_waiting_handlers_and_refuses_new_work() -> None:
    llm = make_llm()
    worker = EngineWorker(llm)
    worker.start()

    async def scenario() -> tuple[Any, Any]:
        items = worker.submit("long", prompt(9, 16), SamplingParams(max_tokens=1000))
        accepted = await asyncio.wait_for(items.get(), 10)
        await asyncio.wait_for(items.get(), 10)  # one token: it is running
        assert await asyncio.to_thread(worker.stop, 10)
        last = None
        while not items.empty():
            last = items.get_nowait()
        return accepted, last

    accepted, last = asyncio.run(scenario())
    assert type(accepted).__name__ == "Accepted"
    assert getattr(last, "status", None) == 503
    assert worker.thread is not None and not worker.thread.is_alive()
    assert not llm.scheduler.has_unfinished()
    with pytest.raises(RuntimeError):
        worker.call(lambda llm: None)


def test_serve_args_defaults() -> None:
    p = argparse.ArgumentParser()
    add_serve_args(p)
    a = p.parse_args([])
    assert (a.model, a.host, a.port) == ("tiny", "127.0.0.1", 8000)
    assert (a.block_size, a.prefix_match_unit, a.num_blocks, a.max_model_len) == (
        64,
        16,
        None,
        4096,
    )
    assert (a.policy, a.num_speculative_tokens, a.no_prefix_caching, a.dtype) == (
        "limit",
        0,
        False,
        "float32",
    )
    assert (a.max_num_seqs, a.max_num_batched_tokens) == (64, 8192)


def test_cache_salt_isolates_tenants_on_the_server(client: httpx.Client) -> None:
    """Same prompt from tenants "A" then "B": B gets no cached tokens (nothing leaks across
    salts); a second request from A does; an unsalted request shares nothing with salted ones."""
    ids = prompt(31, 300)

    def cached(salt: str | None) -> int:
        body: dict[str, Any] = {"prompt": ids, "max_tokens": 2}
        if salt is not None:
            body["cache_salt"] = salt
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached("A") == 0
    assert cached("B") == 0
    assert cached(None) == 0
    assert cached("A") > 0
    bad = client.post("/v1/completions", json={"prompt": ids, "cache_salt": ""})
    assert bad.status_code == 400


def test_openai_fields_at_their_unused_values_are_accepted(client: httpx.Client) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": 2, "n": 1, "stop": None, "echo": False}
    r = client.post("/v1/completions", json={**body, "logprobs": None, "model": "anything"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"  # the served name, whatever the client sent


def test_an_oversized_body_is_refused_without_stalling_others(client: httpx.Client) -> None:
    from hycache.server.serving import MAX_BODY_BYTES

    huge = b'{"prompt": [' + b"1," * (MAX_BODY_BYTES // 2) + b"1]}"
    r = client.post("/v1/completions", content=huge, headers={"content-type": "application/json"})
    assert r.status_code == 413
    ok = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
    assert ok.status_code == 200


def test_the_served_model_name_is_never_a_path() -> None:
    from hycache.server.settings import ServerSettings

    p = argparse.ArgumentParser()
    add_serve_args(p)

    def served_model_name(args: argparse.Namespace) -> str:
        return ServerSettings.from_cli_args(args).model_name

    assert served_model_name(p.parse_args(["--model", "/data/ckpts/bamba-9b/"])) == "bamba-9b"
    assert served_model_name(p.parse_args([])) == "tiny"
    named = p.parse_args(["--model", "/x/y", "--served-model-name", "ibm/bamba"])
    assert served_model_name(named) == "ibm/bamba"


# ------------------------------------------------------------ OpenAI drop-in: chat, models, auth
SYSTEM_WORDS = 45  # rendered: <s> <|system|> 45 words <|end|> = 48 tokens before the user turn


@pytest.fixture(scope="module")
def chat_server() -> Iterator[str]:
    """`limit` with an EAGLE drafter (k = 2, B = 16, u = 4), a tokenizer, a chat template and
    an API key: the `/v1` base URL."""
    from hycache.server.chat_template import ChatTemplate

    llm = limit_llm(300)
    llm.tokenizer = chat_tokenizer()
    template = ChatTemplate(CHAT_TEMPLATE, bos_token="<s>", eos_token="<|end|>")
    app = create_app(llm, model_name="tiny-chat", chat_template=template, api_key=API_KEY)
    with serving(app) as (url, _, _):
        yield f"{url}/v1"


@pytest.fixture
def oai(chat_server: str) -> Any:
    import openai

    return openai.OpenAI(base_url=chat_server, api_key=API_KEY, max_retries=0, timeout=30)


def test_openai_client_completions(server: tuple[str, LLM], reference: LLM) -> None:
    """The official client, non-streaming and streaming, gets the engine's greedy tokens."""
    import openai

    client = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)
    ids = prompt(41, 80)
    want = expected(reference, ids, 6)
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=6)
    assert r.model == "tiny" and r.object == "text_completion"
    assert r.choices[0].model_extra["token_ids"] == want
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens_details is not None
    stream = client.completions.create(model="tiny", prompt=ids, max_tokens=6, stream=True)
    chunks = list(stream)
    assert [t for c in chunks for t in c.choices[0].model_extra["token_ids"]] == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_client_chat_and_system_prompt_reuse(oai: Any, chat_server: str) -> None:
    """Two chats sharing a 45-word system message: the rendered prompts share 49 tokens
    (<s> <|system|> 45 words <|end|> <|user|>) and the system part, 48 tokens, is passed as a
    prefix hint, so the *first* chat already checkpoints for its family and the second
    reports the limit floor((49-1)/4)*4 = 48 cached tokens. The same conversation shape
    without a system message (no hint) gets nothing cached on its first sibling. Streaming
    returns the same text as non-streaming."""
    system = {"role": "system", "content": words(50, SYSTEM_WORDS)}
    first = oai.chat.completions.create(
        model="tiny-chat",
        messages=[system, {"role": "user", "content": words(51, 20)}],
        max_tokens=4,
    )
    assert first.object == "chat.completion" and first.model == "tiny-chat"
    assert first.id.startswith("chatcmpl-")
    msg = first.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None
    assert first.usage.prompt_tokens == 1 + 1 + SYSTEM_WORDS + 1 + 1 + 20 + 1 + 1
    assert first.usage.completion_tokens == 4
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    user = [system, {"role": "user", "content": words(52, 11)}]
    second = oai.chat.completions.create(model="tiny-chat", messages=user, max_tokens=4)
    assert second.usage.prompt_tokens_details.cached_tokens == 48

    def unhinted(seed: int) -> int:  # a shared first user turn is no hint
        shared = {"role": "user", "content": words(53, SYSTEM_WORDS + 2)}
        turns = [shared, {"role": "assistant", "content": "w1"}]
        turns.append({"role": "user", "content": words(seed, 20 if seed == 54 else 11)})
        r = oai.chat.completions.create(model="tiny-chat", messages=turns, max_tokens=2)
        return int(r.usage.prompt_tokens_details.cached_tokens)

    # 54 shared tokens: a hint would resume the first sibling at the limit 52; without one it
    # resumes at the block-grid state the producer kept for free (48: the drop's boundary)
    assert [unhinted(54), unhinted(55)] == [0, 48]

    stream = oai.chat.completions.create(
        model="tiny-chat",
        messages=user,
        max_completion_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == second.choices[0].message.content  # greedy: the same answer
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    # without include_usage no usage chunk is sent
    plain = list(
        oai.chat.completions.create(model="tiny-chat", messages=user, stream=True, max_tokens=2)
    )
    assert all(c.choices for c in plain)


CHAT_BAD: list[tuple[str, dict[str, Any]]] = [
    ("n over the cap", {"n": 17}),
    ("top_logprobs without logprobs", {"top_logprobs": 2}),
    ("top_logprobs over 20", {"logprobs": True, "top_logprobs": 21}),
    ("empty stop string", {"stop": [""]}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("json mode", {"response_format": {"type": "json_object"}}),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("no messages", {"messages": []}),
    ("max_tokens 0", {"max_tokens": 0}),
    ("too long", {"max_tokens": 10_000}),
]


@pytest.mark.parametrize(("what", "extra"), CHAT_BAD, ids=[w for w, _ in CHAT_BAD])
def test_chat_refuses_what_it_does_not_do(chat_server: str, what: str, extra: dict) -> None:
    body = {"messages": [{"role": "user", "content": "w1 w2"}], **extra}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{chat_server}/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 400, (what, r.text)
    assert r.json()["error"]["message"]


def test_chat_without_template_or_tokenizer_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert "chat" in r.json()["error"]["message"]


def test_api_key_guards_v1_only(chat_server: str, oai: Any) -> None:
    import openai

    base = chat_server.removesuffix("/v1")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(f"{chat_server}/models", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
        body = {"prompt": [1, 2], "max_tokens": 1}
        assert (
            httpx.post(f"{chat_server}/completions", json=body, headers=headers).status_code == 401
        )
    assert httpx.get(f"{base}/health").status_code == 200
    assert httpx.get(f"{base}/metrics").status_code == 200
    bad = openai.OpenAI(base_url=chat_server, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    ok = httpx.get(f"{chat_server}/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_models_lists_the_served_name(oai: Any, client: httpx.Client) -> None:
    assert [m.id for m in oai.models.list()] == ["tiny-chat"]
    assert oai.models.retrieve("tiny-chat").owned_by == "hycache"
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [("tiny", "model")]
    assert client.get("/v1/models/other").status_code == 404


def test_metrics_parse_and_move(client: httpx.Client) -> None:
    wait_idle(client)
    before = scrape(client)
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "hycache:lost_reuse_tokens_total",
        "hycache:junctions_observed_total",
        "hycache:ssm_state_pages",
    ):
        assert name in before, name
    ids = prompt(60, 200)
    for _ in range(2):
        r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 5})
        assert r.status_code == 200
    with client.stream("POST", "/v1/completions", json={**{"prompt": ids}, "stream": True}) as r:
        assert sse_events(r.iter_lines())[-1] == "[DONE]"
    wait_idle(client)
    after = scrape(client)
    grew = {k for k in before if after[k] > before[k]}
    assert {
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
    } <= grew
    assert after["vllm:time_to_first_token_seconds_count"] == (
        before["vllm:time_to_first_token_seconds_count"] + 3
    )
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["hycache:ssm_state_pages"] > 0  # the tiny preset has Mamba layers
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert 0 < hits <= after["vllm:prefix_cache_queries_total"]


def test_chat_template_from_checkpoint_config(tmp_path: Any) -> None:
    from hycache.server.chat_template import ChatTemplateError, load_chat_template

    assert load_chat_template(tmp_path) is None  # no tokenizer_config.json
    config = {
        "chat_template": CHAT_TEMPLATE,
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "<|end|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None and template.bos_token == "<s>"
    messages = [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2"}]
    text, system_end = template.render(messages)
    assert text == "<s><|system|> w1 <|end|> <|user|> w2 <|end|> <|assistant|>"
    assert text[:system_end] == "<s><|system|> w1 <|end|> "
    assert template.render(messages[1:])[1] == 0  # no system message: no hint
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(tmp_path, override).render(messages)[0] == "w1w2"  # type: ignore[union-attr]
    override.write_text("{% for %}")
    with pytest.raises(ChatTemplateError):
        load_chat_template(tmp_path, override)
    p = argparse.ArgumentParser()
    add_serve_args(p)
    a = p.parse_args(["--chat-template", str(override), "--api-key", "k"])
    assert (a.chat_template, a.api_key) == (str(override), "k")
    assert p.parse_args([]).api_key is None


def test_a_loopback_server_refuses_foreign_hosts_and_origins() -> None:
    """DNS rebinding (a page's own domain resolving to 127.0.0.1) and cross-site posts: a
    server listening on loopback answers 403 to a foreign Host or Origin; local clients pass."""
    from hycache.server.security import is_loopback

    assert is_loopback("127.0.0.1:8000") and is_loopback("localhost") and is_loopback("[::1]:80")
    assert not is_loopback("127.0.0.1.evil.example") and not is_loopback("evil.example:8000")
    app = create_app(make_llm(), model_name="tiny", loopback_only=True)
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=30) as c:
        body = {"prompt": [1, 2, 3], "max_tokens": 2}
        assert c.post("/v1/completions", json=body).status_code == 200
        port = url.rsplit(":", 1)[1]
        local = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
        assert c.post("/v1/completions", json=body, headers=local).status_code == 200
        rebound = c.post("/v1/completions", json=body, headers={"Host": "evil.example"})
        assert rebound.status_code == 403
        assert "Host" in rebound.json()["error"]["message"]
        cross = {"Origin": "https://evil.example"}
        assert c.post("/v1/completions", json=body, headers=cross).status_code == 403
        assert c.get("/health", headers={"Host": "evil.example"}).status_code == 403
