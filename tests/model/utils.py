"""Helpers for the model tests: small configs, a driver for the paged-cache API, and the
parity harness shared by the per-architecture comparisons with transformers (random-weight
checkpoints written with `save_pretrained`, greedy references, engine-level checks)."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from hycache.model.configs.bamba import BambaConfig
from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.paged import PagedKVCache, StateCache, StepBatch

# what the small Bamba and Qwen3-Next configs share: 4 layers, attention at 1 and 3
SMALL: dict[str, object] = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "attn_layer_indices": (1, 3),
}


def small_config(**overrides: object) -> BambaConfig:
    """A Bamba config small enough for exact float64 tests to run in milliseconds."""
    base: dict[str, object] = {
        **SMALL,
        "mamba_n_heads": 4,
        "mamba_d_head": 16,
        "mamba_n_groups": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 8,
    }
    base.update(overrides)
    return BambaConfig(**base)  # type: ignore[arg-type]


def small_gdn_config(**overrides: object) -> Qwen3NextConfig:
    """A Qwen3-Next (Gated DeltaNet) config as small: 2 value heads per key head, a GDN chunk of
    8, a sparse MoE on every other layer."""
    base: dict[str, object] = {
        **SMALL,
        "mamba_layers": (0, 2),
        "mamba_n_heads": 4,
        "mamba_d_head": 6,
        "mamba_n_groups": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_chunk_size": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "decoder_sparse_step": 2,
    }
    base.update(overrides)
    return Qwen3NextConfig(**base)  # type: ignore[arg-type]


def shuffled_blocks(num_blocks: int, seed: int) -> list[int]:
    """Block ids 0..num_blocks-1 in a random order (non-contiguous block tables)."""
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    return ids


def step(
    model: HybridForCausalLM,
    tokens: list[int],
    start: int,
    table: list[int],
    kv: PagedKVCache,
    states: StateCache,
    *,
    src: int,
    writes: list[tuple[int, int]],
) -> torch.Tensor:
    """Run one single-request step of `tokens` at positions start.. ; returns (q, hidden)."""
    q = len(tokens)
    batch = StepBatch(
        input_ids=torch.tensor(tokens, dtype=torch.int64),
        positions=torch.arange(start, start + q, dtype=torch.int64),
        query_lens=[q],
        context_lens=[start],
        block_tables=[table],
        state_src=[src],
        state_writes=[writes],
    )
    return model(batch, kv, states)


def prefill(
    model: HybridForCausalLM,
    tokens: list[int],
    chunks: list[int],
    table: list[int],
    kv: PagedKVCache,
    states: StateCache,
    slot: int,
) -> torch.Tensor:
    """Feed `tokens` in chunks of the given sizes, carrying the state in `slot`; returns the
    hidden states of all tokens, (len(tokens), hidden)."""
    assert sum(chunks) == len(tokens)
    outs = []
    pos = 0
    for c in chunks:
        outs.append(
            step(
                model,
                tokens[pos : pos + c],
                pos,
                table,
                kv,
                states,
                src=slot if pos else -1,
                writes=[(c, slot)],
            )
        )
        pos += c
    return torch.cat(outs)


def random_chunks(total: int, rng: random.Random, max_chunk: int) -> list[int]:
    chunks = []
    left = total
    while left:
        c = rng.randint(1, min(max_chunk, left))
        chunks.append(c)
        left -= c
    return chunks


def fresh_caches(
    model: HybridForCausalLM, num_blocks: int = 64, block_size: int = 16, num_slots: int = 8
) -> tuple[PagedKVCache, StateCache]:
    return model.make_kv_cache(num_blocks, block_size), model.make_state_cache(num_slots)


def full_hidden(model: HybridForCausalLM, tokens: list[int], block_size: int = 16) -> torch.Tensor:
    """Hidden states of a single whole-prompt forward on fresh caches."""
    nblocks = -(-len(tokens) // block_size) + 1
    kv, states = fresh_caches(model, nblocks, block_size, 1)
    return step(
        model, tokens, 0, list(range(nblocks)), kv, states, src=-1, writes=[(len(tokens), 0)]
    )


# ------------------------------------------------------------------------------ HF parity
def perturb_hf(model: Any, seed: int) -> None:
    """transformers' init leaves norms, D, dt_bias and biases at constants; perturb them so that
    every parameter matters for a comparison."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith((".D", ".dt_bias")):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def save_hf(model: Any, path: Path, **kw: Any) -> Path:
    """`save_pretrained` in float32 (`max_shard_size=...` to shard), chatter silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path, **kw)
    return path


def random_prompt(n: int, seed: int, vocab: int, low: int = 3) -> torch.Tensor:
    return torch.randint(low, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def hf_logits(hf: Any, prompt: torch.Tensor) -> torch.Tensor:
    """transformers' logits of a whole prompt, no cache: (T, vocab)."""
    with torch.no_grad():
        return hf(prompt[None], use_cache=False).logits[0].float()


def hf_greedy_recompute(hf: Any, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy continuation by full recomputation (no cache) - the reference."""
    ids = prompt[None]
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = hf(ids, use_cache=False).logits[0, -1].argmax()
            out.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out


def hf_generate(hf: Any, prompt: torch.Tensor, n: int) -> list[int]:
    """transformers' own cached greedy `generate` (EOS disabled: random models may emit it)."""
    hf.generation_config.eos_token_id = None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = hf.generate(prompt[None], max_new_tokens=n, do_sample=False)
    return gen[0, prompt.shape[0] :].tolist()


def cli_generate(path: Path, prompt: torch.Tensor, n: int, capsys: Any) -> list[int]:
    """The `n` greedy tokens `hycache generate --model path` prints for `prompt` (`capsys`:
    pytest's capture of stdout)."""
    from hycache.cli.main import main

    ids = ",".join(map(str, prompt.tolist()))
    args = ["generate", "--model", str(path), "--prompt-token-ids", ids]
    args += ["--max-tokens", str(n), "--ignore-eos", "--json"]
    args += ["--max-model-len", "256", "--num-blocks", "64"]
    assert main(args) == 0
    return list(json.loads(capsys.readouterr().out)["token_ids"])


def paged_greedy(
    model: HybridForCausalLM, prompt: torch.Tensor, n: int, chunks: list[int] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Prefill `prompt` (in `chunks`, default one step) on shuffled blocks, then decode `n`
    tokens one step each through the paged API; returns (prompt logits, tokens)."""
    t = prompt.shape[0]
    block = 8
    nblocks = -(-(t + n) // block) + 1
    kv, states = model.make_kv_cache(nblocks, block), model.make_state_cache(2)
    table = shuffled_blocks(nblocks, 3)
    hidden = prefill(model, prompt.tolist(), chunks or [t], table, kv, states, slot=1)
    logits = model.compute_logits(hidden)
    out = []
    nxt = int(logits[-1].argmax())
    for pos in range(t, t + n):
        out.append(nxt)
        h = step(model, [nxt], pos, table, kv, states, src=1, writes=[(1, 1)])
        nxt = int(model.compute_logits(h)[-1].argmax())
    return logits, out


def checkpoint_tensor_names(path: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


# ------------------------------------------------------------------------------ engine checks
ENGINE_KW: dict[str, Any] = {
    "dtype": "float64",
    "block_size": 16,
    "prefix_match_unit": 4,
    "max_model_len": 160,
    "num_blocks": 40,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 48,
}


def engine_outputs(path: Path, prompts: list[list[int]], max_tokens: int, **kw: Any) -> Any:
    """An `LLM` on checkpoint `path` (float64, small pool) and its greedy outputs for `prompts`,
    run as two rounds: all prompts, then all prompts again (the second round can hit cache)."""
    from hycache.engine.engine import LLM
    from hycache.request import SamplingParams

    llm = LLM(str(path), **{**ENGINE_KW, **kw})
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts, sp)]
    second = [o.token_ids for o in llm.generate(prompts, sp)]
    return llm, first, second


def sharing_prompts(vocab: int, seed: int) -> list[list[int]]:
    """A shared system prompt with different suffixes, a resend and a longer sibling; every
    prompt is longer than the tiny configs' SSD chunk size."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    system = toks(29)
    a = system + toks(7)
    return [a, system + toks(12), list(a), a + toks(9)]
