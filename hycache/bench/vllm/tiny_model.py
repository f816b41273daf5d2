"""A tiny random Nemotron-H checkpoint (hidden 256, layers `M-M*M-`, vocab 1024, fp32) for vLLM's
real engine on CPU (`benchmarks/bench_vllm_engine.py`, tests/vllm_engine): config.json and
model.safetensors, no tokenizer (prompts are ids).

With `mtp=True` it also carries one MTP layer (pattern `*`, vLLM's `NemotronHMTP`) built to be
accepted part of the time: its fusion projection `eh_proj = [0 | I]` keeps only the target's
hidden state at position t, its attention output is tiny, so it re-proposes the token the target
predicted at t, i.e. a repeat of the token it is fed; and `lm_head` is nudged toward the input
embedding, so the target itself repeats tokens often. Both the accept and the reject paths of
speculative decoding then run in every few steps."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, VOCAB, PATTERN = 256, 1024, "M-M*M-"
HEADS, KV_HEADS, HEAD_DIM, FFN = 4, 2, 64, 512
M_HEADS, M_HEAD_DIM, D_STATE, CONV = 8, 32, 16, 4


REPEAT_NUDGE = 0.03  # lm_head += REPEAT_NUDGE * embeddings (mtp=True only): some repeats


def config(mtp: bool = False) -> dict:
    extra = {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*"} if mtp else {}
    return extra | {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "hybrid_override_pattern": PATTERN,
        "num_hidden_layers": len(PATTERN),
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": FFN,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": M_HEADS,
        "mamba_head_dim": M_HEAD_DIM,
        "ssm_state_size": D_STATE,
        "n_groups": 1,
        "conv_kernel": CONV,
        "expand": 2,
        "chunk_size": 64,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_hidden_act": "silu",
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def _mamba(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    inner = M_HEADS * M_HEAD_DIM
    conv_dim = inner + 2 * D_STATE
    return {
        f"{p}.dt_bias": torch.randn(M_HEADS, generator=g) * 0.1,
        f"{p}.A_log": torch.rand(M_HEADS, generator=g).log1p(),
        f"{p}.D": torch.ones(M_HEADS),
        f"{p}.conv1d.weight": torch.randn(conv_dim, 1, CONV, generator=g) * 0.3,
        f"{p}.conv1d.bias": torch.zeros(conv_dim),
        f"{p}.in_proj.weight": torch.randn(2 * inner + 2 * D_STATE + M_HEADS, HIDDEN, generator=g)
        * 0.06,
        f"{p}.norm.weight": torch.ones(inner),
        f"{p}.out_proj.weight": torch.randn(HIDDEN, inner, generator=g) * 0.06,
    }


def _attention(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    return {
        f"{p}.q_proj.weight": torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=g) * 0.06,
        f"{p}.k_proj.weight": torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=g) * 0.06,
        f"{p}.v_proj.weight": torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=g) * 0.06,
        f"{p}.o_proj.weight": torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=g) * 0.06,
    }


def _mtp(g: torch.Generator) -> dict[str, torch.Tensor]:
    p = "mtp.layers.0"
    w = _attention(g, f"{p}.mixer")
    w[f"{p}.mixer.o_proj.weight"] *= 1e-3
    return w | {
        f"{p}.enorm.weight": torch.ones(HIDDEN),
        f"{p}.hnorm.weight": torch.ones(HIDDEN),
        f"{p}.eh_proj.weight": torch.cat([torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], 1),
        f"{p}.norm.weight": torch.ones(HIDDEN),
        f"{p}.final_layernorm.weight": torch.ones(HIDDEN),
    }


def write(path: Path, seed: int = 0, mtp: bool = False) -> Path:
    g = torch.Generator().manual_seed(seed)
    w: dict[str, torch.Tensor] = {
        "backbone.embeddings.weight": torch.randn(VOCAB, HIDDEN, generator=g),
        "backbone.norm_f.weight": torch.ones(HIDDEN),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=g) * 0.1,
    }
    for i, kind in enumerate(PATTERN):
        p = f"backbone.layers.{i}"
        w[f"{p}.norm.weight"] = torch.ones(HIDDEN)
        if kind == "M":
            w.update(_mamba(g, f"{p}.mixer"))
        elif kind == "*":
            w.update(_attention(g, f"{p}.mixer"))
        else:
            w[f"{p}.mixer.up_proj.weight"] = torch.randn(FFN, HIDDEN, generator=g) * 0.06
            w[f"{p}.mixer.down_proj.weight"] = torch.randn(HIDDEN, FFN, generator=g) * 0.04
    if mtp:
        w["lm_head.weight"] += REPEAT_NUDGE * w["backbone.embeddings.weight"]
        w.update(_mtp(g))
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config(mtp), indent=1))
    save_file({k: v.contiguous() for k, v in w.items()}, str(path / "model.safetensors"))
    return path
