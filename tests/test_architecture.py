"""The package's shape: its import graph has no cycle, and the lower layers never import
the upper ones (docs/architecture.md has the map). Every import counts, a function-level or
`TYPE_CHECKING` one too: a cycle hidden behind a late import is still a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "hycache"

# a package -> the packages it must never import (the layers of docs/architecture.md §2)
UPPER = ("engine", "server", "cli", "bench", "fleet", "sim", "vllm")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "hycache.hashing": ("config", "request", "cache", "store", "sched", "model", *UPPER),
    "hycache.request": ("cache", "store", "sched", "model", *UPPER),
    "hycache.store": ("cache", "sched", "model", *UPPER),
    "hycache.cache": ("sched", "model", *UPPER),
    "hycache.sched": ("model", *UPPER),
    "hycache.model.configs": ("cache", "sched", "store", "model.hybrid", "engine", *UPPER),
    "hycache.model": ("sched", *UPPER),
    "hycache.engine": ("server", "cli", "bench", "fleet", "sim", "vllm"),
    "hycache.sim": ("engine", "server", "cli", "bench", "fleet", "vllm"),
    "hycache.server": ("sim", "cli", "bench", "fleet", "vllm"),
    "hycache.bench": ("server", "cli", "fleet"),
    "hycache.fleet": ("sim", "cli", "bench", "vllm"),
    "hycache.vllm": ("sched", "model", "engine", "server", "cli", "bench", "fleet", "sim"),
}

# what `--scheduler-cls hycache.vllm.Scheduler` loads in a vLLM deployment, and nothing else:
# the harness beside vLLM's real scheduler lives with the benchmarks (hycache/bench/vllm)
VLLM_PLUGIN = {"__init__", "scheduler", "managers", "compat", "cpu_fixes"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The hycache modules `path` imports (relative imports resolved). `from pkg import x`
    imports module `pkg.x` when there is one, else a name of `pkg` itself."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: imports(path, name, set(files)) for name, path in files.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (module names, first repeated at the end), or None. A package's
    `__init__` importing its own submodules is not a cycle by itself; a submodule importing
    its package's `__init__` back is."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(layer: str) -> None:
    bad = sorted(
        f"{m} imports {n}"
        for m, targets in graph().items()
        if _within(m, layer)
        for n in targets
        if any(_within(n, f"hycache.{up}") for up in FORBIDDEN[layer])
    )
    assert not bad, "\n".join(bad)


def test_the_vllm_package_is_the_plugin_only() -> None:
    present = {p.stem for p in (ROOT / "vllm").iterdir() if p.suffix == ".py" or p.is_dir()}
    assert present - {"__pycache__"} == VLLM_PLUGIN


def test_only_the_coordinator_applies_the_eagle_drop() -> None:
    """architecture §4.4: `Boundaries.drop` is read where it is defined and in the coordinator
    (`usable_match`), nowhere else; a second reader would apply the drop twice or differently."""
    readers = sorted(
        str(p.relative_to(ROOT.parent))
        for p in ROOT.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.Attribute) and node.attr == "drop"
    )
    assert set(readers) <= {"hycache/cache/boundaries.py", "hycache/cache/coordinator.py"}, readers


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# -- the engine's and the knobs' shape ---------------------------------------------------------

MAX_INIT_LINES = 50


def test_llm_init_is_short() -> None:
    """`LLM.__init__` (signature, docstring and body) stays under 50 lines: loading, sizing
    and assembly live in `hycache.engine.build`."""
    tree = ast.parse((ROOT / "engine" / "engine.py").read_text())
    llm = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LLM")
    init = next(n for n in llm.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert init.end_lineno is not None
    lines = init.end_lineno - init.lineno + 1
    assert lines < MAX_INIT_LINES, f"LLM.__init__ is {lines} lines (at most {MAX_INIT_LINES - 1})"


def _knob_names() -> set[str]:
    from dataclasses import fields

    from hycache.config import CacheKnobs

    return {f.name for f in fields(CacheKnobs)}


def front_ends() -> dict[str, type]:
    """Every front end that takes the user's cache choices: each holds one `CacheKnobs`."""
    from hycache.bench.calibrate import CalibrateOptions
    from hycache.bench.suite import EngineBench, SimBench
    from hycache.bench.validate import ValidateOptions
    from hycache.bench.vllm.reference import VllmSetup
    from hycache.cli.args import EngineArgs
    from hycache.config import CacheConfig
    from hycache.engine.options import EngineOptions
    from hycache.sim.build import SimGeometry
    from hycache.sim.explain import ExplainInputs

    return {
        c.__name__: c
        for c in (
            CacheConfig,
            SimGeometry,
            ExplainInputs,
            EngineBench,
            SimBench,
            ValidateOptions,
            CalibrateOptions,
            VllmSetup,
            EngineArgs,
            EngineOptions,
        )
    }


@pytest.mark.parametrize("name", sorted(front_ends()))
def test_front_ends_hold_the_knobs_and_copy_none(name: str) -> None:
    """Each knob is declared once, in `CacheKnobs`: no front end (nor `CacheConfig`, nor
    the engine's other options) declares one as a field of its own, and each that takes the
    user's cache choices holds a `knobs: CacheKnobs`."""
    from dataclasses import fields

    cls = front_ends()[name]
    own = {f.name for f in fields(cls)}
    assert not own & _knob_names(), f"{name} copies knobs: {sorted(own & _knob_names())}"
    if name != "EngineOptions":
        assert "knobs" in own, f"{name} has no `knobs: CacheKnobs`"


def test_engine_args_are_typed_through() -> None:
    """`EngineArgs` holds typed objects (no `dict[str, Any]` of keyword arguments)."""
    from dataclasses import fields

    from hycache.cli.args import EngineArgs

    for f in fields(EngineArgs):
        assert "dict" not in str(f.type), f"EngineArgs.{f.name}: {f.type}"
