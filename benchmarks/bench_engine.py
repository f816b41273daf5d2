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
import statistics
import tempfile
import time

import torch

from hycache.engine.engine import LLM
from hycache.model.loader import save_model
from hycache.request import SamplingParams


def vs_transformers(num: int, prompt_len: int, out_len: int, repeat: int = 3) -> None:
    """Median of `repeat` alternating runs of each contender (the machine is noisy)."""
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
    ids = torch.tensor(prompts)

    def hf_generate(batch: torch.Tensor) -> torch.Tensor:
        return hf.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            max_new_tokens=out_len,
            min_new_tokens=out_len,
            do_sample=False,
            pad_token_id=0,
        )

    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=2))  # warm up
    times: dict[str, list[float]] = {"hycache": [], "batched": [], "one_at_a_time": []}
    with torch.no_grad():
        hf_generate(ids[:, :32])  # warm up
        for _ in range(repeat):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp)
            times["hycache"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            gen = hf_generate(ids)
            times["batched"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i in range(num):  # one request at a time, as a script serving requests would
                hf_generate(ids[i : i + 1])
            times["one_at_a_time"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = sum(o.token_ids == gen[i, prompt_len:].tolist() for i, o in enumerate(outs))
    n = num * out_len
    print(f"[1] median of {repeat} alternating runs, {num} x {prompt_len} prompt + {out_len} out")
    for k, label in (
        ("hycache", "hycache"),
        ("batched", "transformers, one padded batch"),
        ("one_at_a_time", "transformers, one request at a time"),
    ):
        print(f"    {label:38s} {n / med[k]:8.1f} output tok/s  ({med[k]:.2f} s)")
    print(
        f"    hycache / batched {med['batched'] / med['hycache']:.2f}x   "
        f"hycache / one-at-a-time {med['one_at_a_time'] / med['hycache']:.2f}x   "
        f"identical greedy outputs: {same}/{num}"
    )


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
