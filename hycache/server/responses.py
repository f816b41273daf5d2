"""The OpenAI-compatible response side of `hycache serve`: usage, streamed text, logprobs.

- `usage`: OpenAI's usage block over a request's choices (prompt tokens counted once,
  completion tokens summed; `cached_tokens` is the first choice's resume point; with a second
  cache tier, `prompt_tokens_details.store_cached_tokens` says how many of them came from it).
- `TextDelta`: incremental detokenisation of one streamed choice; it holds back a trailing
  half character and, with stop strings, any tail that could begin one, so that nothing past a
  stop string is ever streamed.
- `LogprobFormatter`: a choice's `TokenLogprob`s in the completions (legacy) shape
  `{tokens, token_logprobs, top_logprobs, text_offset}` or the chat shape
  `{content: [{token, logprob, bytes, top_logprobs}]}`. Values are the log_softmax of the raw
  logits (before temperature and top-p), as vLLM reports by default. A chat entry's `bytes`
  are the token's own bytes (`TokenBytes`: a byte-level token's bytes, a `<0xNN>` byte
  token's byte), so the bytes of a character split across tokens join back into it.
- `sse`: one server-sent event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from hycache.engine.outputs import RequestOutput
from hycache.request import TokenLogprob

Decode = Callable[[list[int]], str | None]
# the chunks to stream once every choice has finished, from their outputs
Tail = Callable[[list[RequestOutput]], list[dict[str, Any]]]


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def usage(outputs: Sequence[RequestOutput], store: bool = False) -> dict[str, Any]:
    """OpenAI's usage block for the choices of one prompt; cached tokens are the first choice's
    resume point (prompt tokens it took from the prefix cache instead of computing them). With
    `store` (the engine has a second tier), `prompt_tokens_details.store_cached_tokens`: how
    many of the cached tokens were loaded from it (an extension)."""
    prompt = len(outputs[0].prompt_token_ids)
    completion = sum(len(out.token_ids) for out in outputs)
    cached = outputs[0].hit_tokens
    details: dict[str, int] = {"cached_tokens": cached}
    if store:
        details["store_cached_tokens"] = outputs[0].store_hit_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
        "cached_tokens": cached,
    }


def _held_tail(text: str, stops: Sequence[str]) -> int:
    """The length of the longest tail of `text` that is a proper prefix of a stop string."""
    longest = max((len(s) for s in stops), default=1)
    for k in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0


class TextDelta:
    """Incremental detokenisation: decode everything so far, emit what is new, and hold back
    a trailing replacement character (a multi-byte character cut in half) and any tail that
    could begin one of `stops`."""

    def __init__(self, decode: Decode | None, stops: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stops = tuple(stops)
        self.ids: list[int] = []
        self.sent = ""

    def push(self, new_ids: list[int], final_text: str | None = None) -> str | None:
        """The text to stream for `new_ids` (None without a tokenizer). `final_text`: the
        choice's whole text once it has finished (cut before a stop string)."""
        if self.decode is None:
            return None
        self.ids.extend(new_ids)
        if final_text is not None:
            text = final_text
        else:
            text = self.decode(self.ids) or ""
            if text.endswith("\ufffd"):
                return ""
            text = text[: len(text) - _held_tail(text, self.stops)]
        delta = text[len(self.sent) :] if text.startswith(self.sent) else text
        self.sent = text
        return delta


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is spelt with, inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _uses_byte_level(tokenizer: Any) -> bool:
    """Whether a `tokenizers.Tokenizer` decodes with the byte-level decoder (GPT-2 style)."""
    try:
        doc = json.loads(tokenizer.to_str()).get("decoder") or {}
    except (AttributeError, ValueError, TypeError):
        return False
    parts = doc.get("decoders", [doc]) if isinstance(doc, dict) else []
    return any(isinstance(d, dict) and d.get("type") == "ByteLevel" for d in parts)


class TokenBytes:
    """A token id's own bytes: a byte-level vocabulary's token spelt back into bytes, a
    `<0xNN>` byte-fallback token as that byte, else the token decoded alone (UTF-8)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.table = _byte_level_table() if _uses_byte_level(tokenizer) else None
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes | None:
        got = self._cache.get(token_id)
        if got is not None:
            return got
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return None
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            out = bytes([int(byte.group(1), 16)])
        elif self.table is not None and all(c in self.table for c in piece):
            out = bytes(self.table[c] for c in piece)
        else:
            out = self.tokenizer.decode([token_id]).encode()
        self._cache[token_id] = out
        return out


class LogprobFormatter:
    """Formats `TokenLogprob`s for responses; token strings are each id decoded alone (or
    `token_id:N` without a tokenizer, as vLLM writes ids)."""

    def __init__(
        self, decode: Decode | None, token_bytes: Callable[[int], bytes | None] | None = None
    ) -> None:
        self.decode = decode
        self.token_bytes = token_bytes
        self._texts: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            decoded = self.decode([token_id]) if self.decode is not None else None
            text = self._texts[token_id] = (
                decoded if decoded is not None else f"token_id:{token_id}"
            )
        return text

    def completion(self, logprobs: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """The legacy completions shape; `offset`: the text offset of the first token (the
        length of the text streamed before it). Each `top_logprobs` entry holds the requested
        alternatives and the chosen token, as OpenAI's does, none lost to a shared text (see
        `_alternatives`)."""
        tokens = [self.token(lp.token_id) for lp in logprobs]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        top = [self._alternatives(lp, text) for lp, text in zip(logprobs, tokens, strict=True)]
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def _alternatives(self, lp: TokenLogprob, text: str) -> dict[str, float]:
        """One position's `top_logprobs`: every alternative, most likely first, and the chosen
        token (under `text`, its own value). The legacy shape keys them by text, and distinct
        tokens may decode alike (byte tokens of a split character all decode to "\ufffd"):
        a key already taken goes to the later token as `token_id:N`, so none is lost."""
        out: dict[str, float] = {}
        taken = {text}
        chosen_listed = False
        for token_id, value in lp.top:
            if token_id == lp.token_id:
                out[text] = lp.logprob
                chosen_listed = True
                continue
            key = self.token(token_id)
            if key in taken:
                key = f"token_id:{token_id}"
            taken.add(key)
            out[key] = value
        if not chosen_listed:
            out[text] = lp.logprob
        return out

    def chat(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The chat shape: `{"content": [{token, logprob, bytes, top_logprobs}]}`."""

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.token(token_id)
            raw = self.token_bytes(token_id) if self.token_bytes is not None else None
            return {"token": text, "logprob": logprob, "bytes": list(raw or text.encode())}

        return {
            "content": [
                {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(*t) for t in lp.top]}
                for lp in logprobs
            ]
        }
