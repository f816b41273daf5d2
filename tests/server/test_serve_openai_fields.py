"""`hycache serve`'s OpenAI generation fields on a live server: `stop` strings, `n`, logprobs
and `stream_options.include_usage`, on both routes, streaming and not.

The server is the tiny model with a word-level tokenizer (`w0`..`w499`, decoded joined by
spaces) and a chat template; greedy references come from an identical `LLM`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hycache.engine.engine import LLM
from hycache.engine.outputs import RequestOutput
from hycache.request import SamplingParams
from hycache.server.app import create_app
from hycache.server.chat_template import ChatTemplate
from tests.helpers import HANG_S
from tests.server.conftest import CHAT_TEMPLATE, chat_tokenizer, serving, sse_events, words

LLM_KW: dict[str, Any] = {
    "block_size": 16,
    "prefix_match_unit": 4,
    "num_blocks": 300,
    "max_model_len": 256,
}


def make_llm(**kw: Any) -> LLM:
    llm = LLM("tiny", **{**LLM_KW, **kw})
    llm.tokenizer = chat_tokenizer()
    return llm


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, LLM]]:
    llm = make_llm()
    template = ChatTemplate(CHAT_TEMPLATE, bos_token="<s>", eos_token="<|end|>")
    app = create_app(llm, model_name="tiny", chat_template=template)
    with serving(app) as (url, _, _):
        yield url, llm
    assert not llm.scheduler.has_unfinished()
    assert llm.scheduler.cache.stats().used_blocks == 0


@pytest.fixture(scope="module")
def reference() -> LLM:
    return make_llm()


@pytest.fixture
def oai(server: tuple[str, LLM]) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(reference: LLM, text: str, max_tokens: int) -> RequestOutput:
    return reference.generate([text], SamplingParams(max_tokens=max_tokens, logprobs=3))[0]


def spanning_stop(out: RequestOutput, reference: LLM) -> tuple[str, int]:
    """A stop string across a token boundary (the last digit of token j, the space, `w` and
    the first digit of token j + 1) that first occurs there; and j + 2, the tokens kept."""
    assert out.text is not None
    end = 0
    for j, t in enumerate(out.token_ids[:-1]):
        end += len(reference.decode([t]) or "") + (1 if j else 0)
        stop = out.text[end - 1 : end + 3]
        if j >= 3 and out.text.find(stop) == end - 1:
            return stop, j + 2
    raise AssertionError(f"no stop string spans a boundary in {out.text!r}")


def post(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return events[:-1]


def idle(client: httpx.Client) -> bool:
    s = client.get("/v1/stats").json()
    return s["running"] == 0 and s["waiting"] == 0


# ---------------------------------------------------------------------------------- stop
def test_stop_string_across_tokens_cuts_text_and_ends_the_request(
    client: httpx.Client, reference: LLM
) -> None:
    """The text is the unstopped output cut before the stop string, the tokens end with the one
    that completed it, finish_reason is "stop", and the engine request is already gone (it was
    aborted before the answer was sent, with max_tokens far away)."""
    text = words(60, 30)
    full = greedy(reference, text, 12)
    stop, kept = spanning_stop(full, reference)
    assert full.text is not None
    want = full.text[: full.text.index(stop)]
    body = {"prompt": text, "max_tokens": 200, "stop": [stop, "never-occurs"]}
    before = client.get("/v1/stats").json()["engine"]
    out = post(client, body)
    choice = out["choices"][0]
    assert choice["text"] == want and stop not in choice["text"]
    assert choice["token_ids"] == full.token_ids[:kept]
    assert choice["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == kept
    assert idle(client)
    after = client.get("/v1/stats").json()["engine"]  # counted as a finished request
    assert after["output_tokens"] - before["output_tokens"] == kept
    assert after["prompt_tokens"] - before["prompt_tokens"] == out["usage"]["prompt_tokens"]

    chunks = stream(client, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == want
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == full.token_ids[:kept]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stream_holds_back_a_possible_stop_start_and_releases_it(
    client: httpx.Client, reference: LLM
) -> None:
    """A stop string that begins like the output but never completes: every chunk's text so far
    is a prefix of the full text that never ends with a proper prefix of the stop string,
    and the held-back tail comes out at the end, so the whole text arrives, finish "length"."""
    text = words(61, 30)
    full = greedy(reference, text, 10)
    assert full.text is not None
    stop = full.text[-3:] + "QQ"  # its start, the output's last 3 characters, comes last
    chunks = stream(client, "/v1/completions", {"prompt": text, "max_tokens": 10, "stop": stop})
    sent = ""
    for c in chunks[:-1]:
        sent += c["choices"][0]["text"]
        assert full.text.startswith(sent)
        assert not any(sent.endswith(stop[:k]) for k in range(1, len(stop)))
    sent += chunks[-1]["choices"][0]["text"]
    assert sent == full.text and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_stop_strings_with_the_openai_client(oai: Any, reference: LLM) -> None:
    """Chat, streaming and not: the answer is the unstopped answer cut before the stop."""
    messages = [{"role": "user", "content": words(62, 20)}]
    free = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=12)
    content = free.choices[0].message.content
    words_out = content.split(" ")
    stop = words_out[5][-1] + " " + words_out[6][:2]
    assert content.find(stop) == len(" ".join(words_out[:6])) - 1
    want = content[: content.index(stop)]
    r = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=12, stop=stop)
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 7
    chunks = list(
        oai.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, stop=[stop], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_token_ids_end_the_output_at_that_token(client: httpx.Client, reference: LLM) -> None:
    text = words(63, 30)
    full = greedy(reference, text, 10)
    stop = full.token_ids[3]
    out = post(client, {"prompt": text, "max_tokens": 10, "stop_token_ids": [stop]})
    choice = out["choices"][0]
    assert choice["token_ids"] == full.token_ids[: full.token_ids.index(stop) + 1]
    assert choice["finish_reason"] == "stop"


# ---------------------------------------------------------------------------------- n
def test_n_choices_are_independent_reproducible_and_counted(client: httpx.Client) -> None:
    """n = 3 with a seed: three choices (index 0..2) that differ, the same three again on a
    resend; usage counts the prompt once and sums the completion tokens. Without a seed two
    sends differ. Streamed, each index's chunks carry the same tokens as the non-streamed
    choice, and include_usage ends with the summed usage."""
    text = words(64, 30)
    body = {"prompt": text, "max_tokens": 8, "n": 3, "temperature": 1.0, "seed": 11}
    first = post(client, body)
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    tokens = [c["token_ids"] for c in first["choices"]]
    assert len({tuple(t) for t in tokens}) == 3
    assert [c["token_ids"] for c in post(client, body)["choices"]] == tokens
    prompt_tokens = len(chat_tokenizer().encode(text).ids)
    assert first["usage"]["prompt_tokens"] == prompt_tokens
    assert first["usage"]["completion_tokens"] == 24
    assert first["usage"]["total_tokens"] == prompt_tokens + 24

    unseeded = {k: v for k, v in body.items() if k != "seed"}
    a, b = post(client, unseeded), post(client, unseeded)
    assert [c["token_ids"] for c in a["choices"]] != [c["token_ids"] for c in b["choices"]]

    chunks = stream(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        streamed[choice["index"]].extend(choice["token_ids"])
    assert [streamed[i] for i in range(3)] == tokens
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert idle(client)


def test_chat_n_with_the_openai_client(oai: Any) -> None:
    messages = [{"role": "user", "content": words(65, 12)}]
    r = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, n=2, temperature=1.0, seed=3
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content != r.choices[1].message.content
    assert r.usage.completion_tokens == 10
    chunks = list(
        oai.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=5,
            n=2,
            temperature=1.0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in r.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


# ---------------------------------------------------------------------------------- logprobs
def test_completion_logprobs_match_the_engine(client: httpx.Client, reference: LLM) -> None:
    """logprobs = 3: per token its text, the engine's logprob (greedy: the top alternative is
    the token itself), the top 3 as {text: logprob} and its offset in the text; streaming
    gives the same values chunk by chunk."""
    text = words(66, 30)
    want = greedy(reference, text, 6)
    assert want.logprobs is not None
    out = post(client, {"prompt": text, "max_tokens": 6, "logprobs": 3})
    lp = out["choices"][0]["logprobs"]
    names = [reference.decode([t]) for t in want.token_ids]
    assert lp["tokens"] == names
    assert lp["token_logprobs"] == pytest.approx([x.logprob for x in want.logprobs], abs=1e-6)
    for name, top, x in zip(names, lp["top_logprobs"], want.logprobs, strict=True):
        assert len(top) == 3 and max(top, key=top.get) == name
        assert all(v <= 0 for v in top.values())
        assert top[name] == pytest.approx(x.logprob, abs=1e-6)
    assert lp["text_offset"] == [sum(len(n) for n in names[:i]) for i in range(len(names))]

    chunks = stream(client, "/v1/completions", {"prompt": text, "max_tokens": 6, "logprobs": 3})
    merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        for key in merged:
            merged[key].extend(c["choices"][0]["logprobs"][key])
    assert merged["tokens"] == lp["tokens"] and merged["text_offset"] == lp["text_offset"]
    # the stream resumes from the first request's cached state: float32 rounding differs
    assert merged["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-5)


def test_chat_logprobs_with_the_openai_client(oai: Any) -> None:
    messages = [{"role": "user", "content": words(67, 15)}]
    r = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    assert " ".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.bytes == list(e.token.encode())
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert -math.inf < e.logprob <= 0
    chunks = list(
        oai.chat.completions.create(
            model="tiny", messages=messages, max_tokens=5, logprobs=True, stream=True
        )
    )
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(e.top_logprobs == [] for e in streamed)  # top_logprobs left out: 0 alternatives
    plain = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert plain.choices[0].logprobs is None


# ---------------------------------------------------------------------------------- usage
def test_completion_stream_include_usage(client: httpx.Client) -> None:
    """With include_usage the stream ends with a chunk of no choices and the usage; without
    it no such chunk is sent."""
    body = {"prompt": words(68, 25), "max_tokens": 4}
    chunks = stream(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 4
    assert last["usage"]["prompt_tokens"] == 25
    assert last["usage"]["total_tokens"] == 29
    assert "cached_tokens" in last["usage"]["prompt_tokens_details"]
    assert all(c["choices"] for c in stream(client, "/v1/completions", body))


def test_stop_strings_find_the_token_that_completes_one() -> None:
    """Several tokens at once (an accepted draft run): the kept tokens end with the one that
    completes the earliest stop string, and the text stops before it."""
    from hycache.server.worker import StopStrings

    def decode(ids: list[int]) -> str:
        return " ".join("abcdefg"[i] for i in ids)

    stops = StopStrings(decode, ["c d", "f"])
    assert stops.push([0, 1]) is None
    assert stops.push([2, 3, 4, 5]) == (2, "a b ")


def test_a_dropped_n_stream_aborts_every_choice(client: httpx.Client) -> None:
    """Closing an n = 3 stream early aborts all three choices: the engine goes idle and none
    of them ran to its end (finished requests count in the engine's output tokens)."""
    before = client.get("/v1/stats").json()["engine"]["output_tokens"]
    body = {"prompt": words(69, 20), "max_tokens": 200, "n": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line:
                break  # leaving the block closes the stream with three choices running
    deadline = time.monotonic() + HANG_S  # a hang's bound
    while not idle(client):
        assert time.monotonic() < deadline, "the dropped stream's choices are still running"
        time.sleep(0.02)
    assert client.get("/v1/stats").json()["engine"]["output_tokens"] == before
