"""Real CPU engine timings, each a ratio measured side by side in one run.

    .venv/bin/python benchmarks/bench_engine.py

1. hycache vs transformers `generate` on the same tiny Bamba model: 8 requests of 512 prompt
   tokens, 128 output tokens, greedy, no prefix caching. Reports output tokens/s of each.
2. 8 requests sharing a 2,048-token system prompt (+64 private tokens, 32 outputs each):
   end-to-end time with prefix caching on vs off.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from hycache.engine.engine import LLM
from hycache.model.loader import save_model
from hycache.request import SamplingParams


def vs_transformers(num: int, prompt_len: int, out_len: int) -> tuple[float, float]:
    from transformers import BambaForCausalLM

    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(prompt_len)] for _ in range(num)]
    llm = LLM(
        "tiny",
        enable_prefix_caching=False,
        max_model_len=prompt_len + out_len + 8,
        block_size=64,
        prefix_match_unit=16,
    )
    with tempfile.TemporaryDirectory() as d:
        save_model(llm.model, d)
        hf = BambaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    sp = SamplingParams(max_tokens=out_len, ignore_eos=True)
    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=2))  # warm up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    t_hy = time.perf_counter() - t0
    assert all(len(o.token_ids) == out_len for o in outs)
    ids = torch.tensor(prompts)
    with torch.no_grad():
        hf.generate(ids[:, :32], max_new_tokens=2, do_sample=False)  # warm up
        t0 = time.perf_counter()
        gen = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=out_len,
            min_new_tokens=out_len,
            do_sample=False,
            pad_token_id=0,
        )
        t_hf = time.perf_counter() - t0
    same = sum(o.token_ids == gen[i, prompt_len:].tolist() for i, o in enumerate(outs))
    n = num * out_len
    print(f"[1] hycache      {n / t_hy:8.1f} output tok/s  ({t_hy:.2f} s)")
    print(f"    transformers {n / t_hf:8.1f} output tok/s  ({t_hf:.2f} s)")
    print(f"    ratio {t_hf / t_hy:.2f}x   identical greedy outputs: {same}/{num}")
    return n / t_hy, n / t_hf


def shared_prompt(num: int, shared: int, private: int, out_len: int) -> tuple[float, float]:
    rng = random.Random(1)
    system = [rng.randrange(512) for _ in range(shared)]
    prompts = [system + [rng.randrange(512) for _ in range(private)] for _ in range(num)]
    sp = SamplingParams(max_tokens=out_len, ignore_eos=True)
    times = {}
    for caching in (False, True):
        llm = LLM(
            "tiny",
            enable_prefix_caching=caching,
            block_size=64,
            prefix_match_unit=16,
            max_model_len=shared + private + out_len + 8,
        )
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp)
        times[caching] = time.perf_counter() - t0
        hits = [o.hit_tokens for o in outs]
        print(f"[2] caching {'on ' if caching else 'off'}  {times[caching]:6.2f} s   hits {hits}")
    print(f"    time with caching / without: {times[True] / times[False]:.3f}")
    return times[True], times[False]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    if not args.skip_transformers:
        vs_transformers(8, 512, 128)
    shared_prompt(8, 2048, 64, 32)


if __name__ == "__main__":
    main()
