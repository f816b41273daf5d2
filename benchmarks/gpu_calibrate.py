"""Calibrate the cost model on one H200 for a Bamba-9B-shaped model (random bf16 weights made
on the device; nothing is downloaded), and set the fit beside the `h200` preset's assumptions.

    .venv/bin/python benchmarks/gpu_calibrate.py --out out/h200-profile.json    # on the GPU
    .venv/bin/python benchmarks/gpu_calibrate.py --smoke --out /tmp/smoke.json  # CPU, tiny

It runs `hycache.bench.calibrate` (the same probes as `hycache calibrate`: prefill chunks at several
contexts, decode/verify batches with k drafts, mixed steps, block copies, state writes) with a
grid sized for the GPU (B=2208, u=64, so chunks of 2,208-8,832 tokens stay on the block grid;
contexts to 16k; batches to 32; k=3 as the simulated tables use), then reports per shape

* the measured step time (median of the repeats, CUDA-synchronised around `LLM.step()`);
* the roofline of the `h200` preset as it stands (compute_efficiency 0.6, bandwidth 0.8,
  1.5 ms per step, 0.2 ms per drafter pass: the numbers every simulated table uses);
* the roofline refitted to these timings (the GPU form: max of compute and memory per phase,
  no per-request term, K/V read once), its efficiencies beside the preset's, and the rms
  error of both on the fitted and the held-out shapes.

The profile it writes is accepted by `hycache simulate --gpu-config`. Budget: the model build
(~20 GB of bf16 on the device) takes well under a minute; the grid is sized for about three
minutes of probes on an H200 (the engine is a reference PyTorch implementation, not vLLM's
kernels, so its efficiencies are a floor for the preset's, not a replacement).
`--smoke` runs the same code on the CPU with the tiny model and the quick grids.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hycache.bench.calibrate import (
    CalibrateOptions,
    DecodeProbe,
    Grid,
    Measured,
    PrefillProbe,
    measure,
)
from hycache.config import CacheKnobs
from hycache.sim.fit import Fit, fit, predict, profile_dict, residuals
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.terms import resolve

GPU_GRID = Grid(
    prefill=(
        PrefillProbe(2208, (0, 8832), k=3),
        PrefillProbe(4416, (0, 8832), k=3),
        PrefillProbe(8832, (0,), k=3),
    ),
    decode=(
        DecodeProbe(4416, 3, (1, 8, 32), mixed=((8, 4416),)),
        DecodeProbe(16000, 3, (1, 16)),
        DecodeProbe(4416, 0, (8,)),
    ),
    copies=(8,),
    state_writes=(8,),
)
GPU_HELD_OUT = Grid(
    prefill=(PrefillProbe(6624, (0,), k=3),),
    decode=(DecodeProbe(8000, 3, (4, 24)),),
    copies=(),
    state_writes=(),
)


def bamba_9b_on_device(seed: int = 0) -> tuple[Any, Any]:
    """Bamba-9B's geometry (the `bamba-9b` simulator preset) with random bf16 weights drawn
    on the GPU (`HybridForCausalLM.random` draws float32 on the host: ~40 GB, too slow)."""
    import torch

    from hycache.model.bamba import BambaForCausalLM
    from hycache.model.configs.bamba import BambaConfig

    cfg = BambaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        attn_layer_indices=(9, 18, 27),
        mamba_n_heads=128,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        max_position_embeddings=65536,
    )
    model = BambaForCausalLM.empty(cfg, torch.bfloat16, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _fill(name, p, gen)
    return model, cfg


def _fill(name: str, p: Any, gen: Any) -> None:
    """The families `hycache.model.hybrid._random_init` draws, on the parameter's device."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    x = torch.empty(p.shape, device=p.device, dtype=torch.float32)
    if leaf == "A_log":
        x.uniform_(1.0, 16.0, generator=gen).log_()
    elif leaf == "dt_bias":
        dt = torch.exp(math.log(1e-3) + math.log(100.0) * x.uniform_(generator=gen))
        x = dt + torch.log(-torch.expm1(-dt))
    elif leaf == "D" or "norm" in name:
        x.normal_(1.0, 0.1, generator=gen)
    elif "conv1d" in name:
        x.normal_(0.0, 0.3 if leaf == "weight" else 0.05, generator=gen)
    else:
        x.normal_(0.0, 0.02, generator=gen)
    p.copy_(x)


def options(smoke: bool, repeats: int) -> tuple[CalibrateOptions, str, str]:
    """(options, model preset, GPU preset) for the GPU run or the CPU smoke run."""
    if smoke:
        return CalibrateOptions(quick=True, repeats=max(1, min(repeats, 2))), "tiny", "h200"
    opts = CalibrateOptions(
        model="bamba-9b",
        threads=1,
        repeats=repeats,
        knobs=CacheKnobs(2208, 64),
        dtype="bfloat16",
        device="cuda",
        cache_memory_gb=48.0,
        vocab=128256,
        grid=GPU_GRID,
        held_out=GPU_HELD_OUT,
        build=bamba_9b_on_device,
    )
    return opts, "bamba-9b", "h200"


def report(m: Measured, model_name: str, gpu_name: str, command: str) -> dict[str, Any]:
    """The preset's roofline and the refitted one on every shape, and the profile."""
    model = load_model_spec(model_name)
    preset = load_gpu(gpu_name)
    # fitted against the preset's datasheet peaks, so the efficiencies compare one to one
    gpu = replace(preset, name=f"{gpu_name}-calibrated", description=f"{m.gpu.description}")
    block = int(m.conditions.extra["block_size"])
    # the preset's terms, each unset one at its fallback
    assumed = Fit(**resolve(preset).terms())
    fitted = fit(m.fitted, model, gpu, block_size=block, overlap=True, seq_overhead=False,
                 kv_factor=False)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for part, samples in (("fitted", m.fitted), ("held-out", m.held_out)):
        for s in samples:
            rows.append(
                {
                    "grid": part,
                    "shape": s.label,
                    "measured_s": s.wall_s,
                    "preset_s": predict(s, assumed, model, gpu, block),
                    "refit_s": predict(s, fitted, model, gpu, block),
                }
            )
    doc = profile_dict(
        gpu, fitted, model=model_name, fitted=residuals(m.fitted, fitted, model, gpu, block),
        held_out=residuals(m.held_out, fitted, model, gpu, block), conditions=m.conditions,
        command=command,
    )  # fmt: skip
    doc["calibration"]["measured_peaks"] = {
        "peak_flops": m.gpu.peak_flops,
        "hbm_bandwidth": m.gpu.hbm_bandwidth,
    }
    doc["calibration"]["preset_beside_measured"] = rows
    doc["calibration"]["preset_assumed"] = {
        "compute_efficiency": assumed.compute_efficiency,
        "bandwidth_efficiency": assumed.bandwidth_efficiency,
        "step_overhead_s": assumed.step_overhead_s,
        "draft_pass_overhead_s": assumed.draft_pass_overhead_s,
    }
    return doc


def print_report(doc: dict[str, Any]) -> None:
    rows = doc["calibration"]["preset_beside_measured"]
    print(f"{'shape':48s} {'measured':>10s} {'preset':>10s} {'err':>7s} {'refit':>10s} {'err':>7s}")
    for r in rows:
        m, p, f = r["measured_s"], r["preset_s"], r["refit_s"]
        print(f"{r['grid'][:4]} {r['shape']:43s} {m * 1e3:9.2f}ms {p * 1e3:9.2f}ms "
              f"{p / m - 1:+7.1%} {f * 1e3:9.2f}ms {f / m - 1:+7.1%}")  # fmt: skip
    a = doc["calibration"]["preset_assumed"]
    print("\nparameter               preset      fitted")
    for key in ("compute_efficiency", "bandwidth_efficiency", "step_overhead_s",
                "draft_pass_overhead_s"):  # fmt: skip
        print(f"{key:22s} {a[key]:10.4g} {doc[key]:10.4g}")
    peaks = doc["calibration"]["measured_peaks"]
    print(f"measured peaks: {peaks['peak_flops']:.3g} FLOP/s, {peaks['hbm_bandwidth']:.3g} B/s "
          f"(preset {doc['peak_flops']:.3g}, {doc['hbm_bandwidth']:.3g})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, quick grids")
    args = p.parse_args(argv)
    opts, model_name, gpu_name = options(args.smoke, args.repeats)
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke on a CPU", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    m = measure(opts, lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}",
                                        file=sys.stderr, flush=True))  # fmt: skip
    command = "benchmarks/gpu_calibrate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = report(m, model_name, gpu_name, command)
    print_report(doc)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
