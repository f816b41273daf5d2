"""Unbounded or loose command-line inputs (issue 19): each is refused at once, on one line with
exit status 2, before any work starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hycache.cli.main import main

PRESETS = Path(__file__).parents[2] / "hycache" / "sim" / "presets" / "models"
QUICK = ["simulate", "--workload", "system-prompt", "--num-requests", "2", "--quiet",
         "--shared-prefix-tokens", "64", "--suffix-tokens", "8",
         "--output-tokens", "2"]  # fmt: skip


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_instances_are_capped(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--instances: at most 256" in one_line_error([*QUICK, "--instances", "100000"], capsys)


def test_routing_needs_instances(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error([*QUICK, "--routing", "prefix-aware"], capsys)
    assert "--routing" in err and "--instances" in err


@pytest.mark.parametrize("flag", ["--model-config", "--gpu-config"])
def test_config_files_are_capped_in_size_and_depth(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "over 4 MiB" in one_line_error([*QUICK, flag, "/dev/zero"], capsys)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested deeper than 32" in one_line_error([*QUICK, flag, str(deep)], capsys)
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 40 + "]" * 40)  # within the parser, over the cap
    assert "nested deeper" in one_line_error([*QUICK, flag, str(nested)], capsys)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("hidden_size", 256.5, "'hidden_size' must be an integer"),
        ("hidden_size", 4096.0, "'hidden_size' must be an integer"),
        ("vocab_size", "512", "'vocab_size' must be an integer"),
        ("num_attention_heads", True, "'num_attention_heads' must be an integer"),
        ("layer_norm_epsilon", "1e-5", "'layer_norm_epsilon' must be a number"),
        ("tie_word_embeddings", 1, "'tie_word_embeddings' must be true or false"),
    ],
)
def test_model_configs_take_strict_types(
    field: str, value: object, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads((PRESETS / "nemotron-h-8b.json").read_text())
    assert main([*QUICK, "--model-config", str(PRESETS / "nemotron-h-8b.json")]) == 0
    capsys.readouterr()
    doc[field] = value
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(doc))
    assert needle in one_line_error([*QUICK, "--model-config", str(bad)], capsys)


@pytest.mark.parametrize("gb", ["1e300", "-1", "nan", "inf", "2e6"])
@pytest.mark.parametrize("command", ["simulate", "generate"])
def test_kv_store_gb_is_one_rule(gb: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The same rule, and message, for every command (serve and bench: test_serve_store)."""
    argv = {
        "simulate": QUICK,
        "generate": ["generate", "--prompt-token-ids", "1,2,3", "--kv-store", "host"],
    }[command]
    err = one_line_error([*argv, "--kv-store-gb", gb], capsys)
    assert "kv-store-gb: must be a number > 0 and at most 1048576 (GiB)" in err
    assert "(0: no store tier)" in err


def test_kv_store_gb_zero_means_no_store_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--kv-store-gb 0` is no store tier on every command (it used to be refused): simulate
    runs as without the flag; beside `--kv-store host` it is a contradiction, refused."""
    plain, zero = tmp_path / "plain.json", tmp_path / "zero.json"
    assert main([*QUICK, "--json", str(plain)]) == 0
    assert main([*QUICK, "--kv-store-gb", "0", "--json", str(zero)]) == 0
    assert json.loads(zero.read_text())["policies"] == json.loads(plain.read_text())["policies"]
    capsys.readouterr()
    argv = ["generate", "--prompt-token-ids", "1,2,3", "--kv-store", "host", "--kv-store-gb", "0"]
    err = one_line_error(argv, capsys)
    assert "kv-store-gb: must be > 0 with --kv-store host (0 means no store tier)" in err


@pytest.mark.parametrize(
    "url", ["mooncake://evil host:5", "mooncake://a_b:5", "mooncake://u@host:5", "mooncake://h:5?x"]
)
def test_mooncake_hosts_are_validated(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(["generate", "--prompt-token-ids", "1,2", "--kv-store", url], capsys)
    assert "kv-store:" in err


def test_trace_gen_makes_no_folder_it_was_not_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    out = missing / "x.jsonl"
    err = one_line_error(["trace-gen", "--out", str(out), "--num-requests", "4"], capsys)
    assert "does not exist" in err and not missing.exists()
    assert main(["trace-gen", "--out", str(tmp_path / "t.jsonl"), "--num-requests", "4"]) == 0
    assert (tmp_path / "t.jsonl").is_file()


def test_model_config_integers_are_integers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`256.0` for an integer field is refused, as the README says (issue 34)."""
    doc = json.loads((PRESETS / "tiny.json").read_text())
    doc["hidden_size"] = float(doc["hidden_size"])
    path = tmp_path / "float.json"
    path.write_text(json.dumps(doc))
    err = one_line_error([*QUICK, "--model-config", str(path)], capsys)
    assert "hidden_size" in err and "integer" in err


@pytest.mark.parametrize("flag", ["--model-config", "--gpu-config"])
def test_a_fifo_config_is_refused_not_waited_on(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO with no writer would block `open` for ever: it is refused at once (the run is
    bounded by a thread join, so a regression fails instead of hanging the suite)."""
    import os
    import threading

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(main([*QUICK, flag, str(fifo)])))
    run.daemon = True
    run.start()
    run.join(60)
    if run.is_alive():  # unblock the reader so the thread ends, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("--model-config waited on a FIFO")
    assert codes == [2]
    assert "not a regular file" in capsys.readouterr().err
