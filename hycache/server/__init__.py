"""`hycache serve`: an OpenAI-like HTTP server over one `LLM`.

    run.serve(llm, settings)        uvicorn over create_app, until interrupted (settings.py)
    app.create_app                  middleware (security.py), lifespan, the routers:
      completions.py  chat.py         POST /v1/completions, /v1/chat/completions, both through
                                      serving.OpenAIServing (parse -> engine -> stream | whole)
      tokenize.py                     POST /tokenize, /detokenize (vLLM's bodies and answers)
      info.py                         GET /health, /v1/models, /v1/stats, /metrics (metrics.py)
    worker.EngineWorker             the one thread that owns the LLM; stop strings
    protocol.py  responses.py       request bodies and errors; usage, text deltas, logprobs
    prompts.py  chat_template.py    text and chat messages -> token ids, off the event loop
    http.py                         slow-client deadlines, connection cap

The app's lifespan starts the engine worker and, on shutdown, stops it and aborts whatever is
still unfinished. With an API key every `/v1/*` route, vLLM's `/tokenize` and `/detokenize`
and the API docs want `Authorization: Bearer KEY` (401 otherwise); `/health` and `/metrics`
stay open. Every POST must be `application/json` (415); on loopback, foreign Hosts and Origins
(`null` too) get 403. Text is bounded by length before any work and rendered and tokenized on
a thread pool (`prompts.PromptPrep`), never on the event loop or the engine thread; slow
clients are timed out and connections capped (`http`, `--header-timeout`, `--body-timeout`,
`--max-connections`). At shutdown uvicorn's server (`run.HycacheServer`) first ends in-flight
requests (503) so that open streams close instead of holding the shutdown up.

Bad input answers HTTP 400 `{"error": {"message", "type", "param", "code"}}` and disturbs no
other request. OpenAI fields hycache does not implement (`echo`, `suffix`, `best_of` other than
`n`; for chat also tools, `response_format`, ...) are refused
with a 400 unless left at their unused value, never answered with other semantics. A body over
`serving.MAX_BODY_BYTES` is refused (413) before it is read whole. Responses name the served model
(`--served-model-name`, else the model path's last component), never a path.

Both generation routes take, as OpenAI and vLLM do:
- `stop`: a string or up to 4; the text ends before the first one (which is not included),
  finish reason "stop", and the engine request is aborted right there. A stream never sends
  text past a stop string. Needs a tokenizer; `stop_token_ids` works without one.
- `n` (up to `protocol.MAX_N`): independent choices, each its own engine request (with a
  `seed`, choice i uses seed + i); usage counts the prompt once and sums the choices'
  completion tokens; streamed chunks carry their choice's `index`.
- `frequency_penalty`, `presence_penalty`, `repetition_penalty`, `logit_bias`, with vLLM's
  semantics (`hycache.engine.sampling.adjust_logits`). Every bound a request may ask for, and
  the HTTP framing refused, are listed in docs/security.md.
- logprobs (completions: `logprobs: k`; chat: `logprobs: true`, `top_logprobs: k`; k <= 20):
  each output token's log-probability and the k most likely alternatives, computed as
  log_softmax of the model's raw logits (vLLM's default: before temperature and top-p).
- `stream_options.include_usage`: a last chunk with empty `choices` and the usage of all
  choices (completions also put each choice's usage on its last chunk).

Extensions to the OpenAI completions body: `token_ids` in each choice, `stop_token_ids`,
`ignore_eos`, and `prefix_hints` (token counts where the prompt's shared prefixes end, e.g. the
end of a system prompt: under the `limit` policy the first request of a family already
checkpoints there, so the next one resumes at its limit). `usage.prompt_tokens_details.
cached_tokens` (and, for older clients, `usage.cached_tokens`) is the request's resume point.

Second cache tier (`--kv-store host|mooncake://HOST:PORT`, `--kv-store-gb`): the blocks and SSM
checkpoints the device cache keeps are also written to the store, where they outlive device
eviction (and, on Mooncake, are shared with other servers); a lookup continues there. Then
`usage.prompt_tokens_details.store_cached_tokens` says how many of the cached tokens were loaded
from the store, `/v1/stats` splits `cache.hit_tokens` into `device_hit_tokens` and
`store_hit_tokens` and adds a `store` section (backend, capacity and used bytes, the store's and
the mirror's counters), and `/metrics` adds the `hycache:store_*` counters. A store that fails
(an unreachable Mooncake master) costs hits, never requests: its calls become misses, counted
in `store.stats.errors`. The store is closed when the server shuts down.

Chat: messages are rendered with the checkpoint's chat template (`chat_template.py`; the
`--chat-template` file overrides it) and tokenized without extra special tokens, the message
text as plain text (a special token's string in a message never becomes that token: no forged
turns), the template's markup with its special tokens; a model with no template or no
tokenizer answers 400. The end of the last system message is passed as a prefix
hint, so under `limit` the first chat of a system-prompt family already checkpoints for it.
`max_completion_tokens` (else `max_tokens`, else the room left in `max_model_len`).

Tenants: requests with different `cache_salt` strings never share cache entries, so
`cached_tokens` tells a client nothing about another tenant's prompts. Without a salt the cache
is shared by every client.
"""
