"""vLLM's tokenizer routes: `POST /tokenize` (a text `prompt`, or chat `messages` rendered and
tokenized as `/v1/chat/completions` does -> `{count, max_model_len, tokens, token_strs}`) and
`POST /detokenize` (token ids -> `{prompt}`). Both run on the prompt thread pool
(`hycache.server.prompts`), never on the event loop or the engine thread.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hycache.server.protocol import DetokenizeBody, TokenizeBody, error_response
from hycache.server.serving import context, parse_body

router = APIRouter()


def _no_tokenizer() -> JSONResponse:
    return error_response(400, "this model has no tokenizer (tokenizer.json)")


@router.post("/tokenize", response_model=None)
async def tokenize(request: Request) -> Response:
    ctx = context(request)
    body = await parse_body(request, {}, TokenizeBody)
    if isinstance(body, Response):
        return body
    try:
        body.checked()
    except ValueError as e:
        return error_response(400, str(e))
    tokenizer = ctx.llm.tokenizer
    if tokenizer is None:
        return _no_tokenizer()
    if body.messages is not None and ctx.prep.encoder is None:
        return error_response(400, "this model has no chat template; pass --chat-template FILE")
    try:
        if body.messages is not None:
            messages = [m.as_template_input() for m in body.messages]
            ids, _ = await ctx.prep.chat(messages, body.add_generation_prompt)
        else:
            assert body.prompt is not None
            add = body.add_special_tokens is not False
            ids = await ctx.prep.text(body.prompt, add)
    except ValueError as e:
        return error_response(400, str(e))
    strs = [tokenizer.id_to_token(t) for t in ids] if body.return_token_strs else None
    return JSONResponse(
        {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids, "token_strs": strs}
    )


@router.post("/detokenize", response_model=None)
async def detokenize(request: Request) -> Response:
    ctx = context(request)
    body = await parse_body(request, {}, DetokenizeBody)
    if isinstance(body, Response):
        return body
    if ctx.llm.tokenizer is None:
        return _no_tokenizer()
    if len(body.tokens) > ctx.max_model_len:
        return error_response(
            400, f"tokens: {len(body.tokens):,} ids, more than max_model_len {ctx.max_model_len}"
        )
    vocab = ctx.llm.model_config.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        return error_response(400, f"tokens: {bad} is outside the vocabulary [0, {vocab})")
    return JSONResponse({"prompt": await ctx.prep.decode(body.tokens)})
