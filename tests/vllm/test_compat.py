"""`hycache.vllm.compat`: the plugin on each supported vLLM release, and never a silent no-op.

An unsupported release, a missing internal or a changed signature: the plugin class still
imports, schedules exactly as stock vLLM (hits and chunk ends), and says why in one WARNING at
startup; `hycache explain --backend vllm` says so in its `scheduler` row.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hycache.bench.vllm.reference import VllmSetup, run_reference
from hycache.config import CacheKnobs
from hycache.sim.explain import ExplainInputs
from hycache.vllm import compat
from tests.vllm.shapes import PLUGIN, SYNC, family, hits, with_cls

# every stop made (a free pass): at B=64 no sub-block stop pays the default price, and these
# tests check that the mechanisms are on, or off exactly as stock
SETUP = VllmSetup(CacheKnobs(64, 16), 8192, pass_price=(0.0, 1.0))


@pytest.fixture
def fresh_compat() -> Iterator[None]:
    """`compat.problem()` is cached per process: clear it around a test that changes vLLM."""
    compat.problem.cache_clear()
    yield
    compat.problem.cache_clear()


def test_this_vllm_is_supported() -> None:
    import vllm

    assert compat.release_of(vllm.__version__) in compat.RELEASES
    assert compat.problem() is None
    assert compat.release_of("0.34.1.dev3+g12ab") == "0.34"
    assert compat.release_of("nightly") is None


def test_the_plugin_is_on_and_says_which_vllm(caplog: pytest.LogCaptureFixture) -> None:
    import vllm

    with caplog.at_level(logging.INFO, logger="hycache.vllm"):
        got = run_reference(with_cls(SETUP, PLUGIN), family(0, 640, 83, 3))
    assert hits(got) == [0, 0, 624]
    lines = [r for r in caplog.records if r.name == "hycache.vllm"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert f"limit on (vLLM {vllm.__version__}" in lines[0].getMessage()


def stock_and_plugin(cls: str, caplog: pytest.LogCaptureFixture) -> tuple[Any, Any, list[str]]:
    turns = family(0, 640, 83, 3)  # stock 0 / 0 / 576, the plugin's 0 / 0 / 624
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hycache.vllm"):
        plugin = run_reference(with_cls(SETUP, cls), turns)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "hycache.vllm" and r.levelno == logging.WARNING
    ]
    stock = run_reference(SETUP, turns)
    return (
        [(t.hit, t.chunk_ends) for t in stock],
        [(t.hit, t.chunk_ends) for t in plugin],
        warnings,
    )


def hide_make_key(monkeypatch: pytest.MonkeyPatch) -> str:
    # vLLM's own modules imported it by name, so stock scheduling keeps it
    monkeypatch.delattr("vllm.v1.core.kv_cache_utils.make_block_hash_with_group_id")
    return "has no vllm.v1.core.kv_cache_utils.make_block_hash_with_group_id"


def rename_split_parameters(monkeypatch: pytest.MonkeyPatch) -> str:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._mamba_block_aligned_split

    def split(self: Any, request: Any, num_new_tokens: int, *rest: int) -> int:
        return int(original(self, request, num_new_tokens, *rest))

    monkeypatch.setattr(Scheduler, "_mamba_block_aligned_split", split)
    return "_mamba_block_aligned_split has no parameter num_new_local_computed_tokens"


def unsupported_release(monkeypatch: pytest.MonkeyPatch) -> str:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.35.0")
    return "vLLM 0.35.0 is not a supported release (0.32.x, 0.33.x, 0.34.x)"


def missing_scheduler_attribute(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(compat, "SCHEDULER_ATTRS", (*compat.SCHEDULER_ATTRS, "moved_flag"))
    return "the scheduler has no attribute moved_flag"


@pytest.mark.parametrize(
    "change,cls",
    [
        (hide_make_key, PLUGIN),
        (rename_split_parameters, PLUGIN),
        (unsupported_release, PLUGIN),
        (unsupported_release, SYNC),
        (missing_scheduler_attribute, SYNC),
    ],
)
def test_a_vllm_it_cannot_carry_gets_stock_scheduling_and_a_warning(
    change: Any,
    cls: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_compat: None,
) -> None:
    why = change(monkeypatch)
    compat.problem.cache_clear()
    stock, plugin, warnings = stock_and_plugin(cls, caplog)
    assert plugin == stock and [hit for hit, _ in stock] == [0, 0, 576]
    assert len(warnings) == 1 and "inert" in warnings[0] and why in warnings[0], warnings


def test_the_plugin_imports_on_a_vllm_it_cannot_carry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process with an unsupported version: `--scheduler-cls` resolves the class."""
    code = (
        "import vllm; vllm.__version__ = '0.99.0'\n"
        "from vllm.utils.import_utils import resolve_obj_by_qualname\n"
        "cls = resolve_obj_by_qualname('hycache.vllm.Scheduler')\n"
        "from hycache.vllm import compat\n"
        "print(cls.__name__, compat.problem())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    assert "Scheduler vLLM 0.99.0 is not a supported release" in out


def test_explain_says_the_plugin_is_inert(
    monkeypatch: pytest.MonkeyPatch, fresh_compat: None
) -> None:
    from hycache.bench.vllm.explain import explain_vllm
    from hycache.cli.tables import explain_table

    inputs = ExplainInputs(CacheKnobs(64, 16), True, 723, 640, num_speculative_tokens=1)
    on = explain_vllm(inputs)["policies"]
    assert on["hycache.vllm.Scheduler"]["scheduler"].endswith("limit on")
    unsupported_release(monkeypatch)
    compat.problem.cache_clear()
    off = explain_vllm(inputs)
    cols = off["policies"]
    assert cols["vllm"]["scheduler"] == "vLLM 0.35.0"
    assert cols["hycache.vllm.Scheduler"]["scheduler"] == (
        "vLLM 0.35.0, INERT: vLLM 0.35.0 is not a supported release (0.32.x, 0.33.x, 0.34.x)"
    )
    assert cols["vllm"]["siblings"] == cols["hycache.vllm.Scheduler"]["siblings"]
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(explain_table(off))
    assert "INERT: vLLM 0.35.0 is not a supported release" in console.export_text()


def test_compat_names_every_vllm_import_of_the_plugin() -> None:
    """Only `compat` imports vLLM in the plugin's modules (type hints aside)."""
    for name in ("scheduler", "managers"):
        module = importlib.import_module(f"hycache.vllm.{name}")
        lines = Path(module.__file__ or "").read_text().splitlines()
        imports = [ln for ln in lines if ln.startswith(("import vllm", "from vllm"))]
        assert not imports, (name, imports)
