"""hycache's Gated DeltaNet hybrids match transformers on random checkpoints written with
`save_pretrained` (float32): Qwen3-Next (GDN, gated attention, sparse MoE with a shared
expert), Qwen3.5 dense and MoE text models, and a multimodal Qwen3.5 checkpoint's text part.

The configs are drawn from a seed (layer pattern, head counts and sizes, the GDN key / value
heads and dims, conv width, experts, top-k, sparse step, MLP-only layers, tying, partial
rotary factor), not fixed in advance. Prompt logits match within 1e-4 (whole prompt and cut
into chunks that split the GDN chunk), the paged greedy tokens equal transformers' greedy
tokens (recomputed and `generate`), and `hycache generate --model DIR` prints them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hycache.model.loader import load_config

from .archs import QWEN3_NEXT, QWEN_ARCHS, qwen_hf_model
from .utils import cli_generate, hf_generate, random_prompt, save_hf

transformers = pytest.importorskip("transformers")

ARCH = QWEN3_NEXT
VOCAB, PROMPT_LEN, NEW_TOKENS = ARCH.vocab, ARCH.prompt_len, ARCH.new_tokens
ARCHS, SEEDS = QWEN_ARCHS, (0, 1, 2)
hf_model = qwen_hf_model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_config_round_trips(arch: str, seed: int, tmp_path: Path) -> None:
    path = save_hf(hf_model(arch, seed), tmp_path / "model")
    config = load_config(path)
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert load_config(tmp_path) == config
    assert config.num_mamba_layers + config.num_attention_layers == config.num_hidden_layers


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_generate_matches_transformers(
    arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = hf_model(arch, 7)
    path = save_hf(hf, tmp_path / arch)
    prompt = random_prompt(PROMPT_LEN, 30, VOCAB)
    assert cli_generate(path, prompt, NEW_TOKENS, capsys) == hf_generate(hf, prompt, NEW_TOKENS)
