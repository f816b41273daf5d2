"""Real CPU engine timings, each a ratio measured side by side in one run.

    .venv/bin/python benchmarks/bench_engine.py [--threads N] [--repeat R] [--profile]

1. hycache vs transformers `generate` on the same tiny Bamba model: 8 requests of 512 prompt
   tokens, 128 output tokens, greedy, no prefix caching. Reports output tokens/s of each, the
   wall and CPU time (this process's user + system time) of each contender and the load average
   around the runs (a shared machine swung the same benchmark 12x: read ratios, not absolutes),
   and the one-at-a-time figures (each engine serving the 8 requests one after another).
2. Where a decode step goes: wall time per part of the forward (attention, Mamba/SSM, MLP,
   norms + embedding + residuals, LM head), sampling, and the rest of the engine step (Python:
   scheduler, batch building, bookkeeping), from module hooks on a separate decode-heavy run;
   `--profile` adds the top operators of `torch.profiler` over decode steps.
3. 8 requests sharing a 2,048-token system prompt (+64 private tokens, 32 outputs each):
   end-to-end time with prefix caching on vs off.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

import hycache.engine.runner as runner_mod
from hycache.engine.engine import LLM
from hycache.model.layers import MLP, Attention, RMSNorm
from hycache.model.loader import save_model
from hycache.model.mamba2 import Mamba2Mixer
from hycache.request import SamplingParams


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} CPUs"


@contextmanager
def _timed(acc: dict[str, list[float]], key: str) -> Iterator[None]:
    t0, c0 = time.perf_counter(), time.process_time()
    yield
    acc[key].append(time.perf_counter() - t0)
    acc[key + ":cpu"].append(time.process_time() - c0)


def _engine(prompt_len: int, out_len: int) -> LLM:
    return LLM(
        "tiny",
        enable_prefix_caching=False,
        max_model_len=prompt_len + out_len + 8,
        block_size=64,
        prefix_match_unit=16,
    )


def vs_transformers(num: int, prompt_len: int, out_len: int, repeat: int) -> None:
    """Median of `repeat` alternating runs of each contender (the machine is noisy)."""
    from transformers import BambaForCausalLM

    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(prompt_len)] for _ in range(num)]
    llm = _engine(prompt_len, out_len)
    with tempfile.TemporaryDirectory() as d:
        save_model(llm.model, d)
        hf = BambaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
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
    times: dict[str, list[float]] = defaultdict(list)
    print(f"[1] before: {_load()}")
    with torch.no_grad():
        hf_generate(ids[:, :32])  # warm up
        for _ in range(repeat):
            with _timed(times, "hycache"):
                outs = llm.generate(prompts, sp)
            with _timed(times, "batched"):
                gen = hf_generate(ids)
            with _timed(times, "one_at_a_time"):
                for i in range(num):  # one request at a time, as a script serving requests would
                    hf_generate(ids[i : i + 1])
            with _timed(times, "hycache_one"):
                for p in prompts:
                    llm.generate([p], sp)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = sum(o.token_ids == gen[i, prompt_len:].tolist() for i, o in enumerate(outs))
    n = num * out_len
    print(f"    median of {repeat} alternating runs, {num} x {prompt_len} prompt + {out_len} out")
    for k, label in (
        ("hycache", "hycache"),
        ("batched", "transformers, one padded batch"),
        ("one_at_a_time", "transformers, one request at a time"),
        ("hycache_one", "hycache, one request at a time"),
    ):
        runs = " ".join(f"{t:.2f}" for t in times[k])
        print(
            f"    {label:38s} {n / med[k]:8.1f} output tok/s  wall {med[k]:.2f} s  "
            f"cpu {med[k + ':cpu']:.2f} s  (runs: {runs})"
        )
    ratio = [b / h for b, h in zip(times["batched"], times["hycache"], strict=True)]
    cpu_ratio = med["batched:cpu"] / med["hycache:cpu"]
    print(
        f"    hycache / batched {med['batched'] / med['hycache']:.2f}x (per run: "
        + " ".join(f"{r:.2f}" for r in ratio)
        + f"; by CPU time {cpu_ratio:.2f}x)   "
        f"hycache / one-at-a-time {med['one_at_a_time'] / med['hycache']:.2f}x   "
        f"identical greedy outputs: {same}/{num}"
    )
    print(
        "    one request at a time, hycache / transformers "
        f"{med['one_at_a_time'] / med['hycache_one']:.2f}x"
    )
    print(f"    after: {_load()}")


PARTS: tuple[tuple[str, type[nn.Module]], ...] = (
    ("attention", Attention),
    ("mamba", Mamba2Mixer),
    ("mlp", MLP),
    ("norm", RMSNorm),
)


def _hook_parts(model: nn.Module, acc: dict[str, float]) -> list[Any]:
    """Forward hooks adding each part's wall time to acc (nested parts are not double
    counted: an RMSNorm inside a mixer is the mixer's)."""
    handles = []
    depth = [0]
    for module in model.modules():
        name = next((n for n, t in PARTS if isinstance(module, t)), None)
        if name is None:
            continue
        start: list[float] = []

        def pre(_m: nn.Module, _a: Any, start: list[float] = start) -> None:
            depth[0] += 1
            start.append(time.perf_counter())

        def post(
            _m: nn.Module, _a: Any, _o: Any, start: list[float] = start, k: str = name
        ) -> None:
            depth[0] -= 1
            t = time.perf_counter() - start.pop()
            if depth[0] == 0:
                acc[k] += t

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles


def _wrap(obj: Any, attr: str, acc: dict[str, float], key: str) -> Callable[[], None]:
    orig = getattr(obj, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - t0

    setattr(obj, attr, timed)
    return lambda: setattr(obj, attr, orig)


def step_breakdown(num: int, prompt_len: int, out_len: int, profile: bool) -> None:
    """Per decode step: where the wall time goes (hooks), and optionally the top operators."""
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(prompt_len)] for _ in range(num)]
    llm = _engine(prompt_len, out_len)
    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=2))  # warm up
    sp = SamplingParams(max_tokens=out_len, ignore_eos=True)
    llm.add_requests(prompts, sp)
    llm.step()  # the prefill
    for _ in range(3):
        llm.step()
    model, runner = llm.model, llm.runner
    assert runner.model is model
    plain = out_len // 3  # decode steps timed without hooks, then the rest with them
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(plain):
        llm.step()
    plain_ms = (time.perf_counter() - t0) / plain * 1e3
    plain_cpu = (time.process_time() - c0) / plain * 1e3
    acc: dict[str, float] = defaultdict(float)
    handles = _hook_parts(model, acc)
    undo = [
        _wrap(model, "forward", acc, "forward"),
        _wrap(model, "compute_logits", acc, "lm_head"),
        _wrap(runner_mod, "verify", acc, "sampling"),
        _wrap(runner_mod, "pick", acc, "sampling"),
    ]
    steps = out_len - 8 - plain
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        llm.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for h in handles:
        h.remove()
    for u in undo:
        u()
    per = {k: v / steps * 1e3 for k, v in acc.items()}
    step_ms = wall / steps * 1e3
    forward_rest = per["forward"] - sum(per[n] for n, _ in PARTS)
    engine_rest = step_ms - per["forward"] - per["lm_head"] - per["sampling"]
    print(f"[2] decode step breakdown, {num} requests ({_load()})")
    print(
        f"    step {plain_ms:.2f} ms wall, {plain_cpu:.2f} ms CPU ({plain} steps, no hooks); "
        f"split over {steps} hooked steps of {step_ms:.2f} ms wall, {cpu / steps * 1e3:.2f} ms "
        "CPU (the hooks' own cost lands in the forward's rest)"
    )
    rows = [(n, per[n]) for n, _ in PARTS]
    rows += [
        ("embed/residual/rope/plans", forward_rest),
        ("lm head", per["lm_head"]),
        ("sampling", per["sampling"]),
        ("engine Python (sched, batch)", engine_rest),
    ]
    for name, ms in rows:
        print(f"    {name:30s} {ms:6.2f} ms  {100 * ms / step_ms:5.1f}%")
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                llm.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


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
        print(f"[3] caching {'on ' if caching else 'off'}  {times[caching]:6.2f} s   hits {hits}")
    print(f"    time with caching / without: {times[True] / times[False]:.3f}  ({_load()})")
    return times[True], times[False]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-shared", action="store_true")
    # One thread by default: on a shared 2-core machine a second OpenMP thread spins against
    # other processes and swings 8-row matmuls by 100x (measured); 0 keeps torch's default.
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="top operators of a few decode steps")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_transformers:
        vs_transformers(8, 512, 128, args.repeat)
    step_breakdown(8, 512, 128, args.profile)
    if not args.skip_shared:
        shared_prompt(8, 2048, 64, 32)


if __name__ == "__main__":
    main()
