"""Helpers for the model tests: small configs and a driver for the paged-cache API."""

from __future__ import annotations

import random

import torch

from hycache.model.bamba import BambaForCausalLM
from hycache.model.config import BambaConfig
from hycache.model.paged import PagedKVCache, StateCache, StepBatch


def small_config(**overrides: object) -> BambaConfig:
    """A Bamba config small enough for exact float64 tests to run in milliseconds."""
    base: dict[str, object] = {
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "attn_layer_indices": (1, 3),
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


def shuffled_blocks(num_blocks: int, seed: int) -> list[int]:
    """Block ids 0..num_blocks-1 in a random order (non-contiguous block tables)."""
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    return ids


def step(
    model: BambaForCausalLM,
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
    model: BambaForCausalLM,
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
    model: BambaForCausalLM, num_blocks: int = 64, block_size: int = 16, num_slots: int = 8
) -> tuple[PagedKVCache, StateCache]:
    return model.make_kv_cache(num_blocks, block_size), model.make_state_cache(num_slots)


def full_hidden(model: BambaForCausalLM, tokens: list[int], block_size: int = 16) -> torch.Tensor:
    """Hidden states of a single whole-prompt forward on fresh caches."""
    nblocks = -(-len(tokens) // block_size) + 1
    kv, states = fresh_caches(model, nblocks, block_size, 1)
    return step(
        model, tokens, 0, list(range(nblocks)), kv, states, src=-1, writes=[(len(tokens), 0)]
    )
