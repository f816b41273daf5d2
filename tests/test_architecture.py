"""The package's shape: its import graph has no cycle, and the lower layers never import
the upper ones (docs/architecture.md has the map). Every import counts, a function-level or
`TYPE_CHECKING` one too: a cycle hidden behind a late import is still a cycle."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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

# what `--scheduler-cls hycache.vllm.Scheduler` (and `--middleware hycache.vllm.guard...`) loads
# in a vLLM deployment, and nothing else:
# the harness beside vLLM's real scheduler lives with the benchmarks (hycache/bench/vllm)
VLLM_PLUGIN = {"__init__", "scheduler", "managers", "compat", "events", "guard"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, package: str, modules: set[str] | None = None) -> set[str]:
    """The module names `path` (in `package`) imports, relative imports resolved. `from pkg
    import x` imports module `pkg.x` when it is one of `modules`, else a name of `pkg` itself;
    without `modules`, both `pkg` and `pkg.x` count."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for sub in (f"{base}.{a.name}" for a in node.names):
                if modules is None:
                    out.update((base, sub))
                else:
                    out.add(sub if sub in modules else base)
    return out


def imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The hycache modules `path` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return {m for m in imported(path, package, modules) if m in modules and m != name}


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


def test_the_cpu_fixes_are_a_package_vllm_alone_loads() -> None:
    """`hycache.vllm_cpu` (vLLM's general plugin on its CPU engine) reaches vLLM through
    `hycache.vllm.compat` only, and no hycache module imports it (vLLM does, by entry point)."""
    edges = graph()
    fixes = {m: t for m, t in edges.items() if _within(m, "hycache.vllm_cpu")}
    assert fixes, "hycache/vllm_cpu is gone"
    outside = {n for t in fixes.values() for n in t if not _within(n, "hycache.vllm_cpu")}
    assert outside <= {"hycache.vllm", "hycache.vllm.compat"}, sorted(outside)
    importers = sorted(
        m
        for m, t in edges.items()
        if m not in fixes and any(_within(n, "hycache.vllm_cpu") for n in t)
    )
    assert not importers, importers


def test_the_cpu_fixes_read_no_launch_argument_by_position() -> None:
    """The fused-kernel stand-ins read a launch's arguments by the kernel's parameter names
    (`compat.PRECOPY`, `compat.POSTPROCESS`), never `args[13]`."""
    tree = ast.parse((ROOT / "vllm_cpu" / "state_copies.py").read_text())
    by_position = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "args"
    ]
    assert not by_position, by_position


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


# -- the front door ----------------------------------------------------------------------------


def _make_prerequisites(target: str) -> list[str]:
    makefile = (ROOT.parent / "Makefile").read_text().splitlines()
    (line,) = [ln for ln in makefile if ln.startswith(f"{target}:")]
    return line.split(":", 1)[1].split()


def test_make_demo_sets_up_only_what_the_demo_runs() -> None:
    """`make demo` runs `hycache explain` and `hycache bench` (hycache's own engine and
    simulator, no vLLM): it builds the main venv only, never vLLM's CPU engine venv nor the
    0.34 folder, which `make test` (through `setup`) still builds."""
    assert _make_prerequisites("demo") == ["$(STAMP)"]
    setup = _make_prerequisites("setup")
    assert {"$(STAMP)", "$(VLLM_034_STAMP)", "$(VLLM_CPU_STAMP)"} <= set(setup)
    assert "setup" in _make_prerequisites("test")


# -- the tests' shape --------------------------------------------------------------------------

REPO = ROOT.parent


def _imports_of_tests(folder: str, is_bad: Any) -> list[str]:
    return sorted(
        f"{p.relative_to(REPO)} imports {m}"
        for p in (REPO / folder).rglob("*.py")
        for m in imported(p, ".".join(p.relative_to(REPO).parent.parts))
        if is_bad(m)
    )


def _is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/helpers.py, a folder's conftest.py or a helper module;
    a test module (`test_*.py`) is never imported, so each runs and reads on its own."""
    bad = _imports_of_tests("tests", _is_test_module)
    assert not bad, "\n".join(bad)


def test_no_benchmark_imports_a_test() -> None:
    bad = _imports_of_tests("benchmarks", lambda m: m == "tests" or m.startswith("tests."))
    assert not bad, "\n".join(bad)


def _closure(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(edges.get(m, ()))
    return seen


def test_a_workload_does_not_load_the_simulator() -> None:
    """`Workload` and `OfferedLoad` live in `sim.workloads`, which imports (even late) none of
    the simulator; building one (`sim.build`) loads no simulator either until arrivals are
    measured against it."""
    import subprocess
    import sys

    from hycache.sim.load import OfferedLoad
    from hycache.sim.workloads import Workload

    assert Workload.__module__ == OfferedLoad.__module__ == "hycache.sim.workloads"
    reached = _closure(graph(), "hycache.sim.workloads")
    simulator = {"hycache.sim.simulator", "hycache.sim.compare", "hycache.sim.load"}
    assert not reached & simulator, sorted(reached & simulator)
    code = "import sys, hycache.sim.build; print(sorted(m for m in sys.modules if m in %r))"
    out = subprocess.run(
        [sys.executable, "-c", code % sorted(simulator)], capture_output=True, text=True,
        check=True, cwd=ROOT.parent,
    ).stdout  # fmt: skip
    assert out.strip() == "[]", out


MAX_FUNCTION_LINES = 80
# the two kernels, each one pass over its tensors that reads best whole
LONG_KERNELS = {"model/mamba2.py:Mamba2Mixer._gathered", "model/ssd.py:_scan"}


def _function_lengths(path: Path) -> dict[str, int]:
    """`Class.method` / `function` (nested ones by their path) -> lines, signature to end."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, names: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = [*names, child.name]
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    out[".".join(name)] = child.end_lineno - child.lineno + 1
                walk(child, name)
            else:
                walk(child, names)

    walk(ast.parse(path.read_text()), [])
    return out


def test_no_function_is_over_80_lines() -> None:
    """No function in hycache/ runs over 80 lines (signature, docstring and body) but the two
    kernels; a longer one splits along its phases."""
    long = sorted(
        f"{where} ({n} lines)"
        for path in sorted(ROOT.rglob("*.py"))
        for name, n in _function_lengths(path).items()
        if n > MAX_FUNCTION_LINES
        and (where := f"{path.relative_to(ROOT).as_posix()}:{name}")
        not in LONG_KERNELS
    )
    assert not long, long


def test_the_length_checker_measures_nested_functions(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(3))
    src = f"class A:\n    def f(self):\n        def g():\n            pass\n{body}\n"
    (tmp_path / "m.py").write_text(src)
    assert _function_lengths(tmp_path / "m.py") == {"A.f": 6, "A.f.g": 2}


# -- model/: flat ------------------------------------------------------------------------------

ARCHITECTURES = ("bamba", "nemotron_h", "granite_hybrid", "qwen3_next")


def test_no_architecture_imports_another() -> None:
    """Each architecture module imports shared parts (`moe`, `hybrid`, `layers`, `mamba2`,
    `gdn`, ...), never a sibling architecture; the drafters read weights through `weights`,
    not the loader (which imports every architecture)."""
    edges = graph()
    arch = {f"hycache.model.{a}" for a in ARCHITECTURES}
    bad = sorted(f"{m} imports {n}" for m in arch for n in edges[m] if n in arch)
    for drafter in ("hycache.model.eagle", "hycache.model.mtp"):
        bad += [f"{drafter} imports {n}" for n in edges[drafter] if n == "hycache.model.loader"]
    assert not bad, bad


def test_the_decoder_container_is_declared_once() -> None:
    """`HybridForCausalLM._add_decoder` builds every architecture's embedding / layers / norm
    container and its accessors; an architecture declares only its checkpoint's names."""
    repeated = sorted(
        f"{a}.{node.name}"
        for a in ARCHITECTURES
        for node in ast.walk(ast.parse((ROOT / "model" / f"{a}.py").read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.name in ("embed_tokens", "decoder_layers", "final_layernorm", "_add_lm_head")
    )
    assert not repeated, repeated


def test_the_engine_picks_the_drafter_by_a_model_property() -> None:
    """`engine.build` asks the config (`mtp_drafter`), never its class (no `isinstance` on a
    config, no import of an architecture's config module)."""
    tree = ast.parse((ROOT / "engine" / "build.py").read_text())
    class_checks = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "isinstance"
        and "Config" in ast.unparse(n.args[1])
    ]
    assert not class_checks, class_checks
    own = {n for n in graph()["hycache.engine.build"] if n.startswith("hycache.model.configs.")}
    assert own <= {"hycache.model.configs.base"}, sorted(own)


def _front_end_files() -> list[Path]:
    """The bench, the server and the command line (`bench/vllm` drives vLLM's scheduler, not
    hycache's engine: left out)."""
    return [
        p
        for pkg in ("bench", "server", "cli")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.relative_to(ROOT).parts[:2] != ("bench", "vllm")
    ]


def test_the_front_ends_drive_the_engine_through_its_own_api() -> None:
    """The bench, the server and the command line read the engine through `LLM`'s methods and
    step observers, never its scheduler (`llm.scheduler.running`, `...cache.pool`); every
    `llm` they hold is annotated `LLM`, not `Any`."""
    reached, untyped = [], []
    for path in _front_end_files():
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "scheduler":
                reached.append(f"{where}:{node.lineno} {ast.unparse(node)}")
            named: list[tuple[str, ast.expr | None, int]] = []
            if isinstance(node, ast.arg):
                named.append((node.arg, node.annotation, node.lineno))
            elif isinstance(node, ast.AnnAssign):
                named.append((ast.unparse(node.target), node.annotation, node.lineno))
            for name, ann, line in named:
                if name.rpartition(".")[2] == "llm":
                    shown = ast.unparse(ann) if ann is not None else "nothing"
                    if shown.strip("'\"") not in ("LLM", "LLM | None"):
                        untyped.append(f"{where}:{line} {name}: {shown}")
    assert not reached, reached
    assert not untyped, untyped


HELP_MODULES = 10  # hycache modules `hycache --help` may load (3 today: hycache, cli, cli.main)


def test_help_loads_no_sub_command() -> None:
    """`hycache --help` lists every sub-command from the registry, importing none of their
    modules (it loaded 62 hycache modules when each was imported up front)."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['hycache', '--help']\n"
        "try:\n    runpy.run_module('hycache', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('MODULES', *sorted(m for m in sys.modules if m.split('.')[0] == 'hycache'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    from hycache.cli.main import COMMANDS

    for c in COMMANDS:
        assert c.name in out and c.help in " ".join(out.split()), c.name
    loaded = out.rpartition("MODULES")[2].split()
    assert "hycache.cli.main" in loaded
    assert len(loaded) <= HELP_MODULES, loaded


def test_the_registry_help_is_each_sub_commands_own() -> None:
    """The one line `hycache --help` shows for a sub-command (the registry's) is the one its
    module registers when it defines the sub-command in full."""
    from hycache.cli.main import COMMANDS, make_parser

    full = next(
        a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    shown = {c.dest: c.help for c in full._choices_actions}
    assert shown == {c.name: c.help for c in COMMANDS}


# the functions of bench/ and cli/ that still return an untyped JSON object, other than the
# serialisation helpers (`to_json`, `*_json`, `line`): each a fragment of a document whose
# fields another package defines (the simulator's summaries, `bench serve`'s, the flags')
UNTYPED_RETURNS = {
    "bench/loadgen.py summarize",
    "bench/repeats.py ratio_spread",
    "bench/results.py caching_overhead",
    "cli/args.py namespace_values",  # keyword arguments, not a result
    "cli/args.py size_flags",
    "cli/simulate.py run_inputs",
}


def test_the_bench_returns_typed_results() -> None:
    """`hycache bench`'s rows, curve points, tables and the suite's result are dataclasses
    with a `to_json()`; a function returning `dict[str, Any]` (or the `Json` alias) in
    bench/ or cli/ is a serialisation helper or one of `UNTYPED_RETURNS` (29 were, before)."""
    found = set()
    for path in [*(ROOT / "bench").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]:
        where = path.relative_to(ROOT)
        if where.parts[:2] == ("bench", "vllm") or where.name == "bench_vllm.py":
            continue  # vLLM's harness: its own documents
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.returns is None:
                continue
            returns = ast.unparse(node.returns)
            untyped = "dict[str, Any]" in returns or re.search(r"\bJson\b", returns)
            if untyped and not (node.name.endswith("to_json") or node.name.endswith("_json")
                                or node.name == "line"):  # fmt: skip
                found.add(f"{where} {node.name}")
    assert found <= UNTYPED_RETURNS, sorted(found - UNTYPED_RETURNS)


# -- retention: one owner (issue 43, item 1) -------------------------------------------------

RETENTION = ROOT / "cache" / "retention"
# the admission rule's tuned constants: defined in `retention.rule`, read only by the package
RETENTION_CONSTANTS = {
    "ALWAYS_KEPT", "ADMIT_EXPLORE", "HELD_CHANCE", "DEMOTE_RATIO", "GHOST_FRACTION",
    "MAX_HINT_STATES", "HINT_POOL_FRACTION",
}  # fmt: skip


def _lines(path: Path, name: str) -> int:
    """Lines of the class or function `name` defined at the top of `path`'s module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            assert node.end_lineno is not None
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"{name} is not defined in {path}")


def test_the_cache_managers_stay_small() -> None:
    """The managers do their own verbs; retention decisions live in `hycache.cache.retention`."""
    manager = _lines(ROOT / "cache" / "manager.py", "CacheManager")
    assert manager < 300, f"CacheManager is {manager} lines"
    ssm = len((ROOT / "cache" / "ssm.py").read_text().splitlines())
    assert ssm < 220, f"hycache/cache/ssm.py is {ssm} lines"


def test_no_cache_function_is_over_80_lines() -> None:
    long = sorted(
        f"{p.relative_to(ROOT.parent)}:{n.name} ({n.end_lineno - n.lineno + 1})"
        for p in (ROOT / "cache").rglob("*.py")
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.FunctionDef) and n.end_lineno and n.end_lineno - n.lineno >= 80
    )
    assert not long, long


def test_a_keep_everything_policy_replaces_no_admission() -> None:
    """No code in the cache tests for a missing admission rule: `KeepEverything` is the
    policy that keeps every state."""
    found = sorted(
        str(p.relative_to(ROOT.parent))
        for p in (ROOT / "cache").rglob("*.py")
        if any(s in p.read_text() for s in ("admission is None", "admission = None"))
    )
    assert not found, found


def test_only_the_retention_package_reads_the_admission_constants() -> None:
    readers = sorted(
        f"{p.relative_to(ROOT.parent)}: {name}"
        for p in ROOT.rglob("*.py")
        if RETENTION not in p.parents
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom)
        for name in (a.name for a in node.names)
        if name in RETENTION_CONSTANTS
    )
    assert not readers, readers
    assert not (ROOT / "cache" / "admission.py").exists()  # one home: retention/rule.py
