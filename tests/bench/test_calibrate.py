"""`hycache calibrate`'s fit, profile and validation arithmetic (hycache.sim.fit,
hycache.bench.calibrate, hycache.bench.validate); timings themselves are never asserted here."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hycache.bench.steps import STEP_KINDS
from hycache.bench.validate import RunMetrics, compare, misses
from hycache.config import CacheKnobs
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.fit import (
    Conditions,
    CopyFit,
    Fit,
    Sample,
    fit,
    fit_copies,
    predict,
    profile_dict,
    residuals,
)
from hycache.sim.presets import GpuSpec, load_gpu, load_model_spec

MODEL = load_model_spec("tiny")
CPU = GpuSpec(name="cpu-test", peak_flops=1e11, hbm_bandwidth=1.5e10, memory_bytes=1 << 34)
B = 552


def _shapes() -> list[tuple[str, StepWork, int]]:
    """A grid like the real one: prefill chunks, decode batches with k drafts, mixed."""
    out: list[tuple[str, StepWork, int]] = []
    for n, c in ((552, 0), (1104, 0), (1104, 4416), (2208, 2208), (4416, 0)):
        out.append((f"prefill {n} {c}", StepWork((SeqWork(n, c, 0, True),)), 2))
    for k in (0, 1, 2, 3):
        for b, c in ((1, 512), (4, 2048), (8, 8000)):
            seq = SeqWork(1 + k, c, k, False)
            out.append((f"decode {b} {c} k={k}", StepWork((seq,) * b), k))
    mixed = (SeqWork(3, 4000, 2, False),) * 4 + (SeqWork(1104, 0, 0, True),)
    out.append(("mixed", StepWork(mixed), 2))
    for b, c in ((4, 4000), (8, 8000)):  # siblings: all but the first read a warm prefix
        seqs = (SeqWork(3, c, 2, False),) + (SeqWork(3, c, 2, False, 0, c - 8),) * (b - 1)
        out.append((f"siblings {b} {c}", StepWork(seqs), 2))
    return out


def _synthetic(truth: Fit) -> list[Sample]:
    return [
        Sample(label, work, k, truth.cost_model(MODEL, CPU, k, block_size=B).step_time(work))
        for label, work, k in _shapes()
    ]


def test_fit_recovers_known_parameters_compute_plus_memory() -> None:
    truth = Fit(0.45, 0.6, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=5.0, phase_overlap=False)
    got = fit(_synthetic(truth), MODEL, CPU, block_size=B)
    assert got.phase_overlap is False
    for name in (
        "compute_efficiency",
        "bandwidth_efficiency",
        "step_overhead_s",
        "draft_pass_overhead_s",
        "seq_overhead_s",
        "kv_bytes_factor",
    ):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-3), name


def test_fit_recovers_known_parameters_roofline() -> None:
    truth = Fit(0.3, 0.5, 3e-3, 5e-4)
    samples = _synthetic(truth)
    got = fit(samples, MODEL, CPU, block_size=B, overlap=True, seq_overhead=False, kv_factor=False)
    assert got.phase_overlap is True
    for r in residuals(samples, got, MODEL, CPU, B):
        assert abs(r.error) < 0.01, r
    assert got.compute_efficiency == pytest.approx(0.3, rel=0.03)
    assert got.step_overhead_s == pytest.approx(3e-3, rel=0.05)


def test_copy_samples_alone_are_not_a_fit() -> None:
    copies = Sample("copies", StepWork((), num_block_copies=4), 2, 1.0, kind="copies")
    with pytest.raises(ValueError, match="no whole-step samples"):
        fit([copies], MODEL, CPU, block_size=B)
    truth = Fit(0.45, 0.6, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=5.0, phase_overlap=False)
    a = fit(_synthetic(truth), MODEL, CPU, block_size=B)
    assert a.copy_efficiency is None and a.state_copy_efficiency is None


def _copy_probes(truth: Fit) -> list[Sample]:
    """Block copies and state writes timed alone, as `hycache calibrate` times them."""
    out = []
    for kind in ("copies", "state_writes"):
        for n in (4, 32):
            s = Sample(f"{kind} {n}", StepWork((), num_block_copies=n), 2, 1.0, kind=kind)
            t = predict(s, truth, MODEL, CPU, B)
            out.append(Sample(s.label, s.work, 2, t, kind=kind))
    return out


def test_fit_recovers_copy_efficiencies_and_holds_them_in_the_step_fit() -> None:
    # state copies far faster than the forward's bandwidth: the CPU engine's case
    truth = Fit(0.45, 0.1, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=2.0, phase_overlap=False,
                copy_efficiency=0.3, state_copy_efficiency=0.9)  # fmt: skip
    samples = [*_synthetic(truth), *_copy_probes(truth)]
    got = fit(samples, MODEL, CPU, block_size=B)
    # with the state traffic priced apart, the weight bytes a step reads are the same every
    # step, like its overhead: only their sum is identified, so the predictions are compared
    for name in ("compute_efficiency", "copy_efficiency", "state_copy_efficiency"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    for r in residuals(samples, got, MODEL, CPU, B):
        assert abs(r.error) < 1e-3, r
    assert fit_copies(_synthetic(truth), MODEL, CPU, block_size=B) == CopyFit()


def test_state_traffic_and_copies_cost_at_their_own_efficiency() -> None:
    work = StepWork((SeqWork(552, 552, 0, True, num_state_writes=3),), num_block_copies=2)
    base = CostModel(MODEL, CPU, bandwidth_efficiency=0.2, speculative=False,
                     num_speculative_tokens=0, block_size=B, phase_overlap=False)  # fmt: skip
    assert base.copy_efficiency == base.state_copy_efficiency == 0.2
    fast = CostModel(MODEL, CPU, bandwidth_efficiency=0.2, speculative=False,
                     num_speculative_tokens=0, block_size=B, phase_overlap=False,
                     copy_efficiency=0.4, state_copy_efficiency=0.8)  # fmt: skip
    state = (1 + 1 + 3) * MODEL.ssm_state_bytes  # read, final write, 3 checkpoints
    copies = 2.0 * 2 * base.copy_bytes()
    saved = state / CPU.hbm_bandwidth * (1 / 0.2 - 1 / 0.8)
    saved += copies / CPU.hbm_bandwidth * (1 / 0.2 - 1 / 0.4)
    assert base.step_time(work) - fast.step_time(work) == pytest.approx(saved, rel=1e-9)
    with pytest.raises(ValueError, match="state_copy_efficiency"):
        CostModel(MODEL, CPU, speculative=False, num_speculative_tokens=0,
                  state_copy_efficiency=1.5)  # fmt: skip


def test_sample_clock() -> None:
    s = Sample("x", StepWork((SeqWork(1, 0, 0, False),)), 0, 2.0, cpu_s=1.5)
    assert s.measured("wall") == 2.0 and s.measured("cpu") == 1.5
    with pytest.raises(ValueError):
        s.measured("gpu")
    with pytest.raises(ValueError):
        Sample("x", StepWork(()), 0, 0.0)


def test_defaults_keep_todays_step_times() -> None:
    gpu = load_gpu("h200")
    model = load_model_spec("bamba-9b")
    work = StepWork((SeqWork(3, 60_000, 2, False),) * 8 + (SeqWork(4096, 0, 0, True),), 2)
    a = CostModel(model, gpu, speculative=True, num_speculative_tokens=3, block_size=4416)
    b = CostModel(
        model, gpu, speculative=True, num_speculative_tokens=3, block_size=4416,
        seq_overhead_s=0.0, kv_bytes_factor=1.0, phase_overlap=True, draft_pass_overhead_s=2e-4,
    )  # fmt: skip
    assert a.step_time(work) == b.step_time(work)
    assert a.seq_overhead_s == 0.0 and a.kv_bytes_factor == 1.0 and a.phase_overlap
    assert a.copy_efficiency == a.state_copy_efficiency == a.bandwidth_efficiency
    assert a.decode_kv_bytes_factor == a.kv_bytes_factor and a.decode_state_rewrites == 0.0


def test_decode_kv_and_state_rewrites_charge_decoding_requests_only() -> None:
    kw = {"speculative": True, "num_speculative_tokens": 2, "block_size": B,
          "phase_overlap": False, "state_copy_efficiency": 0.5}  # fmt: skip
    base = CostModel(MODEL, CPU, **kw)
    prefill = StepWork((SeqWork(552, 1104, 0, True),))
    decode = StepWork((SeqWork(3, 2000, 2, False),) * 4)
    heavy = CostModel(MODEL, CPU, decode_kv_bytes_factor=3.0, decode_state_rewrites=2.0, **kw)
    assert heavy.step_time(prefill) == base.step_time(prefill)
    # K/V: the target's attention layers read context + 3 new rows, the drafter's first pass
    # the same, its second pass context + 3 + 1 (one more position); each 2 more times
    per_token = MODEL.kv_bytes_per_token_per_layer
    rows = MODEL.layers.attention * 2003 + MODEL.drafter.num_layers * (2003 + 2004)
    kv = 4 * 2.0 * per_token * rows / (CPU.hbm_bandwidth * base.bandwidth_efficiency)
    # states: 3 verified positions x 2 rewrites x (a read and a write), per request
    states = 4 * 3 * 2.0 * 2 * MODEL.ssm_state_bytes / (CPU.hbm_bandwidth * 0.5)
    assert heavy.step_time(decode) - base.step_time(decode) == pytest.approx(kv + states)
    with pytest.raises(ValueError, match="decode_state_rewrites"):
        CostModel(MODEL, CPU, decode_state_rewrites=-1.0, **kw)
    with pytest.raises(ValueError, match="decode_kv_bytes_factor"):
        CostModel(MODEL, CPU, decode_kv_bytes_factor=0.0, **kw)


def test_fit_recovers_the_decode_terms() -> None:
    """Decoding requests' K/V at factors of their own (own context; context shared with a
    request read before) and SSM state rewrites per decoded token (the CPU engine's decode
    costs) are told apart from the K/V factor and the per-request overhead, and predicted
    exactly."""
    truth = Fit(0.45, 0.3, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=2.0, phase_overlap=False,
                copy_efficiency=0.3, state_copy_efficiency=0.9, decode_kv_bytes_factor=9.0,
                warm_kv_bytes_factor=3.0, decode_state_rewrites=3.0)  # fmt: skip
    samples = [*_synthetic(truth), *_copy_probes(truth)]
    got = fit(samples, MODEL, CPU, block_size=B)
    # a step's weight bytes are constant, like its overhead: only each K/V factor over the
    # bandwidth efficiency is identified, so their ratio is what the fit must recover
    assert got.decode_kv_bytes_factor is not None
    assert got.decode_kv_bytes_factor / got.kv_bytes_factor == pytest.approx(4.5, rel=1e-3)
    assert got.warm_kv_bytes_factor is not None
    assert got.warm_kv_bytes_factor / got.kv_bytes_factor == pytest.approx(1.5, rel=1e-3)
    assert got.decode_state_rewrites == pytest.approx(3.0, rel=1e-3)
    for r in residuals(samples, got, MODEL, CPU, B):
        assert abs(r.error) < 1e-3, r
    # without the decode terms the same samples cannot be fitted
    plain = fit(samples, MODEL, CPU, block_size=B, decode_kv=False, state_rewrites=False)
    assert plain.decode_kv_bytes_factor is None and plain.decode_state_rewrites is None
    assert plain.warm_kv_bytes_factor is None
    assert max(abs(r.error) for r in residuals(samples, plain, MODEL, CPU, B)) > 0.01


def _measured(scale: float, rate: float) -> Any:
    from hycache.bench.calibrate import Measured

    work = StepWork((SeqWork(3, 512, 2, False),))
    gpu = replace(CPU, peak_flops=CPU.peak_flops * scale)
    cond = Conditions("cpu", 1, "float32", "x", 0.1, 0.2 * scale, 1.0, 60.0,
                      {"clock": "wall", "repeats": 3, "acceptance_rate": {"2": rate}})  # fmt: skip
    return Measured(
        gpu,
        [Sample("decode", work, 2, 0.010 * scale, cpu_s=0.009 * scale, repeats=3)],
        [Sample("held", work, 2, 0.020 * scale, repeats=3)],
        cond,
    )


def test_pooled_rounds_take_each_shapes_median() -> None:
    from hycache.bench.calibrate import pool

    got = pool([_measured(1.0, 0.1), _measured(3.0, 0.3), _measured(2.0, 0.2)])
    (decode,) = got.fitted
    assert decode.wall_s == pytest.approx(0.020) and decode.cpu_s == pytest.approx(0.018)
    assert decode.repeats == 9 and decode.spread == pytest.approx((0.030 - 0.010) / 0.020)
    assert got.held_out[0].wall_s == pytest.approx(0.040)
    assert got.gpu.peak_flops == pytest.approx(2.0 * CPU.peak_flops)
    assert got.conditions.extra["rounds"] == 3 and got.conditions.extra["repeats"] == 9
    assert got.conditions.extra["acceptance_rate"] == {"2": pytest.approx(0.2)}
    assert got.conditions.load_after == pytest.approx(0.4)  # the last round's
    assert got.conditions.wall_s == pytest.approx(180.0)
    with pytest.raises(ValueError, match="no rounds"):
        pool([])


def _profile(tmp_path: Path) -> Path:
    truth = Fit(0.45, 0.6, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=5.0, phase_overlap=False)
    samples = _synthetic(truth)
    got = fit(samples, MODEL, CPU, block_size=B)
    rows = residuals(samples, got, MODEL, CPU, B)
    cond = Conditions("cpu", 1, "float32", "x", 0.1, 0.2, 0.99, 60.0, {"clock": "wall"})
    doc = profile_dict(
        CPU, got, model="tiny", fitted=rows, held_out=rows[:2], conditions=cond, command="t"
    )
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    return path


def test_profile_round_trips_and_drives_the_cost_model(tmp_path: Path) -> None:
    path = _profile(tmp_path)
    gpu = load_gpu(path)
    assert gpu.fitted_on == "tiny" and gpu.phase_overlap is False
    assert gpu.calibration is not None and len(gpu.calibration["residuals"]) == len(_shapes())
    cost = CostModel(MODEL, gpu, speculative=True, num_speculative_tokens=2, block_size=B,
                     pool_layout="separate")  # fmt: skip
    doc = json.loads(path.read_text())
    assert cost.seq_overhead_s == doc["seq_overhead_s"]
    assert cost.kv_bytes_factor == doc["kv_bytes_factor"]
    for r in doc["residuals"]:
        assert abs(r["error"]) < 1e-3


def test_profile_bad_calibration_fields_are_refused(tmp_path: Path) -> None:
    doc = json.loads(_profile(tmp_path).read_text())
    doc["residuals"] = "no"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="residuals"):
        load_gpu(bad)


def test_simulate_accepts_the_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hycache.cli.main import main

    path = _profile(tmp_path)
    rc = main(
        ["simulate", "--gpu-config", str(path), "--model-config", "tiny", "--num-requests", "3",
         "--shared-prefix-tokens", "200", "--suffix-tokens", "40", "--output-tokens", "4",
         "--block-size", "64", "--prefix-match-unit", "8", "--num-speculative-tokens", "2",
         "--compare", "lookahead,limit", "--json", str(tmp_path / "s.json")]
    )  # fmt: skip
    assert rc == 0
    out = json.loads((tmp_path / "s.json").read_text())
    assert out["policies"]["limit"]["output_tokens_per_s"] > 0


def test_compare_errors_and_ratio() -> None:
    measured = {
        "lookahead": _m(20.0, 2.0, 4.0, 0.5),
        "limit": _m(25.0, 1.0, 3.0, 0.6),
    }
    predicted = {
        "lookahead": _m(22.0, 1.8, 4.0, 0.5),
        "limit": _m(26.0, 1.5, 3.0, 0.6),
    }
    c = compare(measured, predicted)
    assert c.metrics["lookahead"]["output_tokens_per_s"].error == pytest.approx(0.10)
    assert c.metrics["lookahead"]["ttft_p50_s"].error == pytest.approx(-0.10)
    assert c.metrics["limit"]["ttft_p50_s"].error == pytest.approx(0.5)
    assert c.ratio is not None and c.ratio.measured == pytest.approx(1.25)
    assert c.ratio.predicted == pytest.approx(26 / 22)
    assert c.ratio.error_pp == pytest.approx(100 * (26 / 22 - 1.25))
    assert c.to_json()["ratio"]["error_pp"] == c.ratio.error_pp
    assert c.to_json()["limit"]["ttft_p50_s"] == {"measured": 1.0, "predicted": 1.5, "error": 0.5}
    miss = misses({"w": c})
    assert any("limit ttft_p50_s" in m for m in miss)
    assert any("limit/lookahead" in m for m in miss)  # -6.8 pp
    assert not any("lookahead output" in m for m in miss)  # exactly 10%: inside


def test_acceptance_rate_inverts_tokens_per_step() -> None:
    from hycache.bench.calibrate import acceptance_rate

    assert acceptance_rate(2, 1.0) == 0.0
    assert acceptance_rate(2, 3.0) == 1.0
    p = acceptance_rate(3, 1 + 0.5 + 0.25 + 0.125)
    assert p == pytest.approx(0.5, abs=1e-9)


def _tiny_calibration() -> Any:
    """The smallest calibration grid (one thread, one repeat: a few seconds): every kind of
    probe, and one held-out shape."""
    from hycache.bench.calibrate import CalibrateOptions, DecodeProbe, Grid, PrefillProbe

    grid = Grid(
        prefill=(PrefillProbe(64, (0, 64)),),
        decode=(DecodeProbe(64, 2, (1, 2), mixed=((1, 64),), turns=((2, 2, 16),)),),
        copies=(2,),
        state_writes=(2,),
    )
    held = Grid(prefill=(PrefillProbe(128, (0,)),), decode=(), copies=(), state_writes=())
    return CalibrateOptions(
        repeats=1,
        knobs=CacheKnobs(64, 8),
        grid=grid,
        held_out=held,
        cache_memory_gb=0.05,
        clock="cpu",
    )


def test_a_tiny_calibrate_run_produces_residuals() -> None:
    """The engine side on the smallest grid."""
    from hycache.bench.calibrate import calibrate

    opts = _tiny_calibration()
    messages: list[str] = []
    profile = calibrate(opts, messages.append, command="test")
    # the held-out shape is measured in the middle of the fitted ones, not after them all
    probes = [m for m in messages if m.startswith(("fitted ", "held out "))]
    assert probes == [
        "fitted 1/4: prefill chunks of 64 (k=2)",
        "fitted 2/4: decode at 64 (k=2, batches (1, 2))",
        "held out 1/1: prefill chunks of 128 (k=2)",
        "fitted 3/4: block copies",
        "fitted 4/4: state writes",
    ]
    shapes = {r.shape for r in profile.residuals}
    assert {"prefill n=64 c=0 k=2", "prefill n=64 c=64 k=2", "decode b=1 c=64 k=2"} <= shapes
    assert any(s.startswith("mixed b=1") for s in shapes)
    (turns,) = (r for r in profile.residuals if r.shape == "turns b=2 c=64 + 2x16 k=2")
    assert turns.requests == 4  # two decoding, two next turns in one step
    assert {r.kind for r in profile.residuals} == {"step", "copies", "state_writes"}
    assert [r.shape for r in profile.held_out] == ["prefill n=128 c=0 k=2"]
    for r in profile.residuals + profile.held_out:
        assert r.measured_s > 0 and r.predicted_s > 0
    assert profile.clock == "cpu"
    doc = profile.to_json()
    assert doc["model"] == "tiny" and doc["calibration"]["extra"]["clock"] == "cpu"
    assert doc["calibration"]["extra"]["acceptance_rate"]["2"] >= 0.0
    from hycache.sim.presets import gpu_from_dict

    assert gpu_from_dict(doc).fitted_on == "tiny"


def test_gpu_script_smoke(tmp_path: Path) -> None:
    """benchmarks/gpu_calibrate.py --smoke: the GPU script's code path on the CPU."""
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "gpu_calibrate.py"
    spec = importlib.util.spec_from_file_location("gpu_calibrate", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "smoke.json"
    assert mod.main(["--smoke", "--repeats", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["calibration"]["preset_beside_measured"]
    assert rows and all(r["preset_s"] > 0 and r["refit_s"] > 0 for r in rows)
    assert load_gpu(out).phase_overlap is True


def test_padded_decode_attention_reads_the_longest_context() -> None:
    gpu = load_gpu("h200")
    mixed = StepWork((SeqWork(3, 100, 2, False), SeqWork(3, 1000, 2, False),
                      SeqWork(64, 5000, 0, True)))  # fmt: skip
    even = StepWork((SeqWork(3, 1000, 2, False), SeqWork(3, 1000, 2, False),
                     SeqWork(64, 5000, 0, True)))  # fmt: skip
    kw = {"speculative": True, "num_speculative_tokens": 2, "block_size": 64}
    padded = CostModel(MODEL, gpu, padded_decode_attention=True, **kw)
    plain = CostModel(MODEL, gpu, **kw)
    assert padded.breakdown(mixed)["bytes"] == plain.breakdown(even)["bytes"]
    assert padded.breakdown(mixed)["flops"] == plain.breakdown(even)["flops"]
    assert plain.breakdown(mixed)["bytes"] < plain.breakdown(even)["bytes"]


def test_validate_recalibrates_between_the_engine_runs(tmp_path: Path) -> None:
    """`hycache bench --validate PROFILE --recalibrate` on smoke sizes: a calibration round
    before each engine repeat, pooled into the profile it then predicts with; the simulator's
    hit rates equal the engine's (the same scheduler and cache on both sides). Each workload
    is predicted with the probes and the other workload's runs fitted, the probes alone
    beside it; the raw rounds and steps are pickled."""
    import pickle

    from hycache.bench.validate import ValidateOptions, validate

    cal = _tiny_calibration()
    path = tmp_path / "profile.json"
    opts = ValidateOptions(
        profile=str(path), quick=True, repeats=2, workloads=("family", "multi-turn"),
        isolate=False, raw=str(tmp_path / "raw.pkl"),
    )  # fmt: skip
    messages: list[str] = []
    doc = validate(opts, messages.append, recalibrate=cal)
    rounds = [m for m in messages if m.startswith("calibration round")]
    assert rounds == [f"calibration round {i}/2 (this process)" for i in (1, 2)]
    first_run = messages.index(
        "family · engine · lookahead + limit in turn · repeat 1/2 (this process)"
    )
    assert messages.index(rounds[0]) < first_run < messages.index(rounds[1])
    profile = json.loads(path.read_text())
    assert profile["calibration"]["extra"]["rounds"] == 2
    assert profile["calibration"]["extra"]["repeats"] == 2
    assert doc.profile is not None and doc.profile.to_json() == profile
    assert doc.inputs.recalibrated is True and doc.inputs.clock == "cpu"
    family = doc.workloads["family"]
    c = family.comparison.metrics
    for p in ("lookahead", "limit"):
        hits = c[p]["token_hit_rate"]
        assert hits.measured == hits.predicted > 0
        # the engine's steps, priced: every step of a run is in one kind, and the kinds and
        # the loop between them add up to the run's time
        att = family.prediction.steps[p]
        kinds = att.kinds
        assert {"prefill", "decode", "all steps"} <= kinds.keys()
        total = kinds["all steps"]
        assert total.measured_s == pytest.approx(
            sum(v.measured_s for k, v in kinds.items() if k in STEP_KINDS)
        )
        assert 0 <= att.outside_steps_s < total.measured_s
        assert total.predicted_s > 0
        # the simulator replays the engine's drafts; drawn at the rate, beside it
        at_rate = family.prediction.at_rate
        assert at_rate is not None
        assert at_rate.comparison.metrics[p]["token_hit_rate"].measured == hits.measured
        assert doc.inputs.acceptance == "replay"
        assert doc.inputs.drafts_accepted["family"][p] >= 0
        # TTFT p50 on the engine's own schedule: timed steps a little under the TTFT
        ttft = family.prediction.ttft_steps[p]
        assert 0 < ttft.measured_s <= c[p]["ttft_p50_s"].measured
        assert ttft.predicted_s > 0
    assert doc.inputs.cross_fitted is True
    for name, other in (("family", "multi-turn"), ("multi-turn", "family")):
        part = doc.workloads[name]
        assert part.cross_fit is not None and part.probes_only is not None
        assert part.cross_fit.fitted_on == ("calibration probes", other)
        assert {r.shape.split(" · ")[0] for r in part.cross_fit.engine_steps} == {other}
        assert {r.shape.split(" · ")[0] for r in part.cross_fit.own_steps} == {name}
        before = part.probes_only.comparison
        limit_hits = part.comparison.metrics["limit"]["token_hit_rate"]
        assert before.metrics["limit"]["token_hit_rate"] == limit_hits
        # the measured side is the same; the measured ratio pairs each repeat's two runs
        r = part.comparison.ratio
        assert r is not None and before.ratio is not None
        assert r.paired is True and r.measured == before.ratio.measured
    # the --json document: the same figures, by key
    js = json.loads(json.dumps(doc.to_json()))
    assert list(js) == ["workloads", "inputs", "wall_s", "misses"]
    assert list(js["workloads"]["family"]) == ["measured", "predicted", "steps", "ttft_steps",
                                               "comparison", "at_rate", "probes_only",
                                               "cross_fit", "size"]  # fmt: skip
    assert js["workloads"]["family"]["comparison"]["ratio"]["paired"] is True
    assert js["inputs"]["cross_fitted"] is True and js["misses"] == doc.misses()
    raw = pickle.loads((tmp_path / "raw.pkl").read_bytes())
    assert len(raw["rounds"]) == 2 and len(raw["steps"]["family"]["limit"]) == 2
    assert len(raw["spans"]["family"]["limit"]) == 2
    assert len(raw["accepted"]["family"]["limit"]) == 2


def test_isolated_runs_come_back_from_fresh_processes(tmp_path: Path) -> None:
    """The default: each calibration round and engine run in a spawned interpreter, its
    measurements pickled back."""
    from hycache.bench.calibrate import CalibrateOptions, DecodeProbe, Grid, PrefillProbe
    from hycache.bench.validate import ValidateOptions, validate

    grid = Grid(prefill=(PrefillProbe(64, (0,)),), decode=(DecodeProbe(64, 2, (1,)),),
                copies=(), state_writes=())  # fmt: skip
    empty = Grid(prefill=(), decode=(), copies=(), state_writes=())
    cal = CalibrateOptions(repeats=1, knobs=CacheKnobs(64, 8), grid=grid, held_out=empty,
                           cache_memory_gb=0.05)  # fmt: skip
    path = tmp_path / "profile.json"
    opts = ValidateOptions(profile=str(path), quick=True, workloads=("multi-turn",),
                           policies=("limit",))  # fmt: skip
    messages: list[str] = []
    doc = validate(opts, messages.append, recalibrate=cal)
    assert "calibration round 1/1 (a fresh process)" in messages
    part = doc.workloads["multi-turn"]
    assert part.measured["limit"].requests == part.size
    hits = part.comparison.metrics["limit"]["token_hit_rate"]
    assert hits.measured == hits.predicted > 0
    assert json.loads(path.read_text())["calibration"]["extra"]["rounds"] == 1


def test_ttft_priced_on_the_engines_own_schedule() -> None:
    """`ttft_attribution` sums the steps each request's TTFT spans, timed and priced, and
    takes the median over requests, then over repeats: steps measured 25% slower than
    priced show as -20%."""
    from hycache.bench.steps import EngineStep, ttft_attribution

    cost = CostModel(MODEL, load_gpu("h200"), speculative=True, num_speculative_tokens=2)
    prefill = StepWork((SeqWork(512, 0, 0, True),))
    decode = StepWork((SeqWork(3, 800, 2, False), SeqWork(3, 900, 2, False)))
    run = [EngineStep(w, 1.25 * cost.step_time(w)) for w in (prefill, decode, decode)]
    spans = [(0, 0), (0, 1), (1, 2)]  # the middle one: prefill + one decode
    out = ttft_attribution([run, run], [spans, spans], cost)
    priced = cost.step_time(prefill) + cost.step_time(decode)
    assert out.predicted_s == pytest.approx(priced)
    assert out.measured_s == pytest.approx(1.25 * priced)
    assert out.error == pytest.approx(-0.2)


def test_step_kinds_and_their_attribution() -> None:
    """`step_attribution` prices the engine's own steps with the cost model, per kind, as
    seconds per run; a step measured 25% slower than priced shows as -20%."""
    from hycache.bench.steps import EngineStep, step_attribution, step_kind

    cost = CostModel(MODEL, load_gpu("h200"), speculative=True, num_speculative_tokens=2)
    prefill = StepWork((SeqWork(512, 0, 0, True),))
    decode = StepWork((SeqWork(3, 800, 2, False), SeqWork(3, 900, 2, False)))
    mixed = StepWork((SeqWork(3, 800, 2, False), SeqWork(64, 0, 0, True)))
    copies = StepWork((), num_block_copies=3)
    kinds = [step_kind(w) for w in (prefill, decode, mixed, copies)]
    assert kinds == ["prefill", "decode", "mixed", "copies"]
    run = [EngineStep(w, 1.25 * cost.step_time(w)) for w in (prefill, decode, decode, mixed)]
    att = step_attribution([run, run], [10.0, 12.0], cost)
    out = att.kinds
    assert list(out) == ["prefill", "mixed", "decode", "all steps"]
    assert out["decode"].steps == 2
    assert out["decode"].predicted_s == pytest.approx(2 * cost.step_time(decode))
    for kind in ("prefill", "decode", "mixed", "all steps"):
        assert out[kind].error == pytest.approx(-0.2)
    assert att.outside_steps_s == pytest.approx(11.0 - out["all steps"].measured_s)
    assert list(att.to_json()) == [*out, "outside_steps_s"]


def _m(tok_s: float, p50: float, p95: float, hit: float) -> RunMetrics:
    return RunMetrics(output_tokens_per_s=tok_s, ttft_p50_s=p50, ttft_p95_s=p95,
                      token_hit_rate=hit, makespan_s=1.0, requests=4)  # fmt: skip
