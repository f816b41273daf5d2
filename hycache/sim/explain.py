"""`hycache explain`: where a producer, its siblings and an identical resend resume, per policy.

Everything is measured by running the real scheduler and cache on synthetic tokens: the
producer's SSM checkpoints are read off the block pool's events, and each resume point is the
hit the coordinator returned.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hycache.cache.block_pool import BlockEvent
from hycache.config import POLICY_NAMES, CacheKnobs, GroupKind
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler
from hycache.sim.build import SimGeometry, build_config

NUM_SIBLINGS = 3
MAX_PROMPT_TOKENS = 4_000_000  # about 4 s per policy here; far beyond any model's context


@dataclass(frozen=True)
class ExplainInputs:
    """What explain runs: the cache knobs (each policy replaces their `policy`), the drafter,
    the producer's prompt `T` and the prefix `P` its siblings share."""

    knobs: CacheKnobs
    eagle: bool
    prompt_tokens: int
    shared_prefix: int
    num_speculative_tokens: int = 3
    max_num_batched_tokens: int = 8192
    prefix_hints: tuple[int, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The `inputs` part of an explain result (this one and `--backend vllm`'s)."""
        return {
            "block_size": self.knobs.block_size,
            "prefix_match_unit": self.knobs.unit,
            "eagle": self.eagle,
            "prompt_tokens": self.prompt_tokens,
            "shared_prefix": self.shared_prefix,
            "prefix_hints": list(self.prefix_hints),
        }

    def validate(self) -> None:
        if self.prompt_tokens < 2:
            raise ValueError(f"prompt_tokens: need at least 2 tokens, got {self.prompt_tokens}")
        if self.prompt_tokens > MAX_PROMPT_TOKENS:
            raise ValueError(
                f"prompt_tokens: {self.prompt_tokens:,} is above the {MAX_PROMPT_TOKENS:,} tokens "
                "explain runs (it builds every request's tokens)"
            )
        if not 0 < self.shared_prefix <= self.prompt_tokens:
            raise ValueError(
                f"shared_prefix: must lie in [1, prompt_tokens={self.prompt_tokens}], "
                f"got {self.shared_prefix}"
            )


def explain_policy(inputs: ExplainInputs, policy: str) -> dict[str, Any]:
    """Run producer, three siblings and an identical resend one after another."""
    t, p, b = inputs.prompt_tokens, inputs.shared_prefix, inputs.knobs.block_size
    max_len = t + 8
    blocks_per_req = -(-max_len // b) + 1
    geometry = SimGeometry(
        inputs.knobs,
        num_speculative_tokens=inputs.num_speculative_tokens if inputs.eagle else 0,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
    )
    cfg = build_config(
        geometry, max_model_len=max_len, num_blocks=8 * blocks_per_req + 16, policy=policy
    )
    sched = Scheduler(cfg)
    ssm_group = cfg.cache.groups.index(GroupKind.SSM)
    checkpoints: dict[str, list[int]] = {}
    current = [""]
    held = [0, 0]  # SSM pages keyed now, and the most at any time: what the states cost

    def on_event(e: BlockEvent) -> None:
        if e.key.group != ssm_group:
            return
        if e.kind == "stored":
            checkpoints.setdefault(current[0], []).append(e.position)
            held[0] += 1
            held[1] = max(held)
        else:
            held[0] -= 1

    sched.cache.subscribe(on_event)
    ex = DryRunExecutor(num_speculative_tokens=cfg.speculative.num_speculative_tokens)
    rng = random.Random(0)
    prefix = [rng.randrange(32000) for _ in range(p)]

    def run(rid: str, prompt: list[int]) -> Request:
        sp = SamplingParams(max_tokens=1, ignore_eos=True)
        req = sched.new_request(rid, prompt, sp, prefix_hints=inputs.prefix_hints)
        current[0] = rid
        sched.add_request(req)
        run_to_completion(sched, ex)
        return req

    producer_prompt = prefix + [rng.randrange(32000) for _ in range(t - p)]
    producer = run("producer", producer_prompt)
    siblings = [
        run(f"sibling{i + 1}", prefix + [rng.randrange(32000) for _ in range(t - p)])
        for i in range(NUM_SIBLINGS)
    ]
    resend = run("resend", producer_prompt)
    bounds = sched.bounds
    return {
        "replay_boundary": bounds.replay_boundary(t),
        "tail_checkpoint": bounds.tail_checkpoint(t),
        "producer_checkpoints": sorted(checkpoints.get("producer", [])),
        "resend": resend.first_hit_tokens,
        "siblings": [s.first_hit_tokens for s in siblings],
        "sibling_junctions": [s.first_outcome.junction if s.first_outcome else 0 for s in siblings],
        "sibling_prefill_steps": [s.num_prefill_steps for s in siblings],
        "producer_prefill_steps": producer.num_prefill_steps,
        "limit": bounds.limit(p),
        "ssm_pages_held": [held[0], held[1]],
    }


def explain(inputs: ExplainInputs, policies: tuple[str, ...] = POLICY_NAMES) -> dict[str, Any]:
    inputs.validate()
    return {
        "inputs": inputs.summary(),
        "policies": {name: explain_policy(inputs, name) for name in policies},
    }
