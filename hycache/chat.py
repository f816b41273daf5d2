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
"""

from __future__ import annotations

import json
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

    def render(self, messages: list[dict[str, Any]]) -> tuple[str, int]:
        """The prompt for `messages` (with the generation prompt) and the character offset where
        the last system message ends in it (0: no system message, or its end is not a prefix
        of the prompt). Raises ChatTemplateError."""
        text = self._render(messages, add_generation_prompt=True)
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


__all__ = ["SYSTEM_ROLES", "ChatTemplate", "ChatTemplateError", "load_chat_template"]
