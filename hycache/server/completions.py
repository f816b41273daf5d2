"""`POST /v1/completions`: a text or token-id prompt, OpenAI's legacy completions shape.

Beyond OpenAI's body (`hycache.server.protocol.CompletionBody`): `token_ids` in each choice,
`stop_token_ids`, `ignore_eos` and `prefix_hints` (token counts where the prompt's shared
prefixes end). Each choice's last streamed chunk carries its own usage (older clients read it).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hycache.request import TokenLogprob
from hycache.server.protocol import UNSUPPORTED_FIELDS, CompletionBody
from hycache.server.serving import OpenAIServing, Prepared, Reply, Route

OBJECT = "text_completion"  # of a whole response and of a chunk
router = APIRouter()


class CompletionServing(OpenAIServing[CompletionBody]):
    route = Route(CompletionBody, UNSUPPORTED_FIELDS, "cmpl", OBJECT, OBJECT, choice_usage=True)

    async def prepare(self, body: CompletionBody) -> Prepared:
        params = body.sampling_params()
        prompt = body.prompt
        if isinstance(prompt, str):  # bounded, then tokenized off the loop and engine
            prompt = await self.ctx.prep.text(prompt)
        return Prepared(prompt, body.prefix_hints, params)

    def content(self, text: str | None, streamed: bool) -> dict[str, Any]:
        return {"text": text}

    def format_logprobs(self, reply: Reply, i: int, logprobs: list[TokenLogprob]) -> Any:
        if not reply.streamed:
            return reply.fmt.completion(logprobs)
        shaped = reply.fmt.completion(logprobs, reply.offsets[i])
        reply.offsets[i] += sum(len(t) for t in shaped["tokens"])
        return shaped


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response:
    serving: CompletionServing = request.app.state.completions
    return await serving.handle(request)
