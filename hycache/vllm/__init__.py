"""hycache and vLLM: vLLM 0.33's real scheduler as the reference (`reference`), and hycache's
`limit` policy as a vLLM scheduler class (`scheduler`): `--scheduler-cls hycache.vllm.Scheduler`.

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
