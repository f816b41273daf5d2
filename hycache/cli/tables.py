"""What the command line prints: its consoles, progress bars and every rich table (explain,
the arms of simulate and bench, the bench's curves, the simulated instances, eviction curves,
`bench serve`'s results, calibration and validation).

Presentation only: the numbers come from hycache.sim, hycache.bench and hycache.bench.validate.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hycache.sim.compare import BASELINE, HEADLINE, reference_arm

if TYPE_CHECKING:
    from hycache.bench.validate import Comparison, ValidationReport
    from hycache.sim.fit import Profile, Residual
    from hycache.sim.simulator import SimResult

console = Console(stderr=False)
if not console.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
    console = Console(stderr=False, width=120)
err_console = Console(stderr=True)


def progress_bar(disable: bool = False) -> Progress:
    """The command line's progress bar on stderr: description, bar, done / total, elapsed."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=disable,
    )


@contextlib.contextmanager
def progress_reporter(what: str) -> Iterator[Callable[[str], None]]:
    """A callback that reports progress on stderr: a live status line on a terminal, plain
    timestamped lines otherwise (a piped or logged run is never silent)."""
    if err_console.is_terminal:
        with err_console.status(what) as status:
            yield lambda msg: status.update(f"{what}: {msg}")
        return
    start = time.monotonic()

    def line(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {what}: {msg}", file=sys.stderr, flush=True)

    yield line


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    if isinstance(v, list):
        return " / ".join(fmt(x) for x in v)
    return str(v)


def explain_table(result: Mapping[str, Any]) -> Table:
    inp = result["inputs"]
    title = (
        f"B={inp['block_size']:,}  u={inp['prefix_match_unit']:,}  "
        f"EAGLE {'on' if inp['eagle'] else 'off'}  T={inp['prompt_tokens']:,}  "
        f"P={inp['shared_prefix']:,}"
    )
    if "model" in inp:  # `--backend vllm`: the KV cache config vLLM scheduled
        title += f"  model={inp['model']}"
    policies = result["policies"]
    table = Table(title=title)
    table.add_column("position")
    for name in policies:
        table.add_column(name, justify="right")
    # `--backend vllm` columns say which vLLM ran and whether the plugin was on
    rows = [("scheduler", "scheduler")] if all("scheduler" in p for p in policies.values()) else []
    rows += [
        ("replay boundary", "replay_boundary"),
        ("tail checkpoint", "tail_checkpoint"),
        ("producer checkpoints (observed)", "producer_checkpoints"),
        ("identical resend resumes at", "resend"),
        ("sibling 1 / 2 / 3 resume at", "siblings"),
        ("sibling junctions observed", "sibling_junctions"),
        ("sibling prefill steps", "sibling_prefill_steps"),
        ("the limit floor((P-1)/u)*u", "limit"),
        ("SSM pages keyed: at the end / peak", "ssm_pages_held"),
    ]
    for label, key in rows:
        table.add_row(label, *(fmt(p[key]) for p in policies.values()))
    return table


SIM_ROWS = (
    ("output tokens/s", "output_tokens_per_s", True),
    ("requests/s", "request_throughput", True),
    ("TTFT p50 (s)", "ttft_p50_s", True),
    ("TTFT p95 (s)", "ttft_p95_s", True),
    ("ITL p50 (s)", "itl_p50_s", True),
    ("ITL p95 (s)", "itl_p95_s", True),
    ("prefill tokens computed", "prefill_tokens_computed", True),
    ("hit tokens", "hit_tokens", True),
    ("token hit rate", "token_hit_rate", True),
    ("lost-reuse tokens", "lost_reuse_tokens", False),
    ("requests that observed a junction", "junctions_observed", False),
    ("extra prefill steps (max)", "extra_prefill_steps_max", False),
    ("SSM state pages keyed (total)", "ssm_pages_stored", True),
    ("  of which decode snapshots", "ssm_snapshot_pages", False),
    ("SSM state pages keyed (peak held)", "ssm_pages_peak", True),
    ("peak blocks used", "peak_blocks_used", False),
    ("cache blocks", "num_blocks", False),
    ("preemptions", "preemptions", False),
)


def _ratio(v: Any, base: Any) -> str:
    ok = isinstance(v, int | float) and isinstance(base, int | float) and base
    return f"{v / base:.3f}x" if ok else ""


def headline_pair(names: list[str]) -> tuple[str, str] | None:
    """(numerator, denominator) of a table's ratio column: `limit / lookahead` when both are
    there, the second arm over the first for a pair, else None."""
    if HEADLINE in names and BASELINE in names:
        return HEADLINE, BASELINE
    if len(names) == 2:
        return names[1], names[0]
    return None


def policy_table(title: str, policies: Mapping[str, Mapping[str, Any]]) -> Table:
    """Metrics per arm; a bold column with the headline ratio (`limit / lookahead`), and a last
    row with every arm's output tokens/s over the baseline (`lookahead` when present)."""
    table = Table(title=title)
    table.add_column("metric")
    names = list(policies)
    for name in names:
        table.add_column(name, justify="right")
    pair = headline_pair(names)
    if pair:
        table.add_column(f"{pair[0]}/{pair[1]}", justify="right", style="bold")
    for label, key, ratio in SIM_ROWS:
        if all(policies[n].get(key) is None for n in names):
            continue
        cells = [fmt(policies[n].get(key)) for n in names]
        if pair:
            num, den = (policies[x].get(key) for x in pair)
            cells.append(_ratio(num, den) if ratio else "")
        table.add_row(label, *cells)
    if len(names) > 1:
        base = reference_arm(names)
        key = "output_tokens_per_s"
        cells = [_ratio(policies[n].get(key), policies[base].get(key)) for n in names]
        table.add_row(f"output tokens/s ÷ {base}", *cells, *([""] if pair else []), style="bold")
    return table


def curves_table(curves: Mapping[str, Any]) -> Table:
    """`limit / lookahead` output tokens/s at each point of the bench's curves."""
    table = Table(title=f"{HEADLINE} / {BASELINE} output tokens/s (simulated curves)")
    table.add_column("over")
    table.add_column("workload")
    table.add_column("x: ratio")
    for axis in ("output_tokens", "concurrency"):
        for name, points in curves.get(axis, {}).items():
            cells = "  ".join(f"{p['x']}: {p['ratio']:.3f}" for p in points)
            table.add_row(axis.replace("_", " "), name, cells)
    return table


INSTANCE_COLUMNS = (
    ("requests", "requests"),
    ("token hit rate", "token_hit_rate"),
    ("store hit tokens", "store_hit_tokens"),
    ("hit tokens", "hit_tokens"),
    ("predicted hit tokens", "predicted_hit_tokens"),
    ("TTFT p50 s", "ttft_p50_s"),
    ("TTFT p95 s", "ttft_p95_s"),
    ("output tok/s", "output_tokens_per_s"),
    ("load s", "store_load_s"),
)


def instances_table(title: str, results: Mapping[str, SimResult]) -> Table:
    """A rich table: per arm, each instance and the total (columns `INSTANCE_COLUMNS`)."""
    table = Table(title=title)
    table.add_column("arm")
    table.add_column("instance")
    for label, _ in INSTANCE_COLUMNS:
        table.add_column(label, justify="right")
    for name, res in results.items():
        rows = [(str(i["instance"]), i) for i in res.instances] + [("all", res.summary)]
        for label, summary in rows:
            cells = [fmt(summary.get(key)) for _, key in INSTANCE_COLUMNS]
            table.add_row(name, label, *cells, style="bold" if label == "all" else None)
    return table


def eviction_table(doc: dict[str, Any]) -> Table:
    """A rich table: per workload and fraction, each arm's hit rate and TTFT p95, and the
    `limit` flop-aware / lru ratios."""
    arms = doc["inputs"]["arms"]
    t = Table(title=f"eviction under memory pressure (alpha {doc['inputs']['alpha']:g})")
    t.add_column("workload")
    t.add_column("memory", justify="right")
    for arm in arms:
        t.add_column(f"{arm}\nhit · p95 s", justify="right")
    t.add_column("limit fa/lru\nhit · p95", justify="right")
    for name, rows in doc["curves"].items():
        for row in sorted(rows, key=lambda r: r["fraction"]):
            cells = []
            for arm in arms:
                a = row["arms"][arm]
                cells.append(f"{a['token_hit_rate']:.3f} · {a['ttft_p95_s']:.2f}")
            r = row["ratios"]
            hit = "-" if r["token_hit_rate"] is None else f"{r['token_hit_rate']:.2f}"
            p95 = "-" if r["ttft_p95_s"] is None else f"{r['ttft_p95_s']:.2f}"
            t.add_row(name, f"{row['fraction']:g}", *cells, f"{hit} · {p95}")
    return t


def results_table(title: str, summary: dict[str, Any]) -> Table:
    """The summary as a rich table."""

    def num(v: float | None, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("requests ok / failed", f"{summary['ok']} / {summary['failed']}")
    t.add_row("duration (s)", num(summary["duration_s"]))
    t.add_row("request throughput (req/s)", num(summary["request_throughput_per_s"]))
    t.add_row("output throughput (tok/s)", num(summary["output_throughput_tok_per_s"], ".1f"))
    t.add_row("prompt / output tokens", f"{summary['prompt_tokens']} / {summary['output_tokens']}")
    t.add_row("mean cached tokens", num(summary["mean_cached_tokens"], ".1f"))
    ratio = summary["cached_token_ratio"]
    t.add_row("cached / prompt tokens", "-" if ratio is None else f"{ratio:.1%}")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        d = summary[key]
        t.add_row(
            f"{name} ms p50 / p95 / p99",
            " / ".join(num(d[p]) for p in ("p50", "p95", "p99")),
        )
    for message, count in list(summary["errors"].items())[:5]:
        t.add_row(Text(f"failed x{count}", style="red"), Text(message))
    return t


def residuals_table(title: str, rows: Sequence[Residual]) -> Table:
    """Per shape: measured on the fit's clock (wall and CPU beside), predicted, error; the
    spread of the repeats and the load average. Copies and state writes (dim) are not
    fitted."""
    t = Table(title=title)
    cols = ("shape", "measured ms", "wall ms", "CPU ms", "predicted ms", "error", "spread", "load")
    for col in cols:
        t.add_column(col, justify="left" if col == "shape" else "right")
    for r in rows:
        style = None if r.kind == "step" else "dim"
        t.add_row(
            r.shape,
            f"{r.measured_s * 1e3:.2f}",
            f"{r.wall_s * 1e3:.2f}",
            f"{r.cpu_s * 1e3:.2f}",
            f"{r.predicted_s * 1e3:.2f}",
            f"{r.error:+.1%}",
            f"{r.spread:.0%}",
            f"{r.load:.1f}",
            style=style,
        )
    return t


def fit_table(profile: Profile) -> Table:
    """The fitted profile's terms (peaks beside them), its rms errors, the ablation and the
    machine's load while it was measured."""
    cond = profile.conditions
    t = Table(title=f"fitted on {profile.model} ({profile.clock} clock)")
    t.add_column("parameter")
    t.add_column("value", justify="right")
    from hycache.sim.presets import PRESET_FIELDS

    spec = profile.spec
    skip = {"name", "description", "source", "memory_bytes"}
    for key in (k for k in PRESET_FIELDS if k not in skip):
        v = getattr(spec, key)
        t.add_row(key, "unset" if v is None else str(v) if isinstance(v, bool) else f"{v:.4g}")
    from hycache.sim.fit import rms_error

    t.add_row("rms error, fitted / held out", f"{rms_error(profile.residuals):.1%} / "
              f"{rms_error(profile.held_out):.1%}")  # fmt: skip
    for name, rms in profile.ablation.items():
        t.add_row(f"ablation: {name}", f"{rms:.1%}")
    t.add_row("load before / after", f"{cond.load_before:.1f} / {cond.load_after:.1f}")
    t.add_row("CPU / wall", f"{cond.cpu_over_wall:.2f}")
    return t


def validation_table(report: ValidationReport) -> Table:
    """Measured vs predicted per workload and policy, with the error of each."""
    i = report.inputs
    t = Table(
        title=f"simulator ({i.profile}, {i.clock} clock) vs the CPU engine "
        f"({i.model} + EAGLE k={i.num_speculative_tokens}, acceptance "
        f"{i.acceptance_rate:.2f}; median of {i.repeats})"
    )
    for col in ("workload", "policy", "metric", "measured", "predicted", "error"):
        t.add_column(col, justify="left" if col in ("workload", "policy", "metric") else "right")
    from hycache.bench.validate import METRICS

    for name, part in report.workloads.items():
        c = part.comparison
        for p, by in c.metrics.items():
            for label, key in METRICS:
                v = by[key]
                t.add_row(name, p, label, f"{v.measured:.3g}", f"{v.predicted:.3g}",
                          _pct(v.error, ""))  # fmt: skip
        if c.ratio is not None:
            r = c.ratio
            cells = (f"{r.measured:.3f}", f"{r.predicted:.3f}", f"{r.error_pp:+.1f} pp")
            t.add_row(name, "limit/lookahead", "output tok/s", *cells, style="bold")
    return t


def _pct(e: float | None, missing: str = "-") -> str:
    return f"{e:+.1%}" if e is not None else missing


def _transitions(
    t: Table, name: str, before: Comparison, after: Comparison, extra: list[str]
) -> None:
    """Rows of a workload's errors, one comparison → another (tok/s, TTFT p50, the ratio)."""
    for p, by in after.metrics.items():
        cells = [
            f"{_pct(before.metrics[p][key].error)} → {_pct(by[key].error)}"
            for key in ("output_tokens_per_s", "ttft_p50_s")
        ]
        t.add_row(name, p, *cells, *extra)
    if after.ratio is not None and before.ratio is not None:
        e0, e1 = before.ratio.error_pp, after.ratio.error_pp
        blank = [""] * (1 + len(extra))
        t.add_row(name, "limit/lookahead", f"{e0:+.1f} → {e1:+.1f} pp", *blank, style="bold")


def cross_fit_table(report: ValidationReport) -> Table:
    """`--validate --recalibrate`: each workload's errors predicted from the probes alone
    beside those with the probes and the other workloads' engine steps fitted."""
    t = Table(title="probes only → cross-fitted (the probes and the other workloads' runs)")
    for col in ("workload", "policy", "tok/s error", "TTFT p50 error", "own steps rms"):
        t.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for name, part in report.workloads.items():
        if part.cross_fit is None or part.probes_only is None:
            continue
        rms = f"{part.cross_fit.rms_error_own_steps:.1%}"
        _transitions(t, name, part.probes_only.comparison, part.comparison, [rms])
    return t


def replay_table(report: ValidationReport) -> Table:
    """`--validate`: each workload's errors with the simulator drawing drafts at the
    profile's rate beside those with the engine's accepted drafts replayed."""
    t = Table(title="drafts drawn at the profile's rate → the engine's replayed")
    for col in ("workload", "policy", "tok/s error", "TTFT p50 error"):
        t.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for name, part in report.workloads.items():
        at_rate = part.prediction.at_rate
        if at_rate is not None:
            _transitions(t, name, at_rate.comparison, part.comparison, [])
    return t


def step_table(report: ValidationReport) -> Table:
    """`--validate`: the cost model on the engine's own steps, per step kind (seconds per
    run): an error here is the cost model's; a tok/s error it does not explain, the
    schedule's."""
    t = Table(title="the cost model on the engine's own steps (seconds per run)")
    for col in ("workload", "policy", "steps", "count", "measured s", "cost model s", "error"):
        t.add_column(col, justify="left" if col in ("workload", "policy", "steps") else "right")
    for name, part in report.workloads.items():
        for p, att in part.prediction.steps.items():
            for kind, v in att.kinds.items():
                t.add_row(name, p, kind, f"{v.steps:.0f}", f"{v.measured_s:.2f}",
                          f"{v.predicted_s:.2f}", _pct(v.error, ""),
                          style="bold" if kind == "all steps" else None)  # fmt: skip
            t.add_row(name, p, "between steps", "", f"{att.outside_steps_s:.2f}", "0", "")
    return t


def ttft_step_table(report: ValidationReport) -> Table:
    """`--validate`: TTFT p50 priced on the engine's own schedule (the steps each request's
    TTFT spans) beside the simulator's: the first error is the cost model's, what the
    second adds is the simulator's schedule."""
    t = Table(title="TTFT p50: the cost model on the engine's schedule, and the simulator's")
    cols = ("workload", "policy", "measured s", "on its steps s", "cost model s", "error",
            "simulator s", "error ")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for name, part in report.workloads.items():
        for p, v in part.prediction.ttft_steps.items():
            c = part.comparison.metrics[p]["ttft_p50_s"]
            seconds = (c.measured, v.measured_s, v.predicted_s)
            t.add_row(name, p, *(f"{x:.3f}" for x in seconds), _pct(v.error, ""),
                      f"{c.predicted:.3f}", _pct(c.error, ""))  # fmt: skip
    return t


def engine_prediction_table(measured: dict[str, Any], predicted: dict[str, Any]) -> Table:
    """`hycache bench --engine-profile`: the CPU engine arm, measured beside predicted."""
    from hycache.bench.validate import METRICS

    t = Table(title="CPU engine arm: measured vs the simulator with the calibrated profile")
    for col in ("policy", "metric", "measured", "predicted", "error"):
        t.add_column(col, justify="left" if col in ("policy", "metric") else "right")
    for p, pred in predicted.items():
        for label, key in METRICS:
            m, s = measured[p][key], pred[key]
            t.add_row(p, label, f"{m:.3g}", f"{s:.3g}", f"{s / m - 1:+.1%}" if m else "")
    if {"limit", "lookahead"} <= set(predicted):
        key = "output_tokens_per_s"
        rm = measured["limit"][key] / measured["lookahead"][key]
        rp = predicted["limit"][key] / predicted["lookahead"][key]
        t.add_row("limit/lookahead", "output tok/s", f"{rm:.3f}", f"{rp:.3f}",
                  f"{100 * (rp - rm):+.1f} pp", style="bold")  # fmt: skip
    return t


def _priced_title(i: Mapping[str, Any], what: str) -> str:
    """A `hycache bench vllm` table's title: the release, model, GPU and grid, `what`, and the
    arrival rate where one was set."""
    rate = f", {i['request_rate']:g} arrivals/s" if i.get("request_rate") else ""
    return (
        f"vLLM {i['vllm']} priced: {i['model']} on {i['gpu']}, B={i['block_size']}, "
        f"u={i['unit']}, {what}{rate}"
    )


def vllm_draws_table(doc: Mapping[str, Any]) -> Table:
    """`hycache bench vllm --draws N`: per workload and concurrency, plugin / stock over the
    workload draws, median (min-max), and how many draws meet the bar (`!` where one does not)."""
    i = doc["inputs"]
    seeds = i["seeds"]
    t = Table(title=_priced_title(i, f"plugin / stock over seeds {seeds[0]}-{seeds[-1]}"))
    for col in ("workload", "conc", "out tok/s", "TTFT p50", "TTFT p95", "meet the bar"):
        t.add_column(col, justify="left" if col == "workload" else "right", no_wrap=True)

    def cell(s: Mapping[str, float]) -> str:
        return f"{s['median']:.3f}x ({s['min']:.3f}-{s['max']:.3f})"

    for r in doc["across_draws"]:
        bar = f"{r['ok']} of {r['draws']}" + ("" if r["ok"] == r["draws"] else " !")
        t.add_row(
            r["workload"], str(r["concurrency"]), cell(r["output_tok_s"]), cell(r["ttft_p50"]),
            cell(r["ttft_p95"]), bar,
        )  # fmt: skip
    return t


def vllm_priced_table(doc: Mapping[str, Any]) -> Table:
    """`hycache bench vllm`: per workload, concurrency and arm, the priced figures; the
    plugin's row ends with its ratios to stock (output tok/s, TTFT p50; `!` below the bar:
    < 0.99x tok/s or > 1.01x TTFT p50)."""
    i = doc["inputs"]
    t = Table(title=_priced_title(i, f"k={i['num_speculative_tokens']}, budget {i['budget']}"))
    for col in ("workload", "conc", "arm", "out tok/s", "TTFT p50", "TTFT p95", "passes",
                "prefill tok", "hit tok", "vs stock"):  # fmt: skip
        left = col in ("workload", "arm")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    ratio = {(r["workload"], r["concurrency"]): r for r in doc["ratios"]}
    for r in doc["rows"]:
        cell = ratio.get((r["workload"], r["concurrency"])) if r["arm"] == "plugin" else None
        vs = ""
        if cell:
            vs = f"{cell['output_tok_s']:.3f}x {cell['ttft_p50']:.3f}x"
            vs += "" if cell["ok"] else " !"
        t.add_row(
            r["workload"], str(r["concurrency"]), r["arm"], f"{r['output_tok_s']:,.0f}",
            f"{r['ttft_p50_s'] * 1e3:,.1f} ms", f"{r['ttft_p95_s'] * 1e3:,.1f} ms",
            f"{r['passes_per_request']:.2f}", fmt(r["prefill_tokens"]), fmt(r["hit_tokens"]), vs,
        )  # fmt: skip
    return t
