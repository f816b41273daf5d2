"""hycache and vLLM: vLLM's real scheduler (0.33 or 0.34) as the reference (`reference`), and
hycache's `limit` policy as a vLLM scheduler class (`scheduler`): `--scheduler-cls
hycache.vllm.Scheduler`. Every vLLM internal they use is named in `compat`, per release.

`Scheduler` and `SyncScheduler` are imported on first use, so `import hycache` (and this
package) never needs vllm.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Scheduler", "SyncScheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hycache.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'hycache.vllm' has no attribute {name!r}")
