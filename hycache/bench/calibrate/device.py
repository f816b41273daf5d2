"""The device's peaks, measured: `measure_device` (peak FLOP/s from a matrix product, memory
bandwidth from a copy: the `peak_flops` and `hbm_bandwidth` of a profile).
"""

from __future__ import annotations

import os
import time

from hycache.sim.presets import GpuSpec


def measure_device(
    threads: int, device: str = "cpu", dtype: str = "float32", clock: str = "wall"
) -> GpuSpec:
    """Peak FLOP/s (a square matrix product in `dtype`: 1024 on a CPU, 8192 on a GPU; best of
    5) and memory bandwidth (a copy, read + written: 64 MiB on a CPU, 4 GiB on a GPU; best
    of 5) on `threads` torch threads, timed by `clock` (``"cpu"``: process CPU time, so
    that a machine shared with other work does not halve the peaks)."""
    import torch

    from hycache.engine.build import DTYPES

    torch.set_num_threads(threads)
    tick = time.process_time if clock == "cpu" and device == "cpu" else time.perf_counter
    gpu = device != "cpu"
    n = 8192 if gpu else 1024
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    best = float("inf")
    for _ in range(6):
        t0 = tick()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, tick() - t0)
    flops = 2.0 * n**3 / best
    src = torch.empty((1 << 30) if gpu else (16 << 20), device=device)  # float32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        t0 = tick()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, tick() - t0)
    bandwidth = 2.0 * src.numel() * 4 / best
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return GpuSpec(
        name=f"{device}-{threads}t",
        peak_flops=flops,
        hbm_bandwidth=bandwidth,
        memory_bytes=memory,
        description=f"{device}, {threads} torch thread(s), measured by hycache calibrate",
        source=f"peak_flops: a {n}^3 {dtype} matmul; hbm_bandwidth: a "
        f"{src.numel() * 4 >> 20} MiB copy (best of 5)",
    )
