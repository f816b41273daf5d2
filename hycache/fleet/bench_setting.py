"""The fleet benchmark's setting, one home for the real fleet and its simulated twin:
`benchmarks/bench_fleet.py` starts workers with `engine_args`, sends `workload_sizes`' requests
at `CONCURRENCY`; `benchmarks/bench_fleet_sim.py --predict --like-bench-fleet` feeds the same
numbers to the simulator.

Why these sizes: on the `tiny` model on a CPU, a prefill of a few hundred tokens is short beside
the frontend's and the engines' own overheads, so hits barely move TTFT; a prefill of 2,048
tokens costs about ten times a hit on it (measured on this 2-core machine: about 0.7 s cold
against 0.065 s resumed, loaded). So the shared parts are long (families share 1,536-3,072
tokens, sessions a 1,024-token system prompt, trace prompts are cut to 2,048 tokens), what
follows them is short (8-32 token suffixes), and outputs are a few tokens: prefill is what
TTFT measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORKERS = 4
BLOCK = 64  # B: the attention block
UNIT = 16  # u: the prefix-match unit (the `resumable` events' block)
SPECULATIVE = 2  # EAGLE's k
NUM_BLOCKS = 512  # each worker's attention blocks (32,768 tokens: all families fit in one)
MAX_MODEL_LEN = 4096
CONCURRENCY = 4
WORKLOADS = ("family", "multi-turn", "trace")

# `hycache bench serve`'s shapes, resized: `hycache.sim.build.WorkloadSizes` fields over
# `SERVE_SHAPES` (plain values here: fleet sits beside the simulator, not above it)
SIZES: dict[str, dict[str, Any]] = {
    "family": {
        "families": 12,
        "requests_per_family": 4,
        "shared_prefix_tokens": (1536, 3072),
        "suffix_tokens": (8, 32),
        "output_tokens": 4,
    },
    "multi-turn": {
        "sessions": 12,
        "turns": (3, 4),
        "system_prompt_tokens": 1024,
        "user_tokens": (8, 32),
        "output_tokens": 4,
    },
}


@dataclass(frozen=True)
class TraceCut:
    """The Mooncake-like trace (`generate_mooncake_like`): `requests` of it, every prompt cut to
    its first `prompt_tokens`, every output `output_tokens` long."""

    requests: int = 48
    prompt_tokens: int = 2048
    output_tokens: int = 4


TRACE = TraceCut()


def engine_args(policy: str = "limit", num_blocks: int = NUM_BLOCKS) -> tuple[str, ...]:
    """`hycache fleet worker`'s engine flags for every worker of the benchmark."""
    return ("--model", "tiny", "--block-size", str(BLOCK), "--prefix-match-unit", str(UNIT),
            "--num-speculative-tokens", str(SPECULATIVE), "--num-blocks", str(num_blocks),
            "--max-model-len", str(MAX_MODEL_LEN), "--policy", policy)  # fmt: skip
