"""Fitting the cost model on the engine's own steps (hycache.bench.steps, the summed samples of
hycache.sim.fit): the sums price what their steps price, and a workload's prediction is never
fitted on its own runs. Synthetic times only (priced by a known cost model)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hycache.bench.calibrate import Measured
from hycache.bench.steps import EngineStep, cross_fit, engine_samples
from hycache.bench.validate import RunMetrics, compare
from hycache.config import CacheKnobs
from hycache.sim.costmodel import SeqWork, StepWork
from hycache.sim.fit import Conditions, Fit, Sample, fit, predict, residuals
from hycache.sim.presets import GpuSpec, load_model_spec

MODEL = load_model_spec("tiny")
CPU = GpuSpec(name="cpu-test", peak_flops=1e11, hbm_bandwidth=1.5e10, memory_bytes=1 << 34)
B = 552
TRUTH = Fit(0.45, 0.6, 2.5e-3, 1.2e-3, 4e-4, kv_bytes_factor=5.0, phase_overlap=False)


def _price(work: StepWork, k: int = 2, truth: Fit = TRUTH) -> float:
    return truth.cost_model(MODEL, CPU, k, block_size=B).step_time(work)


def _probes(k: int = 2) -> list[Sample]:
    """Isolated shapes: prefill chunks at several contexts, decode batches, one mixed."""
    works = [StepWork((SeqWork(n, c, 0, True),)) for n, c in
             ((552, 0), (1104, 0), (1104, 4416), (2208, 2208), (4416, 0))]  # fmt: skip
    works += [StepWork((SeqWork(1 + k, c, k, False),) * b) for b, c in
              ((1, 512), (4, 2048), (8, 8000), (2, 4000))]  # fmt: skip
    works.append(StepWork((SeqWork(3, 4000, 2, False),) * 4 + (SeqWork(1104, 0, 0, True),)))
    return [Sample(f"probe {i}", w, k, _price(w, k)) for i, w in enumerate(works)]


def _run(scale: float, contexts: tuple[int, ...]) -> list[EngineStep]:
    """An engine run's steps: a prefill chunk, then decodes and mixed steps over `contexts`,
    each taking `scale` times its price."""
    works = [StepWork((SeqWork(2000, 0, 0, True),))]
    for c in contexts:
        works.append(StepWork((SeqWork(3, c, 2, False),) * 6))
        works.append(StepWork((SeqWork(3, c, 2, False),) * 5 + (SeqWork(200, c, 0, True),)))
    return [EngineStep(w, scale * _price(w)) for w in works]


def test_a_summed_sample_prices_the_sum_of_its_steps() -> None:
    steps = [(s.work, s.wall_s) for s in _probes()]
    total = Sample.total("all", steps, 2, repeats=3)
    assert total.works == tuple(w for w, _ in steps) and total.repeats == 3
    assert total.wall_s == pytest.approx(sum(t for _, t in steps)) == total.cpu_s
    assert predict(total, TRUTH, MODEL, CPU, B) == pytest.approx(total.wall_s, rel=1e-12)
    (row,) = residuals([total], TRUTH, MODEL, CPU, B)
    assert row.steps == len(steps) and row.error == pytest.approx(0.0, abs=1e-12)
    assert row.tokens == sum(w.num_tokens for w, _ in steps)


def test_summed_samples_fit_like_the_steps_they_sum() -> None:
    """The linear form's terms add up over steps: a fit on prefill probes and two summed
    groups of decode and mixed steps prices every single step as the truth does."""
    probes = _probes()
    prefill, rest = probes[:5], probes[5:]
    groups = [Sample.total(f"g{i}", [(s.work, s.wall_s) for s in rest[i::2]], 2)
              for i in range(2)]  # fmt: skip
    got = fit([*prefill, *groups, *rest[:2]], MODEL, CPU, block_size=B)
    for r in residuals(probes, got, MODEL, CPU, B):
        assert abs(r.error) < 1e-3, r


def test_summed_samples_are_whole_steps_of_the_linear_form() -> None:
    work = StepWork((SeqWork(3, 512, 2, False),))
    with pytest.raises(ValueError, match="only whole steps"):
        Sample("c", StepWork((), num_block_copies=2), 2, 1.0, kind="copies", more=(work,))
    with pytest.raises(ValueError, match="no steps"):
        Sample.total("empty", [], 2)
    total = Sample.total("t", [(work, 0.01), (work, 0.01)], 2)
    with pytest.raises(ValueError, match="linear form only"):
        fit([total, *_probes()], MODEL, CPU, block_size=B, overlap=True)


def _measured() -> Measured:
    cond = Conditions("cpu", 1, "float32", "test", 0.0, 0.0, 1.0, 1.0,
                      extra={"block_size": B, "clock": "wall"})  # fmt: skip
    return Measured(CPU, _probes(), [], cond)


def _runs(scales: dict[str, float]) -> dict[str, dict[str, list[list[EngineStep]]]]:
    contexts = {"a": (1500, 1800), "b": (2500, 3000), "c": (1000, 4000)}
    return {n: {"limit": [_run(s, contexts[n])] * 2, "lookahead": [_run(s, contexts[n][::-1])]}
            for n, s in scales.items()}  # fmt: skip


def test_engine_samples_sum_each_policy_and_kind() -> None:
    runs = _runs({"a": 1.0})["a"]
    samples = engine_samples("a", runs, 2)
    labels = [s.label for s in samples]
    assert labels == [f"a · {p} · {k} (engine)" for p in ("limit", "lookahead")
                      for k in ("prefill", "mixed", "decode")]  # fmt: skip
    by = {s.label: s for s in samples}
    limit_decode = by["a · limit · decode (engine)"]
    assert len(limit_decode.works) == 4 and limit_decode.repeats == 2
    decode_s = sum(st.seconds for run in runs["limit"] for st in run
                   if not any(q.is_prefill for q in st.work.seqs))  # fmt: skip
    assert limit_decode.wall_s == pytest.approx(decode_s)


def test_cross_fit_never_sees_the_workload_it_predicts() -> None:
    """Runs 10% slower than the probes: the fit on the probes and the other runs prices the
    held-out workload's steps closer than the probes alone, and it does not move when the
    held-out workload's own times do."""
    probes = _measured()
    runs = _runs({"a": 1.10, "b": 1.10, "c": 1.10})
    cf = cross_fit(probes, runs, "c", "tiny", 2, CPU)
    assert cf.fitted_on == ("calibration probes", "a", "b") and cf.held_out == "c"
    assert [r.shape.split(" · ")[0] for r in cf.own_steps] == ["c"] * 6
    alone = fit(probes.fitted, MODEL, CPU, block_size=B, padded=True)
    c_steps = engine_samples("c", runs["c"], 2)
    probes_only = residuals(c_steps, alone, MODEL, CPU, B)
    crossed = cf.own_steps
    assert max(abs(r.error) for r in crossed) < min(abs(r.error) for r in probes_only)
    assert cf.gpu.name == CPU.name and cf.gpu.compute_efficiency > 0
    # its own runs twice as slow: the same fit; another workload's: a different one
    slower = _runs({"a": 1.10, "b": 1.10, "c": 2.2})
    assert cross_fit(probes, slower, "c", "tiny", 2, CPU).values == cf.values
    moved = _runs({"a": 1.10, "b": 1.4, "c": 1.10})
    assert cross_fit(probes, moved, "c", "tiny", 2, CPU).values != cf.values


def test_the_paired_ratio_is_the_measured_ratio() -> None:
    m = {"limit": _m(12.0, 1.0, 2.0, 0.5),
         "lookahead": _m(10.0, 1.0, 2.0, 0.4)}  # fmt: skip
    p = dict(m)
    c = compare(m, p, paired=1.25)
    assert c.ratio is not None
    assert c.ratio.measured == 1.25 and c.ratio.of_medians == pytest.approx(1.2)
    assert c.ratio.paired is True
    assert c.ratio.error_pp == pytest.approx(100 * (1.2 - 1.25))
    c = compare(m, p)
    assert c.ratio is not None
    assert c.ratio.measured == pytest.approx(1.2) and c.ratio.paired is False


def test_a_calibration_round_every_other_engine_repeat() -> None:
    """`round_every=2`: two engine repeats per calibration round (the policy order still
    alternating); a round_every below 1 is refused."""
    from hycache.bench.calibrate import CalibrateOptions, DecodeProbe, Grid, PrefillProbe
    from hycache.bench.validate import ValidateOptions, validate

    grid = Grid(prefill=(PrefillProbe(64, (0,)),), decode=(DecodeProbe(64, 2, (1,)),),
                copies=(), state_writes=())  # fmt: skip
    empty = Grid(prefill=(), decode=(), copies=(), state_writes=())
    cal = CalibrateOptions(repeats=1, decode_repeats=2, knobs=CacheKnobs(64, 8), grid=grid,
                           held_out=empty, cache_memory_gb=0.05)  # fmt: skip
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        opts = ValidateOptions(profile=f"{d}/p.json", quick=True, workloads=("family",),
                               repeats=2, round_every=2, isolate=False)  # fmt: skip
        messages: list[str] = []
        doc = validate(opts, messages.append, recalibrate=cal)
        with pytest.raises(ValueError, match="round_every"):
            validate(replace(opts, round_every=0), messages.append, recalibrate=cal)
    rounds = [m for m in messages if m.startswith("calibration round")]
    assert rounds == ["calibration round 1/1 (this process)"]
    runs = [m for m in messages if " · engine · " in m]
    pairs = ((1, "lookahead + limit"), (2, "limit + lookahead"))
    assert runs == [f"family · engine · {a} in turn · repeat {r}/2 (this process)"
                    for r, a in pairs]  # fmt: skip
    assert doc.inputs.repeats == 2


def _m(tok_s: float, p50: float, p95: float, hit: float) -> RunMetrics:
    return RunMetrics(output_tokens_per_s=tok_s, ttft_p50_s=p50, ttft_p95_s=p95,
                      token_hit_rate=hit, makespan_s=1.0, requests=4)  # fmt: skip
