"""The vLLM plugin, and only it: hycache's `limit` policy as a vLLM scheduler class
(`scheduler`, with the KV cache managers it re-classes in `managers`): `--scheduler-cls
hycache.vllm.Scheduler`. Every vLLM internal they use is named in `compat`, per release,
beside the names `hycache.vllm_cpu` replaces (the general plugin vLLM loads in its engine
processes on CPU: a package of its own). The harness on vLLM's real scheduler (reference,
scenarios, `explain --backend vllm`) is hycache.bench.vllm.

`Scheduler` and `SyncScheduler` are imported on first use, so `import hycache` (and this
package) never needs vllm. `guard.RequestGuard` is the front door `vllm serve --middleware`
loads before a request reaches vLLM (it imports no vLLM either).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Scheduler", "SyncScheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hycache.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'hycache.vllm' has no attribute {name!r}")
