"""The model directory Dynamo's frontend reads for a model: `config.json` (sizes, the context
length, EOS) and a tokenizer (`tokenizer.json`, `tokenizer_config.json`).

A checkpoint directory that has them is used as it is. A built-in preset (`tiny`) has neither:
`write_card` writes its config and a word-level tokenizer with one token per id (`<t17>`),
so any token the model emits decodes to text and back, and a chat template that joins the
messages' contents. The frontend insists on an end-of-sequence id: a preset's card names
token 0 (`PRESET_EOS`), which the frontend then sends as a stop token. Every worker of one
model must register the same card (the frontend rejects a worker whose card differs), so the
default place is one fixed directory per model (`default_card_dir`), written once and
atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hycache.model.configs.presets import PRESETS, preset_config

CARD_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
PRESET_EOS = 0
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def token_name(token_id: int) -> str:
    return f"<t{token_id}>"


def _tokenizer_json(vocab_size: int) -> dict[str, object]:
    """A Hugging Face `tokenizers` WordLevel tokenizer: token i is `<ti>`, split on spaces."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {token_name(i): i for i in range(vocab_size)},
            "unk_token": token_name(0),
        },
    }


def has_card(model_dir: Path) -> bool:
    return all((model_dir / f).is_file() for f in CARD_FILES)


def default_card_dir(model: str) -> Path:
    """Where a preset's card goes by default: one directory per preset and user."""
    return Path(tempfile.gettempdir()) / f"hycache-card-{model}-{os.getuid()}"


def write_card(model: str, out: Path | None = None) -> Path:
    """The card of `model`: the checkpoint directory itself when it holds one, else, for a
    preset, `out` (default `default_card_dir`), written unless it already holds a card
    (ValueError for anything else)."""
    src = Path(model)
    if src.is_dir() and has_card(src):
        return src
    if model not in PRESETS:
        raise ValueError(
            f"model {model!r}: Dynamo's frontend needs {', '.join(CARD_FILES)} in the model "
            "directory; give a checkpoint that has them, or a preset"
        )
    out = out or default_card_dir(model)
    if has_card(out):
        return out
    config = preset_config(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    hf = {**config.to_hf_dict(), "eos_token_id": PRESET_EOS}
    (tmp / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    (tmp / "tokenizer.json").write_text(json.dumps(_tokenizer_json(config.vocab_size)))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": hf.get("max_position_embeddings", 65536),
        "chat_template": CHAT_TEMPLATE,
    }
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, sort_keys=True))
    try:
        tmp.rename(out)  # atomic: another process may have written the same card meanwhile
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not has_card(out):
            raise
    return out
