"""`--eviction` end to end: the flag, the simulator under memory pressure, the admission
accounting, and the eviction curves (smoke size)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hycache.cli.main import main

FAMILY = [
    "simulate",
    "--workload",
    "family",
    "--families",
    "6",
    "--shared-prefix-tokens",
    "6000:12000",
    "--suffix-tokens",
    "64:512",
    "--output-tokens",
    "16:64",
    "--concurrency",
    "8",
    "--max-num-seqs",
    "8",
    "--num-blocks",
    "40",
    "--policy",
    "limit",
    "--quiet",
]


def _summary(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())["policies"]["limit"]


def test_a_bad_eviction_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*FAMILY, "--eviction", "lfu"])
    assert main([*FAMILY, "--eviction", "flop-aware", "--eviction-alpha", "-1"]) == 2
    assert "eviction_alpha" in capsys.readouterr().err


def test_lru_is_the_default_and_flop_aware_is_deterministic(tmp_path: Path) -> None:
    default, lru, fa1, fa2 = (tmp_path / f"{n}.json" for n in ("d", "l", "f1", "f2"))
    assert main([*FAMILY, "--json", str(default)]) == 0
    assert main([*FAMILY, "--eviction", "lru", "--json", str(lru)]) == 0
    assert default.read_bytes() == lru.read_bytes()
    for out in (fa1, fa2):
        assert main([*FAMILY, "--eviction", "flop-aware", "--json", str(out)]) == 0
    assert fa1.read_bytes() == fa2.read_bytes()
    s = _summary(fa1)
    assert s["requests"] == _summary(lru)["requests"]


def test_admission_accounting_adds_up() -> None:
    from hycache.bench.suite import SimBench, bench_workload, sim_config, sim_cost
    from hycache.sim.compare import compare_policies

    s = SimBench()
    s = replace(s, family=replace(s.family, families=4), concurrency=16)
    cost = sim_cost(s)
    w = bench_workload(s, "family")
    cfg = sim_config(s, w, cost)
    for eviction in ("lru", "flop-aware"):
        c = replace(cfg, cache=replace(cfg.cache.with_knobs(eviction=eviction), num_blocks=60))
        res = compare_policies(w, c, ["limit"], cost=cost)["limit"]
        kinds = res.page_kinds
        stored = sum(k["stored"] for k in kinds.values())
        assert 0 < stored <= res.summary["ssm_pages_stored"]
        for k in kinds.values():
            assert 0 <= k["evicted_never_hit"] <= k["evicted"] <= k["stored"]
        # (preempted requests' snapshots count as snapshots here, not in ssm_snapshot_pages;
        # at 60 pages for 16 requests no snapshot page is held: the waiting need them)
        assert kinds["snapshot"]["stored"] >= res.summary["ssm_snapshot_pages"] >= 0
        assert set(res.evictions) <= {"attention", "ssm", "snapshot"}
        assert res.evictions  # the pool was under pressure


def test_eviction_curves_smoke(tmp_path: Path) -> None:
    from hycache.bench.eviction import EvictionBench, eviction_curves, plot_eviction, quick

    b = replace(quick(EvictionBench()), workloads=("family",), fractions=(0.25,))
    doc = eviction_curves(b).to_json()
    row = doc["curves"]["family"][0]
    assert set(row["arms"]) == {
        "limit lru",
        "limit flop-aware",
        "lookahead lru",
        "lookahead flop-aware",
    }
    assert row["ratios"]["token_hit_rate"] is not None
    assert set(doc["goal"]["workloads"]) == {"family"}
    plot_eviction(str(tmp_path / "e.png"), doc)
    assert (tmp_path / "e.png").stat().st_size > 0
