"""The simulator's pool layout: `CostModel.pool_sizes`, separate-pool copy costs, and
`hycache simulate --pool-layout` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hycache.cache.layout import PAGES_PER_SEQUENCE, split_budget
from hycache.cli.main import main
from hycache.cli.simulate import add_parser as add_simulate_parser
from hycache.config import CacheConfig, CacheKnobs
from hycache.sim.compare import sized_cache
from hycache.sim.costmodel import POOL_LAYOUTS, CostModel, StepWork
from hycache.sim.presets import load_gpu, load_model_spec

BAMBA = load_model_spec("bamba-9b")
H200 = load_gpu("h200")


def cm(*, spec: bool = True, block_size: int | None = None, layout: str = "shared") -> CostModel:
    return CostModel(
        BAMBA,
        H200,
        speculative=spec,
        num_speculative_tokens=3 if spec else 0,
        block_size=block_size,
        pool_layout=layout,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("spec", [True, False])
@pytest.mark.parametrize(("block_size", "max_len"), [(64, 4096), (4416, 70_000), (16, 300)])
def test_separate_pools_fit_the_budget_and_follow_the_split(
    spec: bool, block_size: int, max_len: int
) -> None:
    c = cm(spec=spec)
    budget = c.cache_budget_bytes()
    attn, state = c.attention_block_bytes(block_size), BAMBA.ssm_state_bytes
    pools = c.pool_sizes(block_size, max_len, layout="separate")
    assert pools.num_state_pages is not None
    # the null block and null page are the only slack over the budget
    used = (pools.num_blocks - 1) * attn + (pools.num_state_pages - 1) * state
    assert used <= budget
    # little of the budget is left over: under one sequence's worth
    blocks_per_seq = math.ceil(max_len / block_size)
    assert budget - used < blocks_per_seq * attn + PAGES_PER_SEQUENCE * state + attn + state
    # the proportion one max-length sequence uses
    ratio = (pools.num_blocks - 1) / (pools.num_state_pages - 1)
    assert ratio == pytest.approx(blocks_per_seq / PAGES_PER_SEQUENCE, rel=0.01)
    assert pools == split_budget(
        budget,
        attention_block_bytes=attn,
        state_page_bytes=state,
        max_model_len=max_len,
        block_size=block_size,
    )


def test_shared_pool_sizes_are_num_blocks() -> None:
    for spec in (True, False):
        c = cm(spec=spec)
        pools = c.pool_sizes(4416, 70_000, layout="shared")
        assert pools.num_blocks == c.num_blocks(4416)
        assert pools.num_state_pages is None
        assert c.cache_budget_bytes() // c.block_bytes(4416) == c.num_blocks(4416)


def test_separate_attention_groups_count_per_group() -> None:
    one = cm().pool_sizes(64, 4096, layout="separate")
    two = cm().pool_sizes(64, 4096, layout="separate", attention_groups=2)
    assert two.num_blocks > one.num_blocks
    assert two.num_state_pages < one.num_state_pages


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="pool layout"):
        cm().pool_sizes(64, 4096, layout="pooled")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pool layout"):
        cm(layout="pooled")


def test_separate_copies_cost_an_attention_block() -> None:
    shared, separate = cm(block_size=64), cm(block_size=64, layout="separate")
    work = StepWork((), num_block_copies=3)
    assert shared.breakdown(work)["copy_bytes"] == 2 * 3 * shared.block_bytes(64)
    assert separate.breakdown(work)["copy_bytes"] == 2 * 3 * separate.attention_block_bytes(64)
    # at B = 64 a shared page is an SSM state (117 MiB), an attention block 1 MiB
    assert separate.copy_bytes() < shared.copy_bytes() == BAMBA.ssm_state_bytes
    assert separate.without_drafter().pool_layout == "separate"


def test_sized_cache_follows_the_cost_models_layout() -> None:
    cache = CacheConfig(
        CacheKnobs(block_size=64, prefix_match_unit=None), num_blocks=4096, max_model_len=4096
    )
    shared = sized_cache(cache, cm())
    assert (shared.num_blocks, shared.num_state_pages) == (cm().num_blocks(64), None)
    separate = sized_cache(cache, cm(layout="separate"))
    pools = cm().pool_sizes(64, 4096, layout="separate")
    assert (separate.num_blocks, separate.num_state_pages) == tuple(vars(pools).values())


def test_cli_choices_are_the_cost_models_layouts() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "simulate"
    ]
    action = next(a for a in sub._actions if a.dest == "pool_layout")
    assert tuple(action.choices) == POOL_LAYOUTS
    assert action.default == "shared"


SMALL = ["simulate", "--workload", "system-prompt", "--num-requests", "6", "--quiet"]


def _run(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main([*SMALL, "--compare", "eagle-off,lookahead,limit", "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_simulate_separate_pools_end_to_end(tmp_path: Path) -> None:
    default = _run(tmp_path, "default")
    shared = _run(tmp_path, "shared", "--pool-layout", "shared")
    separate = _run(tmp_path, "separate", "--pool-layout", "separate")
    # shared is the default and adds nothing to the output
    assert shared == default
    assert "pool_layout" not in default["inputs"]
    assert all("num_state_pages" not in p for p in default["policies"].values())
    # separate: the inputs and every arm report their pools
    assert separate["inputs"]["pool_layout"] == "separate"
    assert separate["inputs"]["num_state_pages"] == separate["policies"]["limit"]["num_state_pages"]
    assert separate["inputs"]["num_blocks"] == separate["policies"]["limit"]["num_blocks"]
    for name, arm in separate["policies"].items():
        assert arm["num_state_pages"] > 0
        assert arm["output_tokens_per_s"] > 0
        assert arm["requests"] == default["policies"][name]["requests"]
    # without the drafter more memory is left: both pools grow
    off, la = separate["policies"]["eagle-off"], separate["policies"]["lookahead"]
    assert off["num_blocks"] > la["num_blocks"] and off["num_state_pages"] > la["num_state_pages"]


def test_simulate_separate_needs_the_cost_models_sizing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--pool-layout", "separate", "--num-blocks", "2000"]) == 2
    assert "--pool-layout separate" in capsys.readouterr().err
    assert main([*SMALL, "--pool-layout", "separate", "--cost-model", "none"]) == 2
