"""The measuring phase: `measure` (the device, then both grids, on the options' torch
threads, with the conditions they ran under), what it returns (`Measured`, which fits and
prices itself), and the drafter's per-draft `acceptance_rate` from the tokens per verify step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from hycache.bench.calibrate.device import measure_device
from hycache.bench.calibrate.options import CalibrateOptions, Progress
from hycache.bench.calibrate.probes import measure_grids
from hycache.sim.fit import Conditions, Fit, Residual, Sample, fit, residuals
from hycache.sim.model_spec import ModelSpec
from hycache.sim.presets import GpuSpec


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def acceptance_rate(k: int, tokens_per_step: float) -> float:
    """The per-draft acceptance `p` (drafts accepted in a row, as the simulator draws them)
    whose expected tokens per verify step, 1 + p + ... + p^k, is `tokens_per_step`."""
    target = tokens_per_step - 1.0
    if target <= 0:
        return 0.0
    if target >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class Measured:
    """What `measure` timed: the device, the fitted and held-out shapes, and where."""

    gpu: GpuSpec
    fitted: list[Sample]
    held_out: list[Sample]
    conditions: Conditions

    @property
    def block_size(self) -> int:
        return int(self.conditions.extra["block_size"])

    @property
    def clock(self) -> str:
        return str(self.conditions.extra.get("clock", "wall"))

    def fit(self, model: ModelSpec, more: Sequence[Sample] = ()) -> Fit:
        """The fitted shapes (and `more` samples) fitted at these probes' block size and
        clock; the engine pads decode/verify attention to the step's longest context
        (model/layers.py)."""
        samples = [*self.fitted, *more]
        return fit(samples, model, self.gpu, block_size=self.block_size, clock=self.clock,
                   padded=True)  # fmt: skip

    def residuals(self, samples: Sequence[Sample], values: Fit, model: ModelSpec) -> list[Residual]:
        """`samples` priced by `values` on these probes' block size and clock."""
        return residuals(samples, values, model, self.gpu, self.block_size, self.clock)


def measure(o: CalibrateOptions, progress: Progress) -> Measured:
    """Measure the device and both grids (on `o.threads` torch threads)."""
    import torch

    if o.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {o.repeats}")
    if o.decode_repeats < 1:
        raise ValueError(f"decode_repeats must be >= 1, got {o.decode_repeats}")
    if o.threads < 1:
        raise ValueError(f"threads must be >= 1, got {o.threads}")
    fit_grid, held_grid = o.grids()
    t0, c0 = time.perf_counter(), time.process_time()
    load0 = os.getloadavg()[0]
    with _threads(o.threads), torch.inference_mode():
        progress("measuring the device")
        dtype = "bfloat16" if o.device != "cpu" else "float32"
        gpu = measure_device(o.threads, o.device, dtype, o.clock)
        accepted: dict[int, list[int]] = {}
        fitted, held = measure_grids(o, fit_grid, held_grid, progress, accepted)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    cond = Conditions(
        device=o.device,
        threads=o.threads,
        dtype=o.dtype,
        torch_version=str(torch.__version__),
        load_before=load0,
        load_after=os.getloadavg()[0],
        cpu_over_wall=cpu / wall if wall else 0.0,
        wall_s=wall,
        extra={
            "block_size": o.run_knobs.block_size,
            "prefix_match_unit": o.knobs.prefix_match_unit,
            "repeats": o.repeats,
            "decode_repeats": o.repeats * o.decode_repeats,
            "cores": os.cpu_count() or 0,
            "clock": o.clock,
            # per k: the per-draft acceptance of the engine's drafter on the probes' random
            # prompts (what `--acceptance-rate` should be to simulate this engine)
            "acceptance_rate": {
                str(k): acceptance_rate(k, tokens / steps)
                for k, (tokens, steps) in accepted.items()
            },
        },
    )
    return Measured(gpu, fitted, held, cond)
