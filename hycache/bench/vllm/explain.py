"""`hycache explain --backend vllm`: the `explain` table measured on vLLM's real scheduler
(0.32, 0.33 or 0.34, whichever is installed; 0.32 hashes MTP with the EAGLE drop).

Two columns: stock vLLM (its `Scheduler`) and `hycache.vllm.Scheduler`, each built as `vllm
serve --scheduler-cls` builds it (`hycache.bench.vllm.reference`), each running the same producer,
three siblings and an identical resend as `hycache explain` does, on the KV cache config of
`--model` (Nemotron-H's Mamba2 groups, or Qwen3-Next's GDN ones: `hycache.bench.vllm.reference`).
The producer's Mamba checkpoints are read off vLLM's block pool (the first Mamba group) after
it finishes; each resume point is the hit vLLM's scheduler gave. The `scheduler` row says
which vLLM ran, and whether the plugin was on or inert (and why: an unsupported release, a
missing internal, the deployment).
"""

from __future__ import annotations

import random
from typing import Any

from hycache.bench.vllm.reference import NEMOTRON_H, ReferenceScheduler, VllmSetup
from hycache.bench.vllm.scenario import Turn
from hycache.cache.boundaries import Boundaries
from hycache.config import Policy
from hycache.sim.explain import NUM_SIBLINGS, ExplainInputs
from hycache.vllm import compat

BACKENDS = {"vllm": None, "hycache.vllm.Scheduler": "hycache.vllm.Scheduler"}


def mamba_checkpoints(ref: ReferenceScheduler) -> list[int]:
    """Positions of the Mamba states keyed in vLLM's block pool now (the first Mamba group:
    every Mamba group keeps the same positions)."""
    pool = ref.scheduler.kv_cache_manager.block_pool
    group = ref.mamba_group_ids[0]
    return sorted(
        b.block_hash_num_tokens
        for b in pool.blocks
        if b.block_hash is not None and compat.get_group_id(b.block_hash) == group
    )


def scheduler_status(ref: ReferenceScheduler) -> str:
    """ "vLLM 0.34.0" for stock; the plugin adds "limit on" or "inert: <why>"."""
    head = f"vLLM {compat.version()}"
    if not hasattr(ref.scheduler, "hycache_inert_reason"):
        return head
    reason = ref.scheduler.hycache_inert_reason
    return f"{head}, limit on" if reason is None else f"{head}, INERT: {reason}"


def explain_backend(
    inputs: ExplainInputs,
    scheduler_cls: str | None,
    model: str = NEMOTRON_H,
    pass_price: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One column; `pass_price`: the plugin's (pass, token) price (`VllmSetup.pass_price`;
    None: its default)."""
    t, p = inputs.prompt_tokens, inputs.shared_prefix
    b, u = inputs.knobs.block_size, inputs.knobs.unit
    k = inputs.num_speculative_tokens if inputs.eagle else 0
    blocks_per_req = -(-(t + 8) // b) + 1
    setup = VllmSetup(
        inputs.knobs,
        inputs.max_num_batched_tokens,
        num_speculative_tokens=k,
        num_blocks=8 * blocks_per_req + 16,
        scheduler_cls=scheduler_cls,
        lookahead=compat.has_lookahead_keys(),  # vLLM 0.32: the EAGLE drop
        model=model,
        pass_price=pass_price,
    )
    ref = ReferenceScheduler(setup)
    rng = random.Random(0)
    prefix = [rng.randrange(32000) for _ in range(p)]
    hints = inputs.prefix_hints

    def turn(prompt: list[int]) -> Turn:
        return Turn(prompt, [5], (), hints)

    producer_prompt = prefix + [rng.randrange(32000) for _ in range(t - p)]
    producer = ref.run("producer", turn(producer_prompt))
    checkpoints = mamba_checkpoints(ref)
    siblings = [
        ref.run(f"sibling{i + 1}", turn(prefix + [rng.randrange(32000) for _ in range(t - p)]))
        for i in range(NUM_SIBLINGS)
    ]
    resend = ref.run("resend", turn(producer_prompt))
    bounds = Boundaries(b, u, bool(k), Policy.LOOKAHEAD, lookahead_keys=compat.has_lookahead_keys())
    return {
        "scheduler": scheduler_status(ref),
        "replay_boundary": bounds.replay_boundary(t),
        "tail_checkpoint": bounds.tail_checkpoint(t),
        "producer_checkpoints": checkpoints,
        "resend": resend.hit,
        "siblings": [s.hit for s in siblings],
        "sibling_junctions": None,  # vLLM's request objects are not kept past the run
        "sibling_prefill_steps": [len(s.chunk_ends) for s in siblings],
        "producer_prefill_steps": len(producer.chunk_ends),
        "limit": bounds.resume_limit(p),
        "ssm_pages_held": [len(mamba_checkpoints(ref)), None],
    }


def explain_vllm(
    inputs: ExplainInputs,
    model: str = NEMOTRON_H,
    pass_price: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """`hycache.sim.explain.explain`'s result, one column per vLLM scheduler class, on
    `model`'s KV cache config (`hycache.bench.vllm.reference.MODELS`); `pass_price`: the
    plugin's price of a pass (None: its default)."""
    inputs.validate()
    return {
        "inputs": {**inputs.summary(), "model": model},
        "policies": {
            name: explain_backend(inputs, cls, model, pass_price) for name, cls in BACKENDS.items()
        },
    }
