"""Every hybrid architecture matches transformers on random checkpoints written with
`save_pretrained` and read back with `load_model` (float32), one check for all (the cases:
tests/model/archs.py): prompt logits within 1e-4, whole and in chunks that cross the SSD / GDN
chunk; the paged greedy tokens equal transformers' (recomputed, and `generate` where it is a
reference); our parameters are exactly the checkpoint's tensors we use. Each architecture's own
checks (configs, MoE routing, the CLI) live in its test_parity_<arch>.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.hybrid import HybridForCausalLM
from hycache.model.loader import load_model

from .archs import ARCHS, NEMOTRON_H, Arch
from .utils import (
    checkpoint_tensor_names,
    hf_generate,
    hf_greedy_recompute,
    hf_logits,
    paged_greedy,
    random_prompt,
    save_hf,
)

pytest.importorskip("transformers")

Pair = tuple[Arch, str, Any, HybridForCausalLM, Path]
CASES = [(arch, case, seed) for arch in ARCHS for case, seed in arch.parity]


@pytest.fixture(scope="module", params=CASES, ids=[f"{a.name}-{c}-{s}" for a, c, s in CASES])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    arch, case, seed = request.param
    hf = arch.hf_model(case, seed)
    path = save_hf(hf, tmp_path_factory.mktemp(f"{arch.name}-{case}-{seed}"))
    ours, config, tokenizer = load_model(str(path))
    assert isinstance(ours, arch.model_cls) and tokenizer is None
    if arch is not NEMOTRON_H:  # transformers' NemotronH keeps a separate head anyway
        assert config.tie_word_embeddings == bool(hf.config.tie_word_embeddings)
    return arch, case, hf, ours, path


def test_prompt_logits_match(pair: Pair) -> None:
    arch, _, hf, ours, _ = pair
    prompt = random_prompt(arch.prompt_len, 1, arch.vocab)
    ref = hf_logits(hf, prompt)
    whole, _ = paged_greedy(ours, prompt, 0)
    chunked, _ = paged_greedy(ours, prompt, 0, chunks=list(arch.chunks))
    assert ref.abs().max() > arch.logit_floor  # the comparison is not between near-zeros
    torch.testing.assert_close(whole, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-4)


def test_greedy_generation_matches(pair: Pair) -> None:
    arch, case, hf, ours, _ = pair
    prompt = random_prompt(arch.prompt_len, 2, arch.vocab)
    ref = hf_greedy_recompute(hf, prompt, arch.new_tokens)
    assert paged_greedy(ours, prompt, arch.new_tokens)[1] == ref
    if arch.generate_ok(ours, case):
        assert hf_generate(hf, prompt, arch.new_tokens) == ref


def test_parameter_names_match_the_checkpoint(pair: Pair) -> None:
    _, _, _, ours, path = pair
    names = {ours.checkpoint_key(k) for k in checkpoint_tensor_names(path)} - {None}
    if ours.config.tie_word_embeddings:
        names.discard("lm_head.weight")
    assert set(ours.state_dict()) == names
