"""Shared builders for the cache and scheduler tests."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hycache.cache.boundaries import Boundaries
from hycache.config import CacheConfig, HycacheConfig, SchedulerConfig, SpeculativeConfig
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler


def make_config(
    *,
    block_size: int = 16,
    unit: int | None = 4,
    policy: str = "junction",
    eagle: bool = True,
    k: int = 3,
    num_blocks: int | None = None,
    max_model_len: int = 4096,
    budget: int = 8192,
    max_num_seqs: int = 64,
    retention: str | int = "semantic",
    prefix_caching: bool = True,
) -> HycacheConfig:
    cache = CacheConfig(
        block_size=block_size,
        prefix_match_unit=unit,
        num_blocks=num_blocks or (4 * max_model_len // block_size + 64),
        max_model_len=max_model_len,
        policy=policy,
        retention=retention,
        enable_prefix_caching=prefix_caching,
    )
    spec = SpeculativeConfig(num_speculative_tokens=k if eagle else 0)
    return HycacheConfig(cache, spec, SchedulerConfig(budget, max_num_seqs))


def tokens(rng: random.Random, n: int, vocab: int = 30000) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def new_request(
    cfg: HycacheConfig,
    rid: str,
    prompt: Sequence[int],
    max_tokens: int = 4,
    prefix_hints: Sequence[int] = (),
) -> Request:
    return Request.new(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        unit=cfg.cache.unit,
        hash_seed=cfg.cache.hash_seed,
        lookahead=Boundaries.from_config(cfg.cache, cfg.speculative).lookahead,
        prefix_hints=prefix_hints,
    )


class RecordingExecutor(DryRunExecutor):
    """Dry-run executor that records every scheduled chunk: rid -> [(start, end, checkpoint)]."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.chunks: dict[str, list[tuple[int, int, bool]]] = {}

    def execute(self, out):  # type: ignore[no-untyped-def]
        for s in out.scheduled:
            self.chunks.setdefault(s.request.request_id, []).append(
                (s.start, s.end, s.alloc.checkpoint)
            )
        return super().execute(out)


def run_sequential(
    cfg: HycacheConfig, prompts: Sequence[Sequence[int]], max_tokens: int = 4
) -> tuple[Scheduler, list[Request]]:
    """Each request runs to completion before the next arrives."""
    sched = Scheduler(cfg)
    ex = RecordingExecutor(num_speculative_tokens=cfg.speculative.num_speculative_tokens)
    sched.recorder = ex  # type: ignore[attr-defined]
    reqs = []
    for i, p in enumerate(prompts):
        r = new_request(cfg, f"r{i}", p, max_tokens)
        sched.add_request(r)
        run_to_completion(sched, ex, check=True)
        reqs.append(r)
    return sched, reqs
