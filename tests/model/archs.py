"""The hybrid architectures the model tests compare with transformers: for each, random
transformers models drawn from named cases (`Arch.hf_model(case, seed)`), its parity cases and
the prompt shape, and what the shared parity checks (tests/model/test_parity.py) need to know
about it. Each architecture's own checks live in its test_parity_<arch>.py."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hycache.model.bamba import BambaForCausalLM
from hycache.model.granite_hybrid import GraniteHybridForCausalLM
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.nemotron_h import NemotronHForCausalLM
from hycache.model.qwen3_next import Qwen3NextForCausalLM
from tests.helpers import NEMOTRON_TINY

from .utils import perturb_hf

try:
    import transformers
except ImportError:  # the parity tests skip; building a model needs it
    transformers = None


@dataclass(frozen=True)
class Arch:
    """One architecture: `hf_model(case, seed)` builds a random transformers model of a named
    case; `parity` lists the (case, seed) pairs the shared checks run."""

    name: str
    model_cls: type[HybridForCausalLM]
    hf_model: Callable[[str, int], Any]
    parity: tuple[tuple[str, int], ...]
    vocab: int
    prompt_len: int  # longer than the SSD / GDN chunk: the scan crosses a chunk boundary
    new_tokens: int
    chunks: tuple[int, ...]  # a chunked prefill of the prompt (sums to `prompt_len`)
    logit_floor: float  # the reference's largest |logit| is above it: not near-zero numbers
    # whether transformers' `generate` is a reference too for a case (its cache needs an
    # attention layer; its cached decode ignores `time_step_limit`)
    generate_ok: Callable[[HybridForCausalLM, str], bool]


def _by_name(cases: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple((name, i) for i, name in enumerate(sorted(cases)))


BAMBA_VOCAB = 128
NEMOTRON_VOCAB = GRANITE_VOCAB = QWEN_VOCAB = 96

BAMBA_BASE: dict[str, Any] = {
    "vocab_size": BAMBA_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_indices": [1, 3],
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_chunk_size": 8,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

BAMBA_CASES: dict[str, dict[str, Any]] = {
    "gqa2-groups2-untied": {},
    "mha-tied-full-rope": {
        "num_hidden_layers": 3,
        "attn_layer_indices": [0],
        "num_key_value_heads": 4,
        "mamba_n_groups": 1,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000.0,
            "partial_rotary_factor": 1.0,
        },
    },
    "gqa4-groups4-quarter-rope-biases": {
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attn_layer_indices": [2],
        "mamba_n_groups": 4,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    "mqa-first-last-dconv2": {
        "num_hidden_layers": 5,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "attn_layer_indices": [0, 4],
        "mamba_d_conv": 2,
        "mamba_d_state": 8,
    },
    "mamba-only-dt-limit": {
        "num_hidden_layers": 3,
        "attn_layer_indices": None,
        "time_step_limit": (0.01, 0.2),
    },
}


def bamba_hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.BambaConfig(**{**BAMBA_BASE, **overrides})
    cfg._attn_implementation = "eager"
    model = transformers.BambaForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    return model


NEMOTRON_BASE: dict[str, Any] = {
    **NEMOTRON_TINY,
    "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba"],
    "chunk_size": 8,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

NEMOTRON_CASES: dict[str, dict[str, Any]] = {
    "gqa2-groups2-untied": {},
    "mqa-groups1-tied-conv2": {
        "layers_block_type": ["mamba", "attention", "mamba", "mlp", "mamba", "attention"],
        "num_key_value_heads": 1,
        "n_groups": 1,
        "conv_kernel": 2,
        "tie_word_embeddings": True,  # transformers' NemotronH keeps a separate head anyway
    },
    "mha-groups4-biases-legacy-pattern": {
        "layers_block_type": None,
        "hybrid_override_pattern": "*M-M",
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "mamba_num_heads": 8,
        "mamba_head_dim": 8,
        "n_groups": 4,
        "use_bias": True,
        "mlp_bias": True,
        "use_conv_bias": False,
    },
    "no-attention": {"layers_block_type": ["mamba", "mlp", "mamba", "mlp"]},
    # Nemotron-3 MoE blocks: 8 experts in 2 groups, only the best group's experts selectable,
    # experts in a 16-wide latent space, MLP biases (shared expert, latent projections)
    "moe-latent-groups2-topgroup1": {
        "layers_block_type": ["mamba", "moe", "attention", "mlp", "moe", "mamba"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "moe_shared_expert_intermediate_size": 40,
        "moe_latent_size": 16,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "mlp_bias": True,
    },
    # 3 of 8 experts among the best 2 of 4 groups, unnormalised weights, no latent space
    "moe-groups4-topgroup2-unnormalised": {
        "layers_block_type": ["moe", "mamba", "attention", "moe", "mamba", "moe"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 20,
        "moe_shared_expert_intermediate_size": 24,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.5,
    },
}


def nemotron_hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    kw = {k: v for k, v in {**NEMOTRON_BASE, **overrides}.items() if v is not None}
    cfg = transformers.NemotronHConfig(**kw)
    cfg._attn_implementation = "eager"
    model = transformers.NemotronHForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # a buffer, left at zero by transformers' init
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen))
    return model


GRANITE_BASE: dict[str, Any] = {
    "vocab_size": GRANITE_VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "shared_intermediate_size": 40,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_n_heads": 4,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_chunk_size": 8,
    "position_embedding_type": "rope",
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.6,
    "attention_multiplier": 0.25,
    "logits_scaling": 2.0,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

GRANITE_CASES: dict[str, dict[str, Any]] = {
    "moe-top2-rope-gqa2-untied": {},
    "dense-nope-mqa-tied": {
        "num_hidden_layers": 3,
        "layer_types": ["attention", "mamba", "mamba"],
        "num_local_experts": 0,
        "position_embedding_type": None,
        "num_key_value_heads": 1,
        "mamba_n_groups": 1,
        "tie_word_embeddings": True,
    },
    "moe-top1-groups4-biases-gqa4": {
        "layer_types": ["mamba", "mamba", "attention", "attention"],
        "num_local_experts": 3,
        "num_experts_per_tok": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mamba_n_heads": 8,
        "mamba_n_groups": 4,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
    },
    "mamba-only-moe-top3-dt-limit": {
        "num_hidden_layers": 3,
        "layer_types": ["mamba", "mamba", "mamba"],
        "num_experts_per_tok": 3,
        "time_step_limit": (0.01, 0.2),
    },
}


def granite_hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.GraniteMoeHybridConfig(**{**GRANITE_BASE, **overrides})
    cfg._attn_implementation = "eager"
    model = transformers.GraniteMoeHybridForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    return model


def qwen_draw_config(arch: str, seed: int) -> dict[str, Any]:
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
        "vocab_size": QWEN_VOCAB,
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


def qwen_hf_model(arch: str, seed: int) -> Any:
    """A random transformers model of `arch` (norms, dt_bias perturbed: every weight matters)."""
    torch.manual_seed(seed)
    kw = qwen_draw_config(arch, seed)
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


QWEN_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_multimodal")

BAMBA = Arch(
    "bamba", BambaForCausalLM, lambda case, seed: bamba_hf_model(BAMBA_CASES[case], seed),
    _by_name(BAMBA_CASES), BAMBA_VOCAB, 23, 8, (5, 11, 1, 6), 1.0,
    lambda _ours, case: "dt-limit" not in case,
)  # fmt: skip
NEMOTRON_H = Arch(
    "nemotron_h", NemotronHForCausalLM,
    lambda case, seed: nemotron_hf_model(NEMOTRON_CASES[case], seed),
    _by_name(NEMOTRON_CASES), NEMOTRON_VOCAB, 27, 6, (5, 11, 1, 10), 1.0,
    lambda ours, _case: bool(ours.config.num_attention_layers),
)  # fmt: skip
GRANITE = Arch(
    "granitemoehybrid", GraniteHybridForCausalLM,
    lambda case, seed: granite_hf_model(GRANITE_CASES[case], seed),
    _by_name(GRANITE_CASES), GRANITE_VOCAB, 27, 6, (5, 11, 1, 10), 0.5,
    lambda ours, case: bool(ours.config.num_attention_layers) and "dt-limit" not in case,
)  # fmt: skip
QWEN3_NEXT = Arch(
    "qwen3_next", Qwen3NextForCausalLM, qwen_hf_model,
    tuple((a, s) for a in QWEN_ARCHS for s in (0, 1, 2)), QWEN_VOCAB, 83, 6, (5, 70, 1, 7), 1.0,
    lambda _ours, _case: True,
)  # fmt: skip
ARCHS = (BAMBA, NEMOTRON_H, GRANITE, QWEN3_NEXT)
