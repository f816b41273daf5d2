"""Requests arriving together wait for the prefix a running request is computing."""

from __future__ import annotations

import random
from dataclasses import replace

from hycache.config import HycacheConfig
from hycache.sched.executor import run_to_completion
from hycache.sched.scheduler import Scheduler
from tests.helpers import RecordingExecutor, make_config, new_request, tokens


def run_together(cfg: HycacheConfig, prompts: list[list[int]]) -> Scheduler:
    sched = Scheduler(cfg)
    ex = RecordingExecutor(num_speculative_tokens=cfg.speculative.num_speculative_tokens)
    sched.recorder = ex  # type: ignore[attr-defined]
    for i, p in enumerate(prompts):
        sched.add_request(new_request(cfg, f"r{i}", p))
    run_to_completion(sched, ex, check=True)
    return sched


def siblings(n: int) -> list[list[int]]:
    rng = random.Random(4)
    shared = tokens(rng, 7 * 16 + 5)  # 117 shared tokens: the last shared block ends at 112
    return [shared + tokens(rng, 30) for _ in range(n)]


def first_hits(sched: Scheduler, n: int) -> list[tuple[int, int]]:
    by_id = {r.request_id: r for r in sched.finished}
    return [
        (by_id[f"r{i}"].first_outcome.resume_point, by_id[f"r{i}"].first_outcome.junction)
        for i in range(n)
    ]


def test_siblings_arriving_together_resume_at_the_junction() -> None:
    cfg = make_config(block_size=16, unit=4, budget=32, max_model_len=512)
    hits = first_hits(run_together(cfg, siblings(4)), 4)
    # r1 waits while r0 computes the shared blocks, then observes the real junction (112 - 4);
    # r2 and r3 wait for r1's junction checkpoint and resume there.
    assert hits[0] == (0, 0)
    assert hits[1] == (0, 108)
    assert hits[2][0] == hits[3][0] == 108


def test_without_waiting_they_recompute_the_prefix() -> None:
    base = make_config(block_size=16, unit=4, budget=32, max_model_len=512)
    cfg = replace(base, scheduler=replace(base.scheduler, wait_for_inflight_prefix=False))
    hits = first_hits(run_together(cfg, siblings(4)), 4)
    assert sum(h for h, _ in hits) < 3 * 108
