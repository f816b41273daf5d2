"""`hycache explain --backend vllm`: the `explain` table measured on vLLM's real scheduler
(0.33 or 0.34, whichever is installed).

Two columns: stock vLLM (its `Scheduler`) and `hycache.vllm.Scheduler`, each built as `vllm
serve --scheduler-cls` builds it (`hycache.vllm.reference`), each running the same producer,
three siblings and an identical resend as `hycache explain` does. The producer's Mamba
checkpoints are read off vLLM's block pool after it finishes; each resume point is the hit
vLLM's scheduler gave. The `scheduler` row says which vLLM ran, and whether the plugin was on
or inert (and why: an unsupported release, a missing internal, the deployment).
"""

from __future__ import annotations

import random
from typing import Any

from hycache.cache.boundaries import Boundaries
from hycache.config import Policy
from hycache.sim.explain import NUM_SIBLINGS, ExplainInputs
from hycache.vllm import compat
from hycache.vllm.reference import ReferenceScheduler, VllmSetup
from hycache.vllm.scenario import Turn

BACKENDS = {"vllm": None, "hycache.vllm.Scheduler": "hycache.vllm.Scheduler"}
MAMBA_GROUP = 1  # the harness's KV cache groups: attention, then Mamba


def mamba_checkpoints(ref: ReferenceScheduler) -> list[int]:
    """Positions of the Mamba states keyed in vLLM's block pool now."""
    pool = ref.scheduler.kv_cache_manager.block_pool
    return sorted(
        b.block_hash_num_tokens
        for b in pool.blocks
        if b.block_hash is not None and compat.get_group_id(b.block_hash) == MAMBA_GROUP
    )


def scheduler_status(ref: ReferenceScheduler) -> str:
    """ "vLLM 0.34.0" for stock; the plugin adds "limit on" or "inert: <why>"."""
    head = f"vLLM {compat.version()}"
    if not hasattr(ref.scheduler, "hycache_inert_reason"):
        return head
    reason = ref.scheduler.hycache_inert_reason
    return f"{head}, limit on" if reason is None else f"{head}, INERT: {reason}"


def explain_backend(inputs: ExplainInputs, scheduler_cls: str | None) -> dict[str, Any]:
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
    bounds = Boundaries(b, u, bool(k), Policy.LOOKAHEAD)
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
        "limit": bounds.limit(p),
        "ssm_pages_held": [len(mamba_checkpoints(ref)), None],
    }


def explain_vllm(inputs: ExplainInputs) -> dict[str, Any]:
    """`hycache.sim.explain.explain`'s result, one column per vLLM scheduler class."""
    inputs.validate()
    return {
        "inputs": inputs.summary(),
        "policies": {name: explain_backend(inputs, cls) for name, cls in BACKENDS.items()},
    }
