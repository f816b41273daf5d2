"""`hycache calibrate` (time the real engine, fit the cost model: hycache.calibrate) and the
validation tables of `hycache bench --validate PROFILE` (hycache.validate)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from rich.table import Table

from hycache.cli_common import UserError, positive_int
from hycache.report import check_writable, console, progress_reporter, write_atomic


def cmd_calibrate(args: argparse.Namespace) -> int:
    from hycache.calibrate import CalibrateOptions, calibrate

    check_writable(args.out, "--out")
    opts = CalibrateOptions(
        model=args.model,
        threads=args.threads,
        repeats=args.repeats,
        quick=args.quick,
        clock=args.clock,
        seed=args.seed,
    )
    if opts.model != "tiny":
        raise UserError("--model: the engine's calibration grid is sized for `tiny`")
    command = "hycache " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    with progress_reporter("calibrating") as progress:
        doc = calibrate(opts, progress, command=f"hycache calibrate {command}".strip())
    console.print(residuals_table("fitted shapes", doc["residuals"]))
    console.print(residuals_table("held-out shapes (not fitted)", doc["held_out"]))
    console.print(fit_table(doc))
    write_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


def residuals_table(title: str, rows: list[dict[str, Any]]) -> Table:
    """Per shape: measured on the fit's clock (wall and CPU beside), predicted, error; the
    spread of the repeats and the load average. Copies and state writes (dim) are not
    fitted."""
    t = Table(title=title)
    cols = ("shape", "measured ms", "wall ms", "CPU ms", "predicted ms", "error", "spread", "load")
    for col in cols:
        t.add_column(col, justify="left" if col == "shape" else "right")
    for r in rows:
        style = None if r["kind"] == "step" else "dim"
        t.add_row(
            r["shape"],
            f"{r['measured_s'] * 1e3:.2f}",
            f"{r['wall_s'] * 1e3:.2f}",
            f"{r['cpu_s'] * 1e3:.2f}",
            f"{r['predicted_s'] * 1e3:.2f}",
            f"{r['error']:+.1%}",
            f"{r['spread']:.0%}",
            f"{r['load']:.1f}",
            style=style,
        )
    return t


def fit_table(doc: dict[str, Any]) -> Table:
    cal = doc["calibration"]
    t = Table(title=f"fitted on {doc['model']} ({cal['extra']['clock']} clock)")
    t.add_column("parameter")
    t.add_column("value", justify="right")
    from hycache.sim.fit import PRESET_FIELDS

    skip = {"name", "description", "source", "memory_bytes"}
    for key in (k for k in PRESET_FIELDS if k not in skip):
        t.add_row(key, f"{doc[key]:.4g}" if not isinstance(doc[key], bool) else str(doc[key]))
    t.add_row("rms error, fitted / held out", f"{cal['rms_error_fitted']:.1%} / "
              f"{cal['rms_error_held_out']:.1%}")  # fmt: skip
    for name, rms in cal["ablation_rms_error"].items():
        t.add_row(f"ablation: {name}", f"{rms:.1%}")
    t.add_row("load before / after", f"{cal['load_before']:.1f} / {cal['load_after']:.1f}")
    t.add_row("CPU / wall", f"{cal['cpu_over_wall']:.2f}")
    return t


def validation_table(doc: dict[str, Any]) -> Table:
    """Measured vs predicted per workload and policy, with the error of each."""
    i = doc["inputs"]
    t = Table(
        title=f"simulator ({i['profile']}, {i['clock']} clock) vs the CPU engine "
        f"({i['model']} + EAGLE k={i['num_speculative_tokens']}, acceptance "
        f"{i['acceptance_rate']:.2f}; median of {i['repeats']})"
    )
    for col in ("workload", "policy", "metric", "measured", "predicted", "error"):
        t.add_column(col, justify="left" if col in ("workload", "policy", "metric") else "right")
    from hycache.validate import METRICS

    for name, part in doc["workloads"].items():
        c = part["comparison"]
        for p in (x for x in c if x != "ratio"):
            for label, key in METRICS:
                v = c[p][key]
                err = v["error"]
                t.add_row(name, p, label, f"{v['measured']:.3g}", f"{v['predicted']:.3g}",
                          f"{err:+.1%}" if err is not None else "")  # fmt: skip
        if "ratio" in c:
            r = c["ratio"]
            cells = (f"{r['measured']:.3f}", f"{r['predicted']:.3f}", f"{r['error_pp']:+.1f} pp")
            t.add_row(name, "limit/lookahead", "output tok/s", *cells, style="bold")
    return t


def engine_prediction_table(measured: dict[str, Any], predicted: dict[str, Any]) -> Table:
    """`hycache bench --engine-profile`: the CPU engine arm, measured beside predicted."""
    from hycache.validate import METRICS

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


def cmd_validate(args: argparse.Namespace) -> int:
    """`hycache bench --validate PROFILE`."""
    from hycache.validate import ValidateOptions, misses, validate

    check_writable(args.json, "--json")
    opts = ValidateOptions(
        profile=args.validate,
        threads=args.threads,
        repeats=args.engine_repeats or 1,
        quick=args.quick,
        clock=args.clock,
    )
    with progress_reporter("validating") as progress:
        doc = validate(opts, progress)
    console.print(validation_table(doc))
    miss = misses(doc)
    doc["misses"] = miss
    console.print(
        "within the targets (10% on tok/s and TTFT p50, 3 pp on the ratio)"
        if not miss
        else "outside the targets: " + "; ".join(miss)
    )
    console.print(f"validation wall time: {doc['wall_s']:.1f} s")
    if args.json:
        write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def add_validate_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("validation")
    g.add_argument(
        "--validate",
        default=None,
        metavar="PROFILE",
        help="instead: the simulator with this calibrated profile (`hycache calibrate`) "
        "against the CPU engine on the system-prompt, family and multi-turn workloads, "
        "lookahead and limit (writes --json when given a file other than the default)",
    )
    g.add_argument("--threads", type=positive_int, default=1, help="torch threads (validation)")
    g.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default=None,
        help="validation: time both sides by this clock (default: the profile's)",
    )


def add_calibrate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time the real engine over a grid of step shapes and fit the cost model",
        description="Run the engine on this device over prefill, decode, verify and mixed "
        "step shapes (and block copies, state writes), fit the simulator's cost model, and "
        "write a device profile that `hycache simulate --gpu-config` accepts.",
    )
    p.add_argument("--model", default="tiny", help="the engine model (tiny)")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    p.add_argument("--repeats", type=positive_int, default=5, help="repeats per shape")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="fit the wall time, or the process CPU time (a machine shared with other work)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny grid (a smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_calibrate)
