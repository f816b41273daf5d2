"""`hycache calibrate`: time the real engine over a grid of step shapes and fit the simulator's
cost model to it (the fit itself, torch-free, is `hycache.sim.fit`).

The device is measured first: a large float32 matrix product gives its peak FLOP rate and a
large tensor copy its memory bandwidth (the `peak_flops` and `hbm_bandwidth` of the profile,
so the fitted efficiencies are fractions of what this device does at its best). Then the
engine runs small workloads built so that their steps take known shapes, and each step is
timed around `LLM.step()` (scheduler, runner and sampler: what a simulated step stands for),
its work read from the step's schedule (`LLM.add_step_observer`) exactly as the simulator
describes a step:

* prefill chunks: one request at a time, `max_num_batched_tokens` = the chunk, prefix caching
  off; a long prompt gives chunks at growing contexts;
* decode (verify) steps: the largest batch's requests prefill a context of their own each
  (no shared blocks, as in a real batch), then decode together with `k` drafts (k = 0: no
  drafter); aborting requests shrinks the batch to each smaller size;
* mixed steps: while a batch decodes, a fresh request's prefill chunk joins each step, or
  (`turns`) a few next turns do, each a short chunk over its cached history;
* block copies and SSM state writes, timed alone on the runner's caches.

Each shape is repeated; its time is the median, with the process CPU time and the load
average beside it. Shapes in `held_out` are measured the same way but never shown to the fit.

The phases, a module each: `options` (the probes, the grids, `CalibrateOptions`), `device`
(the peaks), `probes` (timing the steps), `measure` (both grids and the conditions:
`Measured`), `fitting` (pooling rounds, the fit, the profile; `calibrate`).
"""

from hycache.bench.calibrate.device import measure_device
from hycache.bench.calibrate.fitting import calibrate, pool, profile_from
from hycache.bench.calibrate.measure import Measured, acceptance_rate, measure
from hycache.bench.calibrate.options import (
    FIT_GRID,
    HELD_OUT_GRID,
    QUICK_FIT,
    QUICK_HELD_OUT,
    VOCAB,
    CalibrateOptions,
    DecodeProbe,
    Grid,
    PrefillProbe,
    Progress,
)
from hycache.bench.calibrate.probes import measure_grids

__all__ = [
    "FIT_GRID",
    "HELD_OUT_GRID",
    "QUICK_FIT",
    "QUICK_HELD_OUT",
    "VOCAB",
    "CalibrateOptions",
    "DecodeProbe",
    "Grid",
    "Measured",
    "PrefillProbe",
    "Progress",
    "acceptance_rate",
    "calibrate",
    "measure",
    "measure_device",
    "measure_grids",
    "pool",
    "profile_from",
]
