"""`hycache bench` at toy scale: the shape of its output and the direction of its result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hycache.bench import EngineBench, SimBench, bench
from hycache.cli import main

KEYS = {
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "prefill_tokens_computed",
    "hit_tokens",
    "token_hit_rate",
    "lost_reuse_tokens",
    "extra_prefill_steps_max",
}


def toy() -> tuple[EngineBench, SimBench]:
    engine = EngineBench(
        block_size=32,
        prefix_match_unit=4,
        shared_prefix_tokens=150,
        suffix_tokens=40,
        output_tokens=4,
        num_requests=6,
        concurrency=3,
    )
    sim = SimBench(
        block_size=256,
        prefix_match_unit=16,
        shared_prefix_tokens=3000,
        suffix_tokens=400,
        output_tokens=16,
        num_requests=24,
        concurrency=8,
        sessions=4,
        turns=3,
        user_tokens=300,
        turn_output_tokens=20,
        trace_requests=40,
    )
    return engine, sim


def test_bench_halves_share_the_policies_shape() -> None:
    engine, sim = toy()
    doc = bench(engine, sim, lambda _msg: None)
    eng = doc["engine"]["policies"]
    assert set(eng) == {"replay", "junction"}
    assert set(eng["junction"]) >= KEYS
    # junction resumes siblings one unit under the shared block: more hits, less prefill
    assert eng["junction"]["hit_tokens"] > eng["replay"]["hit_tokens"]
    assert eng["junction"]["prefill_tokens_computed"] < eng["replay"]["prefill_tokens_computed"]
    assert eng["junction"]["extra_prefill_steps_max"] <= 2
    simd = doc["simulated"]
    assert set(simd) == {"system-prompt", "multi-turn", "trace"}
    assert set(simd["system-prompt"]["policies"]) == {"tail", "replay", "junction"}
    sp = simd["system-prompt"]["policies"]
    assert sp["junction"]["output_tokens_per_s"] > sp["replay"]["output_tokens_per_s"]
    for part in simd.values():
        for metrics in part["policies"].values():
            assert set(metrics) >= KEYS


@pytest.mark.slow
def test_bench_command_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", "--quick", "--json", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert {"engine", "simulated"} <= set(doc)
    assert png.stat().st_size > 10_000
