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
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.loader import load_config, load_model
from hycache.model.qwen3_next import Qwen3NextForCausalLM

from .utils import (
    checkpoint_tensor_names,
    hf_generate,
    hf_greedy_recompute,
    hf_logits,
    paged_greedy,
    perturb_hf,
    random_prompt,
    save_hf,
)

transformers = pytest.importorskip("transformers")

VOCAB = 96
PROMPT_LEN = 83  # > 64, the GDN chunk: the chunked rule crosses a chunk boundary
NEW_TOKENS = 6
ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_multimodal")
SEEDS = (0, 1, 2)


def draw_config(arch: str, seed: int) -> dict[str, Any]:
    """transformers config kwargs of a small random model of `arch`, drawn from `seed`."""
    rng = random.Random(f"{arch}-{seed}")
    layers = rng.randint(3, 6)
    kinds = [rng.choice(["linear_attention", "full_attention"]) for _ in range(layers)]
    kinds[rng.randrange(layers)] = "linear_attention"
    kinds[rng.randrange(layers)] = "full_attention"
    if kinds.count("linear_attention") == 0:
        kinds[0] = "linear_attention"
    kv_heads = rng.choice([1, 2])
    head_dim = rng.choice([8, 16])
    k_heads = rng.choice([1, 2])
    kw: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": rng.choice([16, 24, 32]),
        "intermediate_size": rng.choice([24, 40]),
        "num_hidden_layers": layers,
        "layer_types": kinds,
        "num_attention_heads": kv_heads * rng.choice([1, 2]),
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": k_heads * rng.choice([1, 2, 3]),
        "linear_key_head_dim": rng.choice([8, 12, 16]),
        "linear_value_head_dim": rng.choice([3, 5, 8]),
        "linear_conv_kernel_dim": rng.choice([2, 3, 4]),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": rng.choice([10000.0, 1e6]),
            "partial_rotary_factor": rng.choice([0.25, 0.5, 1.0]),
        },
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": rng.random() < 0.3,
        "initializer_range": 0.1,
    }
    if arch in ("qwen3_next", "qwen3_5_moe"):
        experts = rng.randint(2, 6)
        kw.update(
            num_experts=experts,
            num_experts_per_tok=rng.randint(1, min(3, experts)),
            moe_intermediate_size=rng.choice([12, 20]),
            shared_expert_intermediate_size=rng.choice([16, 28]),
        )
    if arch == "qwen3_next":
        kw.update(
            decoder_sparse_step=rng.choice([1, 2]),
            mlp_only_layers=sorted(rng.sample(range(layers), rng.randint(0, 1))),
            norm_topk_prob=rng.random() < 0.5,
        )
    return kw


CASES = {arch: arch for arch in ARCHS}  # the engine checks' interface (test_hybrid_architectures)


def _hf_model(case: str, seed: int) -> Any:
    return hf_model(case, seed)


def hf_model(arch: str, seed: int) -> Any:
    """A random transformers model of `arch` (norms, dt_bias perturbed: every weight matters)."""
    torch.manual_seed(seed)
    kw = draw_config(arch, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if arch == "qwen3_next":
            cfg = transformers.Qwen3NextConfig(**kw)
            model = transformers.Qwen3NextForCausalLM(cfg)
        elif arch == "qwen3_5":
            cfg = transformers.Qwen3_5TextConfig(**kw)
            model = transformers.Qwen3_5ForCausalLM(cfg)
        elif arch == "qwen3_5_moe":
            cfg = transformers.Qwen3_5MoeTextConfig(**kw)
            model = transformers.Qwen3_5MoeForCausalLM(cfg)
        else:
            vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2}
            vision["out_hidden_size"] = kw["hidden_size"]
            tie = kw.pop("tie_word_embeddings")
            cfg = transformers.Qwen3_5Config(
                text_config=kw, vision_config=vision, tie_word_embeddings=tie
            )
            model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    cfg._attn_implementation = "eager"
    model.eval()
    perturb_hf(model, seed + 1)
    return model


@pytest.fixture(scope="module", params=[(a, s) for a in ARCHS for s in SEEDS], ids=str)
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Qwen3NextForCausalLM, Path]:
    arch, seed = request.param
    hf = hf_model(arch, seed)
    path = save_hf(hf, tmp_path_factory.mktemp(f"{arch}-{seed}"))
    ours, config, _ = load_model(str(path))
    assert isinstance(ours, Qwen3NextForCausalLM)
    assert config.recurrent_mixer == "gdn"
    return hf, ours, path


def test_prompt_logits_match(pair: tuple[Any, Qwen3NextForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    prompt = random_prompt(PROMPT_LEN, 1, VOCAB)
    ref = hf_logits(hf, prompt)
    whole, _ = paged_greedy(ours, prompt, 0)
    chunked, _ = paged_greedy(ours, prompt, 0, chunks=[5, 70, 1, 7])
    assert ref.abs().max() > 1.0  # the comparison is not between near-zero numbers
    torch.testing.assert_close(whole, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-4)


def test_greedy_generation_matches(pair: tuple[Any, Qwen3NextForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    prompt = random_prompt(PROMPT_LEN, 2, VOCAB)
    ref = hf_greedy_recompute(hf, prompt, NEW_TOKENS)
    assert paged_greedy(ours, prompt, NEW_TOKENS)[1] == ref
    assert hf_generate(hf, prompt, NEW_TOKENS) == ref


def test_parameter_names_match_the_checkpoint(
    pair: tuple[Any, Qwen3NextForCausalLM, Path],
) -> None:
    _, ours, path = pair
    names = {ours.checkpoint_key(k) for k in checkpoint_tensor_names(path)} - {None}
    if ours.config.tie_word_embeddings:
        names.discard("lm_head.weight")
    assert set(ours.state_dict()) == names


def test_config_round_trips(pair: tuple[Any, Qwen3NextForCausalLM, Path], tmp_path: Path) -> None:
    _, _, path = pair
    config = load_config(path)
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert load_config(tmp_path) == config
    assert config.num_mamba_layers + config.num_attention_layers == config.num_hidden_layers


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_generate_matches_transformers(
    arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hycache.cli.main import main

    hf = hf_model(arch, 7)
    path = save_hf(hf, tmp_path / arch)
    prompt = random_prompt(PROMPT_LEN, 30, VOCAB)
    ids = ",".join(map(str, prompt.tolist()))
    args = ["generate", "--model", str(path), "--prompt-token-ids", ids]
    args += ["--max-tokens", str(NEW_TOKENS), "--ignore-eos", "--json"]
    args += ["--max-model-len", "256", "--num-blocks", "64"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == hf_generate(hf, prompt, NEW_TOKENS)
