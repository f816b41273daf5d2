"""The flags several commands share (hycache.cli.args): one definition each, and the fixes of
issue #15: `--kv-store-gb` has one meaning (0: no store tier), `--prefix-hint` one form
(`N`, or bare: the workload's shared prefix)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hycache.cli.args import FLAGS
from hycache.cli.main import main, make_parser
from tests.helpers import WORKED

SIMULATE = ["simulate", "--workload", "family", "--families", "2", "--requests-per-family", "2",
            "--shared-prefix-tokens", "100:200", "--suffix-tokens", "8", "--output-tokens", "2",
            "--cost-model", "none", "--block-size", "64", "--prefix-match-unit", "16",
            "--policy", "limit", "--quiet"]  # fmt: skip


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_shared_flags_keep_each_command_s_default() -> None:
    """One definition of `--block-size` and friends; the defaults per command are as before."""
    commands = subparsers(make_parser())
    want = {
        "explain": (4416, 64, 3),
        "simulate": (4416, 64, 3),
        "generate": (64, 16, 0),
        "serve": (64, 16, 0),
    }
    required = {"explain": ["--prompt-tokens", "9", "--shared-prefix", "4"]}
    for name, expected in want.items():
        args = commands[name].parse_args(required.get(name, []))
        got = (args.block_size, args.prefix_match_unit, args.num_speculative_tokens)
        assert got == expected, name
    for name in ("--block-size", "--prefix-match-unit", "--num-speculative-tokens"):
        assert "default" not in FLAGS[name]  # each command gives its own


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--cost-model", "none", "--quiet"],
        ["generate", "--prompt-token-ids", "1,2"],
        ["bench", "--quick"],
        ["serve", "--port", "0"],
    ],
)
def test_a_negative_store_size_is_a_clear_error(
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--kv-store-gb -1`: one line, exit status 2, before any work starts."""
    import hycache.bench.suite
    import hycache.engine.engine

    def nothing(*_: object, **__: object) -> None:
        raise AssertionError("work started before --kv-store-gb was checked")

    monkeypatch.setattr(hycache.engine.engine, "LLM", nothing)
    monkeypatch.setattr(hycache.bench.suite, "bench", nothing)
    out = ["--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")]
    argv = [*argv, *out] if argv[0] == "bench" else argv
    assert main([*argv, "--kv-store-gb", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--kv-store-gb: must be a number > 0 and at most 1048576 (GiB), got -1" in err
    assert "(0: no store tier)" in err


def test_prefix_hint_bare_in_explain_is_the_shared_prefix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["explain", *WORKED, "--policy", "limit", "--json"]
    assert main([*base, "--prefix-hint", "57600"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert main([*base, "--prefix-hint"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare == given
    assert bare["inputs"]["prefix_hints"] == [57_600]


def test_prefix_hint_takes_a_token_count_in_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bare: each request names its family's prefix (as before); `N`: every request names N."""
    bare, counted = tmp_path / "bare.json", tmp_path / "n.json"
    assert main([*SIMULATE, "--prefix-hint", "--json", str(bare)]) == 0
    assert main([*SIMULATE, "--prefix-hint", "96", "--json", str(counted)]) == 0
    a, b = (json.loads(p.read_text()) for p in (bare, counted))
    assert a["inputs"]["prefix_hint"] is True
    assert b["inputs"]["prefix_hint"] == {"shared": False, "tokens": [96]}
    assert main([*SIMULATE, "--prefix-hint", "-5"]) == 2
    assert "--prefix-hint: token counts must be >= 0" in capsys.readouterr().err


def test_prefix_hint_forms_parse_the_same_everywhere() -> None:
    parser = make_parser()
    gen = ["generate", "--prompt-token-ids", "1"]
    serve = ["bench", "serve", "--url", "http://127.0.0.1:9"]
    for argv in (gen, serve, ["simulate"], ["explain", *WORKED]):
        assert parser.parse_args(
            [*argv, "--prefix-hint", "7", "--prefix-hint", "9"]
        ).prefix_hint == [7, 9]
        assert parser.parse_args([*argv, "--prefix-hint"]).prefix_hint == [None]
        assert parser.parse_args(argv).prefix_hint is None


def test_prefix_hint_bare_needs_a_workload(capsys: pytest.CaptureFixture[str]) -> None:
    """`generate` has no workload to take a shared prefix from: a bare hint is refused."""
    argv = ["generate", "--prompt-token-ids", "1,2,3", "--prefix-hint"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix-hint: give a token count N" in err


def test_simulate_s_chunking_flags_reach_the_scheduler_and_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--saturated-chunk-tokens N` and `--no-step-packing` set every arm's scheduler (and are
    reported); a negative N is an error; explain, which never queues, has neither."""
    from hycache.cli.args import CacheArgs
    from hycache.config import SchedulerConfig
    from hycache.sim.build import build_config

    def scheduler(extra: list[str]) -> SchedulerConfig:
        geometry = CacheArgs.from_cli_args(make_parser().parse_args([*SIMULATE, *extra])).geometry
        return build_config(geometry, max_model_len=512, num_blocks=64, policy="limit").scheduler

    assert scheduler([]) == SchedulerConfig(8192, 64)
    off = scheduler(["--saturated-chunk-tokens", "0", "--no-step-packing"])
    assert (off.saturated_chunk_tokens, off.step_packing) == (0, False)
    out = tmp_path / "s.json"
    argv = [*SIMULATE, "--saturated-chunk-tokens", "256", "--no-step-packing", "--json", str(out)]
    assert main(argv) == 0
    inputs = json.loads(out.read_text())["inputs"]
    assert (inputs["saturated_chunk_tokens"], inputs["step_packing"]) == (256, False)
    with pytest.raises(SystemExit) as bad:
        main([*SIMULATE, "--saturated-chunk-tokens", "-1"])
    assert bad.value.code == 2
    assert "--saturated-chunk-tokens: must be >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_parser().parse_args(["explain", "--no-step-packing"])


def test_bench_model_and_gpu_name_the_simulated_part(tmp_path: Path) -> None:
    """`bench --model M --gpu G`: the simulated part runs M on G (a GDN preset here)."""
    from hycache.cli.bench import BenchArgs

    out = ["--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")]
    argv = ["bench", "--skip-engine", "--model", "qwen3-next-80b-a3b", "--gpu", "b200", *out]
    got = BenchArgs.from_cli_args(make_parser().parse_args(argv))
    assert (got.sim.model, got.sim.gpu) == ("qwen3-next-80b-a3b", "b200")
    default = BenchArgs.from_cli_args(make_parser().parse_args(["bench", "--skip-engine", *out]))
    assert (default.sim.model, default.sim.gpu) == ("bamba-9b", "h200")


def test_one_function_turns_every_command_s_flags_into_knobs() -> None:
    """`knobs_from_cli_args` reads each `CacheKnobs` field by its name (so a new knob needs only
    its field, its flag and its consumer), over the command's base knobs; `--no-prefix-caching`
    turns caching off; under `arms` (simulate, explain) `--policy` names arms, not a knob."""
    from dataclasses import fields

    from hycache.cli.args import EngineArgs, knobs_from_cli_args
    from hycache.config import CacheKnobs, Eviction, Policy

    base = CacheKnobs(552, 8)
    every = argparse.Namespace(
        block_size=32,
        prefix_match_unit=4,
        policy="replay",
        retention="dense",
        no_prefix_caching=True,
        hash_seed=7,
        eviction="flop-aware",
        eviction_alpha=0.5,
        internal_checkpoints=False,
        admission=False,
        protect_declared=False,
        protect_reused=True,
    )
    assert {f.name for f in fields(CacheKnobs)} - set(vars(every)) == {"enable_prefix_caching"}
    got = knobs_from_cli_args(every, base)
    assert got == CacheKnobs(32, 4, Policy.REPLAY, "dense", False, 7, Eviction.FLOP_AWARE,
                             0.5, False, False, False, True)  # fmt: skip
    assert knobs_from_cli_args(every, base, arms=True).policy is base.policy
    assert knobs_from_cli_args(argparse.Namespace(), base) == base  # a command without them
    with pytest.raises(ValueError, match=r"^prefix_match_unit"):
        knobs_from_cli_args(argparse.Namespace(block_size=64, prefix_match_unit=5), base)
    argv = ["generate", "--policy", "junction", "--eviction", "flop-aware"]
    engine = EngineArgs.from_cli_args(make_parser().parse_args(argv))
    assert engine.knobs == CacheKnobs(policy="junction", eviction="flop-aware")
    assert engine.options.max_model_len == 4096 and engine.options.kv_store is None
