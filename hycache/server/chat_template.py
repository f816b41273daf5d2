"""Chat templates for `POST /v1/chat/completions`: load one and render messages into a prompt.

A checkpoint's template is `chat_template` in its `tokenizer_config.json` (a string, or a list
of `{"name", "template"}` entries of which "default" is used); `--chat-template FILE` replaces
it. Rendering follows transformers' `apply_chat_template`: a sandboxed jinja2 environment with
`trim_blocks`/`lstrip_blocks` and loop controls, a `tojson` filter, `raise_exception` and
`strftime_now` globals, and the variables `messages`, `add_generation_prompt=True` and
`bos_token`/`eos_token` when the tokenizer config names them.

`ChatTemplate.render` also returns where the last system message ends in the rendered text,
which the server turns into a prefix hint (the system prompt is the prefix a family of chats
shares).

`ChatEncoder` renders and tokenizes: the template's own markup keeps its special tokens, while
text that came from the messages is tokenized as plain text, so a user message holding
`"<|system|>"` never becomes the control token and cannot forge a turn. (vLLM parses special
tokens in the rendered prompt as a whole, so there message text can hold control tokens.)
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SYSTEM_ROLES = frozenset({"system", "developer"})


class ChatTemplateError(ValueError):
    """The template is missing, does not compile, or refused these messages."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclass
class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    source: str
    bos_token: str | None = None
    eos_token: str | None = None
    _compiled: jinja2.Template | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._compiled = env.from_string(self.source)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        assert self._compiled is not None
        variables: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        if self.bos_token is not None:
            variables["bos_token"] = self.bos_token
        if self.eos_token is not None:
            variables["eos_token"] = self.eos_token
        try:
            return self._compiled.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from e
        except Exception as e:  # a template tripping over unexpected message shapes
            raise ChatTemplateError(f"chat template failed on these messages: {e}") from e

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> tuple[str, int]:
        """The prompt for `messages` (with the generation prompt unless told otherwise) and the
        character offset where the last system message ends in it (0: no system message, or
        its end is not a prefix of the prompt). Raises ChatTemplateError."""
        text = self._render(messages, add_generation_prompt=add_generation_prompt)
        last_system = max(
            (i for i, m in enumerate(messages) if m.get("role") in SYSTEM_ROLES), default=-1
        )
        if last_system < 0:
            return text, 0
        try:
            head = self._render(messages[: last_system + 1], add_generation_prompt=False)
        except ChatTemplateError:  # e.g. a template that insists on a user turn
            return text, 0
        # The rendered system part is what every chat with these system messages shares; some
        # templates close a conversation differently, so take the common prefix only.
        n = 0
        for a, b in zip(head, text, strict=False):
            if a != b:
                break
            n += 1
        return text, n


def load_chat_template(
    model: str | Path, override: str | Path | None = None
) -> ChatTemplate | None:
    """The template for a checkpoint directory: `override` (a file holding the template) if
    given, else `chat_template` from `tokenizer_config.json`; None when there is none. Special
    tokens come from `tokenizer_config.json` either way. Raises ChatTemplateError on a
    template that is unreadable or does not compile."""
    config: dict[str, Any] = {}
    config_path = Path(model) / "tokenizer_config.json"
    if config_path.is_file():
        try:
            loaded = json.loads(config_path.read_text())
        except ValueError as e:
            raise ChatTemplateError(f"{config_path}: not JSON ({e})") from e
        if isinstance(loaded, dict):
            config = loaded
    source: Any
    if override is not None:
        try:
            source = Path(override).read_text()
        except OSError as e:
            raise ChatTemplateError(f"--chat-template: {e}") from e
    else:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: use the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
    if not isinstance(source, str) or not source:
        return None
    return ChatTemplate(
        source,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
    )


def special_token_strings(tokenizer: Any) -> tuple[str, ...]:
    """The text of every special added token of a `tokenizers.Tokenizer`, longest first."""
    decoder = tokenizer.get_added_tokens_decoder()
    texts = {t.content for t in decoder.values() if t.special and t.content}
    return tuple(sorted(texts, key=len, reverse=True))


def literal_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` that reads special-token text as plain text (its own copy, so that
    other threads encoding with `tokenizer` meanwhile are unaffected)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    return copy


def hint_tokens(offsets: Sequence[tuple[int, int]], end: int) -> int:
    """How many tokens lie wholly within the first `end` characters (0 when `end` is 0)."""
    return sum(1 for _, stop in offsets if stop <= end) if end > 0 else 0


class ChatEncoder:
    """Messages -> prompt token ids and a prefix hint, with message text kept from ever
    becoming a special token.

    Every special-token string inside a message's strings is swapped for a sentinel (private
    use characters around a per-call nonce, so no message can forge one) before rendering. The
    rendered text is then tokenized piecewise: the text between sentinels as usual (the
    template's markup is read as its special tokens), each sentinel's original string by
    `literal_tokenizer`. Without such a string in any message the prompt is tokenized in one
    go, exactly as before."""

    def __init__(self, template: ChatTemplate, tokenizer: Any) -> None:
        self.template = template
        self.tokenizer = tokenizer
        specials = special_token_strings(tokenizer)
        self._specials = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._literal = literal_tokenizer(tokenizer) if specials else None

    def _escape(self, value: Any, nonce: str, found: list[str]) -> Any:
        """`value` with each special-token string swapped for a sentinel (kept in `found`)."""
        if isinstance(value, str) and self._specials is not None:

            def swap(m: re.Match[str]) -> str:
                found.append(m.group(0))
                return _sentinel(nonce, len(found) - 1)

            return self._specials.sub(swap, value)
        if isinstance(value, dict):
            return {k: self._escape(v, nonce, found) for k, v in value.items()}
        if isinstance(value, list):
            return [self._escape(v, nonce, found) for v in value]
        return value

    def encode(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> tuple[list[int], int]:
        """(prompt token ids, prefix hint in tokens: the end of the last system message).
        Raises ChatTemplateError."""
        nonce = secrets.token_hex(8)
        found: list[str] = []
        escaped = [self._escape(m, nonce, found) for m in messages]
        text, system_end = self.template.render(escaped, add_generation_prompt)
        if not found:
            enc = self.tokenizer.encode(text, add_special_tokens=False)
            return list(enc.ids), hint_tokens(enc.offsets, system_end)
        pieces = re.split(f"\ue000{nonce}:([0-9]+)\ue001", text)
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        escaped_at = real_at = 0
        real_end: int | None = None  # `system_end` in the real prompt's characters
        for i, piece in enumerate(pieces):
            literal = i % 2 == 1  # re.split puts each captured sentinel index at an odd place
            real = found[int(piece)] if literal else piece
            size = len(_sentinel(nonce, int(piece))) if literal else len(piece)
            if real_end is None and system_end < escaped_at + size:
                real_end = real_at + (0 if literal else system_end - escaped_at)
            tok = self._literal if literal else self.tokenizer
            enc = tok.encode(real, add_special_tokens=False)
            ids.extend(enc.ids)
            offsets.extend((a + real_at, b + real_at) for a, b in enc.offsets)
            escaped_at += size
            real_at += len(real)
        return ids, hint_tokens(offsets, real_at if real_end is None else real_end)


def _sentinel(nonce: str, index: int) -> str:
    return f"\ue000{nonce}:{index}\ue001"


__all__ = [
    "SYSTEM_ROLES",
    "ChatEncoder",
    "ChatTemplate",
    "ChatTemplateError",
    "hint_tokens",
    "literal_tokenizer",
    "load_chat_template",
    "special_token_strings",
]
