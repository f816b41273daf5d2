"""The serving template without an app: how a body becomes engine requests (`prepare`) and how
a choice is shaped, streamed and whole, for completions and chat. Nothing here runs the engine
or a server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hycache.engine.outputs import RequestOutput, StreamEvent
from hycache.request import TokenLogprob
from hycache.server.chat import ChatServing
from hycache.server.chat_template import ChatTemplate
from hycache.server.completions import CompletionServing
from hycache.server.metrics import ServerMetrics
from hycache.server.prompts import PromptPrep
from hycache.server.protocol import ChatBody, CompletionBody
from hycache.server.responses import LogprobFormatter
from hycache.server.serving import Reply, ServerContext
from hycache.server.worker import EngineWorker
from tests.server.conftest import CHAT_TEMPLATE, chat_tokenizer, make_llm


@pytest.fixture(scope="module")
def ctx() -> Iterator[ServerContext]:
    llm = make_llm()
    llm.tokenizer = chat_tokenizer()
    template = ChatTemplate(CHAT_TEMPLATE, bos_token="<s>", eos_token="<|end|>")
    prep = PromptPrep(llm.tokenizer, llm.config.cache.max_model_len, template)
    yield ServerContext(llm, EngineWorker(llm), ServerMetrics("tiny"), prep, "tiny")
    prep.close()


def output(token_ids: list[int], text: str, reason: str = "length") -> RequestOutput:
    lps = [TokenLogprob(t, -0.5, ((t, -0.5),)) for t in token_ids]
    return RequestOutput("r", [1, 2, 3], token_ids, text, 2, reason, logprobs=lps)


def test_completion_bodies_become_engine_requests(ctx: ServerContext) -> None:
    serving = CompletionServing(ctx)
    body = CompletionBody.model_validate(
        {"prompt": [5, 6, 7], "max_tokens": 3, "prefix_hints": [2]}
    )
    prepared = asyncio.run(serving.prepare(body))
    assert (prepared.prompt, list(prepared.hints), prepared.params.max_tokens) == (
        [5, 6, 7],
        [2],
        3,
    )
    text = CompletionBody.model_validate({"prompt": "w1 w2 w3"})
    assert asyncio.run(serving.prepare(text)).prompt == [1, 2, 3]  # tokenized off the loop
    with pytest.raises(ValueError, match="best_of"):
        asyncio.run(serving.prepare(CompletionBody.model_validate({"prompt": [1], "best_of": 3})))
    assert serving.unavailable() is None


def test_chat_bodies_render_hint_the_system_prompt_and_default_max_tokens(
    ctx: ServerContext,
) -> None:
    serving = ChatServing(ctx)
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3"}]
    prepared = asyncio.run(serving.prepare(ChatBody.model_validate({"messages": messages})))
    ids = prepared.prompt
    assert isinstance(ids, list) and list(prepared.hints) == [5]  # <s> <|system|> w1 w2 <|end|>
    assert prepared.params.max_tokens == ctx.max_model_len - len(ids)
    assert serving.unavailable() is None
    bare = ServerContext(ctx.llm, ctx.worker, ctx.metrics, PromptPrep(None, 64), "tiny")
    refused = ChatServing(bare).unavailable()
    assert refused is not None and refused.status_code == 400


def test_completion_chunks_carry_text_offsets_and_the_choice_usage(ctx: ServerContext) -> None:
    serving = CompletionServing(ctx)
    reply = serving_reply(serving)
    reply.start_stream(2, ())
    lps = [TokenLogprob(1, -0.1), TokenLogprob(2, -0.2)]
    (first,) = reply.chunks(1, StreamEvent("r-1", [1, 2], False, new_logprobs=lps))
    assert first["object"] == "text_completion" and "usage" not in first
    (choice,) = first["choices"]
    assert (choice["index"], choice["text"], choice["token_ids"]) == (1, "w1 w2", [1, 2])
    assert choice["logprobs"]["text_offset"] == [0, 2]
    done = output([1, 2, 3], "w1 w2 w3")
    (last,) = reply.chunks(1, StreamEvent("r-1", [3], True, done, [TokenLogprob(3, -0.3)]))
    assert last["choices"][0]["logprobs"]["text_offset"] == [4]  # after "w1" and "w2"
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 3
    (tail,) = reply.usage_tail([done, done])
    assert tail["choices"] == [] and tail["usage"]["completion_tokens"] == 6


def test_chat_chunks_name_the_role_first_and_carry_deltas(ctx: ServerContext) -> None:
    serving = ChatServing(ctx)
    reply = serving_reply(serving)
    reply.start_stream(1, ())
    (head,) = serving.head(reply, 1)
    assert head["object"] == "chat.completion.chunk"
    assert head["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    (chunk,) = reply.chunks(0, StreamEvent("r", [4], True, output([4], "w4", "stop")))
    choice = chunk["choices"][0]
    assert choice["delta"] == {"content": "w4"} and choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None and "usage" not in chunk


def test_whole_responses_share_one_shape(ctx: ServerContext) -> None:
    outs = [output([1], "w1"), output([2, 3], "w2 w3", "stop")]
    completion = serving_reply(CompletionServing(ctx)).whole(outs)
    chat = serving_reply(ChatServing(ctx)).whole(outs)
    assert completion["object"] == "text_completion" and chat["object"] == "chat.completion"
    assert completion["usage"] == chat["usage"]
    assert completion["usage"]["prompt_tokens"] == 3  # the prompt counted once
    assert completion["choices"][1]["text"] == "w2 w3"
    assert chat["choices"][1]["message"] == {"role": "assistant", "content": "w2 w3"}
    assert completion["choices"][0]["logprobs"]["tokens"] == ["w1"]
    assert chat["choices"][0]["logprobs"]["content"][0]["token"] == "w1"
    for shaped in (completion, chat):
        assert [c["finish_reason"] for c in shaped["choices"]] == ["length", "stop"]
        assert shaped["model"] == "tiny" and shaped["id"] == "x-1"


def serving_reply(serving: CompletionServing | ChatServing) -> Reply:
    return Reply(serving, "x-1", 0, LogprobFormatter(serving.ctx.decode))
