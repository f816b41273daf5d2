"""The CPU engine keeps freed host memory: large per-step temporaries stop faulting in fresh
pages (`hycache.engine.host_memory`). Each case runs in a fresh interpreter, since malloc's
settings are per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# allocations of a 48 MiB tensor, each written whole (what a decode step's K/V gather does):
# 10 to settle malloc's free lists, then 10 counted
PROBE = """
import json, resource, sys
import torch
from hycache.engine.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "1" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def allocate(n):
    for _ in range(n):
        x = torch.empty(12 << 20)  # float32: 48 MiB
        x.fill_(1.0)
        del x
allocate(10)  # the heap grows and its free chunks settle
before = faults()
allocate(10)
print(json.dumps({"applied": applied, "faults": faults() - before}))
"""

PAGES_PER_ALLOCATION = (48 << 20) // 4096


def _probe(apply: bool, env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "1" if apply else "0"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "HYCACHE_KEEP_HOST_MEMORY": "1", **(env or {})},
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_freed_temporaries_are_reused_not_faulted_in_again() -> None:
    plain = _probe(False)
    kept = _probe(True)
    assert kept["applied"] is True
    # without it, every allocation is a fresh mapping: each page faults (and is zeroed) again
    assert int(plain["faults"]) >= 9 * PAGES_PER_ALLOCATION  # type: ignore[call-overload]
    # with it, the heap serves them again: less than one allocation's pages in all
    assert int(kept["faults"]) < PAGES_PER_ALLOCATION  # type: ignore[call-overload]


def test_the_environment_switch_turns_it_off() -> None:
    assert _probe(True, {"HYCACHE_KEEP_HOST_MEMORY": "0"})["applied"] is False
