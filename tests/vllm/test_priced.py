"""`hycache bench vllm` (hycache.bench.vllm.priced): vLLM's real scheduler, each step priced by
the simulator's cost model, on tiny workloads: the table's invariants, not its figures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hycache.bench.vllm.priced import PricedBench, accepted, quick, run, run_arm
from hycache.cli.main import main

BENCH = quick(PricedBench())


@pytest.fixture(scope="module")
def family_doc() -> dict:
    return run(replace(BENCH, workloads=("family",), concurrency=(1, 4)))


def test_alone_a_requests_ttft_is_the_sum_of_its_priced_prefill_passes() -> None:
    cost = BENCH.cost()
    for arm in BENCH.arms:
        r = run_arm(BENCH, arm, BENCH.shape("multi-turn"), 1, cost, BENCH.num_blocks(cost))
        assert len(r.ttft) == len(r.pass_seconds) == 6  # 3 sessions x 2 turns
        assert r.ttft == pytest.approx(r.pass_seconds, rel=1e-9)
        assert all(p >= 1 for p in r.passes)


def test_the_plugin_hits_at_least_stock_and_pays_at_most_two_passes_more(family_doc: dict) -> None:
    rows = {(r["concurrency"], r["arm"]): r for r in family_doc["rows"]}
    assert {arm for _, arm in rows} == {"stock", "stock+flag", "plugin"}
    for c in (1, 4):
        stock, plugin = rows[(c, "stock")], rows[(c, "plugin")]
        assert plugin["requests"] == stock["requests"] == 6
        assert plugin["hit_tokens"] >= stock["hit_tokens"]
        # what a hit saves is prefill: computed + hit tokens cover the same prompts
        total = stock["prefill_tokens"] + stock["hit_tokens"]
        assert plugin["prefill_tokens"] + plugin["hit_tokens"] == total
        assert plugin["passes_per_request"] <= stock["passes_per_request"] + 2
    # at concurrency 1 the family's shared prefixes end off the block grid: the plugin
    # resumes deeper and its output tok/s is above stock's
    cell = next(r for r in family_doc["ratios"] if r["concurrency"] == 1)
    assert cell["hit_tokens"] > 0 and cell["output_tok_s"] > 1.0


def test_drafts_verify_at_the_acceptance_rate() -> None:
    assert [accepted(1, 0.7, n) for n in range(10)] == [0, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    assert sum(accepted(3, 0.5, n) for n in range(100)) == 150
    assert all(accepted(2, 1.0, n) == 2 for n in range(5))


def test_the_command_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "priced.json"
    argv = ["bench", "vllm", "--quick", "--workload", "system-prompt", "--concurrency", "1"]
    flags = ["--num-speculative-tokens", "0", "--price", "default", "--json", str(path)]
    assert main([*argv, *flags]) == 0
    doc = json.loads(path.read_text())
    assert doc["inputs"]["block_size"] == 4416 and doc["inputs"]["num_speculative_tokens"] == 0
    assert doc["inputs"]["price"] == "default"
    # without a drafter vLLM's junction flag does not apply: two arms
    assert [r["arm"] for r in doc["rows"]] == ["stock", "plugin"]
    out = capsys.readouterr().out
    assert "priced" in out and "plugin" in out
    assert main(["bench", "vllm", "--prefix-match-unit", "100", "--quick"]) == 2
