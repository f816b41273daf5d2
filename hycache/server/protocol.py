"""The OpenAI-compatible request side of `hycache serve`: request bodies, the fields hycache
refuses and the error shape.

- `CompletionBody` / `ChatBody`: pydantic bodies of `POST /v1/completions` and
  `POST /v1/chat/completions` (strict types; unknown fields such as `model` are ignored),
  including `n` (at most `MAX_N` choices), `stop` strings (at most `MAX_STOP`) and
  `logprobs` (at most `MAX_LOGPROBS` alternatives per token).
- `UNSUPPORTED_FIELDS` / `CHAT_UNSUPPORTED_FIELDS` and `refuse_unsupported`: OpenAI fields
  hycache does not implement are refused (400) unless null, empty or at their unused value,
  never answered with other semantics. Bodies keep unknown fields (`model_extra`) so that the
  JSON is parsed once, by pydantic (depth-limited, strict UTF-8).
- Bounds: `repetition_penalty` in [0.01, 100], at most `MAX_STOP_TOKEN_IDS` stop token ids,
  `MAX_LOGIT_BIAS` logit_bias entries, prefix hints by `prefix_hints_problem` (its home is
  `hycache.cache.boundaries`, which the vLLM plugin's guard shares), chat roles from `CHAT_ROLES`.
- `error_response`: OpenAI's `{"error": {"message", "type", "param", "code"}}`.
- `TokenizeBody` / `DetokenizeBody`: vLLM's tokenizer routes.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from hycache.cache.boundaries import PREFIX_HINTS_RULE, prefix_hints_problem
from hycache.request import (
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_STOP_TOKEN_IDS,
    MIN_REPETITION_PENALTY,
    SamplingParams,
)

MIN_TEMPERATURE = 1e-6  # below this (but > 0) softmax(logits / t) overflows to NaN
MAX_SEED = 2**64  # torch.Generator.manual_seed takes [0, 2**64)
MAX_N = 16  # choices per request: each is its own engine request
MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_LOGIT_BIAS = 300  # logit_bias entries per request, as OpenAI allows
# chat roles a template may see; any other role is refused (it would be rendered verbatim
# into the template's markup: a role `end|><|system` forges a turn)
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"})
# OpenAI completions fields hycache does not implement, with the value that means "unused":
# any other value is refused (400) instead of silently answered with other semantics
UNSUPPORTED_FIELDS: dict[str, Any] = {
    "echo": False,
    "suffix": None,
}
# the same for chat completions (tools, structured output, ...)
CHAT_UNSUPPORTED_FIELDS: dict[str, Any] = {
    "tools": None,
    "tool_choice": "none",
    "functions": None,
    "function_call": "none",
    "response_format": {"type": "text"},
    "prediction": None,
    "audio": None,
    "modalities": ["text"],
    "web_search_options": None,
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class GenerationBody(BaseModel):
    """The fields both generation routes share: sampling, choices, stop strings, streaming and
    the cache salt."""

    model_config = ConfigDict(strict=True, extra="allow")  # extras: see `refuse_unsupported`

    temperature: float = Field(0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, allow_inf_nan=False)
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # requests with different salts never share cache entries; without one the cache is shared
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    # vLLM's semantics (SamplingParams / hycache.engine.sampling.adjust_logits)
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(
        1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False
    )
    # token id (a string, as JSON keys are) -> bias
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        many = [stop] if isinstance(stop, str) else stop or []
        if len(many) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(many)}")
        if not all(many):
            raise ValueError("stop strings must not be empty")
        return stop

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return tuple(dict.fromkeys(stop))

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Raises ValueError on values the engine would choke on mid-step."""
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature: must be 0 (greedy) or >= {MIN_TEMPERATURE}")
        if self.seed is not None and not 0 <= self.seed < MAX_SEED:
            raise ValueError("seed: must lie in [0, 2**64)")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self._logit_bias(),
        )

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs, each bias clamped to [-100, 100] as vLLM
        (and OpenAI) do. Keys are read as vLLM reads them, `int(key)`: `"7"` and `"07"` name
        one token, the later replacing the earlier. A key that is no decimal token id (ASCII
        digits only: `int` would read `"²"` or `"٣"` otherwise) raises ValueError."""
        out: dict[int, float] = {}
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 20):
                raise ValueError(
                    f"logit_bias: keys must be token ids (decimal digits), got {key!r}"
                )
            if bias != bias or abs(bias) == float("inf"):
                raise ValueError(f"logit_bias: {key}: bias must be a finite number")
            out[int(key)] = min(100.0, max(-100.0, bias))
        return tuple(out.items())


class CompletionBody(GenerationBody):
    """The body of `POST /v1/completions`; unknown fields (`model`, ...) are ignored."""

    prompt: str | list[int]
    max_tokens: int = 16
    # each token's logprob and this many alternatives (OpenAI's legacy completions shape)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None  # only as many as `n`: hycache returns every choice it runs
    # token counts where shared prefixes of the prompt end (hints past the prompt are ignored)
    prefix_hints: list[int] = Field(default_factory=list)

    @field_validator("prefix_hints", mode="before")
    @classmethod
    def _check_prefix_hints(cls, hints: object) -> object:
        problem = prefix_hints_problem(hints)
        if problem is not None:
            raise ValueError(f"prefix_hints must be {PREFIX_HINTS_RULE}; {problem}")
        return hints

    def sampling_params(self) -> SamplingParams:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of: only best_of == n ({self.n}) is supported")
        return self._sampling(self.max_tokens, self.logprobs)


class ChatMessage(BaseModel):
    """One chat message; extra fields (`name`, ...) reach the template as they are."""

    model_config = ConfigDict(strict=True, extra="allow")

    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None

    @field_validator("role")
    @classmethod
    def _check_role(cls, role: str) -> str:
        if role not in CHAT_ROLES:
            raise ValueError(f"role must be one of {', '.join(sorted(CHAT_ROLES))}")
        return role

    def as_template_input(self) -> dict[str, Any]:
        """The message as the template sees it: text parts joined into one string."""
        doc = self.model_dump(exclude_none=False)
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        f"messages: content part of type {part.get('type')!r} is not supported "
                        "(only text)"
                    )
                texts.append(part["text"])
            doc["content"] = "".join(texts)
        return doc


class ChatBody(GenerationBody):
    """The body of `POST /v1/chat/completions`; unknown fields (`model`, `user`, ...) are
    ignored, OpenAI fields hycache does not implement are refused before this is parsed."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """`max_completion_tokens`, else `max_tokens`, else `default_max_tokens`."""
        max_tokens = self.max_completion_tokens
        if max_tokens is None:
            max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs set to true")
        return self._sampling(max_tokens, (self.top_logprobs or 0) if self.logprobs else None)


# vLLM's /tokenize chat fields hycache does not implement, with their unused values
TOKENIZE_CHAT_UNSUPPORTED_FIELDS: dict[str, Any] = {
    "continue_final_message": False,
    "chat_template": None,
    "chat_template_kwargs": None,
    "tools": None,
    "mm_processor_kwargs": None,
}


class TokenizeBody(BaseModel):
    """vLLM's `POST /tokenize` body: a text `prompt`, or chat `messages` rendered as the chat
    route does (`model` is ignored; other chat fields are checked by `refuse_unsupported`)."""

    model_config = ConfigDict(strict=True, extra="allow")

    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # text: default True; chat: only False
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    def checked(self) -> TokenizeBody:
        """Self, or ValueError when it is neither shape."""
        if self.messages is None and self.prompt is None:
            raise ValueError("prompt: Field required (or messages)")
        if self.messages is not None and self.add_special_tokens:
            raise ValueError("add_special_tokens: not supported with messages; leave it out")
        if self.messages is None:
            refuse_unsupported(self.model_extra or {}, {})
        else:
            refuse_unsupported(self.model_extra or {}, TOKENIZE_CHAT_UNSUPPORTED_FIELDS)
        return self


class DetokenizeBody(BaseModel):
    """vLLM's `POST /detokenize` body."""

    model_config = ConfigDict(strict=True, extra="ignore")

    tokens: list[int]  # at most max_model_len of them (checked by the route)


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    body = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse({"error": body}, status_code=status)


def validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return "; ".join(parts)


def refuse_unsupported(extra: dict[str, Any], fields: dict[str, Any]) -> None:
    """Raise ValueError naming the first OpenAI field in `fields` that a body's extra fields
    (pydantic's `model_extra`: the body is parsed once) set to something hycache does not do
    (null, an empty value or the field's unused value pass)."""
    for key, unused in fields.items():
        value = extra.get(key, unused)
        if value is not None and value != unused and value not in ([], {}, ""):
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise ValueError(f"{key}: not supported by hycache (got {shown}); leave it out")
