"""Text prompts and chat messages -> token ids for `hycache serve`, before anything reaches
the engine.

`PromptPrep`: text longer than could ever fit `max_model_len` is refused by its length alone,
before any work, and rendering and tokenizing run on a small thread pool of their own, never
on the event loop (which would freeze every other client) nor on the engine thread (which
would freeze every stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hycache.server.chat_template import ChatEncoder, ChatTemplate


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for (at least 1), from its vocabulary
    (byte-level and metaspace vocabularies spell each byte or space as one character)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(t) for t in vocab), default=1) or 1


def text_chars(value: Any) -> int:
    """The characters in every string inside `value` (chat messages: contents, names, ...)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


class PromptPrep:
    """Text prompts and chat messages -> token ids, off the event loop and the engine thread.

    `max_chars` = `max_model_len` x the longest token's characters: a text over it tokenizes
    to more than `max_model_len` tokens whatever it holds, so it is refused (ValueError) at
    once. `workers` threads render and tokenize (the tokenizer releases the GIL while it
    encodes)."""

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        template: ChatTemplate | None = None,
        workers: int = 2,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_chars = max_model_len * longest_token_chars(tokenizer) if tokenizer else 0
        self.max_model_len = max_model_len
        self.encoder = ChatEncoder(template, tokenizer) if template and tokenizer else None
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="hycache-prompt")

    def check_length(self, chars: int, what: str) -> None:
        if chars > self.max_chars:
            raise ValueError(
                f"{what}: {chars:,} characters cannot fit max_model_len {self.max_model_len} "
                f"(at most {self.max_chars:,} characters)"
            )

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def text(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of a text prompt (ValueError: no tokenizer, or too long)."""
        if self.tokenizer is None:
            raise ValueError("prompt: this model has no tokenizer.json; pass token ids instead")
        self.check_length(len(prompt), "prompt")

        def encode() -> list[int]:
            return list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids)

        ids: list[int] = await self._run(encode)
        return ids

    async def chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> tuple[list[int], int]:
        """(token ids, prefix hint) of chat messages (ValueError: too long, or the template
        refused them)."""
        assert self.encoder is not None
        self.check_length(text_chars(messages), "messages")
        encode = self.encoder.encode
        result: tuple[list[int], int] = await self._run(encode, messages, add_generation_prompt)
        return result

    async def decode(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        text: str = await self._run(self.tokenizer.decode, ids)
        return text

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
