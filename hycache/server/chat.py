"""`POST /v1/chat/completions`: chat messages rendered with the checkpoint's chat template
(`hycache.server.chat_template`; `--chat-template FILE` overrides it) and answered in OpenAI's
chat shape.

The end of the last system message is passed as a prefix hint, so under `limit` the first chat
of a system-prompt family already checkpoints for it. `max_completion_tokens` (else
`max_tokens`, else the room left in `max_model_len`). A model with no template or no tokenizer
answers 400.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hycache.request import TokenLogprob
from hycache.server.protocol import CHAT_UNSUPPORTED_FIELDS, ChatBody, error_response
from hycache.server.serving import OpenAIServing, Prepared, Reply, Route

CHUNK = "chat.completion.chunk"
router = APIRouter()


class ChatServing(OpenAIServing[ChatBody]):
    route = Route(ChatBody, CHAT_UNSUPPORTED_FIELDS, "chatcmpl", "chat.completion", CHUNK)

    def unavailable(self) -> Response | None:
        llm = self.ctx.llm
        if self.ctx.prep.encoder is not None:
            return None
        missing = "tokenizer (tokenizer.json)" if llm.tokenizer is None else "chat template"
        return error_response(
            400,
            f"this model has no {missing}, so chat is unavailable; pass --chat-template FILE "
            "(and a checkpoint with a tokenizer) or use /v1/completions with token ids",
        )

    async def prepare(self, body: ChatBody) -> Prepared:
        messages = [m.as_template_input() for m in body.messages]
        ids, hint = await self.ctx.prep.chat(messages)  # bounded, then off the loop and engine
        params = body.sampling_params(max(self.ctx.max_model_len - len(ids), 1))
        return Prepared(ids, [hint] if 0 < hint < len(ids) else [], params)

    def content(self, text: str | None, streamed: bool) -> dict[str, Any]:
        if streamed:
            return {"delta": {"content": text}}
        return {"message": {"role": "assistant", "content": text}}

    def format_logprobs(self, reply: Reply, i: int, logprobs: list[TokenLogprob]) -> Any:
        return reply.fmt.chat(logprobs)

    def head(self, reply: Reply, n: int) -> list[dict[str, Any]]:
        """Each choice's first chunk names the assistant role."""
        delta = {"role": "assistant", "content": ""}
        return [
            reply.envelope([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            for i in range(n)
        ]


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    serving: ChatServing = request.app.state.chat
    return await serving.handle(request)
